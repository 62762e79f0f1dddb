"""The main study (experiments.studies.sparse_vs_dense) on a tiny budget: files, table,
config errors."""

import csv
import json
import math
import os

import ml_collections
import pytest

from experiments.configs import sparse_vs_dense
from experiments.configs import sparse_vs_dense_full
from experiments.studies import common
from experiments.studies import sparse_vs_dense as study
from rlagent.credit.probe import ProbeConfig
from rlagent.host import loop
from rlagent.prm import PRMConfig
from rlagent.train.evaluation import EvalConfig


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
    config.eval.every = 2  # held-out evaluation after update 2 (the last) only.
    config.eval.episodes = 4
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


def test_a_resume_refused_by_the_loop_leaves_the_study_provenance_untouched(tmp_path, monkeypatch):
    config, workdir = _tiny_config(), str(tmp_path)
    runs = study.reward_runs(config)
    resuming = common.prepare(workdir, config)  # a fresh folder: the run's start record
    common.start_record(workdir, resuming, config.to_dict(), runs=[run.name for run in runs])
    path = tmp_path / "provenance.json"
    before = (path.read_bytes(), os.stat(path).st_mtime_ns)

    def refuse(*args, **kwargs):  # e.g. a run folder whose metrics.csv is damaged
        raise loop.RunError("rewards: metrics.csv is damaged")

    monkeypatch.setattr(loop, "run", refuse)
    with pytest.raises(loop.RunError, match="damaged"):
        common.run_and_report(runs, config, workdir=workdir, title="tiny", resume=True,
                              progress=False)  # fmt: skip
    assert (path.read_bytes(), os.stat(path).st_mtime_ns) == before
    assert os.listdir(workdir) == ["provenance.json"]


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
    assert full.seeds == 30 and setup.eval_config == EvalConfig(every=30, episodes=64)
    full.seeds, full.eval = quick.seeds, quick.eval
    assert full.to_dict() == quick.to_dict()


def test_the_extras_sections_build_their_typed_configs():
    config = sparse_vs_dense.get_config()
    argv = ["--config.prm.kind=implicit", "--config.probe.every=10", "--config.eval.every=20"]
    assert common.unknown_override(config, argv) is None  # every field is settable
    config.prm.kind, config.probe.every, config.eval.every = "implicit", 10, 20
    with pytest.raises(ValueError, match="ProbeConfig.every must be 0 with PRMConfig.kind"):
        common.build(config)  # Monte-Carlo credit targets see no PRM scores
    config.probe.every = 0
    setup = common.build(config)
    assert setup.prm_config == PRMConfig(kind="implicit")
    assert (setup.probe_config, setup.eval_config) == (ProbeConfig(), EvalConfig(every=20))
    config.prm.kind, config.probe.every = "none", 10
    assert common.build(config).probe_config == ProbeConfig(every=10)
    # The old TrainConfig spellings are no fields any more.
    message = common.unknown_override(config, ["--config.train.credit_every=2"])
    assert message.startswith("Unknown config field config.train.credit_every")
    # ToolWorld's section has no kind: the message says where environments are chosen.
    message = common.unknown_override(config, ["--config.env.kind=mastermind"])
    assert "env_section('<kind>')" in message and "mastermind" in message
    assert "sparse_vs_dense.py:<kind>" in message
    config.probe.episodes = 65  # above the 64 episodes of a batch
    with pytest.raises(ValueError, match=r"ProbeConfig.episodes .*batch_size=64"):
        common.build(config)
    config.probe.episodes = 8
    config.prm.prm_noise = 0.1
    with pytest.raises(ValueError, match=r"Unknown PRMConfig fields \['prm_noise'\]"):
        common.build(config)
    # A config from before the sections: their defaults.
    old = {k: v for k, v in config.to_dict().items() if k not in ("prm", "probe", "eval")}
    setup = common.build(ml_collections.ConfigDict(old))
    assert setup[4:] == (PRMConfig(), ProbeConfig(), EvalConfig())


@pytest.mark.parametrize("kind", ["mastermind", "dialogue", "toolworld"])
def test_the_config_file_takes_the_environment_after_a_colon(kind):
    # --config=experiments/configs/sparse_vs_dense.py:<kind> passes <kind> to get_config.
    config = sparse_vs_dense_full.get_config(kind)
    default = sparse_vs_dense.get_config()
    assert config.env.kind == kind and config.seeds == 30
    setup = common.build(config)  # the model reads the environment's vocabulary
    assert setup.policy_config.vocab_size == setup.env.token_spec.vocab_size
    assert {k: v for k, v in config.items() if k not in ("env", "model", "seeds", "eval")} == {
        k: v for k, v in default.items() if k not in ("env", "model", "seeds", "eval")
    }
    if kind == "toolworld":  # the same task as the default section
        assert common.build(default).env.config == setup.env.config
    with pytest.raises(ValueError, match="config.env.kind: unknown environment 'chess'"):
        sparse_vs_dense.get_config("chess")
