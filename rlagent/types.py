"""Pytrees shared across modules.

Shapes use B episodes, S turns (policy steps), O observation tokens shown before a
turn, L action tokens per turn and K task-progress markers. A trajectory is stored
turn-major inside each row; `token_view` flattens it to the token-level conventions of
docs/architecture.md (`tokens [B, T]`, `loss_mask`, `turn_ids`) with T = S * (O + L): for
every turn, the observation tokens the policy read, then the tokens it wrote.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Trajectory(NamedTuple):
    """A batch of multi-turn episodes produced by `rlagent.rollout`."""

    obs_tokens: jax.Array  # [B, S, O] int32: tool return / user message read before turn s.
    progress: jax.Array  # [B, S, K] int32: task-progress markers (pending/done/failed) at turn s.
    action_tokens: jax.Array  # [B, S, L] int32: sampled tokens of turn s (PAD after END).
    action_mask: jax.Array  # [B, S, L] bool: tokens the policy generated (END included).
    logp: jax.Array  # [B, S, L] float32: behaviour log-prob of each sampled token.
    values: jax.Array  # [B, S, L] float32: value estimate at each action token.
    turn_mask: jax.Array  # [B, S] bool: turn s was played.
    # {name: [B, S] float32}: the environment's per-turn signals (`env.signal_names`, e.g.
    # ToolWorld's outcome, verdict, efficiency, violations), 0 on unplayed turns.
    signals: dict[str, jax.Array]
    success: jax.Array  # [B, S] bool: the environment's success flag, on the solving turn.
    done: jax.Array  # [B, S] bool: the episode terminated at turn s (discount 0 after it).
    bootstrap_value: jax.Array  # [B] float32: value after the last played turn if truncated.
    # [B, S, L, V] bool: tokens the sampler allowed (constrained decoding), so that
    # teacher-forced scoring renormalises over the same set; None when sampling was free.
    sampling_mask: jax.Array | None = None

    @property
    def loss_mask(self) -> jax.Array:
        """`[B, S, L]` bool: tokens the policy generated in turns that were played."""
        return self.action_mask & self.turn_mask[..., None]

    @property
    def episode_success(self) -> jax.Array:
        """`[B]` bool: the environment reported success on a played turn."""
        return episode_success(self.success, self.turn_mask)


def episode_success(success: jax.Array, turn_mask: jax.Array) -> jax.Array:
    """`[..., B]` bool of `[..., B, S]` per-turn success flags: success on a played turn."""
    return jnp.any(success & turn_mask, axis=-1)


class TokenView(NamedTuple):
    """Token-level view of a trajectory: observation then action tokens, turn by turn."""

    tokens: jax.Array  # [B, T] int32.
    loss_mask: jax.Array  # [B, T] bool: True exactly on generated tokens.
    turn_ids: jax.Array  # [B, T] int32: turn index of a generated token, -1 elsewhere.


def token_view(trajectory: Trajectory) -> TokenView:
    """Flattens `[B, S, O]` observations and `[B, S, L]` actions into `[B, S * (O + L)]`."""
    obs = trajectory.obs_tokens
    act = trajectory.action_tokens
    batch, turns, obs_len = obs.shape
    act_len = act.shape[-1]
    tokens = jnp.concatenate([obs, act], axis=-1).reshape(batch, -1)
    loss_mask = jnp.concatenate([jnp.zeros_like(obs, dtype=bool), trajectory.loss_mask], axis=-1)
    turn_index = jnp.broadcast_to(
        jnp.arange(turns, dtype=jnp.int32)[None, :, None], (batch, turns, obs_len + act_len)
    )
    loss_mask = loss_mask.reshape(batch, -1)
    turn_ids = jnp.where(loss_mask, turn_index.reshape(batch, -1), -1)
    return TokenView(tokens=tokens, loss_mask=loss_mask, turn_ids=turn_ids)


def action_rows(x: jax.Array) -> jax.Array:
    """`[B, S, L, ...]` -> `[B, S * L, ...]`: one row per episode, generated-token slots only.

    The trainer hands kernels this action-only layout instead of the token view
    `[B, T]` (`token_view`), which also holds the O observation tokens read before every
    turn. For every estimator and loss the two give the same result at the loss positions
    (`loss_mask`), because in the token view an observation token (and a padding slot
    after END) is always masked, carries no reward (a turn's reward sits on its last
    generated token, the KL reward on generated tokens only) and no value that is read:

    * bridged recursions (`gae`, `lambda_returns`, `discounted_returns`, hence `gae_token`,
      `reinforce_pp` and the token part of `hierarchical`) equal their plain counterpart on
      the compressed sequence of unmasked positions (`rlagent.returns`), and deleting
      masked positions leaves the same sequence, in the same order, in both layouts;
    * `whiten`, `aggregate` and the losses reduce over the masked set only, and
      `seq-mean-*` aggregations count tokens per row, which both layouts keep per episode;
    * turn-level and episode-level estimators read `[B, S]` / `[B]` arrays and only
      broadcast back onto `loss_mask`; `turn_ids` map the same tokens to the same turns.

    `tests/test_train_parts.py` checks the equivalence for GAE, REINFORCE++ and the
    hierarchical estimator.
    """
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])
