"""The process-rewards study (experiments.studies.process_rewards, label_quality): condition
parsing, the label study, the hacking table."""

import math
import os

import jax
import numpy as np
import pytest

from experiments.configs import process_rewards
from experiments.configs import process_rewards_accel
from experiments.studies import common
from experiments.studies import label_quality as study
from experiments.studies import process_rewards as prm_experiment
from rlagent.analysis import report
from rlagent.credit import mc
from rlagent.host import loop
from rlagent.prm import PRMConfig


def _label_config():
    config = process_rewards.get_config().labels
    config.behaviours = "prover_0.5"
    config.completers = "oracle"
    config.samples = "2,1"
    config.seeds = 1
    config.num_episodes = 8
    return config


@pytest.fixture(scope="module")
def label_run(tmp_path_factory):
    """The label study on a tiny batch (its compiled functions are cached for the rest)."""
    config = _label_config()
    env = common.build(process_rewards.get_config()).env
    workdir = tmp_path_factory.mktemp("labels")
    return env, config, workdir, study.run(config, env, str(workdir))


def test_prm_runs_group_conditions_by_prm_kind():
    config = process_rewards.get_config()
    config.conditions = (
        "outcome,potential,learned_sum/prm=noisy_oracle@0.2,learned_min/prm=noisy_oracle@0.2,"
        "learned_sum/prm=noisy_oracle@0.4,learned_sum/prm=completion,learned_min/prm=completion"
    )
    runs = common.prm_runs(config)
    assert [r.name for r in runs] == [
        "prm_none",
        "prm_noisy_oracle_0.2",
        "prm_noisy_oracle_0.4",
        "prm_completion",
    ]
    assert runs[1].conditions == (
        "learned_sum/prm=noisy_oracle@0.2",
        "learned_min/prm=noisy_oracle@0.2",
    )
    assert [(r.config.prm.kind, r.config.prm.noise) for r in runs] == [
        ("none", 0.0),
        ("noisy_oracle", 0.2),
        ("noisy_oracle", 0.4),
        ("completion", 0.0),
    ]
    assert config.prm.kind == "none"  # the experiment config is not changed.
    assert [common.build(r.config).prm_config for r in runs[:2]] == [
        PRMConfig(label_episodes=8, label_samples=4),
        PRMConfig(kind="noisy_oracle", noise=0.2, label_episodes=8, label_samples=4),
    ]
    # The default config's conditions parse: one run per PRM kind and noise level.
    default = common.prm_runs(process_rewards.get_config())
    assert len(default) == 1 + 4 + 3  # no PRM, four noise levels (0 the anchor), three PRMs
    accel = process_rewards_accel.get_config()
    assert len(common.prm_runs(accel)) == 1 + 5 + 3
    for run in common.prm_runs(accel):
        common.build(run.config)  # every run's typed configs are valid


@pytest.mark.parametrize(
    "conditions, message",
    [
        ("outcome,learned_sum", "'learned_sum' reads a PRM"),
        ("learned_sum/critic=completion", "must be 'form'"),
        ("learned_sum/prm=completion@0.1", "only noisy_oracle takes @<eps>"),
        ("learned_sum/prm=noisy_oracle@high", "is no number"),
        (" , ", "config.conditions names no reward form"),
    ],
)
def test_prm_runs_errors_name_the_field(conditions, message):
    config = process_rewards.get_config()
    config.conditions = conditions
    with pytest.raises(ValueError, match="config.conditions") as error:
        common.prm_runs(config)
    assert message in str(error.value)


def test_label_study_writes_finite_rows_csv_and_plot(label_run):
    env, config, workdir, rows = label_run
    assert len(rows) == 2 * len(study.LABELLERS)  # N x labellers
    for row in rows:
        assert math.isfinite(row["accuracy"]) and 0 <= row["accuracy"] <= 1
        assert math.isfinite(row["auroc"]) and 0 <= row["auroc"] <= 1
        assert row["judged_turns"] > 0 and row["label_turns"] > 0
    header = (workdir / study.FILENAME).read_text().splitlines()[0].split(",")
    for column in ("labeller", "label", "n", "completer", "accuracy", "auroc", "label_turns"):
        assert column in header
    assert "seed" in header
    assert os.path.getsize(workdir / "label_quality.png") > 0
    table = study.markdown(study.summarize(rows))
    assert "completion/hard | prover_0.5" in table and "N=1" in table and "N=2" in table
    for field, value in [
        ("completers", "oracle,best_of_4"),
        ("completers", "policy+oracle_2"),
        ("behaviours", "ppo_x"),
        ("samples", "0,2"),
        ("samples", "two"),
    ]:
        config = _label_config()
        config[field] = value
        with pytest.raises(ValueError, match=f"config.labels.{field}"):
            study.run(config, env, str(workdir))


def test_label_turns_are_the_mc_turns_of_the_estimates_averaged(label_run):
    env, config, _, _ = label_run
    behaviour = study.make_behaviour(env, "prover_0.5", config)
    trajectory, forks = behaviour.episodes(jax.random.key(3), config.num_episodes)
    sweep = behaviour.sweep("oracle")(forks, trajectory, jax.random.key(5))
    assert isinstance(sweep.completion, mc.MCValues)
    assert sweep.progress.q_success.shape == (2, *trajectory.turn_mask.shape)  # max N = 2
    rows = study.quality_rows(sweep, trajectory, [1, 2], completer="oracle")
    cost = {(row["labeller"], row["n"]): row["label_turns"] for row in rows}
    for labeller, values in (("completion", sweep.completion), ("progress", sweep.progress)):
        assert cost[(labeller, 1)] == float(values.turns[0]) > 0
        assert cost[(labeller, 2)] == float(values.turns[0] + values.turns[1])
    # Completion labels play only the continuations after each step (Q), progress labels
    # those before it too (V), each at most the S turns of an episode.
    played = float(trajectory.turn_mask.sum())
    assert cost[("completion", 2)] < cost[("progress", 2)] <= 2 * 2 * played * env.max_turns
    two = study.first_samples(sweep.progress, 2)
    np.testing.assert_allclose(two.q_success, sweep.progress.q_success.mean(0))
    assert math.isnan(float(two.value_se[0, 0]))


def _rows(condition, seed, success, turns, prm_auroc=math.nan, label_turns=0.0, updates=10):
    return [
        dict(
            condition=condition,
            seed=seed,
            update=u + 1,
            success=success,
            turns=turns,
            turns_over_plan=turns - 3.0,
            collapse_rate=0.0,
            prm_auroc=prm_auroc if u % 2 else math.nan,  # measured every other update
            env_turns_total=100.0 * (u + 1),
            label_turns=label_turns,
        )
        for u in range(updates)
    ]


def test_hacking_table_pairs_forms_per_seed():
    rows = []
    for seed in (0, 1, 2):
        rows += _rows("learned_sum/prm=completion", seed, 0.2, 5.0 + seed * 0.1, prm_auroc=0.6)
        rows += _rows("learned_min/prm=completion", seed, 0.6, 3.0, prm_auroc=0.7)
        rows += _rows("learned_potential/prm=completion", seed, 0.2 + 0.1 * seed, 5.1)
        rows += _rows("outcome", seed, 0.5, 3.0)
    table = prm_experiment.hacking_table(rows)
    assert set(table) == {"completion"}
    forms = table["completion"]["forms"]
    assert forms["learned_sum"]["success"]["mean"] == pytest.approx(0.2)
    assert forms["learned_sum"]["turns"]["mean"] == pytest.approx(5.1)
    assert forms["learned_min"]["prm_auroc"]["mean"] == pytest.approx(0.7)  # NaN skipped
    assert forms["learned_potential"]["prm_auroc"] is None  # never measured
    vs_sum = table["completion"]["vs_sum"]
    assert vs_sum["learned_min"]["success"]["mean"] == pytest.approx(-0.4)
    assert vs_sum["learned_min"]["turns"]["mean"] == pytest.approx(2.1)
    assert vs_sum["learned_potential"]["success"]["mean"] == pytest.approx(-0.1)
    text = prm_experiment.hacking_markdown(table)
    assert "| completion | learned_min | -0.400 ± 0.000 | 2.100 ± 0.248 | yes |" in text
    assert "| completion | learned_potential |" in text
    assert prm_experiment.hacking_markdown({}).startswith("No learned-PRM")
    one_seed = prm_experiment.hacking_table([r for r in rows if r["seed"] == 0])
    assert "fewer than 2 seeds" in prm_experiment.hacking_markdown(one_seed)


def test_paired_table_is_the_declared_family_paired_by_seed():
    values = {  # per seed 0..5: held-out success; AUC = success / 10
        "outcome": [0.1, 0.2, 0.0, 0.3, 0.1, 0.2],
        "learned_sum/prm=completion": [0.0, 0.0, 0.0, 0.1, 0.0, 0.0],
        "learned_centred/prm=completion": [0.4, 0.6, 0.3, 0.7, 0.5, 0.5],
        "learned_potential/prm=completion": [0.1, 0.2, 0.0, 0.3, 0.1, 0.2],
    }
    order = [3, 1, 0, 5, 2, 4]  # seeds listed out of order: pairing is by seed, not position
    summary = {"conditions": {
        name: {"seeds": order, "per_seed": {
            "eval_sampled_success": [v[s] for s in order], "auc": [v[s] / 10 for s in order]}}
        for name, v in values.items()
    }}  # fmt: skip
    family = prm_experiment.paired_table(summary, reps=2000)
    pairs = [(e["a"], e["b"]) for e in family["eval_sampled_success"]]
    assert pairs == [("outcome", name) for name in list(values)[1:]] + [
        ("learned_sum/prm=completion", "learned_centred/prm=completion"),
        ("learned_sum/prm=completion", "learned_potential/prm=completion"),
    ]
    entries = {(e["a"], e["b"]): e for e in family["eval_sampled_success"]}
    centred = entries[("learned_sum/prm=completion", "learned_centred/prm=completion")]
    diff = np.subtract(*(values[f"learned_{f}/prm=completion"] for f in ("centred", "sum")))
    assert centred["difference"]["value"] == pytest.approx(diff.mean())
    assert centred["num_pairs"] == 6 and centred["p_value"] == pytest.approx(2 / 64)  # all > 0
    same = entries[("outcome", "learned_potential/prm=completion")]
    assert same["difference"]["value"] == 0.0 and same["p_value"] == 1.0
    p = [e["p_value"] for e in family["eval_sampled_success"]]
    holm = np.minimum(1, np.maximum.accumulate(np.sort(p) * (len(p) - np.arange(len(p)))))
    np.testing.assert_allclose(sorted(e["p_holm"] for e in family["eval_sampled_success"]), holm)
    assert family["auc"][0]["difference"]["value"] == pytest.approx(
        np.mean(np.subtract(values["learned_sum/prm=completion"], values["outcome"])) / 10
    )
    text = prm_experiment.paired_markdown(family)
    assert "| held-out sampled success | learned_centred/prm=completion | outcome |" in text
    assert prm_experiment.paired_table({"conditions": {}}) == {}
    assert prm_experiment.paired_markdown({}) == ""


def test_total_turns_count_label_turns_cumulatively():
    rows = _rows("learned_sum/prm=completion", 0, 0.5, 4.0, label_turns=50.0, updates=3)
    rows += _rows("outcome", 0, 0.5, 4.0, updates=3)
    with_total = report.with_total_turns(rows)
    total = {(r["condition"], r["update"]): r[report.TOTAL_TURNS] for r in with_total}
    assert total[("learned_sum/prm=completion", 3)] == 300.0 + 150.0
    assert total[("outcome", 3)] == 300.0
    summary = report.summarize(with_total, experience=report.TOTAL_TURNS, reps=50)
    assert summary["settings"]["budget_env_turns"] == 300.0  # the least any run had
    assert "(experience + labelling)" in report.markdown_table(summary)


@pytest.mark.slow
def test_launcher_writes_every_file(label_run, tmp_path):
    """One tiny PRM run (two forms of the noisy oracle share one program) end to end."""
    config = process_rewards.get_config()
    config.conditions = "learned_sum/prm=noisy_oracle@0.2,learned_min/prm=noisy_oracle@0.2"
    config.seeds = 1
    config.chunk_size = 1
    config.train.num_updates = 2
    config.train.num_groups = 2
    config.train.group_size = 2
    config.train.num_minibatches = 1
    config.labels = _label_config()  # the study of `label_run`: its programs are cached
    summary = prm_experiment.run(config, str(tmp_path), progress=False)
    for name in (
        "metrics.csv",
        "curves.png",
        "profiles.png",
        "summary.md",
        "summary.json",
        "provenance.json",
        study.FILENAME,
        "label_quality.png",
    ):
        assert os.path.getsize(tmp_path / name) > 0, name
    assert set(summary["conditions"]) == set(config.conditions.split(","))
    assert summary["settings"]["experience"] == report.TOTAL_TURNS
    assert set(summary["hacking"]) == {"noisy_oracle@0.2"}
    text = (tmp_path / "summary.md").read_text()
    for section in ("## PPO", "## Label quality", "## Reward hacking"):
        assert section in text
    rows = (tmp_path / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 and "label_turns" in rows[0] and "total_turns" in rows[0]
    with pytest.raises(loop.RunError, match="not empty"):
        prm_experiment.run(config, str(tmp_path), progress=False)
    # --report_only rebuilds the same report from the files, provenance untouched.
    text, record = (tmp_path / "summary.md").read_text(), (tmp_path / "provenance.json").read_text()
    again = prm_experiment.run(config, str(tmp_path), progress=False, report_only=True)
    assert (tmp_path / "summary.md").read_text() == text
    assert (tmp_path / "provenance.json").read_text() == record
    assert again["hacking"] == summary["hacking"] and again["paired"] == {}
    with pytest.raises(ValueError, match="no finished study"):
        prm_experiment.run(config, str(tmp_path / "empty"), progress=False, report_only=True)
