"""The long-horizon study: config checks, summary math, warm start, a tiny sweep end to end."""

import csv
import json
import math
import os

import numpy as np
import pytest

from experiments.configs import horizon_estimators_heldout
from experiments.configs import horizon_sweep as default_config
from experiments.configs import horizon_sweep_accel
from experiments.configs import mastermind_heldout
from experiments.configs import tree_rollouts
from experiments.studies import horizon_sweep
from rlagent.host import loop


def _tiny_config():
    config = default_config.get_config()
    config.horizons = "3"  # one horizon: the multi-horizon summary is tested on rows above
    # Two reward forms of one PRM (the cheapest, a noisy oracle): one compiled program.
    config.conditions = "learned_sum/prm=noisy_oracle@0.1,learned_potential/prm=noisy_oracle@0.1"
    config.estimators = ""
    config.seeds = 1
    config.chunk_size = 2
    config.warm_start.steps = 0
    config.train.num_updates = 2
    config.train.num_groups = 2
    config.train.group_size = 2
    config.train.num_minibatches = 1
    config.train.num_epochs = 1
    config.eval.every = 0  # two compiles fewer; summarize's held-out path is tested above
    config.probe.every = 0
    return config


def test_default_plan_compares_rewards_everywhere_and_estimators_at_two_horizons():
    plans = horizon_sweep.plan(default_config.get_config())
    assert [h for h, _ in plans] == [3, 5, 8, 12, 16]
    by_horizon = dict(plans)
    assert [r.name for r in by_horizon[3]] == ["gae_turn", "gae_turn_prm_implicit"]
    assert by_horizon[3][0].conditions == (
        "outcome/gae_turn",
        "process/gae_turn",
        "potential/gae_turn",
    )
    learned = by_horizon[3][1]
    assert learned.conditions == ("learned_potential/prm=implicit/gae_turn",)
    assert (learned.config.prm.kind, learned.config.probe.every) == ("implicit", 0)
    assert by_horizon[3][0].config.probe.every == 30
    assert "prm" not in learned.config.train  # the PRM's fields are its own section's
    assert len(by_horizon[16]) == 2
    env = by_horizon[16][0].config.env
    assert env.max_turns == 16 + 2 and env.num_intents == 5 and env.num_distractors == 0
    runs = by_horizon[12]
    assert [r.name for r in runs] == [
        "gae_turn",
        "gae_turn_prm_implicit",
        "gae_token_lam0.9",
        "grpo",
        "gigpo",
        "hierarchical",
    ]
    assert runs[2].conditions == ("process/gae_token@0.9",)
    assert runs[2].config.train.estimator == "gae_token" and runs[2].config.train.lam == 0.9
    assert runs[2].config.prm.kind == "none"
    accel = horizon_sweep.plan(horizon_sweep_accel.get_config())
    assert [h for h, _ in accel][-1] == 25 and all(len(runs) == 6 for _, runs in accel)


def test_estimators_can_compare_under_a_learned_reward():
    config = default_config.get_config()
    config.conditions = "outcome,learned_sum/prm=noisy_oracle@0.1,learned_min/prm=noisy_oracle@0.1"
    config.estimator_reward = "learned_min/prm=noisy_oracle@0.1"
    runs = dict(horizon_sweep.plan(config))[8]
    assert [r.name for r in runs[:2]] == ["gae_turn", "gae_turn_prm_noisy_oracle_0.1"]
    assert runs[1].conditions == (
        "learned_sum/prm=noisy_oracle@0.1/gae_turn",
        "learned_min/prm=noisy_oracle@0.1/gae_turn",
    )
    grpo = runs[3]
    assert grpo.conditions == ("learned_min/prm=noisy_oracle@0.1/grpo",)
    assert (grpo.config.prm.kind, grpo.config.prm.noise) == ("noisy_oracle", 0.1)
    assert grpo.config.train.estimator == "grpo" and grpo.config.probe.every == 0


def test_estimator_options_set_their_train_fields():
    """`tree_grpo+tree_branches=4+tree_branch_at=surprisal`: one run with those fields;
    a spec that trains what another trains, or a bad option, is refused."""
    config = tree_rollouts.get_config("k4_surprisal")
    runs = dict(horizon_sweep.plan(config))[8]
    spec = "tree_grpo+tree_branches=4+tree_branch_at=surprisal"
    assert [r.name for r in runs] == ["gae_turn", "grpo", "tree_grpo", *tree_rollouts.TREE_VARIANTS]
    fields = [(r.config.train.tree_branches, r.config.train.tree_branch_at) for r in runs[2:]]
    assert fields == [(2, "uniform"), (4, "uniform"), (2, "surprisal"), (4, "surprisal")]
    assert {r.config.train.estimator for r in runs[2:]} == {"tree_grpo"}
    assert runs[5].conditions == (f"outcome/{spec}",)
    confirm = tree_rollouts.get_config("surprisal_confirm")
    ((horizon, runs),) = horizon_sweep.plan(confirm)
    assert horizon == 12 and (confirm.seeds, confirm.first_seed) == (20, 10)
    assert [r.name for r in runs] == ["gae_turn", "grpo", *tree_rollouts.TREE_VARIANTS[1:]]
    heldout = tree_rollouts.get_config("surprisal_heldout")
    ((_, runs),) = horizon_sweep.plan(heldout)
    assert [r.name for r in runs] == ["gae_turn", "grpo", "tree_grpo+tree_branch_at=surprisal"]
    assert {r.config.env.task_split for r in runs} == {"train"}
    assert {r.config.eval.tasks for r in runs} == {"heldout"}
    estimators = horizon_sweep.plan(horizon_estimators_heldout.get_config())
    assert [h for h, _ in estimators] == [12, 16]
    for _, runs in estimators:
        labels = [c for r in runs for c in r.conditions]
        assert labels == [
            "process/gae_turn", "outcome/gae_turn", "process/gae_token@0.9", "process/grpo",
            "process/gigpo", "process/hierarchical",
        ]  # fmt: skip
        assert {(r.config.env.task_split, r.config.eval.tasks) for r in runs} == {
            ("train", "heldout")
        }
    ((guesses, runs),) = horizon_sweep.plan(mastermind_heldout.get_config())
    assert guesses == 6 and [c for r in runs for c in r.conditions] == [
        "outcome/gae_turn", "process/gae_turn", "potential/gae_turn", "process/grpo",
        "process/gigpo",
    ]  # fmt: skip
    for run in runs:
        env = run.config.env
        assert (env.kind, env.code_length, env.num_numbers, env.task_split) == (
            "mastermind",
            3,
            4,
            "train",
        )
        assert env.max_turns == 5 and run.config.eval.tasks == "heldout"
    ((guesses, runs),) = horizon_sweep.plan(mastermind_heldout.get_config("v0"))
    env = runs[0].config.env
    assert (guesses, env.code_length, env.num_numbers, env.max_turns) == (8, 4, 6, 7)
    with pytest.raises(ValueError, match="unknown code 'v1'"):
        mastermind_heldout.get_config("v1")
    for spec, message in [
        ("grpo,grpo+lam=0.95", "'grpo\\+lam=0.95' trains what 'grpo' trains"),
        ("tree_grpo+tree_branches=x", "'tree_branches=x': 'x' is no int"),
        ("tree_grpo+branches=4", "'branches=4' \\(after \\+\\) is no 'field=value'"),
        ("tree_grpo+tree_branches=3", "tree_branches = 3 must divide group_size"),
        ("grpo+reward_weights=1", "'reward_weights=1': reward_weights takes no value after \\+"),
        ("grpo+kl_target=0.1", "'kl_target=0.1': kl_target takes no value after \\+"),
        ("grpo+check_inputs=maybe", "'check_inputs=maybe': 'maybe' is no bool"),
    ]:
        config.estimators = spec
        with pytest.raises(ValueError, match=f"config.estimators: .*{message}"):
            horizon_sweep.plan(config)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("horizons", "3,x", "config.horizons: 'x' is not an integer"),
        ("horizons", " , ", "config.horizons names no horizon"),
        ("horizons", "1,3", "config.horizons: shortest_plan must be >= 2"),
        ("conditions", "outcome,dense", "config.conditions: unknown reward form 'dense'"),
        ("conditions", "learned_min", "config.conditions: 'learned_min' reads a PRM"),
        ("estimators", "grpo,nope", "config.estimators: 'nope'"),
        ("estimator_horizons", "8,9", r"config.estimator_horizons \[9\]"),
        ("estimator_reward", "composed", "config.estimator_reward 'composed'"),
        ("slack", -1, "config.slack must be >= 0"),
        ("warm_start_horizons", "", "config.warm_start_horizons names no horizon"),
    ],
)
def test_config_errors_name_the_field(field, value, message):
    config = default_config.get_config()
    config[field] = value
    with pytest.raises(ValueError, match=message):
        horizon_sweep.plan(config)


def test_warm_start_demonstrations_per_horizon():
    config = default_config.get_config()
    assert config.warm_start_horizons == horizon_sweep.SAME_HORIZON
    assert horizon_sweep._demo_horizons(config, 12) == [12]
    config.warm_start_horizons = "3,5,7"  # shared by every horizon
    assert horizon_sweep._demo_horizons(config, 12) == [3, 5, 7]


def _row(horizon, condition, seed, success, **extra):
    row = dict(horizon=horizon, condition=condition, seed=seed, initial_success=0.1 * seed)
    row.update(final_success=0.0, eval_sampled_success=success, auc=success / 2)
    for name in horizon_sweep.CREDIT_METRICS:
        row[f"credit_{name}_last"] = extra.get(name, float("nan"))
    return row


def test_summary_math_on_synthetic_rows(tmp_path):
    sparse, dense = [0.0, 0.0, 0.2, 1.0], [1.0, 1.0, 0.8, 0.6]
    rows = [_row(4, "outcome/gae_turn", s, v, spearman=0.1 * s) for s, v in enumerate(sparse)]
    rows += [_row(4, "process/gae_turn", s, v) for s, v in enumerate(dense)]
    rows += [_row(7, "outcome/gae_turn", s, 0.0) for s in range(4)]
    rows += [_row(7, "process/gae_turn", s, 0.0) for s in range(4)]
    summary = horizon_sweep.summarize(rows, reference="outcome/gae_turn", reps=200)
    assert summary["settings"]["success"] == "eval_sampled_success"
    cell = summary["horizons"]["4"]
    outcome, process = (
        cell["conditions"]["outcome/gae_turn"],
        cell["conditions"]["process/gae_turn"],
    )
    assert outcome["success"]["mean"]["value"] == pytest.approx(0.3)
    assert outcome["success"]["iqm"]["value"] == pytest.approx(0.1)  # middle two of 0,0,.2,1
    assert process["auc"]["mean"]["value"] == pytest.approx(0.425)
    assert (outcome["takeoff"]["k"], process["takeoff"]["k"]) == (1, 4)
    assert outcome["initial_success"] == pytest.approx(0.15)
    assert outcome["gain"]["mean"]["value"] == pytest.approx(0.15)  # 0, -.1, 0, .7
    assert outcome["credit_spearman"]["mean"] == pytest.approx(0.15)
    assert "credit_spearman" not in process
    gap = cell["gaps"]["process/gae_turn"]
    assert gap["value"] == pytest.approx(0.55) and gap["low"] <= 0.55 <= gap["high"]
    assert [(c["x"], c["y"]) for c in cell["comparisons"]] == [
        ("outcome/gae_turn", "process/gae_turn")
    ]
    flat = summary["horizons"]["7"]["gaps"]["process/gae_turn"]
    assert flat == {"value": 0.0, "low": 0.0, "high": 0.0}
    # The paired family: each condition against the reference at its horizon, per seed.
    from rlagent.analysis import paired

    success = summary["paired"]["success"]
    assert [e["b"] for e in success] == ["4|process/gae_turn", "7|process/gae_turn"]
    first = success[0]
    assert first["difference"]["value"] == pytest.approx(0.55)  # mean(dense - sparse)
    assert first["p_value"] == pytest.approx(paired.sign_flip_test(sparse, dense))
    assert first["p_holm"] == pytest.approx(min(1.0, 2 * min(first["p_value"], 1.0)))
    assert summary["paired"]["auc"][0]["difference"]["value"] == pytest.approx(0.275)
    table = horizon_sweep.markdown(summary)
    assert "| process/gae_turn | 0.900 [" in table and "h=7" in table
    assert "| AUC at equal turns | 4 | process/gae_turn | outcome/gae_turn | +0.275 [" in table
    # An extra reference of the family: each pair once, Holm over all of them.
    both = horizon_sweep.summarize(
        rows, reference="outcome/gae_turn", reps=200, paired_to=["process/gae_turn"]
    )
    assert len(both["paired"]["success"]) == 2
    assert "### gain over the starting policy" in table
    horizon_sweep.plot(summary, str(tmp_path / "horizon.png"))
    assert os.path.getsize(tmp_path / "horizon.png") > 0
    # Without held-out evaluation the final training success is the success.
    for row in rows:
        row["eval_sampled_success"] = float("nan")
    fallback = horizon_sweep.summarize(rows, reference="outcome/gae_turn", reps=200)
    assert fallback["settings"]["success"] == "final_success"


@pytest.mark.slow
def test_tiny_sweep_writes_every_file(tmp_path):
    config = _tiny_config()
    summary = horizon_sweep.run(config, str(tmp_path), progress=False)
    for name in horizon_sweep.FILES:
        assert os.path.getsize(tmp_path / name) > 0, name
    for folder in ("h03",):
        assert os.path.getsize(tmp_path / folder / "metrics.csv") > 0
        assert os.path.getsize(tmp_path / folder / "summary.json") > 0
    rows = list(csv.DictReader(open(tmp_path / "horizon.csv")))
    assert len(rows) == 2  # conditions x 1 seed
    forms = ("learned_sum/prm=noisy_oracle@0.1", "learned_potential/prm=noisy_oracle@0.1")
    assert {(r["condition"], r["reward"], r["estimator"]) for r in rows} == {
        (f"{form}/gae_turn", form, "gae_turn") for form in forms
    }
    assert all(math.isnan(float(r["eval_sampled_success"])) for r in rows)
    assert all(0.0 <= float(r["final_success"]) <= 1.0 for r in rows)
    assert all(math.isnan(float(r["credit_spearman_last"])) for r in rows)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved == json.loads(json.dumps(summary))
    assert set(saved["horizons"]) == {"3"}
    assert saved["settings"]["success"] == "final_success"
    assert json.loads((tmp_path / "provenance.json").read_text())["horizons"] == [3]
    assert loop._chunk.cache_info().currsize == 0  # each horizon's programs were dropped
    with pytest.raises(loop.RunError, match="not empty"):
        horizon_sweep.run(config, str(tmp_path), progress=False)
    config.seeds = 2
    with pytest.raises(loop.RunError, match="different config"):
        horizon_sweep.run(config, str(tmp_path), resume=True, progress=False)
    np.testing.assert_equal(len(os.listdir(tmp_path)), len(horizon_sweep.FILES) + 1)
