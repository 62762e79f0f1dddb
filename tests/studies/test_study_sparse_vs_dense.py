"""The main study (experiments.studies.sparse_vs_dense) on a tiny budget: files, table,
config errors."""

import csv
import json
import math
import os

import pytest

from experiments.configs import sparse_vs_dense
from experiments.configs import sparse_vs_dense_full
from experiments.studies import common
from experiments.studies import sparse_vs_dense as study


def _tiny_config():
    config = sparse_vs_dense.get_config()
    config.conditions = "outcome,potential"
    config.seeds = 2
    config.chunk_size = 1
    config.env.level = 1
    config.train.num_updates = 2
    config.train.num_groups = 2
    config.train.group_size = 2
    config.train.num_minibatches = 1
    return config


@pytest.mark.slow
def test_main_experiment_writes_metrics_plot_and_tables(tmp_path):
    config = _tiny_config()
    config.train.eval_every = 2  # held-out evaluation after update 2 (the last) only.
    config.train.eval_episodes = 4
    summary = common.run_and_report(
        study.reward_runs(config), config, workdir=str(tmp_path), title="tiny",
        progress=False,
    )  # fmt: skip
    assert set(summary["conditions"]) == {"outcome", "potential"}
    assert summary["conditions"]["outcome"]["num_seeds"] == 2
    for name in ("metrics.csv", "curves.png", "profiles.png", "summary.md", "summary.json"):
        assert os.path.getsize(tmp_path / name) > 0
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert len(lines) == 1 + 2 * 2 * 2  # header + conditions x seeds x updates
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["conditions"]["potential"]["seeds"] == [0, 1]
    # Held-out evaluation: NaN on update 1, measured on update 2, summarised per seed.
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    for row in rows:
        for name in ("eval_sampled_success", "eval_greedy_success", "eval_greedy_turns"):
            assert math.isnan(float(row[name])) == (row["update"] == "1")
    outcome = saved["conditions"]["outcome"]
    assert len(outcome["per_seed"]["eval_greedy_success"]) == 2
    assert 0.0 <= outcome["eval_greedy_success"]["iqm"]["value"] <= 1.0
    assert "held-out greedy success" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "summary.md").read_text().startswith("# tiny")
    assert list((tmp_path / "rewards" / "checkpoints").iterdir())


def test_guardrail_runs_and_config_errors():
    config = _tiny_config()
    runs = study.guardrail_runs(config)
    assert [run.config.env.guardrail for run in runs] == ["off", "penalise", "mask"]
    assert runs[1].config.train.violation_penalty == 1.0
    config.model.d_modle = 16
    with pytest.raises(ValueError, match="Unknown model config fields"):
        common.build(config)
    config = _tiny_config()
    config.conditions = " , "
    with pytest.raises(ValueError, match="names no reward form"):
        study.reward_runs(config)


def test_full_config_differs_from_the_quickstart_only_in_seeds_and_evaluation():
    full, quick = sparse_vs_dense_full.get_config(), sparse_vs_dense.get_config()
    setup = common.build(full)  # every field valid for the typed configs
    assert full.seeds == 30 and setup.train_config.eval_every == 30
    full.seeds, full.train.eval_every, full.train.eval_episodes = (
        quick.seeds,
        quick.train.eval_every,
        quick.train.eval_episodes,
    )
    assert full.to_dict() == quick.to_dict()
