"""How right is an estimator's credit? Per-turn credit scored against Monte-Carlo advantages.

`estimator_credit` runs a trainer estimator on a batch and aggregates its token
advantages to turns the way the PPO loss weighs them (`turn_credit`); `credit_accuracy`
compares that per-turn credit with the MC advantage of `rlagent.credit.mc`:

* `spearman`, `pearson`: rank and linear correlation over all played turns of the batch.
* `sign_agreement`: fraction of turns whose MC advantage is clearly non-zero
  (|A| > `significance` standard errors) where the credit has the same sign (a credit of
  exactly 0 gives no direction and counts as a disagreement).
* `auroc_verdict`: probability that a turn the oracle judged a valid step (verdict +1)
  gets more credit than a turn it judged wrong (-1), ties counting one half.
* `relative_bias = mean(c - A) / std(A)` and `relative_variance = var(c - A) / var(A)`:
  the normalised mean squared error `mean((c - A)^2) / var(A)` split into squared bias and
  variance. They compare raw scales, so they are meaningful for estimators whose
  advantages are in return units (no whitening, no std scaling); correlations, sign
  agreement and AUROC are scale-free.

Everything is pure and jit-able (ranks by sorting, ties averaged); a statistic over an
empty set (no significant turn, no verdict of one sign) is NaN.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from rlagent import losses
from rlagent.train.config import TrainConfig
from rlagent.train.estimators import estimate_advantages
from rlagent.types import Trajectory


class CreditAccuracy(NamedTuple):
    """Scalars (float32) describing one estimator's credit on one batch."""

    spearman: jax.Array
    pearson: jax.Array
    sign_agreement: jax.Array
    auroc_verdict: jax.Array
    relative_bias: jax.Array
    relative_variance: jax.Array
    num_turns: jax.Array  # played turns compared.
    num_significant: jax.Array  # turns with |A| > significance * SE.


def estimator_credit(
    trajectory: Trajectory,
    rewards: jax.Array,
    config: TrainConfig,
    branch_turn: jax.Array | None = None,
) -> jax.Array:
    """`[B, S]` per-turn credit of `config.estimator` on a batch, as the loss weighs it.

    The one adapter between the trainer's estimators and credit accuracy: no KL reward
    (credit is about the task reward), then `turn_credit` with `config.agg`.

    Args:
      trajectory: a rollout (its values are the critic's for critic-based estimators;
        episodes grouped by `config.group_size` consecutive rows share a task).
      rewards: `[B, S]` per-turn rewards (`rewards.turn_rewards`).
      config: estimator, gamma, lam, grouping, normalisation and aggregation.
      branch_turn: `[B]` branch turns when `trajectory` is a tree batch
        (`rlagent.train.tree`; a tree estimator needs them).
    """
    loss_mask = trajectory.loss_mask
    zeros = jnp.zeros(loss_mask.shape, jnp.float32)
    advantages, _ = estimate_advantages(trajectory, rewards, zeros, config, branch_turn)
    return turn_credit(advantages, loss_mask, agg=config.agg)


def turn_credit(
    token_advantages: jax.Array, token_mask: jax.Array, *, agg: str = "token-mean"
) -> jax.Array:
    """Token advantages aggregated to their turn with the weights of the policy loss.

    The loss `aggregate(A * ratio, mask, agg)` gives token t the weight w_t = d loss / d x_t.
    The credit of turn s is its weighted advantage in units of an average token,

        c_s = sum_{t in s} w_t A_t / (n_s * mean_t w_t),

    i.e. the mean token advantage of the turn under "token-mean", rescaled per episode
    under the "seq-mean" modes (e.g. tokens of long episodes weigh less under
    "seq-mean-token-mean"). Since the turn's log-likelihood is the sum of its tokens', a
    turn whose tokens all get A gets credit A.

    Args:
      token_advantages: `[B, S, L]` float.
      token_mask: `[B, S, L]` bool, the loss mask (generated tokens of played turns).
      agg: the loss aggregation mode (`TrainConfig.agg`).
    Returns:
      `[B, S]` float32, 0 on turns without tokens.
    """
    chex.assert_rank([token_advantages, token_mask], 3)
    chex.assert_equal_shape([token_advantages, token_mask])
    batch = token_mask.shape[0]
    rows = token_mask.reshape(batch, -1)
    weights = jax.grad(lambda x: losses.aggregate(x, rows, agg))(jnp.zeros(rows.shape))
    weights = weights.reshape(token_mask.shape)
    mean_weight = jnp.sum(weights) / jnp.maximum(jnp.sum(token_mask), 1)
    tokens = jnp.sum(token_mask, axis=-1)
    weighted = jnp.sum(jnp.where(token_mask, weights * token_advantages, 0.0), axis=-1)
    scale = jnp.maximum(tokens, 1) * jnp.where(mean_weight > 0, mean_weight, 1.0)
    return jnp.where(tokens > 0, weighted / scale, 0.0).astype(jnp.float32)


def credit_accuracy(
    estimated: jax.Array,
    mc_advantage: jax.Array,
    mc_advantage_se: jax.Array,
    turn_mask: jax.Array,
    verdict: jax.Array,
    *,
    significance: float = 2.0,
) -> CreditAccuracy:
    """Scores per-turn credit against Monte-Carlo advantages (see the module docstring).

    Args:
      estimated: `[B, S]` float credit (`estimator_credit` / `turn_credit`).
      mc_advantage: `[B, S]` float MC advantage (`MCValues.advantage`).
      mc_advantage_se: `[B, S]` float its standard error (`MCValues.advantage_se`).
      turn_mask: `[B, S]` bool played turns.
      verdict: `[B, S]` float oracle process verdict (`Trajectory.verdict`).
      significance: a turn's MC advantage is clearly non-zero when
        |A| > significance * SE (and A != 0).
    """
    arrays = [estimated, mc_advantage, mc_advantage_se, verdict]
    chex.assert_rank(arrays + [turn_mask], 2)
    chex.assert_equal_shape(arrays + [turn_mask])
    chex.assert_type(turn_mask, bool)
    c = estimated.reshape(-1).astype(jnp.float32)
    a = mc_advantage.reshape(-1).astype(jnp.float32)
    se = mc_advantage_se.reshape(-1).astype(jnp.float32)
    valid = turn_mask.reshape(-1)
    v = verdict.reshape(-1)

    pearson = _pearson(c, a, valid)
    spearman = _pearson(_ranks(c, valid), _ranks(a, valid), valid)
    significant = valid & (jnp.abs(a) > significance * se) & (a != 0)
    agree = jnp.sign(c) == jnp.sign(a)
    sign_agreement = _masked_mean(agree.astype(jnp.float32), significant)

    auroc = verdict_auroc(c, valid, v)

    error = c - a
    var_a = _masked_var(a, valid)
    bias = _masked_mean(error, valid)
    return CreditAccuracy(
        spearman=spearman,
        pearson=pearson,
        sign_agreement=sign_agreement,
        auroc_verdict=auroc,
        relative_bias=bias / jnp.sqrt(var_a),
        relative_variance=_masked_var(error, valid) / var_a,
        num_turns=jnp.sum(valid).astype(jnp.float32),
        num_significant=jnp.sum(significant).astype(jnp.float32),
    )


def verdict_auroc(scores: jax.Array, mask: jax.Array, verdict: jax.Array) -> jax.Array:
    """P(a turn the oracle judged valid (verdict > 0) scores above one judged wrong (< 0)).

    The Mann-Whitney U statistic over the turns of `mask` with a non-zero verdict, ties
    counting one half; NaN when either class is empty. Any shape (flattened), float32.

    Args:
      scores: per-turn scores (credit, PRM probabilities, labels).
      mask: bool, the turns to rank (e.g. played turns).
      verdict: the oracle process verdict of each turn (`Trajectory.verdict`).
    """
    chex.assert_equal_shape([scores, mask, verdict])
    s = scores.reshape(-1).astype(jnp.float32)
    valid, v = mask.reshape(-1), verdict.reshape(-1)
    positive, negative = valid & (v > 0), valid & (v < 0)
    ranks = _ranks(s, positive | negative)
    num_pos = jnp.sum(positive).astype(jnp.float32)
    num_neg = jnp.sum(negative).astype(jnp.float32)
    u = jnp.sum(jnp.where(positive, ranks, 0.0)) - num_pos * (num_pos + 1) / 2
    ok = (num_pos > 0) & (num_neg > 0)
    return jnp.where(ok, u / jnp.maximum(num_pos * num_neg, 1.0), jnp.nan).astype(jnp.float32)


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    count = jnp.sum(mask)
    return jnp.where(count > 0, jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(count, 1), jnp.nan)


def _masked_var(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Population variance over `mask` (NaN when empty)."""
    mean = _masked_mean(x, mask)
    return _masked_mean(jnp.square(x - mean), mask)


def _pearson(x: jax.Array, y: jax.Array, mask: jax.Array) -> jax.Array:
    """Correlation over `mask`; NaN when either side is constant."""
    dx = jnp.where(mask, x - _masked_mean(x, mask), 0.0)
    dy = jnp.where(mask, y - _masked_mean(y, mask), 0.0)
    denom = jnp.sqrt(jnp.sum(dx * dx) * jnp.sum(dy * dy))
    return jnp.where(denom > 0, jnp.sum(dx * dy) / jnp.where(denom > 0, denom, 1.0), jnp.nan)


def _ranks(x: jax.Array, mask: jax.Array) -> jax.Array:
    """1-based ranks of `x` among the entries of `mask`, ties averaged (0 off the mask)."""
    keys = jnp.sort(jnp.where(mask, x, jnp.inf))
    below = jnp.searchsorted(keys, x, side="left")
    at_or_below = jnp.searchsorted(keys, x, side="right")
    return jnp.where(mask, (below + at_or_below + 1) / 2.0, 0.0)
