"""Continuations by the policy LM, from the rollout's carries at turn starts.

`make_rollout(..., with_carries=True)` keeps the `RolloutCarry` at the start of every
turn: the environment state *and* the policy's memory (window and summary, or the
full-context KV cache). `forks_from_carries` lays them out as the `[B, S, ...]` forks of
`mc.mc_values`, and `play_policy` continues forked episodes with the LM (the current
parameters, or any frozen snapshot), optionally mixed per episode with the oracle (a
"prover": with probability epsilon a continuation is the oracle's throughout).

A per-turn mixture with the LM would need the LM to read the oracle's turn into its
memory; the rollout samples every turn itself, so only the per-episode mixture is offered
here (per-turn mixtures of environment-level policies are in `mc.mixture`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rlagent.credit import mc
from rlagent.envs.base import Environment
from rlagent.models.llama import KVCache
from rlagent.rollout import RolloutCarry
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_continue
from rlagent.types import Trajectory


def forks_from_carries(carries: RolloutCarry) -> RolloutCarry:
    """Turn-major carries of `make_rollout(with_carries=True)` -> forks, every leaf `[B, S, ...]`.

    Carry leaves are batch-first except the KV cache's keys and values, which are
    layer-major (`[num_layers, B, ...]`): their batch axis moves to the front too.
    """

    def batch_major(node):
        if isinstance(node, KVCache):  # [S, layers, B, ...] for k and v, [S, B, T] valid
            return KVCache(
                k=jnp.moveaxis(node.k, 2, 0),
                v=jnp.moveaxis(node.v, 2, 0),
                valid=jnp.swapaxes(node.valid, 0, 1),
            )
        return jnp.swapaxes(node, 0, 1)

    return jax.tree.map(batch_major, carries, is_leaf=_is_cache)


def play_policy(
    env: Environment,
    graphdef: nnx.GraphDef,
    rollout_config: RolloutConfig,
    params: nnx.State,
    *,
    oracle_epsilon: float | jax.Array = 0.0,
) -> mc.Play:
    """`play(carries [M], keys [M]) -> TurnSignals [M, S]`: the LM plays forks to the end.

    Each fork resumes at its own turn (`env.episode_turn(carry.env_state)`) with the
    policy memory of its carry, sampled as in the rollout (same `rollout_config`). Every
    continuation plays S = env.max_turns turns; turns after the episode ended (by BYE or
    at max_turns, where the environment truncates) are masked out, so a late fork costs as
    much as an early
    one: O(M * S) policy turns per call.

    Args:
      env: the rollout's environment.
      graphdef: the policy's graph (`nnx.split`).
      rollout_config: the rollout's sampling settings (window, temperature, grammar).
      params: the parameters that continue (current policy, or a frozen snapshot).
      oracle_epsilon: probability that a continuation is the oracle's instead (per
        episode; 0 = the LM only). May be traced; the oracle's environment-level play
        costs little beside the LM's.
    """
    if isinstance(oracle_epsilon, int | float) and not 0.0 <= oracle_epsilon <= 1.0:
        raise ValueError(f"oracle_epsilon must be in [0, 1], got {oracle_epsilon}")
    num_turns = env.max_turns
    continue_ = make_continue(env, graphdef, rollout_config)
    # The oracle's play is built only when it can be drawn (an environment may have none).
    fixed = isinstance(oracle_epsilon, int | float)
    oracle_play = None if fixed and oracle_epsilon == 0 else mc.play_env_policy(env, mc.oracle(env))

    def one(carry: Any, key: jax.Array) -> mc.TurnSignals:
        start = env.episode_turn(carry.env_state)
        traj = continue_fork(continue_, params, carry, start, key, num_turns)
        return _at_absolute_turns(mc.trajectory_signals(traj), start, num_turns)

    def play(carries: Any, keys: jax.Array) -> mc.TurnSignals:
        signals = jax.vmap(one)(carries, keys)
        signals = jax.tree.map(lambda x: x[:, 0], signals)
        if oracle_play is None:
            return signals
        coin = jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, mc.COIN)))(keys)
        prover = oracle_play(carries.env_state, keys)
        use = coin < oracle_epsilon
        return jax.tree.map(
            lambda o, p: jnp.where(use.reshape(-1, *([1] * (p.ndim - 1))), o, p), prover, signals
        )

    return play


def continue_fork(
    continue_: Callable, params: Any, carry: Any, start: jax.Array, key: jax.Array,
    num_turns: int,
) -> Trajectory:  # fmt: skip
    """One fork (a carry of `forks_from_carries`, batch axis dropped) continued by
    `continue_ = rollout.make_continue(...)` from turn `start` for `num_turns` turns: a
    trajectory with a batch of one. Past max_turns the environment is absorbing and the
    turns are masked, so running S turns from any start keeps one compiled program for
    every fork."""
    single = jax.tree.map(_batch_of_one, carry, is_leaf=_is_cache)
    return continue_(params, single, start, key[None], num_turns=num_turns)


def _is_cache(node) -> bool:
    return isinstance(node, KVCache)


def _batch_of_one(node):
    """One fork's carry (batch axis dropped) -> a batch of one, layer-major KV caches."""
    if isinstance(node, KVCache):
        return KVCache(k=node.k[:, None], v=node.v[:, None], valid=node.valid[None])
    return node[None]


def _at_absolute_turns(signals: mc.TurnSignals, start: jax.Array, num_turns: int):
    """`[1, S]` signals of turns `start + k` moved to column `start + k` (dropped past S)."""
    offset = jnp.arange(num_turns) - start
    inside = offset >= 0
    index = jnp.clip(offset, 0, num_turns - 1)
    return jax.tree.map(
        lambda x: jnp.where(inside[None], x[:, index], jnp.zeros_like(x[:, index])), signals
    )
