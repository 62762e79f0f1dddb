"""Wrappers: automatic reset at the end of an episode, and batching with `jax.vmap`.

Both keep the `reset` / `step` / `allowed_tokens` interface of `ToolWorld`, so they stack:
`VmapWrapper(AutoResetWrapper(ToolWorld(cfg)))` steps a batch of never-ending streams of
episodes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlagent.envs.toolworld import State
from rlagent.envs.toolworld import StepType
from rlagent.envs.toolworld import TimeStep
from rlagent.envs.toolworld import ToolWorld

# Folded into the episode key to derive the next episode's key (a derivation path that
# `reset`'s own `split` never takes, so the next episode is independent of this one).
_NEXT_EPISODE = 0x5EED


class Wrapper:
    """Forwards everything to the wrapped environment."""

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        return getattr(self.env, name)

    def reset(self, key):
        return self.env.reset(key)

    def step(self, state, action):
        return self.env.step(state, action)

    def allowed_tokens(self, state, prefix, position, rules: bool = False):
        return self.env.allowed_tokens(state, prefix, position, rules)


class AutoResetWrapper(Wrapper):
    """Starts a new episode after every LAST step (Jumanji convention).

    The timestep of the final step keeps its step type, reward, discount and extras but
    carries the *first observation of the next episode*, and the returned state is that
    next episode's state; the next episode's key is `fold_in(episode_key, _NEXT_EPISODE)`.
    """

    def step(self, state: State, action: jax.Array) -> tuple[State, TimeStep]:
        state, timestep = self.env.step(state, action)
        last = timestep.step_type == StepType.LAST
        next_state, first = self.env.reset(jax.random.fold_in(state.key, _NEXT_EPISODE))
        state = jax.tree.map(lambda new, old: jnp.where(last, new, old), next_state, state)
        observation = jax.tree.map(
            lambda new, old: jnp.where(last, new, old), first.observation, timestep.observation
        )
        return state, timestep._replace(observation=observation)


class VmapWrapper(Wrapper):
    """Batched environment: `reset(keys [B])`, `step(states, actions [B, L])`."""

    def reset(self, keys: jax.Array) -> tuple[State, TimeStep]:
        return jax.vmap(self.env.reset)(keys)

    def step(self, state: State, action: jax.Array) -> tuple[State, TimeStep]:
        return jax.vmap(self.env.step)(state, action)

    def allowed_tokens(self, state, prefix, position, rules: bool = False) -> jax.Array:
        """`[B, VOCAB_SIZE]` bool; `prefix [B, L]`, `position` scalar or `[B]`."""
        position = jnp.broadcast_to(jnp.asarray(position), prefix.shape[:1])
        return jax.vmap(lambda s, p, j: self.env.allowed_tokens(s, p, j, rules))(
            state, prefix, position
        )


def batch_reset(env: ToolWorld, keys: jax.Array) -> tuple[State, TimeStep]:
    """`jax.vmap(env.reset)(keys)` for `keys [B]` (or `[B, 2]` uint32)."""
    return jax.vmap(env.reset)(keys)


def batch_step(env: ToolWorld, state: State, actions: jax.Array) -> tuple[State, TimeStep]:
    """`jax.vmap(env.step)(state, actions)` for `actions [B, L]`."""
    return jax.vmap(env.step)(state, actions)
