"""Returns over masked rows and per-turn reward construction.

All recursions here *bridge* masked positions (docs/architecture.md, "Kernel contracts"): a
position
whose `mask` is False is skipped by the recursion, it neither discounts nor contributes a
value, its output is 0, and a reward found on it is credited to the closest earlier
unmasked position of the same row. Rewards before the first unmasked position of a row
have no action to credit and are dropped. Under this convention every estimator equals
its plain counterpart run on the compressed sequence of unmasked positions.

The bridged recursion and its solves live in `rlagent._recurrence`, the argument checks
shared by the kernels in `rlagent._checks`.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rlagent._checks import _check_float
from rlagent._checks import _check_like
from rlagent._checks import _check_mask
from rlagent._checks import _check_range
from rlagent._checks import _check_rows
from rlagent._recurrence import _bridged_recurrence
from rlagent._recurrence import _lambda_recurrence

PRM_FORMS = ("sum", "min", "potential")


def discounted_returns(
    rewards: jax.Array,
    mask: jax.Array,
    *,
    gamma: float,
    bootstrap_value: jax.Array | None = None,
) -> jax.Array:
    """Bridged discounted returns `G_k = R_k + gamma * G_{k+1}`.

    With `p_0 < p_1 < ...` the unmasked positions of a row, `R_k` is the sum of the
    rewards on `[p_k, p_{k+1})` and `G_n = bootstrap_value` after the last one (Sutton &
    Barto, 2018, eq. 3.9).

    Args:
      rewards: `[B, T]` float rewards at times `[0, T)`.
      mask: `[B, T]` bool, True on positions the recursion runs over.
      gamma: discount per unmasked step in `[0, 1]` (checked when a Python number; a
        traced value is the caller's contract).
      bootstrap_value: `[B]` value after the last unmasked position (default 0:
        termination).

    Returns:
      `[B, T]` float32 returns, 0 where `mask` is False.
    """
    rewards, mask, bootstrap_value = _check_rows("rewards", rewards, mask, bootstrap_value)
    _check_range("gamma", gamma, 0.0, 1.0)
    returns = _bridged_recurrence(rewards, mask, gamma, bootstrap_value)
    return jnp.where(mask, returns, 0.0)


def lambda_returns(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    *,
    gamma: float,
    lam: float,
    bootstrap_value: jax.Array | None = None,
) -> jax.Array:
    """Bridged TD(lambda) returns `G_k = R_k + gamma * ((1 - lam) V_{k+1} + lam G_{k+1})`.

    Conventions as in `discounted_returns`; `V_n = G_n = bootstrap_value` (Sutton & Barto,
    2018, eq. 12.18). Equal to `gae(...).returns`.

    Args:
      rewards: `[B, T]` float rewards.
      values: `[B, T]` float value estimates; read only where `mask` is True.
      mask: `[B, T]` bool.
      gamma: discount per unmasked step in `[0, 1]`.
      lam: the lambda mixing parameter in `[0, 1]` (both checked when Python numbers; traced
        values are the caller's contract).
      bootstrap_value: `[B]` value after the last unmasked position (default 0).

    Returns:
      `[B, T]` float32 lambda-returns, 0 where `mask` is False.
    """
    rewards, mask, bootstrap_value = _check_rows("rewards", rewards, mask, bootstrap_value)
    values = _check_like("values", values, rewards)
    _check_range("gamma", gamma, 0.0, 1.0)
    _check_range("lam", lam, 0.0, 1.0)
    return jnp.where(
        mask, _lambda_recurrence(rewards, values, mask, bootstrap_value, gamma, lam), 0.0
    )


def compose_rewards(
    outcome: jax.Array,
    process: jax.Array,
    efficiency: jax.Array,
    turn_mask: jax.Array,
    weights: tuple[float, float, float] = (0.5, 0.3, 0.2),
) -> jax.Array:
    """Per-turn mix `r_s = w_o * outcome * [s = last] + w_p * process_s + w_e * efficiency_s`.

    `last` is the last valid turn of the row; a row without valid turns gets no reward.

    Args:
      outcome: `[B]` float episode outcome (e.g. 1 solved, 0 not).
      process: `[B, S]` float per-turn process compliance (e.g. the oracle verdict).
      efficiency: `[B, S]` float per-turn efficiency reward.
      turn_mask: `[B, S]` bool valid turns.
      weights: `(w_o, w_p, w_e)`.

    Returns:
      `[B, S]` float32 per-turn rewards, 0 on invalid turns.
    """
    _check_float("process", process, 2)
    _check_mask("turn_mask", turn_mask, process)
    efficiency = _check_like("efficiency", efficiency, process)
    _check_float("outcome", outcome, 1)
    chex.assert_equal_shape_prefix(
        [outcome, process], 1, custom_message="`outcome` must be [B] for `process` [B, S]"
    )
    if len(weights) != 3:
        raise ValueError(f"`weights` must be (outcome, process, efficiency), got {weights!r}")
    w_outcome, w_process, w_efficiency = weights
    num_turns = process.shape[1]
    turn_index = jnp.arange(num_turns)
    last_turn = jnp.max(jnp.where(turn_mask, turn_index, -1), axis=1)
    is_last = turn_index[None, :] == last_turn[:, None]
    rewards = (
        w_outcome * jnp.where(is_last, outcome.astype(jnp.float32)[:, None], 0.0)
        + w_process * process.astype(jnp.float32)
        + w_efficiency * efficiency
    )
    return jnp.where(turn_mask, rewards, 0.0)


def prm_rewards(
    scores: jax.Array,
    turn_mask: jax.Array,
    *,
    form: str,
    temperature: float = 0.1,
    gamma: float = 1.0,
    final_potential: jax.Array | None = None,
) -> jax.Array:
    """Per-turn rewards from per-step process-reward-model scores.

    Over the valid turns of a row, in order:

    * `"sum"`: `r_s = score_s`, the usual summed process reward.
    * `"min"` (min-form credit assignment, Cheng et al., 2025, "Stop Summation"): with
      `M_s = sum_{s' >= s} softmax_{s' >= s}(-score / T)_{s'} * score_{s'}` the soft
      minimum of the future scores and `M_{S} = 0`, `r_s = M_s - M_{s+1}`. The undiscounted
      return from `s` is exactly `M_s`, which tends to `min_{s' >= s} score_{s'}` as
      `T -> 0`. The return of the first turn, `M_0 = sum_s softmax_s(-score/T) score_s`,
      is the paper's transformed total. Use with a `gamma = 1` return.
    * `"potential"` (Ng et al., 1999): `r_s = gamma * Phi_{s+1} - Phi_s` with
      `Phi_s = score_s` and, after the last valid turn, `Phi = final_potential` (default
      0: the episode terminated, so that for `gamma = 1` its rewards sum to `-Phi_0`
      whatever the trajectory). A row cut off by a turn limit and bootstrapped from
      `V(s_S)` must pass the potential of that state: with 0, the shaped return would
      subtract `Phi(s_S)` once in the last reward and again inside the bootstrap value.

    `"sum"` and `"min"` ignore `gamma`.

    Args:
      scores: `[B, S]` float step scores.
      turn_mask: `[B, S]` bool valid turns; invalid turns are bridged.
      form: `"sum"`, `"min"` or `"potential"`.
      temperature: softmin temperature of `"min"`, > 0 (checked when a Python number); a
        traced 0 gives the hard minimum, a traced negative value is the caller's contract.
      gamma: discount of the potential-based shaping, in `[0, 1]`.
      final_potential: `[B]` float potential after the last valid turn (`"potential"`
        only; default zeros).

    Returns:
      `[B, S]` float32 per-turn rewards, 0 on invalid turns.
    """
    if form not in PRM_FORMS:
        raise ValueError(f"`form` must be one of {PRM_FORMS}, got {form!r}")
    _check_float("scores", scores, 2)
    _check_mask("turn_mask", turn_mask, scores)
    scores = scores.astype(jnp.float32)
    if form == "sum":
        return jnp.where(turn_mask, scores, 0.0)
    if form == "potential":
        _check_range("gamma", gamma, 0.0, 1.0)
        if final_potential is None:
            final_potential = jnp.zeros(scores.shape[:1], jnp.float32)
        _check_float("final_potential", final_potential, 1)
        chex.assert_equal_shape_prefix(
            [final_potential, scores], 1, custom_message="`final_potential` must be [B]"
        )
        last = final_potential.astype(jnp.float32)
        next_potential = _next_unmasked(scores, turn_mask, last)
        return jnp.where(turn_mask, gamma * next_potential - scores, 0.0)
    _check_range("temperature", temperature, 0.0, open_low=True)
    num_turns = scores.shape[1]
    turn_index = jnp.arange(num_turns)
    # future[b, s, s'] selects the valid turns s' >= s; S is small at turn level, so the
    # O(S^2) softmin is cheaper and simpler than a streaming one.
    future = (turn_index[None, :] >= turn_index[:, None])[None] & turn_mask[:, None, :]
    has_future = jnp.any(future, axis=-1, keepdims=True)
    # Scores above the future minimum, so the minimum has logit 0 and a traced
    # temperature of 0 gives the hard minimum (its limit) instead of 0 / 0.
    future_min = jnp.min(jnp.where(future, scores[:, None, :], jnp.inf), axis=-1, keepdims=True)
    excess = jnp.where(future, scores[:, None, :] - jnp.where(has_future, future_min, 0.0), 0.0)
    inverse_temperature = jnp.where(temperature > 0, 1.0 / temperature, jnp.inf)
    logits = jnp.where(future, jnp.where(excess > 0, -excess * inverse_temperature, 0.0), -jnp.inf)
    weights = jax.nn.softmax(jnp.where(has_future, logits, 0.0), axis=-1)
    soft_min = jnp.sum(jnp.where(future, weights * scores[:, None, :], 0.0), axis=-1)
    next_soft_min = _next_unmasked(soft_min, turn_mask, jnp.zeros(scores.shape[:1]))
    return jnp.where(turn_mask, soft_min - next_soft_min, 0.0)


# --------------------------------------------------------------------------- helpers


def _next_unmasked(x: jax.Array, mask: jax.Array, last: jax.Array) -> jax.Array:
    """`[B, T]`: x at the first unmasked position strictly after t, else `last [B]`."""
    next_mask = jnp.concatenate([mask[:, 1:], jnp.ones_like(mask[:, :1])], axis=1)
    next_x = jnp.concatenate([x[:, 1:], last[:, None].astype(x.dtype)], axis=1)
    # A reverse fill: y_t = x_{t+1} if mask_{t+1} else y_{t+1}.
    return _bridged_recurrence(jnp.where(next_mask, next_x, 0.0), mask, 0.0, last)
