"""Returns over masked rows and per-turn reward construction.

All recursions here *bridge* masked positions (DESIGN.md "Kernel contracts"): a position
whose `mask` is False is skipped by the recursion, it neither discounts nor contributes a
value, its output is 0, and a reward found on it is credited to the closest earlier
unmasked position of the same row. Rewards before the first unmasked position of a row
have no action to credit and are dropped. Under this convention every estimator equals
its plain counterpart run on the compressed sequence of unmasked positions.

The private helpers `_check_*` and `_lambda_recurrence` (with its blocked and sequential
solves of the bridged recursion) are shared with `rlagent.advantages`.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

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
      `Phi_s = score_s` and `Phi = 0` after the last valid turn, so that for `gamma = 1`
      the rewards of an episode sum to `-Phi_0` whatever the trajectory.

    `"sum"` and `"min"` ignore `gamma`.

    Args:
      scores: `[B, S]` float step scores.
      turn_mask: `[B, S]` bool valid turns; invalid turns are bridged.
      form: `"sum"`, `"min"` or `"potential"`.
      temperature: softmin temperature of `"min"`, > 0 (checked when a Python number); a
        traced 0 gives the hard minimum, a traced negative value is the caller's contract.
      gamma: discount of the potential-based shaping, in `[0, 1]`.

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
        next_potential = _next_unmasked(scores, turn_mask, jnp.zeros(scores.shape[:1]))
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


def _check_float(name: str, x: jax.Array, rank: int | None) -> None:
    """Trace-time check that `x` is a floating array of the given rank."""
    if rank is not None:
        chex.assert_rank(x, rank, custom_message=f"`{name}` must have rank {rank}")
    chex.assert_type(
        x,
        float,
        custom_message=f"`{name}` must be floating point (an integer buffer truncates rewards)",
    )


def _check_range(
    name: str, value: object, low: float, high: float = np.inf, *, open_low: bool = False
) -> None:
    """Checks `low <= value <= high` (`low < value` if `open_low`; NaN fails) when `value`
    is a Python or NumPy number. A traced value cannot be checked at trace time: the range
    is then the caller's contract, stated in the kernel's docstring."""
    if not _is_static(value):
        return
    above = value > low if open_low else value >= low
    if not (above and value <= high):
        bound = f"{'(' if open_low else '['}{low}, {high}{']' if high < np.inf else ')'}"
        raise ValueError(f"`{name}` must lie in {bound}, got {value}")


def _check_mask(name: str, mask: jax.Array, like: jax.Array) -> None:
    """Trace-time check that `mask` is bool and shaped like `like`."""
    chex.assert_type(mask, bool, custom_message=f"`{name}` must be bool")
    chex.assert_equal_shape([mask, like], custom_message=f"`{name}` must match {like.shape}")


def _check_like(name: str, x: jax.Array, like: jax.Array) -> jax.Array:
    """Checks a float array shaped like `like` and returns it as float32."""
    _check_float(name, x, like.ndim)
    chex.assert_equal_shape([x, like], custom_message=f"`{name}` must have shape {like.shape}")
    return x.astype(jnp.float32)


def _check_rows(
    name: str, x: jax.Array, mask: jax.Array, bootstrap_value: jax.Array | None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Validates `[B, T]` float rows, their bool mask and an optional `[B]` bootstrap."""
    _check_float(name, x, 2)
    _check_mask("mask", mask, x)
    if bootstrap_value is None:
        bootstrap_value = jnp.zeros(x.shape[:1], jnp.float32)
    else:
        _check_float("bootstrap_value", bootstrap_value, 1)
        chex.assert_equal_shape_prefix(
            [bootstrap_value, x], 1, custom_message="`bootstrap_value` must be [B]"
        )
    return x.astype(jnp.float32), mask, bootstrap_value.astype(jnp.float32)


def _next_unmasked(x: jax.Array, mask: jax.Array, last: jax.Array) -> jax.Array:
    """`[B, T]`: x at the first unmasked position strictly after t, else `last [B]`."""
    next_mask = jnp.concatenate([mask[:, 1:], jnp.ones_like(mask[:, :1])], axis=1)
    next_x = jnp.concatenate([x[:, 1:], last[:, None].astype(x.dtype)], axis=1)
    # A reverse fill: y_t = x_{t+1} if mask_{t+1} else y_{t+1}.
    return _bridged_recurrence(jnp.where(next_mask, next_x, 0.0), mask, 0.0, last)


def _bridged_recurrence(
    inputs: jax.Array, mask: jax.Array, discount: float, init: jax.Array
) -> jax.Array:
    """`y_t = inputs_t + c_t * y_{t+1}`, `c_t = discount` if t+1 is unmasked, else 1.

    Position T counts as unmasked and holds `init [B]`. At an unmasked `p_k`, `y` is the
    sum of `inputs` over `[p_k, p_{k+1})` plus `discount * y_{p_{k+1}}`: the plain
    discounted recursion over the compressed sequence, with the inputs of masked
    positions folded into the closest earlier unmasked one.

    A discount known at trace time whose `_BLOCK`-th power is a normal float32 takes the
    blocked solve (`_blocked_recurrence`); a traced discount, or one such as 0 whose
    powers underflow, takes the sequential scan.
    """
    next_mask = jnp.concatenate([mask[:, 1:], jnp.ones_like(mask[:, :1])], axis=1)
    if (
        _is_static(discount)
        and 0.0 < discount
        and (_BLOCK_DECAY_RANGE[0] <= float(discount) ** _BLOCK <= _BLOCK_DECAY_RANGE[1])
    ):
        return _blocked_recurrence(inputs, next_mask, float(discount), init)
    discount = jnp.asarray(discount, jnp.float32)

    # Scanning the bool mask rather than a float coefficient array moves 4x fewer bytes
    # through the time-major transpose.
    def step(carry, x):
        step_input, step_next_mask = x
        carry = step_input + jnp.where(step_next_mask, discount * carry, carry)
        return carry, carry

    _, outputs = lax.scan(step, init, (inputs.T, next_mask.T), reverse=True)
    return outputs.T


# Time block of `_blocked_recurrence`: the bits of a block's next-mask are packed into one
# uint32, and a [B * T / 32, 32] x [32, 32] matmul is cheap next to a 4096-step scan.
_BLOCK = 32
# `discount^k` must stay a normal float32 for the rescaling inside a block to be exact to
# rounding; outside this range (e.g. lam = 0) the sequential scan is used.
_BLOCK_DECAY_RANGE = (1e-30, 1e30)


def _is_static(*xs: object) -> bool:
    """Whether every `x` is a Python or NumPy scalar, i.e. known at trace time."""
    return all(isinstance(x, (int, float, np.integer, np.floating)) for x in xs)


def _blocked_recurrence(
    inputs: jax.Array, next_mask: jax.Array, decay: float, init: jax.Array
) -> jax.Array:
    """`_bridged_recurrence` solved in blocks of `_BLOCK` steps with one matmul (`[B, T]`).

    The recursion is `y_t = x_t + c_t y_{t+1}` with `c_t = d` where `next_mask_t` and 1
    (bridge) elsewhere, `y_T = init`. Within a block `[s_0, s_0 + k)`, with `K_t` the
    number of discounting steps `s_0 <= u < t`,

        y_t = d^{-K_t} sum_{t <= s < s_0 + k} d^{K_s} x_s + d^{K_k - K_t} y_{s_0 + k},

    so the in-block part is a reverse cumulative sum of `d^{K_s} x_s` (a matmul with a
    triangular ones matrix) and only the `T / k` block carries `y_{s_0}` need a scan.
    `K_t` is a popcount of the block's packed next-mask bits. No transpose of a `[B, T]`
    array is needed, which is what dominates the time-major scan on CPU. Requires `d^k`
    to be a normal float32 (checked by `_bridged_recurrence`).
    """
    batch, length = inputs.shape
    log_decay = float(np.log(decay))
    # Padding with x = 0 and c = 1 (next_mask False) carries y_T = init through unchanged.
    pad = (-length) % _BLOCK
    if pad:
        inputs = jnp.pad(inputs, ((0, 0), (0, pad)))
        next_mask = jnp.pad(next_mask, ((0, 0), (0, pad)))
    num_blocks = (length + pad) // _BLOCK
    rows = batch * num_blocks
    bit = jnp.left_shift(jnp.uint32(1), jnp.arange(_BLOCK, dtype=jnp.uint32))
    # Bits are disjoint, so the sum is their bitwise or.
    packed = jnp.sum(
        jnp.where(next_mask.reshape(rows, _BLOCK), bit, jnp.uint32(0)),
        axis=1,
        keepdims=True,
        dtype=jnp.uint32,
    )
    count_before = lax.population_count(packed & (bit - jnp.uint32(1))).astype(jnp.float32)
    count_block = lax.population_count(packed).astype(jnp.float32)  # [rows, 1]
    scale = jnp.exp(count_before * log_decay)  # d^{K_t}, in [d^k, 1]
    index = np.arange(_BLOCK)
    upper = jnp.asarray(index[:, None] >= index[None, :], jnp.float32)  # [s, t]: s >= t
    # HIGHEST keeps the matmul in float32 on accelerators that default to bf16 passes.
    partial = jnp.dot(
        inputs.astype(jnp.float32).reshape(rows, _BLOCK) * scale,
        upper,
        precision=lax.Precision.HIGHEST,
    )
    # Block carries: Y_b = partial_b[0] + d^{K_k, b} Y_{b+1} (K_0 = 0, so no rescale).
    block_first = partial[:, 0].reshape(batch, num_blocks).T
    block_decay = jnp.exp(count_block[:, 0] * log_decay).reshape(batch, num_blocks).T

    def step(carry: jax.Array, x: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        first, block_discount = x
        return first + block_discount * carry, carry

    _, carry_in = lax.scan(step, init.astype(jnp.float32), (block_first, block_decay), reverse=True)
    # d^{K_k - K_t} Y_{b+1} = d^{K_k} Y_{b+1} / d^{K_t}: one division per element.
    carry_in = block_decay.T.reshape(rows, 1) * carry_in.T.reshape(rows, 1)
    outputs = (partial + carry_in) / scale
    return outputs.reshape(batch, num_blocks * _BLOCK)[:, :length]


def _lambda_recurrence(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    bootstrap_value: jax.Array,
    gamma: float,
    lam: float,
) -> jax.Array:
    """Bridged lambda-returns as one reverse recursion (valid where `mask` is True).

    Unrolling `G_k = R_k + gamma (1 - lam) V_{k+1} + gamma lam G_{k+1}` shows that the
    value `V_{k+1}` only needs to be added, with weight `gamma (1 - lam)`, somewhere in
    the segment of `p_k`. Adding it on the position just before `p_{k+1}` (where the
    next position is unmasked) needs a shift of `values` by one instead of a second
    recursion that finds the next unmasked value. The bootstrap value enters with weight
    `gamma` since it is never followed by a `- V` term.
    """
    length = rewards.shape[1]
    next_mask = jnp.concatenate([mask[:, 1:], jnp.ones_like(mask[:, :1])], axis=1)
    next_values = jnp.concatenate([values[:, 1:], bootstrap_value[:, None]], axis=1)
    is_last = jnp.arange(length) == length - 1
    value_weight = jnp.where(is_last, gamma, gamma * (1.0 - lam))
    inputs = rewards + jnp.where(next_mask, value_weight * next_values, 0.0)
    return _bridged_recurrence(inputs, mask, gamma * lam, jnp.zeros_like(bootstrap_value))
