"""Policy, value, KL, entropy, preference and process-reward losses.

Token losses take `[B, T]` rows with a bool `mask` and reduce them with `aggregate`, so
the normalisation (per token, per sequence, Dr. GRPO's constant) is one explicit choice.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlagent._checks import _check_float
from rlagent._checks import _check_like
from rlagent._checks import _check_mask
from rlagent._checks import _check_range

AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
KL_KINDS = ("k1", "abs", "k2", "k3")
DPO_KINDS = ("sigmoid", "ipo", "hinge")
# exp() of a log-ratio beyond +-20 overflows float32 gradients long before it is useful.
LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0


class PPOMetrics(NamedTuple):
    clip_fraction: jax.Array  # scalar: masked fraction of tokens where a clip is active.
    approx_kl: jax.Array  # scalar: masked mean of k3(old -> new), >= 0.
    ratio_mean: jax.Array  # scalar: masked mean of pi / pi_old.
    dual_clip_fraction: jax.Array  # scalar: fraction of tokens bounded by the dual clip.


class DPOOutput(NamedTuple):
    losses: jax.Array  # [N] float32 loss per preference pair.
    chosen_rewards: jax.Array  # [N] beta * (log pi - log pi_ref) of the chosen answer.
    rejected_rewards: jax.Array  # [N] same for the rejected answer.


def ppo_policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
) -> tuple[jax.Array, PPOMetrics]:
    """Clipped surrogate `L = -min(rho A, clip(rho, 1 - e_low, 1 + e_high) A)`.

    `rho = exp(clamp(logp - old_logp, -20, 20))` (Schulman et al., 2017, eq. 7; the
    asymmetric `clip_high` is DAPO's clip-higher, Yu et al., 2025). With `dual_clip = c > 1`
    the loss of tokens with `A < 0` is further bounded by `-A c` (Ye et al., 2020), so a
    huge ratio on a bad token cannot dominate. `old_logp` and `advantages` are treated as
    constants.

    Args:
      logp: `[B, T]` float log-probabilities under the current policy.
      old_logp: `[B, T]` float behaviour log-probabilities.
      advantages: `[B, T]` float advantages.
      mask: `[B, T]` bool loss mask.
      clip_low: lower clip range `e_low` >= 0.
      clip_high: upper clip range `e_high` >= 0.
      dual_clip: optional `c > 1` (ranges checked when Python numbers; traced values are
        the caller's contract).
      agg: reduction, see `aggregate`.

    Returns:
      `(loss, PPOMetrics)`: scalar loss and scalar diagnostics.
    """
    _check_float("logp", logp, 2)
    _check_mask("mask", mask, logp)
    old_logp = jax.lax.stop_gradient(_check_like("old_logp", old_logp, logp))
    advantages = jax.lax.stop_gradient(_check_like("advantages", advantages, logp))
    _check_agg(agg)
    _check_range("clip_low", clip_low, 0.0)
    _check_range("clip_high", clip_high, 0.0)
    if dual_clip is not None:
        _check_range("dual_clip", dual_clip, 1.0, open_low=True)
    log_ratio = jnp.clip(logp.astype(jnp.float32) - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    losses = jnp.maximum(unclipped, clipped)
    is_clipped = clipped > unclipped
    dual_clipped = jnp.zeros_like(is_clipped)
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual_clipped = (advantages < 0) & (losses > bound)
        losses = jnp.where(advantages < 0, jnp.minimum(losses, bound), losses)
    loss = aggregate(losses, mask, agg)
    metrics = PPOMetrics(
        clip_fraction=_masked_mean(is_clipped | dual_clipped, mask),
        approx_kl=_masked_mean(jnp.expm1(-log_ratio) + log_ratio, mask),
        ratio_mean=_masked_mean(ratio, mask),
        dual_clip_fraction=_masked_mean(dual_clipped, mask),
    )
    return loss, jax.tree.map(jax.lax.stop_gradient, metrics)


def aggregate(x: jax.Array, mask: jax.Array, mode: str) -> jax.Array:
    """Reduces `[B, T]` per-token losses to a scalar.

    * `"token-mean"`: `sum(x m) / sum(m)`, every token weighs the same.
    * `"seq-mean-token-sum"`: mean over rows of `sum_t x m`.
    * `"seq-mean-token-mean"`: mean over rows of the row's token mean (GRPO).
    * `"seq-mean-token-sum-norm"`: mean over rows of `sum_t x m / T` with the constant
      `T = x.shape[1]` (Dr. GRPO, Liu et al., 2025), free of length bias.

    The two `seq-mean` modes that look at the mask average over rows with at least one
    token, so padding rows do not dilute the loss; an all-masked batch gives 0.

    Args:
      x: `[B, T]` float per-token values.
      mask: `[B, T]` bool.
      mode: one of the four names above.

    Returns:
      float32 scalar.
    """
    _check_agg(mode)
    _check_float("x", x, 2)
    _check_mask("mask", mask, x)
    masked = jnp.where(mask, x.astype(jnp.float32), 0.0)
    if mode == "token-mean":
        return jnp.sum(masked) / jnp.maximum(jnp.sum(mask), 1)
    if mode == "seq-mean-token-sum-norm":
        return jnp.sum(masked) / max(x.shape[0] * x.shape[1], 1)  # 0 for an empty batch.
    tokens = jnp.sum(mask, axis=1)
    rows = tokens > 0
    per_row = jnp.sum(masked, axis=1)
    if mode == "seq-mean-token-mean":
        per_row = per_row / jnp.maximum(tokens, 1)
    return jnp.sum(jnp.where(rows, per_row, 0.0)) / jnp.maximum(jnp.sum(rows), 1)


def value_loss(
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    *,
    clip: float | None = None,
    agg: str = "token-mean",
) -> jax.Array:
    """Clipped value loss `0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)`.

    As in PPO2's baselines implementation; `clip=None` gives `0.5 (V - R)^2`. `returns`
    and `old_values` are constants.

    Args:
      values: `[B, T]` float current value predictions.
      old_values: `[B, T]` float values at rollout time.
      returns: `[B, T]` float targets.
      mask: `[B, T]` bool.
      clip: optional clip range `c` >= 0 (checked when a Python number).
      agg: reduction, see `aggregate`.

    Returns:
      float32 scalar.
    """
    if clip is not None:
        _check_range("clip", clip, 0.0)
    _check_float("values", values, 2)
    _check_mask("mask", mask, values)
    old_values = jax.lax.stop_gradient(_check_like("old_values", old_values, values))
    returns = jax.lax.stop_gradient(_check_like("returns", returns, values))
    values = values.astype(jnp.float32)
    losses = jnp.square(values - returns)
    if clip is not None:
        clipped = old_values + jnp.clip(values - old_values, -clip, clip)
        losses = jnp.maximum(losses, jnp.square(clipped - returns))
    return aggregate(0.5 * losses, mask, agg)


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, kind: str = "k3") -> jax.Array:
    """Per-token KL(pi || pi_ref) estimators from sampled log-probabilities.

    With `d = logp - ref_logp` (Schulman, 2020, "Approximating KL divergence"):
    `"k1"`: `d`; `"abs"`: `|d|`; `"k2"`: `d^2 / 2`; `"k3"`: `exp(-d) + d - 1`, unbiased
    and >= 0. For `k3` the log-ratio is clamped to `[-20, 20]` and the result to
    `[-10, 10]`, which bounds the penalty of tokens where the policies disagree wildly.

    Args:
      logp: float log-probabilities under the policy, any shape.
      ref_logp: float log-probabilities under the reference, same shape.
      kind: `"k1"`, `"abs"`, `"k2"` or `"k3"`.

    Returns:
      float32 array shaped like `logp`.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"`kind` must be one of {KL_KINDS}, got {kind!r}")
    _check_float("logp", logp, None)
    ref_logp = _check_like("ref_logp", ref_logp, logp)
    diff = logp.astype(jnp.float32) - ref_logp
    if kind == "k1":
        return diff
    if kind == "abs":
        return jnp.abs(diff)
    if kind == "k2":
        return 0.5 * jnp.square(diff)
    log_ratio = jnp.clip(-diff, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return jnp.clip(jnp.expm1(log_ratio) - log_ratio, -K3_CLAMP, K3_CLAMP)


def entropy(logits: jax.Array) -> jax.Array:
    """Entropy `H = -sum_v p_v log p_v` of `softmax(logits)` over the last axis.

    Logits of `-inf` (tokens removed by constrained decoding) contribute 0.

    Args:
      logits: `[..., V]` float logits.

    Returns:
      `[...]` float32 entropies.
    """
    _check_float("logits", logits, None)
    if logits.ndim < 1:
        raise ValueError("`logits` must have a vocabulary axis")
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    # Where p = 0, log p = -inf; zero it before the product to keep values and gradients
    # finite.
    allowed = jnp.isfinite(log_probs)
    safe_log_probs = jnp.where(allowed, log_probs, 0.0)
    return -jnp.sum(jnp.where(allowed, jnp.exp(safe_log_probs) * safe_log_probs, 0.0), axis=-1)


def dpo_loss(
    policy_chosen_logp: jax.Array,
    policy_rejected_logp: jax.Array,
    ref_chosen_logp: jax.Array,
    ref_rejected_logp: jax.Array,
    *,
    beta: float,
    kind: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> DPOOutput:
    """Direct preference losses per pair, from sequence log-probabilities.

    With `h = (log pi(y_w) - log pi(y_l)) - (log ref(y_w) - log ref(y_l))`:

    * `"sigmoid"` (DPO, Rafailov et al., 2023), with label smoothing `e` (cDPO):
      `-(1 - e) log sigmoid(beta h) - e log sigmoid(-beta h)`.
    * `"ipo"` (Azar et al., 2023): `(h - 1 / (2 beta))^2`.
    * `"hinge"` (SLiC, Zhao et al., 2023): `max(0, 1 - beta h)`.

    Args:
      policy_chosen_logp: `[N]` float log pi of the preferred answers.
      policy_rejected_logp: `[N]` float log pi of the rejected answers.
      ref_chosen_logp: `[N]` float reference log-prob of the preferred answers.
      ref_rejected_logp: `[N]` float reference log-prob of the rejected answers.
      beta: inverse temperature, > 0 (IPO divides by it).
      kind: `"sigmoid"`, `"ipo"` or `"hinge"`.
      label_smoothing: probability `e` in `[0, 1]` that a label is flipped (sigmoid only).
        Both ranges are checked when Python numbers; traced values are the caller's
        contract.

    Returns:
      `DPOOutput(losses [N], chosen_rewards [N], rejected_rewards [N])`; implicit
      rewards are constants.
    """
    if kind not in DPO_KINDS:
        raise ValueError(f"`kind` must be one of {DPO_KINDS}, got {kind!r}")
    _check_range("beta", beta, 0.0, open_low=True)
    _check_range("label_smoothing", label_smoothing, 0.0, 1.0)
    _check_float("policy_chosen_logp", policy_chosen_logp, 1)
    like = policy_chosen_logp
    policy_rejected_logp = _check_like("policy_rejected_logp", policy_rejected_logp, like)
    ref_chosen_logp = jax.lax.stop_gradient(_check_like("ref_chosen_logp", ref_chosen_logp, like))
    ref_rejected_logp = jax.lax.stop_gradient(
        _check_like("ref_rejected_logp", ref_rejected_logp, like)
    )
    policy_chosen_logp = policy_chosen_logp.astype(jnp.float32)
    margin = (policy_chosen_logp - policy_rejected_logp) - (ref_chosen_logp - ref_rejected_logp)
    if kind == "sigmoid":
        losses = -(1.0 - label_smoothing) * jax.nn.log_sigmoid(
            beta * margin
        ) - label_smoothing * jax.nn.log_sigmoid(-beta * margin)
    elif kind == "ipo":
        losses = jnp.square(margin - 1.0 / (2.0 * beta))
    else:
        losses = jax.nn.relu(1.0 - beta * margin)
    chosen_rewards = jax.lax.stop_gradient(beta * (policy_chosen_logp - ref_chosen_logp))
    rejected_rewards = jax.lax.stop_gradient(beta * (policy_rejected_logp - ref_rejected_logp))
    return DPOOutput(losses, chosen_rewards, rejected_rewards)


def weighted_log_likelihood(logp: jax.Array, mask: jax.Array, weights: jax.Array) -> jax.Array:
    """Mean log-likelihood of the masked tokens of weighted rows (SFT's objective, negated).

    `sum_{b,t} w_b m_{b,t} logp_{b,t} / max(sum_{b,t} w_b m_{b,t}, 1)`: a row of weight 0
    (a rejected episode) counts nowhere, and no accepted token gives 0.

    Args:
      logp: `[B, ...]` float teacher-forced token log-probs (e.g. `[B, S, L]`).
      mask: bool, shaped like `logp`: the tokens that count (the policy's own).
      weights: `[B]` float row weights.

    Returns:
      float32 scalar.
    """
    _check_float("logp", logp, None)
    _check_mask("mask", mask, logp)
    _check_float("weights", weights, 1)
    m = mask * weights.reshape(-1, *[1] * (logp.ndim - 1)).astype(jnp.float32)
    return jnp.sum(logp.astype(jnp.float32) * m) / jnp.maximum(jnp.sum(m), 1.0)


def prm_loss(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
    """Masked mean binary cross-entropy of per-step PRM logits against soft labels.

    `l = -(y log sigmoid(z) + (1 - y) log sigmoid(-z)) = softplus(z) - y z`, averaged
    over the steps where `mask` is True (Lightman et al., 2023; soft labels as in
    Math-Shepherd, Wang et al., 2024).

    Args:
      logits: `[B, S]` float logits `z`.
      labels: `[B, S]` float targets `y` in `[0, 1]`.
      mask: `[B, S]` bool valid steps.

    Returns:
      float32 scalar.
    """
    _check_float("logits", logits, 2)
    _check_mask("mask", mask, logits)
    labels = jax.lax.stop_gradient(_check_like("labels", labels, logits))
    logits = logits.astype(jnp.float32)
    losses = jax.nn.softplus(logits) - labels * logits
    return aggregate(losses, mask, "token-mean")


# --------------------------------------------------------------------------- helpers


def _check_agg(mode: str) -> None:
    if mode not in AGG_MODES:
        raise ValueError(f"`agg` must be one of {AGG_MODES}, got {mode!r}")


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(jnp.where(mask, x.astype(jnp.float32), 0.0)) / jnp.maximum(jnp.sum(mask), 1)
