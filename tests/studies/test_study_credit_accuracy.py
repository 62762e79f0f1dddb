"""The credit-accuracy study on its tiniest setting: files and columns; its launcher refuses a
non-empty workdir unless --overwrite."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from experiments.configs import credit_accuracy
from experiments.studies import credit_accuracy as study

OUTPUTS = (
    "credit.csv",
    "credit_vs_horizon.png",
    "auroc_vs_horizon.png",
    "summary.md",
    "summary.json",
    "provenance.json",
)


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The tiny setting of the test above, as launcher flags.
TINY_FLAGS = [
    "--config.policies=prover_0.5",
    "--config.horizons=2",
    "--config.estimators=gae_turn,rloo",
    "--config.rewards=process",
    "--config.seeds=2",
    "--config.num_groups=2",
    "--config.group_size=2",
    "--config.num_samples=4",
]


def _launch(workdir, *extra):
    command = [sys.executable, "-m", "experiments.credit_accuracy", f"--workdir={workdir}"]
    return subprocess.run(
        [*command, *TINY_FLAGS, *extra], capture_output=True, text=True, cwd=ROOT, timeout=600
    )


def _main_experiment_outputs(folder):
    """What a main-experiment workdir holds that the study would overwrite."""
    (folder / "summary.md").write_text("# the main experiment\n")
    (folder / "summary.json").write_text('{"conditions": {}}\n')
    (folder / "provenance.json").write_text('{"config": {}}\n')
    (folder / "rewards").mkdir()
    (folder / "rewards" / "metrics.csv").write_text("update\n1\n")


def _snapshot(folder):
    return {
        os.path.relpath(os.path.join(root, name), folder): (
            open(os.path.join(root, name), "rb").read(),
            os.stat(os.path.join(root, name)).st_mtime_ns,
        )
        for root, _, files in os.walk(folder)
        for name in files
    }


def test_launcher_refuses_a_non_empty_workdir_and_changes_nothing(tmp_path):
    _main_experiment_outputs(tmp_path)
    before = _snapshot(tmp_path)
    for extra, says in (((), "is not empty"), (("--resume",), "cannot resume")):
        result = _launch(tmp_path, *extra)
        assert result.returncode == 1, result.stderr[-2000:]
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and errors[0] == result.stderr.strip().splitlines()[-1]
        assert says in errors[0] and "--overwrite" in errors[0]
        assert "--resume to" not in errors[0]  # the study cannot resume: not offered.
    assert _snapshot(tmp_path) == before


@pytest.mark.slow
def test_launcher_overwrites_a_non_empty_workdir_and_writes_the_tiny_study(tmp_path):
    _main_experiment_outputs(tmp_path)
    result = _launch(tmp_path, "--overwrite")
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(os.listdir(tmp_path)) == sorted(OUTPUTS)  # nothing of the old run is left
    assert "main experiment" not in (tmp_path / "summary.md").read_text()
    # The tiny study's own outputs (the launcher is the study's one end-to-end run).
    for name in OUTPUTS:
        assert os.path.getsize(tmp_path / name) > 0
    with open(tmp_path / "credit.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2  # estimators x seeds
    for column in ("policy", "horizon", "estimator", "reward", "seed", "spearman", "pearson"):
        assert column in rows[0]
    assert {"sign_agreement", "auroc_verdict"} <= set(rows[0])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["process"]["prover_0.5"]) == {"gae_turn", "rloo"}


@pytest.mark.parametrize(
    "field, value, message",
    [("seeds", -1, "config.seeds must be >= 1"),
     ("horizons", "3,x", "config.horizons: 'x' is not an integer"),
     ("horizons", "3,3", r"names horizon \['3'\] more than once"),
     ("policies", "bogus", "config.policies: Unknown policy 'bogus'"),
     ("rewards", "nope", "config.rewards: Unknown reward 'nope'")],
)  # fmt: skip
def test_bad_values_are_refused_by_field_before_anything_is_written(
    tmp_path, field, value, message
):
    config = credit_accuracy.get_config()
    config[field] = value
    with pytest.raises(ValueError, match=message):
        study.run(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
