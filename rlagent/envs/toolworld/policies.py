"""Scripted ToolWorld policies: the oracle (shortest correct plan) and a random baseline.

All are pure JAX functions of the state, jit/vmap-safe, returning one turn `[L]` int32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax

from rlagent.envs.base import random_action
from rlagent.envs.toolworld.env import ToolWorld
from rlagent.envs.toolworld.types import State
from rlagent.envs.toolworld.types import TimeStep


def oracle_policy(env: ToolWorld, state: State) -> jax.Array:
    """Next turn `[L]` of the shortest correct plan from `state` (`ToolWorld.oracle_action`)."""
    return env.oracle_action(state)


def random_policy(env: ToolWorld, state: State, key: jax.Array) -> jax.Array:
    """A turn `[L]` sampled token by token, uniformly over `env.allowed_tokens`.

    Grammatical; with `guardrail='mask'` it never breaks a rule either
    (`rlagent.envs.base.random_action`).
    """
    return random_action(env, state, key)


class Unroll(NamedTuple):
    """One scripted episode, turn-major (S = number of turns played)."""

    first: TimeStep  # the reset timestep.
    actions: jax.Array  # [S, L] int32.
    timesteps: TimeStep  # leaves [S, ...]: the timestep returned by turn s.


def unroll(
    env: ToolWorld,
    policy: Callable[[State, jax.Array], jax.Array],
    key: jax.Array,
    num_turns: int | None = None,
) -> Unroll:
    """Plays `policy(state, key) -> [L]` for `num_turns` turns (default env.max_turns).

    Turns after the end of the episode hit the absorbing state (reward and signals 0),
    so the result has fixed shapes; jit/vmap-safe (vmap over `key` for a batch).
    """
    num_turns = env.max_turns if num_turns is None else num_turns
    reset_key, policy_key = jax.random.split(key)
    state, first = env.reset(reset_key)

    def turn(state, turn_key):
        action = policy(state, turn_key)
        state, timestep = env.step(state, action)
        return state, (action, timestep)

    _, (actions, timesteps) = jax.lax.scan(turn, state, jax.random.split(policy_key, num_turns))
    return Unroll(first=first, actions=actions, timesteps=timesteps)
