"""Executes the notebooks of colab/ end to end with tiny settings."""

import os

import nbformat
from nbclient import NotebookClient

COLAB = os.path.join(os.path.dirname(os.path.dirname(__file__)), "colab")


def _execute(name: str, folder, monkeypatch) -> str:
    """Runs colab/<name> top to bottom in `folder` with RLAGENT_NOTEBOOK_TINY=1; the text
    of every cell's outputs."""
    monkeypatch.setenv("RLAGENT_NOTEBOOK_TINY", "1")
    monkeypatch.delenv("RLAGENT_HUB_MODEL", raising=False)
    notebook = nbformat.read(os.path.join(COLAB, name), as_version=4)
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": folder}}
    )
    client.execute()
    return "".join(
        output.get("text", "") for cell in notebook.cells for output in cell.get("outputs", [])
    )


def test_quickstart_notebook_runs(tmp_path, monkeypatch):
    outputs = _execute("quickstart.ipynb", tmp_path, monkeypatch)
    assert "bridged GAE advantages" in outputs
    assert "| outcome |" in outputs and "| process |" in outputs
    assert (tmp_path / "quickstart_run" / "curves.png").exists()


def test_pretrained_rl_notebook_loads_plays_and_trains_the_shipped_folder(tmp_path, monkeypatch):
    """The shipped pretrained folder is loaded, two held-out episodes are rendered (the
    model's tool calls and the tools' replies), a GRPO update runs with an evaluation
    after it, and the success plot is written."""
    outputs = _execute("pretrained_rl.ipynb", tmp_path, monkeypatch)
    assert "checkpoints/pretrained_toolworld" in outputs
    assert outputs.count("=== held-out episode") == 2
    assert "[assistant] tell_status({" in outputs and "[tool] {" in outputs
    assert "update 1: held-out success" in outputs
    run = tmp_path / "pretrained_rl_run"
    assert (run / "success.png").exists() and (run / "provenance.json").exists()
    with open(run / "metrics.csv") as f:
        assert len(f.read().strip().splitlines()) == 2  # a header and the update's row.
