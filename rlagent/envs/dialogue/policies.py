"""Scripted policies of the dialogue environment (pure JAX, jit/vmap-safe): the oracle (the
shortest dialogue), the uniform random policy over the grammar, and `unroll`."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax

from rlagent.envs.base import random_action
from rlagent.envs.dialogue.env import DialogueEnv
from rlagent.envs.dialogue.types import State
from rlagent.envs.dialogue.types import TimeStep


def oracle_policy(env: DialogueEnv, state: State, key: jax.Array | None = None) -> jax.Array:
    """Next turn `[L]` of the shortest dialogue from `state` (`DialogueEnv.oracle_action`)."""
    del key
    return env.oracle_action(state)


def random_policy(env: DialogueEnv, state: State, key: jax.Array) -> jax.Array:
    """A grammatical turn `[L]`, sampled token by token uniformly over `allowed_tokens`."""
    return random_action(env, state, key)


class Unroll(NamedTuple):
    """One scripted dialogue, turn-major (S = turns played, absorbing after the end)."""

    first: TimeStep  # the reset timestep.
    actions: jax.Array  # [S, L] int32.
    timesteps: TimeStep  # leaves [S, ...]: the timestep returned by turn s.


def unroll(
    env: DialogueEnv,
    policy: Callable[[State, jax.Array], jax.Array],
    key: jax.Array,
    num_turns: int | None = None,
) -> Unroll:
    """Plays `policy(state, key) -> [L]` for `num_turns` turns (default env.max_turns)."""
    num_turns = env.max_turns if num_turns is None else num_turns
    reset_key, policy_key = jax.random.split(key)
    state, first = env.reset(reset_key)

    def turn(state, turn_key):
        action = policy(state, turn_key)
        state, timestep = env.step(state, action)
        return state, (action, timestep)

    _, (actions, timesteps) = jax.lax.scan(turn, state, jax.random.split(policy_key, num_turns))
    return Unroll(first=first, actions=actions, timesteps=timesteps)
