"""Advantage estimators: token- and turn-level GAE, turn <-> token broadcast,
hierarchical (turn critic, token actor), group-relative (GRPO, Dr.GRPO, RLOO, GiGPO),
REINFORCE++ and masked whitening.

Masked positions are bridged as described in `rlagent.returns`.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from rlagent._checks import _check_float
from rlagent._checks import _check_like
from rlagent._checks import _check_mask
from rlagent._checks import _check_range
from rlagent._checks import _check_rows
from rlagent._recurrence import _lambda_recurrence
from rlagent.returns import discounted_returns

SCALES = ("std", "none")
TURN_POSITIONS = ("first", "last")


class GAEOutput(NamedTuple):
    advantages: jax.Array  # [B, T] float32, 0 where mask is False.
    returns: jax.Array  # [B, T] float32: advantages + values, 0 where mask is False.


class HierarchicalOutput(NamedTuple):
    token_advantages: jax.Array  # [B, T] float32, 0 off policy tokens.
    turn_advantages: jax.Array  # [B, S] float32 turn-level GAE, 0 on invalid turns.
    turn_returns: jax.Array  # [B, S] float32 turn-level lambda-returns (critic targets).


class ReinforcePPOutput(NamedTuple):
    advantages: jax.Array  # [B, T] float32 whitened returns, 0 where mask is False.
    returns: jax.Array  # [B, T] float32 bridged discounted returns.


class GiGPOOutput(NamedTuple):
    advantages: jax.Array  # [N, S] float32 episode + omega * step advantage per turn.
    episode_advantages: jax.Array  # [N] float32 group-relative episode advantage.
    step_advantages: jax.Array  # [N, S] float32 anchor-group-relative step advantage.


def gae(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    *,
    gamma: float,
    lam: float,
    bootstrap_value: jax.Array | None = None,
) -> GAEOutput:
    """Generalised advantage estimation that bridges masked positions.

    With `p_0 < p_1 < ... < p_{n-1}` the unmasked positions of a row, `R_k` the sum of
    the rewards on `[p_k, p_{k+1})` (a reward on a tool-output token is credited to the
    closest earlier policy token; rewards before `p_0` are dropped), `V_k = values[p_k]`
    and `V_n = bootstrap_value`:

        delta_k = R_k + gamma * V_{k+1} - V_k
        A_k = delta_k + gamma * lam * A_{k+1},    A_n = 0

    (Schulman et al., 2016, eq. 16). Masked positions do not discount, their values are
    ignored and their outputs are 0: the result equals plain GAE on the compressed
    sequence. Use `mask = loss_mask` at token level and `mask = turn_mask` at turn level.

    Args:
      rewards: `[B, T]` float rewards.
      values: `[B, T]` float value estimates, read only where `mask` is True.
      mask: `[B, T]` bool, True on the positions the estimator runs over.
      gamma: discount per unmasked step, in `[0, 1]`.
      lam: GAE lambda, in `[0, 1]` (both checked when Python numbers; traced values are
        the caller's contract).
      bootstrap_value: `[B]` value after the last unmasked position (default 0).

    Returns:
      `GAEOutput(advantages, returns)`, both `[B, T]` float32 with
      `returns = advantages + values` where `mask` is True, 0 elsewhere.
    """
    rewards, mask, bootstrap_value = _check_rows("rewards", rewards, mask, bootstrap_value)
    values = _check_like("values", values, rewards)
    _check_range("gamma", gamma, 0.0, 1.0)
    _check_range("lam", lam, 0.0, 1.0)
    # A_k = G^lambda_k - V_k: one reverse recursion for the lambda-return instead of a
    # recursion over TD errors that would need the next unmasked value first.
    lam_returns = _lambda_recurrence(rewards, values, mask, bootstrap_value, gamma, lam)
    returns = jnp.where(mask, lam_returns, 0.0)
    return GAEOutput(jnp.where(mask, returns - values, 0.0), returns)


def turns_to_tokens(turn_x: jax.Array, turn_ids: jax.Array, fill: float = 0.0) -> jax.Array:
    """Broadcasts per-turn values to tokens: `out[b, t] = turn_x[b, turn_ids[b, t]]`.

    Args:
      turn_x: `[B, S]` per-turn values.
      turn_ids: `[B, T]` int, the turn of each policy token, -1 elsewhere. Ids must lie
        in `[-1, S)`; larger ids are clamped to `S - 1`.
      fill: value of tokens with `turn_ids == -1`.

    Returns:
      `[B, T]` array of `turn_x`'s dtype.
    """
    chex.assert_rank(turn_x, 2, custom_message="`turn_x` must be [B, S]")
    _check_turn_ids(turn_ids, turn_x)
    gathered = jnp.take_along_axis(turn_x, jnp.clip(turn_ids, 0, turn_x.shape[1] - 1), axis=1)
    return jnp.where(turn_ids >= 0, gathered, jnp.asarray(fill, turn_x.dtype))


def tokens_to_turns(
    token_x: jax.Array,
    turn_ids: jax.Array,
    *,
    num_turns: int,
    position: str = "first",
    fill: float = 0.0,
    check_inputs: bool = False,
) -> jax.Array:
    """Reads one token per turn: `out[b, s] = token_x[b, t_s]`.

    `t_s` is the first (`position="first"`, e.g. the value of the state the turn starts
    from) or last (`position="last"`) token of turn `s` in row `b`.

    Args:
      token_x: `[B, T]` per-token values.
      turn_ids: `[B, T]` int turn of each policy token, -1 elsewhere; ids must lie in
        `[-1, num_turns)` (a larger id would be dropped with its turn). Checked when
        `turn_ids` is concrete; traced, only with `check_inputs` (see `_check_ids`).
      num_turns: S, the number of turn slots.
      position: `"first"` or `"last"`.
      fill: value of turns without any token.
      check_inputs: check traced ids at run time (needs `checkify.checkify`).

    Returns:
      `[B, S]` array of `token_x`'s dtype.
    """
    if position not in TURN_POSITIONS:
        raise ValueError(f"`position` must be one of {TURN_POSITIONS}, got {position!r}")
    chex.assert_rank(token_x, 2, custom_message="`token_x` must be [B, T]")
    _check_turn_ids(turn_ids, token_x, same_shape=True)
    _check_range("num_turns", num_turns, 1)
    _check_ids("turn_ids", turn_ids, -1, num_turns, check_inputs)
    batch, length = token_x.shape
    rows = jnp.arange(batch)[:, None]
    # Tokens outside any turn scatter to slot `num_turns`, which mode="drop" discards.
    slots = jnp.where(turn_ids >= 0, turn_ids, num_turns)
    times = jnp.broadcast_to(jnp.arange(length), token_x.shape)
    if position == "first":
        index = jnp.full((batch, num_turns), length).at[rows, slots].min(times, mode="drop")
    else:
        index = jnp.full((batch, num_turns), -1).at[rows, slots].max(times, mode="drop")
    present = (index >= 0) & (index < length)
    picked = jnp.take_along_axis(token_x, jnp.clip(index, 0, length - 1), axis=1)
    return jnp.where(present, picked, jnp.asarray(fill, token_x.dtype))


def hierarchical_advantages(
    turn_rewards: jax.Array,
    turn_values: jax.Array,
    turn_mask: jax.Array,
    turn_ids: jax.Array,
    *,
    gamma: float,
    lam: float,
    token_values: jax.Array | None = None,
    bootstrap_value: jax.Array | None = None,
) -> HierarchicalOutput:
    """Turn-level critic, token-level actor (ArCHer, Zhou et al., 2024).

    The turn critic gives `A_s = gae(turn_rewards, turn_values, turn_mask)` and the turn
    action value `Q_s = A_s + V_s`. Every policy token `t` of turn `s` receives

        A_t = Q_s - b_t,   b_t = token_values_t  if given, else V_s (so A_t = A_s),

    i.e. ArCHer's token-level advantage of the turn-level Q against a token-level value
    baseline inside the turn. With `token_values` whose first token in a turn equals
    `V_s` (e.g. `turn_values = tokens_to_turns(token_values, ..., position="first")`),
    the first token of each turn receives exactly `A_s`.

    Args:
      turn_rewards: `[B, S]` float rewards per turn.
      turn_values: `[B, S]` float turn-critic values `V_s`.
      turn_mask: `[B, S]` bool valid turns.
      turn_ids: `[B, T]` int turn of each policy token, -1 elsewhere.
      gamma: discount per turn.
      lam: GAE lambda over turns.
      token_values: optional `[B, T]` float token-level baseline.
      bootstrap_value: `[B]` value after the last valid turn (default 0).

    Returns:
      `HierarchicalOutput(token_advantages [B, T], turn_advantages [B, S],
      turn_returns [B, S])`; token advantages are 0 where `turn_ids == -1`.
    """
    turn_adv, turn_returns = gae(
        turn_rewards,
        turn_values,
        turn_mask,
        gamma=gamma,
        lam=lam,
        bootstrap_value=bootstrap_value,
    )
    _check_turn_ids(turn_ids, turn_rewards)
    if token_values is None:
        token_adv = turns_to_tokens(turn_adv, turn_ids)
    else:
        token_values = _check_like("token_values", token_values, turn_ids.astype(jnp.float32))
        token_q = turns_to_tokens(turn_returns, turn_ids)
        token_adv = jnp.where(turn_ids >= 0, token_q - token_values, 0.0)
    return HierarchicalOutput(token_adv, turn_adv, turn_returns)


def grpo_advantages(
    scores: jax.Array,
    group_ids: jax.Array,
    *,
    num_groups: int,
    scale: str = "std",
    eps: float = 1e-6,
    check_inputs: bool = False,
) -> jax.Array:
    """Group-relative advantages `A_i = (s_i - mean_g) / (std_g + eps)` (GRPO).

    `std_g` is the unbiased standard deviation of the group of sample `i` (Shao et al.,
    2024); `scale="none"` drops the division (Dr. GRPO, Liu et al., 2025). A group of one
    sample gets 0: it has no baseline.

    Args:
      scores: `[N]` float scores (e.g. episode returns).
      group_ids: `[N]` int group of each sample (e.g. its prompt), in `[0, num_groups)`
        (an id outside would silently leave its sample without a group). Checked when
        concrete; traced, only with `check_inputs` (see `_check_ids`).
      num_groups: number of group slots.
      scale: `"std"` or `"none"`.
      eps: added to the standard deviation, >= 0.
      check_inputs: check traced ids at run time (needs `checkify.checkify`).

    Returns:
      `[N]` float32 advantages.
    """
    _check_groups(scores, group_ids, scale, num_groups, check_inputs)
    _check_range("eps", eps, 0.0)
    return _group_relative(scores, group_ids, num_groups, scale, eps, None)


def rloo_advantages(
    scores: jax.Array, group_ids: jax.Array, *, num_groups: int, check_inputs: bool = False
) -> jax.Array:
    """Leave-one-out baseline `A_i = s_i - mean_{j != i, j in g(i)} s_j` (RLOO).

    Kool et al., 2019; Ahmadian et al., 2024. A group of one sample gets 0.

    Args:
      scores: `[N]` float scores.
      group_ids: `[N]` int group of each sample, in `[0, num_groups)` (checked as in
        `grpo_advantages`).
      num_groups: number of group slots.
      check_inputs: check traced ids at run time (needs `checkify.checkify`).

    Returns:
      `[N]` float32 advantages.
    """
    _check_groups(scores, group_ids, "none", num_groups, check_inputs)
    scores = scores.astype(jnp.float32)
    counts, mean, _ = _segment_stats(scores, group_ids, num_groups, None)
    count = counts[group_ids]
    others_mean = (count * mean[group_ids] - scores) / jnp.maximum(count - 1.0, 1.0)
    return jnp.where(count > 1, scores - others_mean, 0.0)


def turn_rloo_advantages(
    turn_returns: jax.Array,
    turn_mask: jax.Array,
    group_ids: jax.Array,
    *,
    num_groups: int,
    check_inputs: bool = False,
) -> jax.Array:
    """Turn-level leave-one-out baseline `A_{i,t} = G_{i,t} - mean_{j != i, j in g(i)} G_{j,t}`.

    `G_{j,t}` is episode j's return from turn index t, 0 once j has ended. The baseline of
    turn t of episode i is a function of turn t and of the other episodes of the group
    only, which are independent of episode i's actions, so `E[grad log pi(a_{i,t}) b] = 0`
    and the policy gradient stays unbiased even when the policy chooses how many turns it
    takes (the episodes that ended before t count with return 0 rather than dropping out
    of the mean).

    The per-turn-index normalisation of MT-GRPO-style estimators instead sums, over the
    turns k >= t that episode i itself still plays, a baseline of the episodes alive at k:
    the number of baseline terms is set by i's own stopping turn, an action-dependent
    baseline, and the expected gradient differs from the true one (verl-project/verl#7244;
    `tests/test_turn_baseline.py` enumerates a small task where both are exact).

    Args:
      turn_returns: `[B, S]` float returns from each turn (0 on unplayed turns).
      turn_mask: `[B, S]` bool, the played turns.
      group_ids: `[B]` int group of each episode, in `[0, num_groups)` (checked as in
        `grpo_advantages`).
      num_groups: number of group slots.
      check_inputs: check traced ids at run time (needs `checkify.checkify`).

    Returns:
      `[B, S]` float32 advantages, 0 on unplayed turns and in groups of one episode.
    """
    chex.assert_rank(turn_returns, 2)
    chex.assert_equal_shape((turn_returns, turn_mask))
    returns = jnp.where(turn_mask, turn_returns, 0.0).astype(jnp.float32)
    per_turn = jax.vmap(
        lambda column: rloo_advantages(
            column, group_ids, num_groups=num_groups, check_inputs=check_inputs
        ),
        in_axes=1,
        out_axes=1,
    )(returns)
    return jnp.where(turn_mask, per_turn, 0.0)


def reinforce_pp_returns(
    rewards: jax.Array,
    mask: jax.Array,
    *,
    gamma: float,
    bootstrap_value: jax.Array | None = None,
    eps: float = 1e-8,
) -> ReinforcePPOutput:
    """REINFORCE++ (Hu, 2025): bridged discounted token returns, globally whitened.

    `G = discounted_returns(rewards, mask, gamma)` then `A = whiten(G, mask)` over every
    unmasked token of the batch. The return is carried across tool-output tokens, not
    reset there (resetting at observations truncates the credit of earlier turns).

    Args:
      rewards: `[B, T]` float token rewards (a KL penalty, if any, already folded in).
      mask: `[B, T]` bool loss mask.
      gamma: discount per policy token.
      bootstrap_value: `[B]` value after the last policy token (default 0).
      eps: added to the standard deviation in `whiten`.

    Returns:
      `ReinforcePPOutput(advantages, returns)`, both `[B, T]` float32, 0 off the mask.
    """
    returns = discounted_returns(rewards, mask, gamma=gamma, bootstrap_value=bootstrap_value)
    return ReinforcePPOutput(whiten(returns, mask, eps=eps), returns)


def gigpo_advantages(
    episode_returns: jax.Array,
    step_returns: jax.Array,
    anchor_ids: jax.Array,
    turn_mask: jax.Array,
    group_ids: jax.Array,
    *,
    num_groups: int,
    omega: float = 1.0,
    scale: str = "none",
    eps: float = 1e-6,
    check_inputs: bool = False,
) -> GiGPOOutput:
    """Group-in-group advantages (GiGPO, Feng et al., 2025).

    `A_{i,s} = A^E_i + omega * A^S_{i,s}` on valid turns, where `A^E` is the
    group-relative advantage of the episode returns (`grpo_advantages` with `scale`) and
    `A^S` the same statistic of `step_returns` within anchor groups: the valid turns of
    all episodes of a group that share an `anchor_id` (the same environment state). An
    anchor group of one turn gets step advantage 0.

    Args:
      episode_returns: `[N]` float episode returns.
      step_returns: `[N, S]` float (discounted) return from each turn.
      anchor_ids: `[N, S]` int id of the state each turn acted from; only equality
        matters.
      turn_mask: `[N, S]` bool valid turns.
      group_ids: `[N]` int group of each episode, in `[0, num_groups)` (checked as in
        `grpo_advantages`).
      num_groups: number of group slots.
      omega: weight of the step advantage.
      scale: `"none"` (GiGPO default) or `"std"`.
      eps: added to the standard deviations.
      check_inputs: check traced ids at run time (needs `checkify.checkify`).

    Returns:
      `GiGPOOutput(advantages [N, S], episode_advantages [N], step_advantages [N, S])`,
      per-turn outputs 0 on invalid turns.
    """
    episode_adv = grpo_advantages(
        episode_returns, group_ids, num_groups=num_groups, scale=scale, eps=eps,
        check_inputs=check_inputs,
    )  # fmt: skip
    _check_float("step_returns", step_returns, 2)
    _check_mask("turn_mask", turn_mask, step_returns)
    chex.assert_type(anchor_ids, int, custom_message="`anchor_ids` must be integer")
    chex.assert_equal_shape(
        [anchor_ids, step_returns], custom_message="`anchor_ids` must match `step_returns`"
    )
    chex.assert_equal_shape_prefix(
        [episode_returns, step_returns], 1, custom_message="`step_returns` must be [N, S]"
    )
    num_episodes, num_turns = step_returns.shape
    # Anchor groups are keyed by (episode group, anchor id); sorting the valid turns by
    # that key makes each anchor group a contiguous run whose index is its segment id.
    flat_group = jnp.broadcast_to(group_ids[:, None], step_returns.shape).reshape(-1)
    flat_anchor = anchor_ids.reshape(-1)
    flat_valid = turn_mask.reshape(-1)
    order = jnp.lexsort((flat_anchor, flat_group, ~flat_valid))
    sorted_group, sorted_anchor = flat_group[order], flat_anchor[order]
    starts = jnp.concatenate(
        [
            jnp.ones((1,), bool),
            (sorted_group[1:] != sorted_group[:-1]) | (sorted_anchor[1:] != sorted_anchor[:-1]),
        ]
    )
    segment_sorted = jnp.cumsum(starts) - 1
    segment = jnp.zeros_like(segment_sorted).at[order].set(segment_sorted)
    num_segments = num_episodes * num_turns
    # Invalid turns go to an extra segment so they never join a real anchor group.
    segment = jnp.where(flat_valid, segment, num_segments)
    step_flat = _group_relative(
        step_returns.reshape(-1), segment, num_segments + 1, scale, eps, flat_valid
    )
    step_adv = jnp.where(turn_mask, step_flat.reshape(step_returns.shape), 0.0)
    advantages = jnp.where(turn_mask, episode_adv[:, None] + omega * step_adv, 0.0)
    return GiGPOOutput(advantages, episode_adv, step_adv)


def whiten(
    x: jax.Array, mask: jax.Array, *, shift_mean: bool = True, eps: float = 1e-8
) -> jax.Array:
    """Masked whitening `(x - mean) / sqrt(var + eps)` over all unmasked entries.

    Mean and (population) variance are taken over the entries where `mask` is True,
    across the whole batch; `shift_mean=False` only rescales. Masked outputs are 0.

    Args:
      x: float array of any shape.
      mask: bool array of the same shape.
      shift_mean: subtract the masked mean.
      eps: added to the variance, >= 0 (checked when a Python number).

    Returns:
      float32 array shaped like `x`.
    """
    _check_float("x", x, None)
    _check_mask("mask", mask, x)
    _check_range("eps", eps, 0.0)
    x = x.astype(jnp.float32)
    masked = jnp.where(mask, x, 0.0)
    # Statistics of x / 2^k with 2^k <= max |x|: the square of values near 1e20 would
    # overflow float32, and a power-of-two scale is exact, so results are unchanged
    # wherever nothing overflows (k = 0 for |x| < 2). The scale is one scalar factor:
    # an elementwise `ldexp` costs more than the rest of the kernel. k stops at 126, as
    # 2^-127 is subnormal (flushed to 0 on CPU); max |x| < 2^128 still scales below 4.
    largest = jnp.maximum(jnp.max(masked), -jnp.min(masked))
    exponent = jnp.clip(jnp.frexp(largest)[1] - 1, 0, 126)
    scale = jnp.ldexp(jnp.float32(1.0), -exponent)
    count = _masked_count(mask)
    mean = _scaled_sum(masked, scale) / count
    scaled = x * scale
    var = jnp.sum(jnp.where(mask, jnp.square(scaled - mean), 0.0)) / count
    centred = scaled - mean if shift_mean else scaled
    scaled_eps = jnp.ldexp(jnp.asarray(eps, jnp.float32), -2 * exponent)
    return jnp.where(mask, centred * jax.lax.rsqrt(var + scaled_eps), 0.0)


# --------------------------------------------------------------------------- helpers


def _check_turn_ids(turn_ids: jax.Array, like: jax.Array, same_shape: bool = False) -> None:
    chex.assert_type(turn_ids, int, custom_message="`turn_ids` must be integer")
    chex.assert_rank(turn_ids, 2, custom_message="`turn_ids` must be [B, T]")
    if same_shape:
        chex.assert_equal_shape([turn_ids, like], custom_message="`turn_ids` must match [B, T]")
    else:
        chex.assert_equal_shape_prefix(
            [turn_ids, like], 1, custom_message="`turn_ids` and the turn array must share B"
        )


def _check_groups(
    scores: jax.Array, group_ids: jax.Array, scale: str, num_groups: int, check_inputs: bool
) -> None:
    if scale not in SCALES:
        raise ValueError(f"`scale` must be one of {SCALES}, got {scale!r}")
    _check_float("scores", scores, 1)
    chex.assert_type(group_ids, int, custom_message="`group_ids` must be integer")
    chex.assert_equal_shape([scores, group_ids], custom_message="`group_ids` must match `scores`")
    _check_range("num_groups", num_groups, 1)
    _check_ids("group_ids", group_ids, 0, num_groups, check_inputs)


def _check_ids(name: str, ids: jax.Array, low: int, high: int, check_inputs: bool) -> None:
    """Ids in `[low, high)`: checked now when concrete (eager calls, NumPy inputs).

    Traced ids are only known at run time. With `check_inputs=True` the kernel adds a
    `checkify.check`, so the caller must functionalise it, e.g.
    `err, out = jax.jit(checkify.checkify(partial(kernel, check_inputs=True)))(...)`
    then `err.throw()`; without it the range is the caller's contract.
    """
    if not isinstance(ids, jax.core.Tracer):
        values = np.asarray(ids)
        if values.size and (values.min() < low or values.max() >= high):
            raise ValueError(
                f"`{name}` must lie in [{low}, {high}), got values in "
                f"[{values.min()}, {values.max()}]"
            )
    elif check_inputs:
        checkify.check(
            jnp.all((ids >= low) & (ids < high)),
            f"`{name}` must lie in [{low}, {high}), got values in [{{lo}}, {{hi}}]",
            lo=jnp.min(ids),
            hi=jnp.max(ids),
        )


def _masked_count(mask: jax.Array) -> jax.Array:
    """`max(sum(mask), 1)`, in float32 when that is exact (at most 2^24 entries): a float
    sum is cheaper than an int32 one on CPU, and the count is converted to float32 for
    the division anyway."""
    if mask.size <= 2**24:
        return jnp.maximum(jnp.sum(mask, dtype=jnp.float32), 1.0)
    return jnp.maximum(jnp.sum(mask), 1)


def _scaled_sum(masked: jax.Array, scale: jax.Array) -> jax.Array:
    """`sum(masked * scale)` for a power-of-two `scale`, without a pass to scale.

    `sum(masked) * scale` is the same number unless the unscaled sum overflowed; only
    then (a branch, so the usual case pays nothing) is the scaled sum taken.
    """
    total = jnp.sum(masked)
    return jax.lax.cond(jnp.isfinite(total), lambda: total * scale, lambda: jnp.sum(masked * scale))


def _segment_stats(
    x: jax.Array, segment: jax.Array, num_segments: int, valid: jax.Array | None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-segment count, mean and unbiased standard deviation of `x`."""
    weight = jnp.ones_like(x) if valid is None else valid.astype(jnp.float32)
    counts = jax.ops.segment_sum(weight, segment, num_segments=num_segments)
    mean = jax.ops.segment_sum(x * weight, segment, num_segments=num_segments) / jnp.maximum(
        counts, 1.0
    )
    sq = jax.ops.segment_sum(
        jnp.square(x - mean[segment]) * weight, segment, num_segments=num_segments
    )
    std = jnp.sqrt(sq / jnp.maximum(counts - 1.0, 1.0))
    return counts, mean, std


def _group_relative(
    x: jax.Array,
    segment: jax.Array,
    num_segments: int,
    scale: str,
    eps: float,
    valid: jax.Array | None,
) -> jax.Array:
    """`(x - mean_seg) [/ (std_seg + eps)]`, 0 in segments of one element."""
    counts, mean, std = _segment_stats(x.astype(jnp.float32), segment, num_segments, valid)
    centred = x - mean[segment]
    if scale == "std":
        centred = centred / (std[segment] + eps)
    return jnp.where(counts[segment] > 1, centred, 0.0)
