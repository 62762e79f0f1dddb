"""Scripted ToolWorld policies: the oracle (shortest correct plan) and a random baseline.

All are pure JAX functions of the state, jit/vmap-safe, returning one turn `[L]` int32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlagent.envs.dsl import Command
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.types import State
from rlagent.envs.types import TaskKind
from rlagent.envs.types import TimeStep


def oracle_policy(env: ToolWorld, state: State) -> jax.Array:
    """Next turn `[L]` of the shortest correct plan from `state`.

    Per task: look the order up if the task needs a fact about it (status, refund,
    exchange), check the stock of the looked-up item (exchange), then the task's correct
    final command; `BYE` once every task is settled. Following it from `reset` solves
    every episode in exactly `shortest_plan` turns with verdict +1 on every turn.
    """
    task = env.task_view(state)
    is_exchange = task.kind == TaskKind.EXCHANGE
    asks_fact = (task.kind == TaskKind.STATUS) | (task.kind == TaskKind.REFUND) | is_exchange
    needs_lookup = asks_fact & ~task.looked_up
    needs_stock = is_exchange & task.looked_up & ~task.stock_checked
    command = jnp.where(needs_stock, Command.CHECK_STOCK, task.final_command)
    arg1 = jnp.where(needs_stock, task.item, task.final_arg1)
    arg2 = task.final_arg2
    command = jnp.where(needs_lookup, Command.LOOKUP_ORDER, command)
    arg1 = jnp.where(needs_lookup, task.order, arg1)
    command = jnp.where(task.active, command, Command.BYE)
    return env.encode(command, arg1, arg2)


def random_policy(env: ToolWorld, state: State, key: jax.Array) -> jax.Array:
    """A turn `[L]` sampled token by token, uniformly over `env.allowed_tokens`.

    Grammatical; with `guardrail='mask'` it never breaks a rule either.

    Args:
      env: the environment.
      state: current state.
      key: PRNG key.
    """

    def sample(prefix, inputs):
        position, position_key = inputs
        allowed = env.allowed_tokens(state, prefix, position)
        token = jax.random.categorical(position_key, jnp.where(allowed, 0.0, -jnp.inf))
        return prefix.at[position].set(token.astype(jnp.int32)), None

    positions = jnp.arange(env.turn_len)
    keys = jax.random.split(key, env.turn_len)
    prefix = jnp.zeros((env.turn_len,), jnp.int32)
    action, _ = jax.lax.scan(sample, prefix, (positions, keys))
    return action


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
