"""Credit accuracy: turn aggregation of token advantages and the scores (rlagent.credit)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from rlagent import credit
from rlagent.train.config import ESTIMATORS
from rlagent.train.config import TrainConfig
from rlagent.types import Trajectory

B, S, L, O, K = 4, 5, 3, 2, 1


def _trajectory(seed: int = 0) -> Trajectory:
    rng = np.random.default_rng(seed)
    turns = np.array([5, 3, 4, 2])
    turn_mask = np.arange(S)[None, :] < turns[:, None]
    lengths = rng.integers(1, L + 1, size=(B, S))
    action_mask = np.arange(L)[None, None, :] < lengths[..., None]
    outcome = np.zeros((B, S), np.float32)
    outcome[0, 4] = 1.0
    outcome[2, 3] = 1.0
    done = np.zeros((B, S), bool)
    done[np.arange(B), turns - 1] = True
    return Trajectory(
        obs_tokens=jnp.asarray(rng.integers(0, 5, size=(B, S, O)), jnp.int32),
        progress=jnp.asarray(rng.integers(0, 3, size=(B, S, K)), jnp.int32),
        action_tokens=jnp.asarray(rng.integers(0, 5, size=(B, S, L)), jnp.int32),
        action_mask=jnp.asarray(action_mask),
        logp=jnp.zeros((B, S, L), jnp.float32),
        values=jnp.asarray(rng.normal(size=(B, S, L)) * action_mask, jnp.float32),
        turn_mask=jnp.asarray(turn_mask),
        signals={
            "outcome": jnp.asarray(outcome * turn_mask),
            "verdict": jnp.asarray(
                rng.choice([-1.0, 0.0, 1.0], size=(B, S)) * turn_mask, jnp.float32
            ),
            "efficiency": jnp.zeros((B, S), jnp.float32),
            "violations": (jnp.zeros((B, S), jnp.int32)).astype(jnp.float32),
        },
        success=(jnp.asarray(outcome * turn_mask)) > 0,
        done=jnp.asarray(done),
        bootstrap_value=jnp.zeros((B,), jnp.float32),
    )


def test_turn_credit_token_mean_is_the_mean_token_advantage():
    advantages = jnp.array([[[1.0, 3.0, 9.0], [2.0, 0.0, 0.0]]])
    mask = jnp.array([[[True, True, False], [True, False, False]]])
    np.testing.assert_allclose(credit.turn_credit(advantages, mask), [[2.0, 2.0]])


def test_turn_credit_seq_mean_token_mean_weighs_episodes_by_length():
    # Episode 0 has 1 token, episode 1 has 3: per-token weights 1/2 and 1/6, mean 1/4.
    advantages = jnp.ones((2, 2, 2))
    mask = jnp.array([[[True, False], [False, False]], [[True, True], [True, False]]])
    out = credit.turn_credit(advantages, mask, agg="seq-mean-token-mean")
    np.testing.assert_allclose(out, [[2.0, 0.0], [2.0 / 3.0, 2.0 / 3.0]], rtol=1e-6)


@pytest.mark.parametrize(
    "agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_turn_credit_of_a_constant_turn_under_token_mean_like_modes(agg):
    """Equal-length episodes: every mode gives a turn whose tokens all get A the credit A."""
    advantages = jnp.array([[[2.0, 2.0], [-1.0, -1.0]], [[0.5, 0.5], [3.0, 3.0]]])
    mask = jnp.ones((2, 2, 2), bool)
    np.testing.assert_allclose(
        credit.turn_credit(advantages, mask, agg=agg), advantages[..., 0], rtol=1e-6
    )


def _random_scores(seed=0, n=(6, 7)):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=n).astype(np.float32)
    se = np.abs(rng.normal(size=n)).astype(np.float32) * 0.3
    mask = rng.random(n) < 0.8
    verdict = rng.choice([-1.0, 0.0, 1.0], size=n).astype(np.float32)
    return a, se, mask, verdict


def test_perfect_credit_scores_perfectly():
    a, se, mask, verdict = _random_scores()
    acc = credit.credit_accuracy(a, a, se, mask, verdict)
    for field in ("spearman", "pearson", "sign_agreement"):
        assert float(getattr(acc, field)) == pytest.approx(1.0, abs=1e-5)
    assert float(acc.relative_bias) == pytest.approx(0.0, abs=1e-6)
    assert float(acc.relative_variance) == pytest.approx(0.0, abs=1e-6)
    assert float(acc.num_turns) == mask.sum()


def test_scores_match_scipy_and_brute_force():
    a, se, mask, verdict = _random_scores(1)
    rng = np.random.default_rng(2)
    # Rounded credit: ties, which the ranks must average.
    c = np.round(a + rng.normal(size=a.shape) * 0.7).astype(np.float32)
    acc = jax.jit(credit.credit_accuracy)(c, a, se, mask, verdict)
    cv, av = c[mask], a[mask]
    assert float(acc.spearman) == pytest.approx(stats.spearmanr(cv, av).statistic, abs=1e-5)
    assert float(acc.pearson) == pytest.approx(stats.pearsonr(cv, av).statistic, abs=1e-5)
    significant = mask & (np.abs(a) > 2 * se)
    expected = np.mean(np.sign(c[significant]) == np.sign(a[significant]))
    assert float(acc.sign_agreement) == pytest.approx(expected)
    pos, neg = c[mask & (verdict > 0)], c[mask & (verdict < 0)]
    pairs = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    assert float(acc.auroc_verdict) == pytest.approx(pairs.mean(), abs=1e-6)
    error = cv - av
    assert float(acc.relative_bias) == pytest.approx(error.mean() / av.std(), rel=1e-4)
    assert float(acc.relative_variance) == pytest.approx(error.var() / av.var(), rel=1e-4)


def test_unplayed_turns_are_ignored_and_empty_sets_are_nan():
    a, se, mask, verdict = _random_scores(3)
    c = a * 2.0 + 1.0
    acc = credit.credit_accuracy(c, a, se, mask, verdict)
    garbage = np.where(mask, c, 1e6).astype(np.float32)
    acc2 = credit.credit_accuracy(garbage, a, se, mask, verdict)
    chex.assert_trees_all_close(acc, acc2)
    no_verdicts = credit.credit_accuracy(c, a, se, mask, np.zeros_like(verdict))
    assert np.isnan(float(no_verdicts.auroc_verdict))
    all_noise = credit.credit_accuracy(c, a, se + 100.0, mask, verdict)
    assert np.isnan(float(all_noise.sign_agreement))
    assert float(all_noise.num_significant) == 0


def test_anti_credit_scores_minus_one():
    a, se, mask, verdict = _random_scores(4)
    acc = credit.credit_accuracy(-a, a, se, mask, verdict)
    assert float(acc.spearman) == pytest.approx(-1.0, abs=1e-5)
    assert float(acc.sign_agreement) == 0.0


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_every_trainer_estimator_gives_turn_credit(estimator):
    trajectory = _trajectory()
    config = TrainConfig(estimator=estimator, num_groups=2, group_size=2)
    rewards = trajectory.signals["outcome"] + 0.5 * trajectory.signals["verdict"]
    # Tree estimators read the batch as trees of 2 (rows 0/1 and 2/3) branched at turn 0.
    branch = jnp.zeros((B,), jnp.int32) if config.uses_trees else None
    out = credit.estimator_credit(trajectory, rewards, config, branch)
    chex.assert_shape(out, (B, S))
    assert np.all(np.isfinite(np.asarray(out)))
    np.testing.assert_array_equal(np.asarray(out)[~np.asarray(trajectory.turn_mask)], 0.0)


def test_monte_carlo_turn_gae_credit_is_the_return_to_go():
    """gae_turn with lam = 1, zero values and no whitening: credit = return from the turn."""
    trajectory = _trajectory()
    trajectory = trajectory._replace(values=jnp.zeros_like(trajectory.values))
    config = TrainConfig(estimator="gae_turn", lam=1.0, normalize_advantages=False)
    rewards = trajectory.signals["verdict"]
    out = credit.estimator_credit(trajectory, rewards, config)
    expected = np.flip(np.cumsum(np.flip(np.asarray(rewards), 1), 1), 1)
    expected = expected * np.asarray(trajectory.turn_mask)
    np.testing.assert_allclose(out, expected, atol=1e-6)
