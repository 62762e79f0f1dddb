"""Sliding-window multi-turn state encoder.

The policy does not read the whole transcript. For turn `s` its context is, in slot order,

    [ summary (M vectors) | block(s-W) ... block(s-1) | obs_s (O) | markers_s (K) ] + action_s (L)

where a *turn block* `block(t) = [obs_t (O tokens) | markers_t (K vectors) | action_t (L tokens)]`
is the transcript of turn t as the policy lived it, `markers_t` are the task-progress markers
(0 absent / 1 pending / 2 done / 3 failed per subtask) shown with the observation, and the
summary is a learned recurrent compression of the turns that left the window:

    H_0 = h_init,   H_{t+1} = GRU(H_t, pool(block(t))),   summary(s) = Proj(H_{max(0, s-W)})

`pool` is attention pooling with a learned query over the valid embeddings of a block. The
context has C = M + W (O + K + L) + O + K slots whatever s is, so the cost of a turn does not
grow with the episode. Turns before the first (`t < 0`) and padding (PAD in observations,
positions after END in actions) are keys nobody attends to. Gradients flow through the
summary into the GRU, the pooling and the shared token embeddings.

Full-context mode concatenates `block(0) ... block(s-1), obs_s, markers_s`, i.e. the same blocks
without window or summary, as an LLM agent's append-only transcript.

All functions here act on one episode (no batch axis); callers vmap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rlagent.models.llama import NEG_INF
from rlagent.models.llama import PolicyConfig
from rlagent.models.llama import RMSNorm

EmbedFn = Callable[[jax.Array], jax.Array]


class StateEncoder(nnx.Module):
    """Marker / role embeddings and the recurrent summary of turns that left the window."""

    def __init__(self, config: PolicyConfig, *, rngs: nnx.Rngs):
        dim, hidden = config.d_model, config.summary_dim
        pdt = jnp.dtype(config.param_dtype)
        init = nnx.initializers.normal(0.02)
        self.config = config
        self.marker_state = nnx.Param(init(rngs.params(), (config.num_marker_states, dim), pdt))
        self.marker_slot = nnx.Param(init(rngs.params(), (config.max_markers, dim), pdt))
        # Observation and action tokens share the vocabulary; a role vector tells them apart.
        self.role = nnx.Param(init(rngs.params(), (2, dim), pdt))
        self.num_slots = config.num_summary_slots
        if self.num_slots:
            lin = dict(param_dtype=pdt, rngs=rngs)
            self.pool_query = nnx.Param(init(rngs.params(), (dim,), pdt))
            self.pool_norm = RMSNorm(dim, config.norm_eps, pdt)
            self.gru_x = nnx.Linear(dim, 3 * hidden, use_bias=True, **lin)
            self.gru_h = nnx.Linear(hidden, 3 * hidden, use_bias=False, **lin)
            self.h_init = nnx.Param(jnp.zeros((hidden,), pdt))
            self.slot_proj = nnx.Linear(hidden, self.num_slots * dim, use_bias=True, **lin)

    def markers(self, progress: jax.Array) -> jax.Array:
        """[K] int32 markers -> [K, D]: state embedding + per-subtask slot embedding."""
        chex.assert_rank(progress, 1)
        num = progress.shape[0]
        if num > self.config.max_markers:
            raise ValueError(
                f"progress has K={num} markers, more than max_markers={self.config.max_markers}"
            )
        state = jnp.clip(progress, 0, self.config.num_marker_states - 1)
        return self.marker_state[...][state] + self.marker_slot[...][:num]

    def observation(
        self, embed: EmbedFn, obs: jax.Array, progress: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """Embeds `obs [O]` tokens then `progress [K]` markers: ([O + K, D], valid [O + K])."""
        chex.assert_rank([obs, progress], 1)
        x = jnp.concatenate([embed(obs) + self.role[...][0], self.markers(progress)], axis=0)
        valid = jnp.concatenate([obs != self.config.pad_id, jnp.ones(progress.shape, bool)], axis=0)
        return x, valid

    def action(self, embed: EmbedFn, act: jax.Array) -> jax.Array:
        """[..., L] action tokens -> [..., L, D] embeddings (validity: the action mask)."""
        return embed(act) + self.role[...][1]

    def block(
        self,
        embed: EmbedFn,
        obs: jax.Array,
        progress: jax.Array,
        act: jax.Array,
        act_mask: jax.Array,
    ) -> tuple[jax.Array, jax.Array]:
        """One turn block [obs | markers | action]: ([O + K + L, D], valid [O + K + L])."""
        x_obs, v_obs = self.observation(embed, obs, progress)
        chex.assert_rank([act, act_mask], 1)
        x = jnp.concatenate([x_obs, self.action(embed, act)], axis=0)
        return x, jnp.concatenate([v_obs, act_mask.astype(bool)], axis=0)

    def initial_summary(self) -> jax.Array:
        """H_0: [summary_dim] (learned)."""
        if not self.num_slots:
            return jnp.zeros((0,), jnp.float32)
        return self.h_init[...].astype(jnp.float32)

    def absorb(self, summary: jax.Array, block_x: jax.Array, block_valid: jax.Array) -> jax.Array:
        """H_{t+1} = GRU(H_t, pool(block)), pool = masked attention pooling.

        GRU (Cho et al., 2014):  z = σ(W_z u + U_z h + b_z),  r = σ(W_r u + U_r h + b_r),
        n = tanh(W_n u + b_n + r ⊙ U_n h),  h' = (1 - z) ⊙ n + z ⊙ h,  with
        u = RMSNorm(Σ_i a_i x_i),  a = softmax_i(x_i · q / sqrt(D)) over valid i.

        Args:
          summary: [summary_dim] H_t.
          block_x: [N, D] embeddings of the turn block leaving the window.
          block_valid: [N] bool.
        """
        if not self.num_slots:
            return summary
        chex.assert_rank([summary, block_x, block_valid], [1, 2, 1])
        x32 = block_x.astype(jnp.float32)
        scores = x32 @ self.pool_query[...].astype(jnp.float32) / jnp.sqrt(x32.shape[-1])
        weights = jax.nn.softmax(jnp.where(block_valid, scores, NEG_INF))
        pooled = self.pool_norm(weights @ x32)
        gx_z, gx_r, gx_n = jnp.split(self.gru_x(pooled), 3)
        gh_z, gh_r, gh_n = jnp.split(self.gru_h(summary), 3)
        z = jax.nn.sigmoid(gx_z + gh_z)
        r = jax.nn.sigmoid(gx_r + gh_r)
        n = jnp.tanh(gx_n + r * gh_n)
        return (1.0 - z) * n + z * summary

    def slots(self, summary: jax.Array) -> jax.Array:
        """[summary_dim] -> [M, D] summary vectors placed at the head of the context."""
        if not self.num_slots:
            return jnp.zeros((0, self.config.d_model), jnp.float32)
        return self.slot_proj(summary).reshape(self.num_slots, self.config.d_model)


class Window(NamedTuple):
    """The last W turn blocks, oldest first (one episode)."""

    obs: jax.Array  # [W, O] int32 observation tokens of each turn in the window.
    progress: jax.Array  # [W, K] int32 markers shown with that observation.
    action: jax.Array  # [W, L] int32 tokens the policy wrote.
    action_mask: jax.Array  # [W, L] bool generated tokens (END included).
    valid: jax.Array  # [W] bool the turn exists (False for turns before the first).


def empty_window(window: int, obs_len: int, num_markers: int, turn_len: int) -> Window:
    """A window holding no turn yet."""
    return Window(
        obs=jnp.zeros((window, obs_len), jnp.int32),
        progress=jnp.zeros((window, num_markers), jnp.int32),
        action=jnp.zeros((window, turn_len), jnp.int32),
        action_mask=jnp.zeros((window, turn_len), bool),
        valid=jnp.zeros((window,), bool),
    )


def push_window(window: Window, obs, progress, action, action_mask) -> Window:
    """Drops the oldest turn, appends (obs [O], progress [K], action [L], action_mask [L])."""
    if window.valid.shape[0] == 0:  # W = 0: nothing is kept verbatim
        return window
    new = Window(obs, progress, action, action_mask.astype(bool), jnp.ones((), bool))
    return jax.tree.map(lambda w, x: jnp.concatenate([w[1:], x[None]], axis=0), window, new)


def gather_window(
    obs: jax.Array,
    progress: jax.Array,
    action: jax.Array,
    action_mask: jax.Array,
    turn: jax.Array | int,
    window: int,
) -> Window:
    """Window of turn `turn` read from a whole episode (turns turn-W .. turn-1).

    Args:
      obs: [S, O]; progress: [S, K]; action, action_mask: [S, L] (one episode).
    """
    chex.assert_rank([obs, progress, action, action_mask], 2)
    index = turn - window + jnp.arange(window)
    valid = index >= 0
    safe = jnp.clip(index, 0, obs.shape[0] - 1)
    return Window(
        obs=jnp.where(valid[:, None], obs[safe], 0),
        progress=jnp.where(valid[:, None], progress[safe], 0),
        action=jnp.where(valid[:, None], action[safe], 0),
        action_mask=valid[:, None] & action_mask[safe].astype(bool),
        valid=valid,
    )


def window_context(
    encoder: StateEncoder,
    embed: EmbedFn,
    summary: jax.Array,
    window: Window,
    obs: jax.Array,
    progress: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Context of one turn: [summary slots | W blocks | obs | markers].

    Args:
      summary: [summary_dim] H_{max(0, s-W)}.
      window: the W previous turns.
      obs: [O] current observation; progress: [K] current markers.
    Returns:
      x: [C, D] input embeddings, C = M + W (O + K + L) + O + K; valid: [C] bool.
    """
    slots = encoder.slots(summary)
    blocks_x, blocks_valid = jax.vmap(lambda o, p, a, m: encoder.block(embed, o, p, a, m))(
        window.obs, window.progress, window.action, window.action_mask
    )
    blocks_valid = blocks_valid & window.valid[:, None]
    obs_x, obs_valid = encoder.observation(embed, obs, progress)
    dim = slots.shape[-1]
    x = jnp.concatenate([slots.astype(obs_x.dtype), blocks_x.reshape(-1, dim), obs_x], axis=0)
    valid = jnp.concatenate(
        [jnp.ones((slots.shape[0],), bool), blocks_valid.reshape(-1), obs_valid], axis=0
    )
    return x, valid


def summary_sequence(
    encoder: StateEncoder,
    embed: EmbedFn,
    obs: jax.Array,
    progress: jax.Array,
    action: jax.Array,
    action_mask: jax.Array,
    *,
    window: int,
) -> jax.Array:
    """Summary state used at every turn of an episode, recomputed differentiably.

    H_0 = h_init, H_{t+1} = absorb(H_t, block(t)) by `lax.scan`; turn s reads
    H_{max(0, s-W)}.

    Args:
      obs: [S, O]; progress: [S, K]; action, action_mask: [S, L] (one episode).
    Returns:
      [S + 1, summary_dim]: the summary of turns s = 0..S (S is the state after the last).
    """
    h0 = encoder.initial_summary()
    if not encoder.num_slots:
        return jnp.zeros((obs.shape[0] + 1, 0), jnp.float32)

    def absorb(h, turn):
        x, valid = encoder.block(embed, *turn)
        h_next = encoder.absorb(h, x, valid)
        return h_next, h_next

    _, hs = jax.lax.scan(absorb, h0, (obs, progress, action, action_mask.astype(bool)))
    states = jnp.concatenate([h0[None], hs], axis=0)  # H_0 .. H_S
    read = jnp.maximum(jnp.arange(obs.shape[0] + 1) - window, 0)
    return states[read]


def full_context(
    encoder: StateEncoder,
    embed: EmbedFn,
    obs: jax.Array,
    progress: jax.Array,
    action: jax.Array,
    action_mask: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """The whole transcript as consecutive blocks: ([S (O + K + L), D], valid).

    Args:
      obs: [S, O]; progress: [S, K]; action, action_mask: [S, L] (one episode).
    """
    x, valid = jax.vmap(lambda o, p, a, m: encoder.block(embed, o, p, a, m))(
        obs, progress, action, action_mask.astype(bool)
    )
    return x.reshape(-1, x.shape[-1]), valid.reshape(-1)
