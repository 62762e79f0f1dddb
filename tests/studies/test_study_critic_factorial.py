"""experiments.studies.critic_factorial: plan, the per-seed rows, the comparison families.

The sweeps themselves are the horizon sweep's (tests/studies/test_study_horizon_sweep.py);
here their folders are written by hand so that every number the factorial adds is
checked against NumPy without training anything.
"""

import json
import math
import os

import numpy as np
import pytest

from experiments.configs import critic_factorial as default_config
from experiments.studies import critic_factorial
from rlagent.analysis import paired
from rlagent.analysis import stats
from rlagent.host.writers import MetricWriter


def test_default_plan_runs_every_critic_at_one_horizon_before_the_next():
    config = default_config.get_config()
    config.horizons = "12,5"
    plans = critic_factorial.plan(config)
    critics = ["shared", "separate", "normalized"]
    assert [(c, h) for c, h, _ in plans] == [(c, 12) for c in critics] + [(c, 5) for c in critics]
    assert {p.horizons for _, _, p in plans} == {"12", "5"}
    sweeps = {c: p for c, h, p in plans if h == 12}
    assert sweeps["shared"].model.value_head == "shared"
    assert not sweeps["shared"].train.normalize_returns
    assert sweeps["separate"].model.value_head == "separate"
    assert sweeps["normalized"].train.normalize_returns
    assert sweeps["normalized"].model.value_head == "shared"
    for sweep in sweeps.values():
        assert "critics" not in sweep and sweep.estimators == ""
        assert sweep.seeds == 10
    assert "critics" in config  # the study's config is not changed by planning


def test_the_archer_configs_differ_only_in_the_estimator():
    from experiments.configs import critic_factorial_archer as archer

    plans = {v: critic_factorial.plan(archer.get_config(v)) for v in archer.VARIANTS}
    for runs in plans.values():
        assert [(c, h) for c, h, _ in runs] == [
            (c, 12) for c in ("shared", "separate", "normalized")
        ]
        for _, _, sweep in runs:
            assert (sweep.conditions, sweep.seeds) == ("process", 20)
            assert (sweep.env.task_split, sweep.eval.tasks) == ("train", "heldout")
    turn, token = ([s.to_dict() for _, _, s in plans[v]] for v in ("turn", "token"))
    for a, b in zip(turn, token, strict=True):
        assert (a["train"]["estimator"], b["train"]["estimator"]) == ("gae_turn", "gae_token")
        assert b["train"]["lam"] == 0.9
        for sweep in (a, b):
            del sweep["train"]["estimator"], sweep["train"]["lam"]
        assert a == b
    with pytest.raises(ValueError, match="name a variant, one of turn, token"):
        archer.get_config()


@pytest.mark.parametrize(
    "value, message",
    [("shared,bogus", "unknown critic"), ("shared,shared", "more than once"), ("", "critics")],
)
def test_bad_critics_are_refused_naming_the_field(value, message):
    config = default_config.get_config()
    config.critics = value
    with pytest.raises(ValueError, match=message) as error:
        critic_factorial.plan(config)
    assert "config.critics" in str(error.value)


def test_sweep_config_errors_surface_before_anything_runs():
    config = default_config.get_config()
    config.horizons = "5,x"
    with pytest.raises(ValueError, match="config.horizons"):
        critic_factorial.plan(config)


SEEDS = 6


def _write_sweep(workdir, critic, horizon, successes, turns_per_update):
    """A finished sweep's horizon.csv and h<h>/metrics.csv: per reward form, its held-out
    success per seed; training success climbs 0 -> 1 over 3 updates."""
    rows, metrics = [], []
    for reward, per_seed in successes.items():
        condition = f"{reward}/gae_turn"
        for seed, success in enumerate(per_seed):
            rows.append(
                dict(
                    horizon=horizon,
                    condition=condition,
                    reward=reward,
                    estimator="gae_turn",
                    seed=seed,
                    updates=3,
                    initial_success=0.5,
                    env_turns=3 * turns_per_update,
                    final_success=1.0,
                    eval_sampled_success=success,
                    eval_greedy_success=1.0 - success,
                    auc=0.5,
                    credit_spearman_first=0.0,
                    credit_spearman_last=float(seed) / 10,
                    credit_sign_agreement_first=math.nan,
                    credit_sign_agreement_last=math.nan,
                )  # fmt: skip
            )
            for update in (1, 2, 3):
                metrics.append(
                    dict(
                        condition=condition,
                        seed=seed,
                        update=update,
                        success=(update - 1) / 2,
                        entropy=0.1 * update + seed / 100,
                        env_turns_total=update * turns_per_update,
                    )  # fmt: skip
                )
    folder = critic_factorial.sweep_dir(str(workdir), critic, horizon)
    MetricWriter(folder, tensorboard=False, filename="horizon.csv").write(rows)
    MetricWriter(os.path.join(folder, f"h{horizon:02d}"), tensorboard=False).write(metrics)


def test_rows_and_families_on_hand_written_sweeps(tmp_path):
    outcome = np.linspace(0.6, 1.0, SEEDS)
    process_shared = outcome - np.array([0.3, 0.2, 0.4, 0.1, 0.3, 0.2])  # worse in every seed
    process_separate = outcome + np.array([0.0, 0.1, -0.1, 0.0, 0.05, -0.05])  # no difference
    _write_sweep(tmp_path, "shared", 12, {"outcome": outcome, "process": process_shared}, 100)
    _write_sweep(tmp_path, "separate", 12, {"outcome": outcome, "process": process_separate}, 80)
    pairs = [("shared", 12), ("separate", 12), ("shared", 5)]
    rows, missing = critic_factorial.seed_rows(str(tmp_path), pairs)
    assert missing == ["shared/h5"]
    assert len(rows) == 2 * 2 * SEEDS
    assert {r["turn_budget"] for r in rows} == {240.0}  # the smallest total of any run
    first = rows[0]
    assert (first["critic"], first["reward"], first["seed"]) == ("shared", "outcome", 0)
    assert first["gain"] == pytest.approx(outcome[0] - 0.5)
    assert first["entropy"] == pytest.approx(0.3)  # the last update's
    assert first["greedy_success"] == pytest.approx(1 - outcome[0])
    # Shared runs: success 0, 0.5, 1 measured after 100, 200, 300 turns, each held until
    # the next (0 before the first); over 240 turns the area is (0.5 * 40) / 240.
    assert first["auc_turns"] == pytest.approx(20 / 240)
    separate = [r for r in rows if r["critic"] == "separate"][0]
    assert separate["auc_turns"] == pytest.approx(
        stats.area_under_curve([0, 0.5, 1], [80, 160, 240], 240)
    )

    summary = critic_factorial.summarize(rows, reference="outcome", reps=200, draws=2_000)
    cell = summary["cells"]["shared|12|process"]
    assert cell["num_seeds"] == SEEDS
    assert cell["success"]["value"] == pytest.approx(process_shared.mean())
    assert cell["entropy"]["value"] == pytest.approx(0.3 + np.mean(np.arange(SEEDS)) / 100)
    assert cell["credit_spearman_last"]["mean"] == pytest.approx(0.25)
    assert cell["credit_spearman_first"]["mean"] == 0.0
    assert "credit_sign_agreement_last" not in cell  # never measured
    reward = {c["b"]: c for c in summary["families"]["reward"]}
    assert set(reward) == {"shared|12|process", "separate|12|process"}
    worse = reward["shared|12|process"]
    assert worse["a"] == "shared|12|outcome" and worse["num_pairs"] == SEEDS
    assert worse["difference"]["value"] == pytest.approx((process_shared - outcome).mean())
    # Every seed lost: the exact sign-flip p over 2^6 sign vectors is 2/64; Holm over 2.
    assert worse["p_value"] == pytest.approx(2 / 64)
    same = reward["separate|12|process"]
    assert same["p_value"] == pytest.approx(paired.sign_flip_test(outcome, process_separate))
    assert worse["p_holm"] == pytest.approx(min(1, 2 * 2 / 64))
    critic = {c["b"]: c for c in summary["families"]["critic"]}
    assert set(critic) == {"separate|12|outcome", "separate|12|process"}
    assert critic["separate|12|outcome"]["p_value"] == 1.0  # identical successes
    assert critic["separate|12|process"]["a"] == "shared|12|process"

    config = default_config.get_config()
    config.critics = "shared,separate"
    config.horizons = "12,5"
    config.conditions = "outcome,process"
    written = critic_factorial.run(config, str(tmp_path), report_only=True)
    assert written["settings"]["missing"] == ["shared/h5", "separate/h5"]
    stored = MetricWriter(str(tmp_path), tensorboard=False, filename="factorial.csv").read()
    assert len(stored) == len(rows)
    assert json.loads((tmp_path / "summary.json").read_text()) == json.loads(json.dumps(written))
    table = (tmp_path / "summary.md").read_text()
    assert "| process / shared / h=12 | outcome / shared / h=12 | 6 |" in table
    assert "Not finished (no rows): shared/h5, separate/h5." in table
    assert "credit accuracy of the trained critic's gae_turn (Spearman" in table
    assert os.path.getsize(tmp_path / "factorial.png") > 0


def test_report_before_any_sweep_finished_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no critic's sweep has finished"):
        critic_factorial.run(default_config.get_config(), str(tmp_path), report_only=True)
