"""The generalization study: the env kind reaches every study, Mastermind's horizon knob,
the findings and their verdicts, the launcher's workdir guard, and (slow) a tiny run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from experiments.configs import generalization as configs
from experiments.studies import common
from experiments.studies import credit_accuracy
from experiments.studies import generalization as study
from experiments.studies import horizon_sweep
from experiments.studies.envs import horizon_env
from experiments.studies.envs import horizon_section
from rlagent.envs import mastermind

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(envs="mastermind,toolworld"):
    config = configs.get_config()
    config.envs = envs
    return config


def test_every_part_gets_the_environment_kind_and_its_horizons():
    plans = study.plan(_config())
    assert [(kind, part) for kind, part, _ in plans] == [
        (kind, part) for kind in ("mastermind", "toolworld") for part in study.PARTS
    ]
    by = {(kind, part): part_config for kind, part, part_config in plans}
    rewards = common.build(by["mastermind", "rewards"])
    assert isinstance(rewards.env, mastermind.Mastermind)
    assert rewards.env.config.code_length == 3 and rewards.env.config.guess_limit == 4
    assert rewards.policy_config.vocab_size == rewards.env.token_spec.vocab_size
    assert type(common.build(by["toolworld", "rewards"]).env).__name__ == "ToolWorld"
    credit = credit_accuracy.plan(by["mastermind", "credit"])
    assert credit.kind == "mastermind" and credit.horizons == [3, 12]
    assert credit_accuracy.plan(by["toolworld", "credit"]).kind == "toolworld"
    for horizon, runs in horizon_sweep.plan(by["mastermind", "estimators"]):
        env = common.build(runs[0].config).env
        assert isinstance(env, mastermind.Mastermind)
        # The horizon is the guess limit of the kind's code.
        assert (env.config.guess_limit, env.config.code_length) == (horizon, 3)
        assert [run.name for run in runs] == ["gae_turn", "grpo", "gigpo"]
    ((horizon, runs),) = horizon_sweep.plan(by["toolworld", "estimators"])
    env = common.build(runs[0].config).env
    assert type(env).__name__ == "ToolWorld" and env.config.max_turns == horizon + 2


def test_mastermind_horizon_knob_and_its_errors_name_the_field():
    env = horizon_env("mastermind", 5)
    assert (env.config.guess_limit, env.config.code_length, env.config.num_numbers) == (5, 4, 6)
    section = {"kind": "mastermind", "code_length": 2, "num_numbers": 5, "max_turns": 9}
    assert horizon_section("mastermind", 3, section=section)["max_turns"] == 2
    assert horizon_section("mastermind", 3, section=section)["code_length"] == 2
    with pytest.raises(ValueError, match="guesses must be an integer >= 1, got 0"):
        horizon_env("mastermind", 0)
    with pytest.raises(ValueError, match=r"config\.slack=2: 'mastermind' has no turns"):
        horizon_section("mastermind", 4, slack=2)
    with pytest.raises(ValueError, match="drop max_turns"):
        mastermind.horizon_config(4, max_turns=3)
    with pytest.raises(ValueError, match="MastermindConfig.code_length"):
        horizon_env("mastermind", 4, section={**section, "code_length": 7})


@pytest.mark.parametrize(
    "field, value, message",
    [("envs", "mastermind,chess", "unknown environment 'chess'"),
     ("kinds.mastermind.credit_horizons", "3,x", r"kinds\.mastermind / config\.credit: .*'x'"),
     ("kinds.mastermind.sweep_horizons", "0", r"config\.estimators: config\.horizons: .*got 0"),
     ("kinds.mastermind.slack", 1, r"config\.estimators: .*config\.slack=1"),
     ("rewards.conditions", "outcome,nope", "unknown reward form 'nope'"),
     ("seeds", 0, "config.seeds must be >= 1"),
     ("references.toolworld_studies.credit", "docs/nope.json",
      r"config\.references\.toolworld_studies\.credit: no file 'docs/nope.json'")],
)  # fmt: skip
def test_config_errors_name_the_field_before_anything_is_written(tmp_path, field, value, message):
    config = _config("mastermind")
    *path, name = field.split(".")
    node = config
    for part in path:
        node = node[part]
    node[name] = value
    with pytest.raises(ValueError, match=message):
        study.run(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def _training(conditions, seeds=5):
    """A training summary (report.summarize's shape) with the given per-seed success."""
    entries = {}
    for name, value in conditions.items():
        interval = {"value": value, "low": value - 0.05, "high": value + 0.05}
        entries[name] = {
            "num_seeds": seeds,
            "final_success": {"iqm": interval, "mean": interval},
            "takeoff": {"k": int(value >= 0.5) * seeds, "n": seeds},
        }
    return {"conditions": entries}


def test_findings_read_each_part_and_their_verdicts_follow_the_intervals():
    from rlagent.analysis import stats

    rewards = _training({"outcome": 0.1, "process": 0.12, "potential": 0.9})
    rewards["comparisons"] = stats.pairwise_comparisons(
        {"outcome": [0.1, 0.12, 0.08, 0.11, 0.09], "potential": [0.9, 0.88, 0.93, 0.91, 0.87],
         "process": [0.13, 0.1, 0.12, 0.09, 0.11]}
    )  # fmt: skip
    rewards["label_quality"] = {
        "completion/soft | prover_0.5": {"policy": {"4": {"auroc": {"mean": 0.6, "ci95": 0.2},
                                                          "seeds": 3}}}
    }  # fmt: skip
    cell = {"auroc_verdict": {"mean": 0.9, "ci95": 0.02}, "sign_agreement": None}
    falling = {"3": cell, "12": {**cell, "auroc_verdict": {"mean": 0.6, "ci95": 0.02}}}
    credit = {"outcome": {"prover_0.9": {"gae_turn": falling, "grpo": falling}}}
    estimators = {"horizons": {}}
    summaries = {"mastermind": {"rewards": rewards, "credit": credit, "estimators": estimators}}
    rows = {row["finding"]: row for row in study.findings(summaries, _config("mastermind"))}
    assert set(rows) == {finding.name for finding in study.FINDINGS}
    assert rows["potential_beats_outcome"]["verdict"] == "holds"
    assert rows["verdict_no_better_than_outcome"]["verdict"].startswith("holds (no difference")
    assert rows["learned_prm_potential_vs_outcome"]["verdict"] == "not measured"
    assert rows["mc_labels_rank_steps"]["verdict"].startswith("cannot tell apart")
    assert rows["credit_degrades_with_horizon"]["verdict"] == "holds"
    assert rows["group_baselines_lose_sign"]["verdict"] == "not measured"  # no signs
    assert rows["grpo_keeps_start_under_verdict"]["verdict"] == "not measured"
    rewards["comparisons"] = stats.pairwise_comparisons(
        {"outcome": [0.9, 0.88, 0.93, 0.91, 0.87], "potential": [0.1, 0.12, 0.08, 0.11, 0.09],
         "process": [0.13, 0.1, 0.12, 0.09, 0.11]}
    )  # fmt: skip
    rows = {row["finding"]: row for row in study.findings(summaries, _config("mastermind"))}
    assert rows["potential_beats_outcome"]["verdict"] == "does not hold (reversed)"
    assert rows["verdict_no_better_than_outcome"]["verdict"] == "does not hold (process worse)"


def test_the_committed_toolworld_studies_are_read_as_references(tmp_path):
    config = _config("mastermind")
    references = study.load_references(config)
    assert set(references["toolworld_30_seeds"]) == {"rewards"}
    rows = study.findings(references, config)
    by = {(row["env"], row["finding"]): row for row in rows}
    # The main experiment's 30-seed result, read by the same verdict code.
    assert by["toolworld_30_seeds", "potential_beats_outcome"]["verdict"] == "holds"
    assert ("toolworld_30_seeds", "credit_degrades_with_horizon") not in by
    summary = study.write_report(str(tmp_path), {}, config, references)
    text = (tmp_path / "summary.md").read_text()
    assert text.count("| toolworld_studies |") == len(study.FINDINGS)
    for row in rows:  # every finding's claim heads its first row
        assert f"\n| {row['claim']} |" in text
    assert summary["parts"]["toolworld_30_seeds"] == {
        "rewards": "docs/results/sparse_vs_dense_full_summary.json"
    }


def _launch(workdir, *extra):
    command = [sys.executable, "-m", "experiments.generalization", f"--workdir={workdir}"]
    return subprocess.run([*command, *extra], capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_launcher_refuses_a_non_empty_workdir_and_changes_nothing(tmp_path):
    (tmp_path / "summary.md").write_text("# another run\n")
    result = _launch(tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and "is not empty" in last and "--overwrite" in last
    assert os.listdir(tmp_path) == ["summary.md"]
    assert (tmp_path / "summary.md").read_text() == "# another run\n"


def _tiny(config):
    """The smallest run of every part."""
    config.seeds = 2
    config.kinds.mastermind.credit_horizons = "2"
    config.kinds.mastermind.sweep_horizons = "3"
    config.kinds.mastermind.estimator_horizons = "3"
    rewards = config.rewards
    rewards.conditions = "outcome,potential"  # a learned PRM: tests/test_prm.py
    rewards.train.num_updates, rewards.chunk_size = 2, 2
    rewards.train.num_groups, rewards.train.group_size = 2, 4
    rewards.prm.label_episodes = 2
    rewards.labels.num_episodes, rewards.labels.samples = 4, "1"
    credit = config.credit
    credit.policies, credit.estimators, credit.rewards = "prover_0.9", "gae_turn,grpo", "outcome"
    credit.num_groups, credit.group_size, credit.num_samples = 2, 2, 2
    sweep = config.estimators
    sweep.conditions, sweep.estimators = "process", "grpo"  # 2 runs each: one evaluate, init
    sweep.train.num_updates, sweep.chunk_size, sweep.eval.every = 2, 2, 2
    sweep.train.num_groups, sweep.train.group_size = 2, 4
    sweep.warm_start.steps, sweep.eval.episodes = 2, 4
    return config


@pytest.mark.slow
def test_tiny_run_writes_every_part_and_the_findings(tmp_path):
    summary = study.run(_tiny(_config("mastermind")), str(tmp_path))
    for name in ("summary.md", "summary.json", "findings.png", "provenance.json"):
        assert os.path.getsize(tmp_path / name) > 0
    for part in study.PARTS:
        assert os.path.exists(tmp_path / "mastermind" / part / "summary.json")
        assert os.path.exists(tmp_path / "mastermind" / part / "provenance.json")
    stored = json.loads((tmp_path / "summary.json").read_text())
    ran = [row["finding"] for row in stored["findings"] if row["env"] == "mastermind"]
    assert ran == [finding.name for finding in study.FINDINGS]
    assert {row["env"] for row in stored["findings"]} == {
        "mastermind",
        *configs.get_config().references,
    }
    assert stored == json.loads(json.dumps(summary, default=float))
    assert "Mastermind (code of 3 numbers 1..4" in (tmp_path / "summary.md").read_text()
    # A finished run resumes without recomputing a part.
    before = os.stat(tmp_path / "mastermind" / "credit" / "credit.csv").st_mtime_ns
    study.run(_tiny(_config("mastermind")), str(tmp_path), resume=True)
    assert os.stat(tmp_path / "mastermind" / "credit" / "credit.csv").st_mtime_ns == before
