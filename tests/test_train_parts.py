"""Trainer pieces that need no model: config validation, rewards, estimators, reports."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlagent import losses
from rlagent.advantages import gae
from rlagent.advantages import hierarchical_advantages
from rlagent.advantages import reinforce_pp_returns
from rlagent.analysis import report
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import dsl
from rlagent.host.writers import MetricWriter
from rlagent.losses import AGG_MODES
from rlagent.returns import compose_rewards
from rlagent.rollout import TokenScores
from rlagent.text.toolworld import make_toolworld_text
from rlagent.train import estimators
from rlagent.train.config import ESTIMATORS
from rlagent.train.config import REWARDS
from rlagent.train.config import TrainConfig
from rlagent.train.estimators import anchor_ids
from rlagent.train.estimators import estimate_advantages
from rlagent.train.estimators import estimator_inputs
from rlagent.train.ppo import _adapt_kl_coef
from rlagent.train.ppo import _token_loss
from rlagent.train.ppo import _token_weights
from rlagent.train.ppo import _TokenTargets
from rlagent.train.ppo import episode_metrics
from rlagent.train.rewards import POTENTIAL_SCALE
from rlagent.train.rewards import ReturnStats
from rlagent.train.rewards import check_forms
from rlagent.train.rewards import reward_weights
from rlagent.train.rewards import scale_rewards
from rlagent.train.rewards import turn_rewards
from rlagent.types import Trajectory
from rlagent.types import token_view

B, S, O, L, K = 4, 3, 2, 3, 2  # two groups of two episodes.


def _trajectory() -> Trajectory:
    """Four hand-written episodes; rows 0/1 share a task, rows 2/3 share another."""
    turn_mask = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], bool)
    action_mask = np.zeros((B, S, L), bool)
    action_mask[..., :2] = True  # two generated tokens per turn ...
    action_mask[0, 1, 2] = True  # ... three in one turn.
    verdict = np.array([[1, 1, 1], [1, -1, 0], [-1, 0, 0], [1, 0, 1]], np.float32)
    outcome = np.zeros((B, S), np.float32)
    outcome[0, 2] = 1.0
    outcome[3, 2] = 1.0
    efficiency = np.array([[0, 0, -1], [0, 0, 0], [0, 0, 0], [0, 0, -1]], np.float32)
    violations = np.zeros((B, S), np.int32)
    violations[1, 1] = 1
    obs = np.arange(B * S * O, dtype=np.int32).reshape(B, S, O) % 7
    obs[1, 0] = obs[0, 0]  # rows 0 and 1 start from the same observation (GiGPO anchor).
    rng = np.random.default_rng(0)
    return Trajectory(
        obs_tokens=jnp.asarray(obs),
        progress=jnp.ones((B, S, K), jnp.int32),
        action_tokens=jnp.asarray(rng.integers(1, 9, (B, S, L)), jnp.int32),
        action_mask=jnp.asarray(action_mask),
        logp=jnp.asarray(-rng.random((B, S, L)), jnp.float32),
        values=jnp.asarray(rng.random((B, S, L)), jnp.float32),
        turn_mask=jnp.asarray(turn_mask),
        signals={
            "outcome": jnp.asarray(outcome),
            "verdict": jnp.asarray(verdict),
            "efficiency": jnp.asarray(efficiency),
            "violations": (jnp.asarray(violations)).astype(jnp.float32),
        },
        success=(jnp.asarray(outcome)) > 0,
        done=jnp.asarray(turn_mask & ~np.roll(turn_mask, -1, axis=1)),
        bootstrap_value=jnp.zeros((B,), jnp.float32),
    )


def _config(**overrides) -> TrainConfig:
    return TrainConfig(**{"num_groups": 2, "group_size": 2, "num_minibatches": 2, **overrides})


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("reward", "dense", "Unknown reward"),
        ("estimator", "ppo", "Unknown estimator"),
        ("agg", "mean", "Unknown agg"),
        ("kl_kind", "k4", "Unknown kl_kind"),
        ("kl_placement", "logits", "Unknown kl_placement"),
        ("num_minibatches", 3, "equal minibatches"),
        ("num_updates", 0, "num_updates must be >= 1"),
        ("gamma", 1.5, "gamma and lam"),
    ],
)
def test_bad_config_values_are_rejected(field, value, message):
    with pytest.raises(ValueError, match=message):
        _config(**{field: value})


def test_config_from_mapping_rejects_unknown_fields():
    assert TrainConfig.from_mapping({"reward": "outcome"}).reward == "outcome"
    with pytest.raises(ValueError, match="Unknown TrainConfig fields"):
        TrainConfig.from_mapping({"rewrd": "outcome"})
    with pytest.raises(ValueError, match="group_size >= 2"):
        TrainConfig(estimator="grpo", group_size=1, num_minibatches=1)


def test_violation_penalty_is_paid_once_per_violating_turn():
    """A turn that breaks three rules costs the penalty once, like a turn that breaks one."""
    violations = np.zeros((B, S), np.int32)
    violations[1, 1], violations[0, 2] = 3, 1
    traj = _trajectory()
    traj = traj._replace(
        signals={**traj.signals, "violations": jnp.asarray(violations, jnp.float32)}
    )
    got = turn_rewards(traj, _config(reward="outcome", violation_penalty=0.5))
    np.testing.assert_allclose(got, np.asarray(traj.signals["outcome"]) - 0.5 * (violations > 0))


def test_malformed_penalty_is_paid_per_malformed_turn_and_needs_the_signal():
    malformed = np.zeros((B, S), np.float32)
    malformed[0, 0] = malformed[1, 2] = 1.0
    traj = _trajectory()
    traj = traj._replace(signals={**traj.signals, "malformed": jnp.asarray(malformed)})
    valid = np.asarray(traj.turn_mask, np.float32)
    verdict = np.asarray(traj.signals["verdict"]) * valid
    got = turn_rewards(traj, _config(reward="process", malformed_penalty=0.25))
    np.testing.assert_allclose(got, verdict - 0.25 * malformed * valid)
    np.testing.assert_allclose(turn_rewards(traj, _config(reward="process")), verdict)
    config = _config(reward="outcome", malformed_penalty=0.25)
    with pytest.raises(ValueError, match="malformed"):  # ToolWorld's token turns report none
        check_forms(ToolWorld(), config, ["outcome"], "config.conditions")
    check_forms(make_toolworld_text(level=1), config, ["outcome"], "config.conditions")
    with pytest.raises(ValueError, match="TrainConfig.malformed_penalty must be >= 0"):
        _config(malformed_penalty=-1.0)


def test_scale_rewards_brings_the_return_std_to_one():
    """After a few batches of returns with std 5, the scaled returns have std ~1."""
    rng = np.random.default_rng(0)
    on, off = _config(normalize_returns=True), _config()
    scale = jax.jit(lambda r, st: scale_rewards(r, st, on))
    stats = ReturnStats.zeros()
    for _ in range(6):
        # [256, 4] turn rewards whose episode returns are ~ N(2, 5^2).
        rewards = jnp.asarray(rng.normal(0.5, 2.5, size=(256, 4)), jnp.float32)
        scaled, stats = scale(rewards, stats)
    assert float(stats.count) == 6 * 256
    assert float(jnp.std(scaled.sum(axis=1))) == pytest.approx(1.0, abs=0.1)
    assert float(stats.mean) == pytest.approx(2.0, abs=0.3)
    # The scale only: rewards keep their sign and ratios.
    np.testing.assert_allclose(scaled * jnp.sqrt(stats.m2 / stats.count), rewards, rtol=1e-5)
    # Returns that never varied are not blown up.
    zeros, zero_stats = scale_rewards(jnp.zeros((4, 3)), ReturnStats.zeros(), on)
    assert float(jnp.abs(zeros).max()) == 0 and float(zero_stats.m2) == 0
    # Off (the default): rewards and statistics are returned as they are.
    same, same_stats = scale_rewards(rewards, stats, off)
    assert same is rewards and same_stats is stats


def test_turn_rewards_match_hand_computed_forms():
    traj = _trajectory()
    valid = np.asarray(traj.turn_mask, np.float32)
    verdict = np.asarray(traj.signals["verdict"]) * valid
    outcome = np.asarray(traj.signals["outcome"])
    penalty = np.asarray(traj.signals["violations"], np.float32)

    np.testing.assert_allclose(turn_rewards(traj, _config(reward="outcome")), outcome)
    np.testing.assert_allclose(turn_rewards(traj, _config(reward="process")), verdict)
    np.testing.assert_allclose(
        turn_rewards(traj, _config(reward="process", violation_penalty=0.5)),
        verdict - 0.5 * penalty,
    )
    composed = np.asarray(turn_rewards(traj, _config(reward="composed")))
    expected = 0.3 * verdict + 0.2 * np.asarray(traj.signals["efficiency"]) * valid + 0.5 * outcome
    np.testing.assert_allclose(composed, expected, atol=1e-6)
    np.testing.assert_allclose(
        turn_rewards(traj, _config(reward="prm_sum")), outcome + verdict, atol=1e-6
    )
    # Potential shaping telescopes: with gamma = 1 an episode's return is its outcome.
    shaped = np.asarray(turn_rewards(traj, _config(reward="potential")))
    np.testing.assert_allclose(shaped.sum(axis=1), outcome.sum(axis=1), atol=1e-6)
    # ... and a valid step is paid POTENTIAL_SCALE when the next turn is played.
    assert shaped[0, 0] == pytest.approx(POTENTIAL_SCALE)
    # Rows 0 and 3 are truncated (their last slot is played, not terminal). Bootstrapped,
    # the state after the last turn keeps its potential (3 and 2 valid steps), so the
    # shaping sums to Phi_S - Phi_0 instead of subtracting Phi_S a second time.
    boot = np.asarray(turn_rewards(traj, _config(reward="potential", bootstrap_truncated=True)))
    np.testing.assert_allclose(
        boot.sum(axis=1) - outcome.sum(axis=1), POTENTIAL_SCALE * np.array([3, 0, 0, 2])
    )
    np.testing.assert_allclose(boot[1:3], shaped[1:3])  # terminated rows are unchanged
    # Min-form credit: each row's return lies between its min step score and outcome + max.
    prm_min = np.asarray(turn_rewards(traj, _config(reward="prm_min")))
    assert np.all(prm_min[~np.asarray(traj.turn_mask)] == 0)
    for name in REWARDS:
        rewards = turn_rewards(traj, _config(reward=name))
        assert rewards.dtype == jnp.float32 and rewards.shape == (B, S)


def test_composed_weights_equal_the_compose_rewards_kernel():
    traj = _trajectory()
    config = _config(reward="composed", reward_weights=(0.6, 0.25, 0.15))
    kernel = compose_rewards(
        jnp.sum(traj.signals["outcome"], axis=1),
        traj.signals["verdict"] * traj.turn_mask,
        traj.signals["efficiency"] * traj.turn_mask,
        traj.turn_mask,
        weights=(0.6, 0.25, 0.15),
    )
    np.testing.assert_allclose(turn_rewards(traj, config), kernel, atol=1e-6)
    # Weights are data: a traced weight vector gives the same rewards as the config name.
    jitted = jax.jit(turn_rewards, static_argnums=1)
    np.testing.assert_allclose(jitted(traj, config, reward_weights(config)), kernel, atol=1e-6)
    with pytest.raises(ValueError, match="Unknown reward"):
        reward_weights(config, "sparse")


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_every_estimator_gives_finite_masked_advantages(estimator):
    traj = _trajectory()
    config = _config(estimator=estimator, reward="process")
    rewards = turn_rewards(traj, config)
    # Tree estimators read the batch as trees of 2 (the groups) branched at turns 1 and 0.
    branch = jnp.asarray([1, 1, 0, 0], jnp.int32) if config.uses_trees else None
    advantages, targets = jax.jit(estimate_advantages, static_argnums=3)(
        traj, rewards, jnp.zeros_like(traj.logp), config, branch
    )
    loss_mask = np.asarray(traj.loss_mask)
    assert advantages.shape == targets.shape == (B, S, L)
    assert np.all(np.isfinite(advantages))
    assert np.all(np.asarray(advantages)[~loss_mask] == 0)
    assert np.any(np.asarray(advantages)[loss_mask] != 0)


def test_group_estimators_match_hand_computed_episode_advantages():
    traj = _trajectory()
    loss_mask = np.asarray(traj.loss_mask)
    config = _config(estimator="drgrpo", reward="process")
    rewards = turn_rewards(traj, config)
    scores = np.asarray(rewards).sum(axis=1)  # [3, 0, -1, 2]
    expected = np.array(
        [scores[0] - scores[:2].mean(), scores[1] - scores[:2].mean(),
         scores[2] - scores[2:].mean(), scores[3] - scores[2:].mean()]
    )  # fmt: skip
    advantages, _ = estimate_advantages(traj, rewards, jnp.zeros_like(traj.logp), config)
    for row in range(B):
        np.testing.assert_allclose(np.asarray(advantages)[row][loss_mask[row]], expected[row])
    # RLOO with groups of two: s_i - s_j.
    config = _config(estimator="rloo", reward="process")
    advantages, _ = estimate_advantages(traj, rewards, jnp.zeros_like(traj.logp), config)
    rloo = np.array([scores[0] - scores[1], scores[1] - scores[0],
                     scores[2] - scores[3], scores[3] - scores[2]])  # fmt: skip
    for row in range(B):
        np.testing.assert_allclose(np.asarray(advantages)[row][loss_mask[row]], rloo[row])


def test_turn_gae_broadcasts_one_advantage_per_turn():
    traj = _trajectory()
    config = _config(estimator="gae_turn", reward="outcome", normalize_advantages=False, lam=1.0)
    rewards = turn_rewards(traj, config)
    advantages, targets = estimate_advantages(traj, rewards, jnp.zeros_like(traj.logp), config)
    values = np.asarray(traj.values)[:, :, 0]
    # lam = gamma = 1: advantage = (return from turn s) - V_s, the same on every token.
    returns = np.cumsum(np.asarray(rewards)[:, ::-1], axis=1)[:, ::-1]
    mask = np.asarray(traj.loss_mask)
    for b in range(B):
        for s in range(S):
            if traj.turn_mask[b, s]:
                np.testing.assert_allclose(
                    np.asarray(advantages)[b, s][mask[b, s]], returns[b, s] - values[b, s],
                    rtol=1e-5, atol=1e-6,
                )  # fmt: skip
                np.testing.assert_allclose(
                    np.asarray(targets)[b, s][mask[b, s]], returns[b, s], rtol=1e-5
                )


def _estimate(name, traj, **overrides):
    """The table entry `name` alone (no whitening), on the process reward."""
    config = _config(estimator=name, reward="process", **overrides)
    inputs = estimator_inputs(traj, turn_rewards(traj, config), jnp.zeros_like(traj.logp), 2)
    return estimators.ESTIMATORS[name].estimate(inputs, config)


def _on_token_view(x, traj):
    """`[B, S, L]` -> the token view's `[B, S * (O + L)]`, zeros on observation tokens."""
    obs = jnp.zeros(traj.obs_tokens.shape, x.dtype)
    return jnp.concatenate([obs, x], axis=-1).reshape(B, -1)


def test_action_rows_equal_the_token_view_for_token_estimators():
    """Observation tokens are masked and rewardless: dropping them changes no advantage."""
    traj = _trajectory()._replace(bootstrap_value=jnp.asarray([0.0, 0.5, 0.0, -1.0]))
    config = _config(reward="process", gamma=0.9, lam=0.8)
    inputs = estimator_inputs(traj, turn_rewards(traj, config), jnp.zeros_like(traj.logp), 2)
    view = token_view(traj)
    assert view.tokens.shape == (B, S * (O + L))
    on_loss = np.asarray(traj.loss_mask)

    def check(name, on_view):
        got = np.asarray(estimators.ESTIMATORS[name].estimate(inputs, config).advantages)
        np.testing.assert_allclose(np.asarray(on_view)[np.asarray(view.loss_mask)], got[on_loss],
                                   rtol=1e-5, atol=1e-6)  # fmt: skip

    rewards, values = _on_token_view(inputs.token_rewards, traj), _on_token_view(traj.values, traj)
    check("gae_token", gae(rewards, values, view.loss_mask, gamma=0.9, lam=0.8,
                           bootstrap_value=traj.bootstrap_value).advantages)  # fmt: skip
    check("reinforce_pp", reinforce_pp_returns(rewards, view.loss_mask, gamma=0.9).advantages)
    check("hierarchical", hierarchical_advantages(
        inputs.turn_rewards, traj.values[:, :, 0], traj.turn_mask, view.turn_ids, gamma=0.9,
        lam=0.8, token_values=values, bootstrap_value=traj.bootstrap_value,
    ).token_advantages)  # fmt: skip


def test_gae_token_puts_the_turn_reward_on_its_last_token():
    traj = _trajectory()
    advantages, targets = _estimate("gae_token", traj, gamma=1.0, lam=1.0)
    # gamma = lam = 1: the return of a token is the reward of its turn and all later turns.
    rewards = np.asarray(turn_rewards(traj, _config(reward="process")))
    later = np.cumsum(rewards[:, ::-1], axis=1)[:, ::-1]
    mask = np.asarray(traj.loss_mask)
    expected = np.broadcast_to(later[..., None], mask.shape)
    np.testing.assert_allclose(np.asarray(targets)[mask], expected[mask], rtol=1e-5)
    np.testing.assert_allclose(
        np.asarray(advantages)[mask], (expected - np.asarray(traj.values))[mask], rtol=1e-5
    )


def test_hierarchical_uses_the_turn_critic_targets_and_token_baselines():
    traj = _trajectory()
    advantages, targets = _estimate("hierarchical", traj)
    turn_adv, turn_targets = _estimate("gae_turn", traj)
    np.testing.assert_allclose(targets, turn_targets, rtol=1e-6)
    # A_t = Q_s - V_t: the first token of a turn (V_t = V_s) gets the turn advantage.
    mask = np.asarray(traj.loss_mask)
    first = mask[..., 0]
    np.testing.assert_allclose(
        np.asarray(advantages)[..., 0][first], np.asarray(turn_adv)[..., 0][first], atol=1e-5
    )
    np.testing.assert_allclose(
        np.asarray(advantages)[mask], (np.asarray(targets) - np.asarray(traj.values))[mask],
        rtol=1e-5, atol=1e-6,
    )  # fmt: skip


def test_grpo_is_drgrpo_scaled_by_the_group_std():
    traj = _trajectory()
    grpo, targets = _estimate("grpo", traj)
    drgrpo, _ = _estimate("drgrpo", traj)
    std = np.std([3.0, 0.0], ddof=1)  # both groups: scores {3, 0} and {-1, 2}
    np.testing.assert_allclose(grpo, np.asarray(drgrpo) / (std + 1e-6), rtol=1e-5)
    assert not np.asarray(targets).any()


def test_reinforce_pp_whitens_token_returns():
    traj = _trajectory()
    advantages, targets = _estimate("reinforce_pp", traj)
    values = np.asarray(advantages)[np.asarray(traj.loss_mask)]
    assert abs(values.mean()) < 1e-5 and abs(values.std() - 1) < 1e-3
    assert not np.asarray(targets).any()


def test_gigpo_adds_step_advantages_within_anchor_groups():
    traj = _trajectory()
    episode_only, _ = _estimate("gigpo", traj, gigpo_omega=0.0)
    np.testing.assert_allclose(episode_only, _estimate("drgrpo", traj)[0], atol=1e-6)
    with_steps, _ = _estimate("gigpo", traj, gigpo_omega=1.0)
    # Rows 0 and 1 start from the same observation: their first turns form an anchor group.
    rewards = np.asarray(turn_rewards(traj, _config(reward="process")))
    first_returns = rewards.sum(axis=1)[:2]  # gamma = 1: return from turn 0 = the score
    step = np.asarray(with_steps - episode_only)[:2, 0, 0]
    np.testing.assert_allclose(step, first_returns - first_returns.mean(), atol=1e-6)


def test_anchor_ids_identify_identical_observations():
    traj = _trajectory()
    ids = np.asarray(anchor_ids(traj))
    assert ids.shape == (B, S) and ids.dtype == np.int32
    assert ids[0, 0] == ids[1, 0]
    assert len({int(ids[0, 0]), int(ids[0, 1]), int(ids[2, 0]), int(ids[3, 0])}) == 4


def test_episode_metrics_by_hand():
    traj = _trajectory()
    first = np.full((B, S), dsl.SAY)
    first[0, 1] = first[3, 0] = dsl.CALL  # episodes 0 and 3 call a tool ...
    first[2, 1] = dsl.CALL  # ... episode 2 only after its last played turn.
    traj = traj._replace(action_tokens=traj.action_tokens.at[..., 0].set(first))
    metrics = jax.tree.map(float, episode_metrics(ToolWorld(), traj))
    assert metrics["collapse_rate"] == pytest.approx(0.5)  # episodes 1 and 2 make no call
    assert metrics["success"] == pytest.approx(0.5)
    assert metrics["turns"] == pytest.approx((3 + 2 + 1 + 3) / 4)
    assert metrics["violation_rate"] == pytest.approx(0.25)
    assert metrics["turns_over_plan"] == pytest.approx(0.5)
    assert metrics["tokens"] == pytest.approx((7 + 4 + 2 + 6) / 4)
    assert metrics["process_score"] == pytest.approx((3 + 0 - 1 + 2) / 9)


def _rows():
    rows = []
    for condition, rate in (("dense", 0.2), ("sparse", 0.05)):
        for seed in (0, 1, 2):
            for update in range(1, 11):
                success = min(1.0, rate * update + 0.01 * seed)
                rows.append({
                    "condition": condition, "seed": seed, "update": update, "success": success,
                    "env_turns_total": 100.0 * update, "violation_rate": 0.0, "turns": 2.0,
                    "turns_over_plan": 0.1 * seed, "process_score": 0.5,
                })  # fmt: skip
    return rows


def test_a_metric_the_environment_does_not_report_is_left_out_of_the_summary():
    """violation_rate NaN in every row (an environment without a rule layer, e.g. the
    dialogue one, in a CSV whose header has the column): no entry, no error."""
    rows = [{**row, "violation_rate": math.nan} for row in _rows()]
    summary = report.summarize(rows, reps=50)
    dense = summary["conditions"]["dense"]
    assert "violation_rate" not in dense and "violation_rate_all" not in dense
    assert dense["turns"]["value"] == 2.0  # the measured ones stay.


def test_summary_numbers_and_files(tmp_path):
    summary = report.summarize(_rows(), reps=200)
    dense, sparse = summary["conditions"]["dense"], summary["conditions"]["sparse"]
    assert summary["settings"]["budget_env_turns"] == 1000.0
    # dense reaches 0.5 at update 3 (seed 0, 1: 0.6, 0.61; seed 2 at 0.62) -> 300 turns.
    assert dense["per_seed"]["turns_to_50"] == [300.0, 300.0, 300.0]
    assert dense["turns_to_50"] == {"median": 300.0, "mean_lower_bound": 300.0, "reached": "3/3"}
    assert dense["turns_to_80"]["median"] == pytest.approx(400.0)
    assert dense["final_success"]["iqm"]["value"] == pytest.approx(1.0)
    # sparse never reaches 0.8: every seed censored at the 1,000-turn budget.
    assert sparse["turns_to_80"] == {"median": None, "mean_lower_bound": 1000.0, "reached": "0/3"}
    assert dense["violation_rate_all"]["value"] == 0.0
    # seeds 0, 1, 2 end at 0.50, 0.51, 0.52 (mean of the last update of 10).
    assert sparse["per_seed"]["final_success"] == pytest.approx([0.50, 0.51, 0.52])
    assert sparse["final_success"]["mean"]["value"] == pytest.approx(0.51)
    assert sparse["takeoff"]["k"] == 3 and dense["takeoff"]["k"] == 3
    # AUC of seed 0 of sparse: success 0.05 u held over [100 u, 100 (u + 1)], u = 1..9.
    expected = sum(0.05 * u * 100 for u in range(1, 10)) / 1000
    assert sparse["per_seed"]["auc"][0] == pytest.approx(expected)
    (comparison,) = summary["comparisons"]
    assert (comparison["x"], comparison["y"]) == ("dense", "sparse")
    assert comparison["prob_improvement"] == 1.0
    table = report.markdown_table(summary)
    assert "| sparse | 3 | 0.510 [" in table and "| dense | sparse | 1.00 |" in table
    assert "not reached (0/3)" in table
    report.write_summary(summary, tmp_path / "s.md", tmp_path / "s.json")
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["conditions"]["dense"]["num_seeds"] == 3
    np.testing.assert_allclose(
        report._moving_average(np.array([[1.0, 2, 3, 4, 5]]), 3), [[1, 1.5, 2, 3, 4]]
    )
    report.plot_curves(_rows(), str(tmp_path / "curves.png"))
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report.plot_profiles(summary, str(tmp_path / "profiles.png"))
    assert (tmp_path / "profiles.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_kl_in_the_reward_reaches_every_estimator_level():
    traj = _trajectory()
    config = _config(estimator="drgrpo", reward="outcome")
    rewards = turn_rewards(traj, config)
    kl_reward = -0.1 * traj.loss_mask.astype(jnp.float32)
    with_kl, _ = estimate_advantages(traj, rewards, kl_reward, config)
    without, _ = estimate_advantages(traj, rewards, jnp.zeros_like(kl_reward), config)
    # Episode scores drop by 0.1 per generated token; rows 0/1 differ by 7 - 4 tokens.
    mask = np.asarray(traj.loss_mask)
    shift = np.asarray(with_kl - without)[0][mask[0]]
    np.testing.assert_allclose(shift, -0.1 * (7 - 4) / 2, atol=1e-6)


def test_adaptive_kl_coefficient_follows_the_target():
    config = _config(kl_target=0.1, kl_coef=0.2, kl_horizon=40.0)  # batch 4: gain 0.1
    coef = jnp.asarray(0.2)
    assert float(_adapt_kl_coef(coef, jnp.asarray(0.3), config)) == pytest.approx(0.2 * 1.02)
    assert float(_adapt_kl_coef(coef, jnp.asarray(0.0), config)) == pytest.approx(0.2 * 0.98)
    assert float(_adapt_kl_coef(coef, jnp.asarray(0.1), config)) == pytest.approx(0.2)
    fixed = _config(kl_coef=0.2)
    assert float(_adapt_kl_coef(coef, jnp.asarray(5.0), fixed)) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="adaptive KL"):
        _config(kl_target=0.1, kl_placement="none")


def test_metric_writer_csv_tensorboard_and_truncate(tmp_path):
    writer = MetricWriter(str(tmp_path))
    rows = [{"condition": "process", "update": u, "seed": 0, "success": u / 4} for u in (1, 2, 3)]
    writer.write(rows)
    assert writer.read() == rows
    assert writer.truncate(2) == rows[:2]
    assert writer.read() == rows[:2]
    writer.close()
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    # Rows of runs that log different metrics: a metric a row lacks reads back as NaN.
    mixed = MetricWriter(str(tmp_path), tensorboard=False, filename="mixed.csv")
    mixed.write([{"update": 1, "credit_spearman": 0.5}, {"update": 1, "prm_auroc": 0.7}])
    first, second = mixed.read()
    assert first["credit_spearman"] == 0.5 and math.isnan(first["prm_auroc"])
    assert math.isnan(second["credit_spearman"]) and second["prm_auroc"] == 0.7


@pytest.mark.parametrize("agg", AGG_MODES)
def test_ppo_loss_as_a_sum_of_token_terms_equals_the_kernels(agg):
    """`_token_loss` with `_token_weights`, summed over turns = the aggregated loss kernels."""
    config = TrainConfig(agg=agg, kl_coef=0.1, dual_clip=3.0, value_clip=0.2)
    keys = jax.random.split(jax.random.key(0), 8)
    shape = (3, 4, 5)  # [B, S, L]
    mask = jax.random.bernoulli(keys[0], 0.6, shape).at[0].set(False)
    logp, old_logp, ref_logp = (-jax.random.exponential(k, shape) for k in keys[1:4])
    values, old_values, targets, advantages = (jax.random.normal(k, shape) for k in keys[4:])
    entropy = jnp.abs(values)
    kl_coef = jnp.float32(0.1)
    token_targets = _TokenTargets(
        old_logp, advantages, old_values, targets, ref_logp, mask,
        _token_weights(mask, agg), _token_weights(mask, "token-mean"),
        jnp.broadcast_to(kl_coef, shape[:2]),
    )  # fmt: skip
    rows = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), token_targets)
    scores = TokenScores(*(x.reshape(-1, shape[-1]) for x in (logp, values, entropy)))
    total, stats = _token_loss(config)(scores, rows)

    def rows_of(x):
        return x.reshape(shape[0], -1)

    m = rows_of(mask)
    policy, policy_stats = losses.ppo_policy_loss(
        rows_of(logp), rows_of(old_logp), rows_of(advantages), m,
        clip_low=config.clip_low, clip_high=config.clip_high, dual_clip=3.0, agg=agg,
    )  # fmt: skip
    want = {
        "policy_loss": policy,
        "entropy": losses.aggregate(rows_of(entropy), m, agg),
        "clip_fraction": policy_stats.clip_fraction,
        "approx_kl": policy_stats.approx_kl,
        "value_loss": losses.value_loss(
            rows_of(values), rows_of(old_values), rows_of(targets), m, clip=0.2, agg=agg
        ),
        "kl_loss": losses.aggregate(losses.kl_penalty(rows_of(logp), rows_of(ref_logp)), m, agg),
    }
    got = jax.tree.map(lambda x: jnp.sum(x, axis=0), stats)
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    want_total = (
        want["policy_loss"] - config.entropy_coef * want["entropy"]
        + config.value_coef * want["value_loss"] + kl_coef * want["kl_loss"]
    )  # fmt: skip
    np.testing.assert_allclose(jnp.sum(total), want_total, rtol=1e-5, atol=1e-6)
