"""The credit-accuracy experiment on its tiniest setting: files and columns."""

from __future__ import annotations

import csv
import json
import os

from experiments.configs import credit_accuracy
from rlagent.credit import study


def test_tiny_study_writes_its_outputs(tmp_path):
    config = credit_accuracy.get_config()
    config.policies = "prover_0.5"
    config.horizons = "2"
    config.estimators = "gae_turn,rloo"
    config.rewards = "process"
    config.seeds = 2
    config.num_groups = 2
    config.group_size = 2
    config.num_samples = 4
    study.run(config, str(tmp_path))
    for name in (
        "credit.csv",
        "credit_vs_horizon.png",
        "auroc_vs_horizon.png",
        "summary.md",
        "summary.json",
        "provenance.json",
    ):
        assert os.path.getsize(tmp_path / name) > 0
    with open(tmp_path / "credit.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2  # estimators x seeds
    for column in ("policy", "horizon", "estimator", "reward", "seed", "spearman", "pearson"):
        assert column in rows[0]
    assert {"sign_agreement", "auroc_verdict"} <= set(rows[0])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["process"]["prover_0.5"]) == {"gae_turn", "rloo"}
