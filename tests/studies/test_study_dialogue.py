"""The dialogue experiment (experiments.studies.dialogue): its refusals, and one tiny run of
every part (two reward forms, the feedback sweep's shared user, the credit study on a
dialogue) whose files are checked against each other."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments.configs import dialogue
from experiments.configs import dialogue_heldout
from experiments.studies import dialogue as study
from experiments.studies.envs import env_section
from rlagent.analysis.report import final_mean
from rlagent.analysis.report import seed_curves
from rlagent.host import loop

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUTPUTS = ("metrics.csv", "curves.png", "summary.md", "summary.json", "provenance.json")
CREDIT_OUTPUTS = ("credit.csv", "credit_vs_horizon.png", "summary.json", "provenance.json")


def _tiny_config():
    config = dialogue.get_config()
    config.seeds = 2
    config.chunk_size = 2
    config.conditions = "dialogue,feedback"
    config.train.update(num_updates=2, num_groups=1, group_size=2, num_minibatches=1)
    # The env's own user (rate 0.3, noise 0.2): its cell is the `feedback` condition.
    config.feedback.rates, config.feedback.noises = "0.3", "0.2"
    config.credit.update(
        horizons="3", policies="prover_0.5", estimators="gae_turn,rloo", rewards="outcome",
        seeds=2, num_groups=1, group_size=2, num_samples=2,
    )  # fmt: skip
    return config


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("dialogue")
    summary = study.run(_tiny_config(), str(workdir), progress=False)
    return workdir, summary


@pytest.mark.slow
def test_tiny_run_writes_every_part_and_its_numbers_agree(tiny_run):
    workdir, summary = tiny_run
    for name in OUTPUTS:
        assert os.path.getsize(workdir / name) > 0, name
    for name in CREDIT_OUTPUTS:
        assert os.path.getsize(workdir / "credit" / name) > 0, name
    assert not (workdir / "feedback_r0.3_n0.2").exists()  # shared: no program of its own
    rows = list(csv.DictReader(open(workdir / "metrics.csv")))
    assert len(rows) == 2 * 2 * 2  # conditions x seeds x updates
    saved = json.loads((workdir / "summary.json").read_text())
    assert set(saved) == {"rewards", "feedback", "credit"}
    rewards, feedback = saved["rewards"]["conditions"], saved["feedback"]["conditions"]
    assert set(rewards) == {"dialogue", "feedback"}
    assert set(feedback) == {"feedback/rate=0.3,noise=0.2"}
    assert feedback["feedback/rate=0.3,noise=0.2"]["per_seed"] == rewards["feedback"]["per_seed"]
    curves = seed_curves([{**r, "update": int(r["update"])} for r in rows])
    for condition, entry in rewards.items():
        assert entry["seeds"] == [0, 1]
        for i, seed in enumerate(entry["seeds"]):
            curve = [{k: float(v) for k, v in r.items() if k != "condition"}
                     for r in curves[(condition, seed)]]  # fmt: skip
            for metric in study.DIALOGUE_METRICS:
                want = final_mean(curve, metric, 0.1)
                assert np.isclose(entry["per_seed"][metric][i], want), (condition, metric)
        assert 1.0 <= entry["satisfaction"]["iqm"]["value"] <= 5.0
        assert 0.0 <= entry["collapse_rate"]["value"] <= 1.0
    credit = json.loads((workdir / "credit" / "summary.json").read_text())
    assert saved["credit"] == credit
    assert set(credit["outcome"]["prover_0.5"]) == {"gae_turn", "rloo"}
    credit_rows = list(csv.DictReader(open(workdir / "credit" / "credit.csv")))
    assert len(credit_rows) == 2 * 2  # estimators x seeds
    assert {r["horizon"] for r in credit_rows} == {"3"}
    provenance = json.loads((workdir / "provenance.json").read_text())
    assert provenance["config"]["credit"]["env"]["kind"] == "dialogue"
    assert provenance["wall_s"] > 0
    text = (workdir / "summary.md").read_text()
    for heading in ("## Reward forms", "## Feedback-only", "## Credit accuracy on dialogues"):
        assert heading in text


def test_a_resumed_run_keeps_a_finished_credit_study(tmp_path):
    folder = tmp_path / "credit"
    folder.mkdir()
    (folder / "summary.json").write_text('{"outcome": {}}')
    config = _tiny_config().credit
    assert study._credit(config, str(folder), resume=True) == {"outcome": {}}


def test_the_sweep_is_one_run_per_user_sharing_the_envs_own():
    config = _tiny_config()
    config.feedback.rates, config.feedback.noises = "1,0.3", "0,0.2"
    runs = study.training_runs(config, ["rewards", "feedback"])
    assert [run.name for run in runs] == ["rewards", "feedback_r1_n0", "feedback_r1_n0.2",
                                          "feedback_r0.3_n0"]  # fmt: skip
    assert runs[0].conditions == ("dialogue", "feedback")
    assert runs[1].conditions == ("feedback/rate=1,noise=0",)
    persona = runs[2].config.env.persona
    assert (persona.feedback_rate, persona.feedback_noise) == (1.0, 0.2)
    assert study.shared_feedback(config, ["rewards", "feedback"]) == "feedback/rate=0.3,noise=0.2"
    config.conditions = "outcome"  # no `feedback` form: the env's user gets its own condition
    runs = study.training_runs(config, ["rewards", "feedback"])
    assert runs[0].conditions == ("outcome", "feedback/rate=0.3,noise=0.2")
    only = study.training_runs(config, ["feedback"])
    assert [run.name for run in only][-1] == "feedback_r0.3_n0.2"
    heldout = dialogue_heldout.get_config()
    (run,) = study.training_runs(heldout, ["rewards"])
    assert run.conditions == ("dialogue", "rating", "feedback", "outcome", "potential")
    assert (run.config.env.task_split, run.config.eval.tasks) == ("train", "heldout")
    assert run.config.eval.every == run.config.train.num_updates == 40


@pytest.mark.parametrize(
    "change, message",
    [(("env", "persona", "patience", 2), r"DialogueConfig\.persona\.patience: must be >= "),
     (("env", "persona", "feedback_rate", 1.5), r"Persona\.feedback_rate: must be in \[0, 1\]"),
     (("env", "num_entities", 1), r"DialogueConfig\.num_entities: a catalogue of 1 entities"),
     (("conditions", "dialogue,nope"), r"config\.conditions: Unknown reward 'nope'"),
     (("train", "violation_penalty", 1.0), r"config\.conditions 'dialogue' .*\['violations'\]"),
     (("feedback", "rates", "1,x"), r"config\.feedback\.rates: 'x' is not a number"),
     (("feedback", "rates", "1,1.5"), r"config\.feedback\.rates: \[1\.5\] outside \[0, 1\]"),
     (("feedback", "noises", "-0.1"), r"config\.feedback\.noises: \[-0\.1\] outside"),
     (("feedback", "noises", "0,0"), r"config\.feedback\.noises names probability \['0'\]"),
     (("feedback", "rates", " "), r"config\.feedback\.rates names no probability"),
     (("parts", "rewards,bogus"), r"config\.parts: unknown parts \['bogus'\]"),
     (("parts", "credit"), r"config\.parts: name 'rewards' or 'feedback'"),
     (("credit", "horizons", "2"), r"config\.credit\.horizons: shortest must be in \[3, 20\]"),
     (("credit", "rewards", "rating,nope"), r"config\.credit\.rewards: Unknown reward 'nope'"),
     (("env", env_section("toolworld")), r"config\.env\.kind must be 'dialogue'")],
)  # fmt: skip
def test_bad_configs_are_refused_naming_the_field_before_anything_is_written(
    tmp_path, change, message
):
    config = _tiny_config()
    *path, value = change
    node = config
    for name in path[:-1]:
        node = node[name]
    node[path[-1]] = value
    with pytest.raises(ValueError, match=message):
        study.run(config, str(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run").exists()


def _launch(*flags):
    command = [sys.executable, "-m", "experiments.dialogue", *flags]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_launcher_refusals_are_one_line_and_write_nothing(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "summary.md").write_text("# an earlier run\n")
    for flags, says in (
        ([f"--workdir={tmp_path / 'new'}", "--config.env.num_entities=1"], "num_entities"),
        ([f"--workdir={tmp_path / 'old'}"], "is not empty"),
    ):
        result = _launch(*flags)
        assert result.returncode == 1, result.stderr[-2000:]
        lines = result.stderr.strip().splitlines()
        errors = [line for line in lines if line.startswith("error:")]
        assert len(errors) == 1 and errors[0] == lines[-1] and says in errors[0]
    assert not (tmp_path / "new").exists()
    assert os.listdir(tmp_path / "old") == ["summary.md"]


def test_held_out_columns_a_dialogue_does_not_measure_are_nan():
    rows = [{"condition": "outcome", "seed": 0, "update": u} for u in (1, 2)]
    measured = {"eval_sampled_success": np.array([0.5]), "eval_greedy_success": np.array([1.0])}
    loop._add_evaluation(rows, [("outcome", 0)], measured)
    assert rows[1]["eval_sampled_success"] == 0.5 and rows[1]["eval_greedy_success"] == 1.0
    assert np.isnan(rows[1]["eval_greedy_violation_rate"])  # ToolWorld's, not a dialogue's
    assert np.isnan(rows[0]["eval_sampled_success"])  # not evaluated at update 1
