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

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rlagent.credit import mc
from rlagent.envs.base import Environment
from rlagent.rollout import RolloutConfig
from rlagent.rollout import continue_fork
from rlagent.rollout import forks_from_carries  # noqa: F401 (credit.forks_from_carries)
from rlagent.rollout import make_continue


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


def _at_absolute_turns(signals: mc.TurnSignals, start: jax.Array, num_turns: int):
    """`[1, S]` signals of turns `start + k` moved to column `start + k` (dropped past S)."""
    offset = jnp.arange(num_turns) - start
    inside = offset >= 0
    index = jnp.clip(offset, 0, num_turns - 1)
    return jax.tree.map(
        lambda x: jnp.where(inside[None], x[:, index], jnp.zeros_like(x[:, index])), signals
    )
