"""The bridged reverse recursion behind every return and GAE kernel, and its two solves.

`_bridged_recurrence` is `y_t = inputs_t + c_t y_{t+1}` where masked positions are skipped
(docs/architecture.md, "Kernel contracts"); `_lambda_recurrence` writes bridged
lambda-returns as one such recursion. A discount known at trace time takes the blocked
solve (a triangular matmul per block of `_BLOCK` steps and a scan over block carries),
otherwise a sequential `lax.scan`; both agree to float32 rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


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
