"""Teacher-forced log-probs of text-mode trajectories, as the text loop sampled them.

A text `Trajectory` (`rlagent.text.loop.to_trajectory`) stores each turn as the template
tokens it read, PAD after them, then the ids the policy generated, PAD after END. The
policy read the transcript without those PADs, at consecutive positions; so scoring packs
each row's tokens (template tokens, `obs != PAD`, and generated ones, `loss_mask`) to the
front in order, runs the LM once over the packed rows (causal, the pads after them never
attended to) and scatters the log-probs of generated ids back to `[B, S, L]`. With the
loop's temperature and sampling mask these are the behaviour log-probs up to float
rounding (`tests/test_text.py`), the ratio's denominator of a text-mode PPO.

The packed rows are `TextConfig.transcript_len` (P + L) wide, the longest transcript the
loop lets an episode have, instead of the trajectory's S * (O + L) slots: most of those
slots are PAD (every turn's O slots are sized for the longest template read), and the LM's
cost grows with the width. A row whose transcript would not fit scores NaN, never a
truncated number (`to_trajectory` refuses such episodes first).

With a history window (`TextConfig.history_window` = W > 0) the policy read each turn's
tokens with only the header (the tokens before the first turn's ids) and the last W turns
in its cache, the turns before evicted (`rlagent.text.loop`); the scorer reads the same
context through a `TurnWindow` mask over the packed transcript, at the same positions.
A token's turn: turn s's ids and the template tokens after them (read before turn s + 1)
are turn s, the header -1. A token's read turn (when its keys were computed): the template
tokens read before turn s and turn s's ids are read at turn s, except the last id, which
the sampler feeds at turn s + 1. A query read at turn r sees the header and turns >= r - W.

`make_text_values` runs a critic (`rlagent.models.policy.ValueLM`) over the same packed
transcripts and scatters its values back the same way: text-mode PPO's V (the whole
transcript: the critic is no policy, it may read more than the policy did).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rlagent.models.llama import PolicyConfig
from rlagent.models.llama import TurnWindow
from rlagent.models.sampler import allowed_to_mask
from rlagent.models.sampler import as_llama
from rlagent.models.sampler import token_log_probs
from rlagent.text.chat import ChatFormat
from rlagent.text.loop import TextConfig
from rlagent.types import Trajectory
from rlagent.types import token_view


def make_text_score(
    chat: ChatFormat, graphdef: nnx.GraphDef, policy_config: PolicyConfig, config: TextConfig
) -> Callable[[nnx.State, Trajectory], jax.Array]:
    """`score(params, trajectory) -> [B, S, L]` float32 log pi of the generated ids (0
    elsewhere), pi = softmax(logits / temperature + sampling mask) as the loop samples."""
    logits_mask = allowed_to_mask(jnp.asarray(chat.sampling_mask(policy_config.vocab_size)))

    @jax.jit
    def score(params: nnx.State, trajectory: Trajectory) -> jax.Array:
        lm = as_llama(nnx.merge(graphdef, params))
        window = config.history_window
        packed, hidden = _packed_hidden(
            lm, trajectory, chat.pad_id, config.transcript_len, window=window
        )
        reading, targets, generated = packed.predictors(trajectory)
        hidden = jnp.take_along_axis(hidden, reading[..., None], axis=1)  # [B, N, D]
        token_logp = token_log_probs(
            hidden, lm.head(), targets, temperature=config.temperature, mask=logits_mask,
            block=policy_config.vocab_block,
        )  # fmt: skip
        return packed.generated(packed.scatter(reading, token_logp, generated), trajectory)

    return score


def make_text_values(
    chat: ChatFormat, graphdef: nnx.GraphDef, config: TextConfig
) -> Callable[[nnx.State, Trajectory], jax.Array]:
    """`values(critic_params, trajectory) -> [B, S, L]` float32 V of a `ValueLM` critic
    (`rlagent.models.policy`) at each generated id (0 elsewhere): the value of a token is
    read from the hidden state that predicts it (the state before the policy emitted it),
    as the policy's log-prob is, so V at a turn's first id is the value of the transcript
    the turn was sampled from."""

    @jax.jit
    def values(params: nnx.State, trajectory: Trajectory) -> jax.Array:
        critic = nnx.merge(graphdef, params)
        packed, hidden = _packed_hidden(critic.lm, trajectory, chat.pad_id, config.transcript_len)
        return packed.generated(critic.values(hidden[:, :-1]), trajectory)

    return values


class Packed(NamedTuple):
    """A trajectory's transcripts packed to the front of each row (`pack_transcripts`)."""

    order: jax.Array  # [B, W] int32: packed position t holds the token_view's order[t].
    tokens: jax.Array  # [B, W] int32.
    loss_mask: jax.Array  # [B, T] bool: the token_view's generated positions.
    fits: jax.Array  # [B] bool: the row's transcript has at most W tokens.

    def predictors(self, trajectory: Trajectory) -> tuple[jax.Array, jax.Array, jax.Array]:
        """`(reading, targets, generated)` `[B, N]`, N = min(S * L, W - 1): the packed
        positions whose hidden state predicts a generated id (front-packed, in order), the
        ids they predict, and which of the N are real (a row generates at most S * L ids)."""
        generated = jnp.take_along_axis(self.loss_mask, self.order, axis=1)[:, 1:]  # [B, W-1]
        count = min(trajectory.action_tokens[0].size, generated.shape[1])
        reading = jnp.argsort(~generated, axis=1, stable=True)[:, :count]
        targets = jnp.take_along_axis(self.tokens[:, 1:], reading, axis=1)
        return reading, targets, jnp.take_along_axis(generated, reading, axis=1)

    def scatter(self, reading: jax.Array, values: jax.Array, generated: jax.Array) -> jax.Array:
        """`[B, N]` values at `predictors`' positions -> `[B, W - 1]` (0 elsewhere)."""
        rows = jnp.arange(reading.shape[0])[:, None]
        out = jnp.zeros((reading.shape[0], self.order.shape[1] - 1), values.dtype)
        return out.at[rows, reading].set(jnp.where(generated, values, 0.0))

    def generated(self, predicted: jax.Array, trajectory: Trajectory) -> jax.Array:
        """`[B, W - 1]` predictions made at packed positions 0..W-2 (each of the token
        after it) -> `[B, S, L]` at the generated ids they predict, 0 elsewhere (NaN at
        every generated id of a row that does not fit)."""
        predicted = jnp.pad(predicted, ((0, 0), (1, 0)))  # position 0 is predicted by none.
        rows = jnp.arange(self.order.shape[0])[:, None]
        unpacked = jnp.zeros(self.loss_mask.shape, predicted.dtype)
        unpacked = unpacked.at[rows, self.order].set(predicted)
        unpacked = jnp.where(self.fits[:, None], unpacked, jnp.nan)
        unpacked = jnp.where(self.loss_mask, unpacked, 0.0)
        batch, turns, turn_len = trajectory.action_tokens.shape
        per_turn = unpacked.reshape(batch, turns, -1)
        return per_turn[..., per_turn.shape[-1] - turn_len :]


def _packed_hidden(lm, trajectory: Trajectory, pad_id: int, width: int, *, window: int = 0):
    """`(Packed, [B, W, D] hidden states)`: the trajectory's transcripts packed into
    `width` positions and the trunk's hidden states there (with a history `window` > 0,
    each position attending what the sampler's cache held: `turn_window`)."""
    view = token_view(trajectory)
    order, tokens, valid = pack_transcripts(view, pad_id, width)
    turns = turn_window(trajectory, order, window) if window else None
    hidden, _ = lm(lm.embed(tokens), valid, window=turns)
    fits = jnp.sum((view.tokens != pad_id) | view.loss_mask, axis=1) <= tokens.shape[1]
    return Packed(order, tokens, view.loss_mask, fits), hidden


def turn_window(trajectory: Trajectory, order: jax.Array, window: int) -> TurnWindow:
    """The `TurnWindow` of packed positions (`order`, `pack_transcripts`') for a history of
    `window` turns: each token's turn and its read turn - window (the module docstring)."""
    batch, turns, obs_len = trajectory.obs_tokens.shape
    act_len = trajectory.action_tokens.shape[-1]
    turn = jnp.arange(turns, dtype=jnp.int32)[None, :, None]
    last = jnp.sum(trajectory.action_mask, axis=-1, keepdims=True) - 1  # [B, S, 1]
    fed_later = jnp.arange(act_len) == last  # the id the sampler feeds at the next turn.
    obs_shape, act_shape = (batch, turns, obs_len), (batch, turns, act_len)
    own = jnp.concatenate(
        [jnp.broadcast_to(turn - 1, obs_shape), jnp.broadcast_to(turn, act_shape)], axis=-1
    )
    read = jnp.concatenate(
        [jnp.broadcast_to(turn, obs_shape), turn + fed_later.astype(jnp.int32)], axis=-1
    )

    def packed(x):
        return jnp.take_along_axis(x.reshape(batch, -1), order, axis=1)

    return TurnWindow(floor=packed(read) - window, turn=packed(own))


def pack_transcripts(
    view, pad_id: int, width: int | None = None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`(order, packed, valid)` `[B, W]` of a `token_view`: each row's transcript (template
    tokens, `!= PAD`, and generated ids, `loss_mask`) moved to the front in its order
    (`packed = tokens[order]`, stable), `valid` True on those positions; W = `width`
    (a row's tokens after it are dropped), or the view's T when None or wider."""
    keep = (view.tokens != pad_id) | view.loss_mask
    order = jnp.argsort(~keep, axis=1, stable=True)[:, :width]
    return (
        order,
        jnp.take_along_axis(view.tokens, order, axis=1),
        jnp.take_along_axis(keep, order, axis=1),
    )
