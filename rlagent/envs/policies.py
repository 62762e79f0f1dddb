"""Scripted ToolWorld policies: the oracle (shortest correct plan) and random baselines.

All are pure JAX functions of the state, jit/vmap-safe, returning one turn `[L]` int32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlagent.envs import dsl
from rlagent.envs.toolworld import EXCHANGE_KIND
from rlagent.envs.toolworld import REFUND_KIND
from rlagent.envs.toolworld import STATUS_KIND
from rlagent.envs.toolworld import State
from rlagent.envs.toolworld import TimeStep
from rlagent.envs.toolworld import ToolWorld


def oracle_policy(env: ToolWorld, state: State) -> jax.Array:
    """Next turn `[L]` of the shortest correct plan from `state`.

    Per task: look the order up if the task needs a fact about it (status, refund,
    exchange), check the stock of the looked-up item (exchange), then the task's correct
    final command; `BYE` once every task is settled. Following it from `reset` solves
    every episode in exactly `shortest_plan` turns with verdict +1 on every turn.
    """
    task = env.task_view(state)
    needs_lookup = (
        (task.kind == STATUS_KIND) | (task.kind == REFUND_KIND) | (task.kind == EXCHANGE_KIND)
    ) & ~task.looked_up
    needs_stock = (task.kind == EXCHANGE_KIND) & task.looked_up & ~task.stock_checked
    command = jnp.where(needs_stock, dsl.CHECK_STOCK, task.final_command)
    arg1 = jnp.where(needs_stock, task.item, task.final_arg1)
    arg2 = task.final_arg2
    command = jnp.where(needs_lookup, dsl.LOOKUP, command)
    arg1 = jnp.where(needs_lookup, task.order, arg1)
    command = jnp.where(task.active, command, dsl.BYE_CMD)
    return env.encode(command, arg1, arg2)


def random_policy(env: ToolWorld, state: State, key: jax.Array, rules: bool = False) -> jax.Array:
    """A grammatical turn `[L]` sampled token by token, uniformly over the allowed tokens.

    Args:
      env: the environment (its grammar mask, and guardrail mask with `rules=True`).
      state: current state.
      key: PRNG key.
      rules: sample from the guardrail-masked grammar (no rule can be broken).
    """

    def sample(prefix, inputs):
        position, position_key = inputs
        allowed = env.allowed_tokens(state, prefix, position, rules=rules)
        token = jax.random.categorical(position_key, jnp.where(allowed, 0.0, -jnp.inf))
        return prefix.at[position].set(token.astype(jnp.int32)), None

    positions = jnp.arange(env.turn_len)
    keys = jax.random.split(key, env.turn_len)
    prefix = jnp.zeros((env.turn_len,), jnp.int32)
    action, _ = jax.lax.scan(sample, prefix, (positions, keys))
    return action


def uniform_tokens_policy(env: ToolWorld, state: State, key: jax.Array) -> jax.Array:
    """A turn of tokens drawn uniformly from the whole vocabulary (almost always malformed)."""
    del state
    return jax.random.randint(key, (env.turn_len,), 0, dsl.VOCAB_SIZE, dtype=jnp.int32)


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

    Turns after the end of the episode hit the absorbing state (reward and extras 0),
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
