"""Executes colab/quickstart.ipynb end to end with tiny settings."""

import os

import nbformat
from nbclient import NotebookClient

NOTEBOOK = os.path.join(os.path.dirname(os.path.dirname(__file__)), "colab", "quickstart.ipynb")


def test_quickstart_notebook_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("RLAGENT_NOTEBOOK_TINY", "1")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()
    outputs = "".join(
        output.get("text", "") for cell in notebook.cells for output in cell.get("outputs", [])
    )
    assert "bridged GAE advantages" in outputs
    assert "| outcome |" in outputs and "| process |" in outputs
    assert (tmp_path / "quickstart_run" / "curves.png").exists()
