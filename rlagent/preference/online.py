"""Online DPO / RLAIF: every iteration samples episodes, a judge ranks them, DPO learns.

`make_online_dpo(config, env, policy_config, rollout_config, judge=)`
returns pure `init`, `update`, `updates` (as the PPO trainer: jit- and vmap-able; the
judge's weights and accuracy are data in the state, so judges that differ only in them
train side by side in one program). One iteration:

1. candidates, by `DPOConfig.pairs`:
   * `"trajectory"`: K episodes of each of G tasks (a group shares the reset key);
   * `"fork"`: one episode per task, a played turn f drawn uniformly, then K
     continuations of the same environment state *and* policy memory from the rollout
     carry at f (`rollout.make_branch`), spliced after the played turns before f:
     counterfactual episodes that differ from f on;
2. the judge scores them (and learns, if it is a PRM), `pairs.group_pairs` takes the
   best against the worst of each group (the judge's `accuracy` flips it), a group whose
   candidates tie gives no pair;
3. `num_epochs` gradient steps of `dpo.preference_loss` on those pairs against the
   frozen initial policy, at the pairs' level (fork pairs at segment level are scored
   from the first differing turn, turn f or later).

`env_turns` counts every environment turn the iteration played: all candidates, and
in fork mode the whole played episode besides its continuations (its turns after f are
spent too); a learned PRM's labelling turns are `label_turns`.

`logged_updates(state, n)` runs the same iterations and also returns each one's `PairLog`
(the candidates, their tasks, the pairs, the judge's scores): what an online pipeline
appends to its preference data as it goes (`pairs.log_records` turns one into records
of `rlagent.preference.data`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rlagent.models import Policy
from rlagent.models import PolicyConfig
from rlagent.preference import pairs as pairing
from rlagent.preference.dpo import DPOConfig
from rlagent.preference.dpo import make_optimizer
from rlagent.preference.dpo import pair_logps
from rlagent.preference.dpo import preference_loss
from rlagent.preference.judges import Judge
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_branch
from rlagent.rollout import make_rollout
from rlagent.rollout import make_score
from rlagent.train.extras import PRMInputs
from rlagent.train.ppo import episode_metrics
from rlagent.train.ppo import guarded_step
from rlagent.train.ppo import policy_graphdef
from rlagent.types import Trajectory

Metrics = dict[str, jax.Array]


class OnlineState(NamedTuple):
    params: Any  # policy parameters (nnx.State).
    opt_state: Any
    ref_params: Any  # frozen initial policy: DPO's reference (and the implicit PRM's).
    judge_weights: jax.Array  # [C] float32: the judge's reward form (judges.judge_weights).
    accuracy: jax.Array  # [] float32: P(the judge keeps a pair's true order).
    judge_state: Any  # what the judge learns (a PRM's state), () otherwise.
    key: jax.Array
    step: jax.Array  # [] int32


class PairLog(NamedTuple):
    """One iteration's pairs as the judge ranked them (device arrays)."""

    trajectory: Trajectory  # [G * K, S] the candidates.
    env_keys: jax.Array  # [G * K, 2] uint32 reset keys (the tasks).
    chosen: jax.Array  # [G] int32 rows of `trajectory` (the judge's preferred side).
    rejected: jax.Array  # [G] int32 rows.
    weight: jax.Array  # [G] float32: 0 for a group whose candidates tie (no pair).
    scores: jax.Array  # [G * K] float32 the judge's scores.
    prefix_turns: jax.Array  # [G] int32 turns both sides share (the fork turn; 0: none).


class OnlineDPO(NamedTuple):
    init: Callable[..., OnlineState]  # init(key, judge_weights, accuracy=1.0, params=None)
    update: Callable[[OnlineState], tuple[OnlineState, Metrics]]
    updates: Callable[[OnlineState, int], tuple[OnlineState, Metrics]]
    graphdef: Any
    # logged_updates(state, n) -> (state, (metrics [n], PairLog [n])).
    logged_updates: Callable[[OnlineState, int], tuple[OnlineState, tuple[Metrics, PairLog]]]


class _Candidates(NamedTuple):
    trajectory: Trajectory  # [G * K, S] episodes the judge ranks.
    carries: Any  # their rollout carries (trajectory mode, when the judge reads them).
    played: Trajectory  # the on-policy episodes of this iteration (success metrics).
    turns: jax.Array  # [] float32 environment turns played.
    prefix_turns: jax.Array  # [G * K] int32 played turns before the fork (0: no fork).
    env_keys: jax.Array  # [G * K, 2] uint32 reset keys of the candidates' tasks.


def make_online_dpo(
    config: DPOConfig, env: Any, policy_config: PolicyConfig, rollout_config: RolloutConfig, *,
    judge: Judge,
) -> OnlineDPO:  # fmt: skip
    """Builds the online DPO trainer (see the module docstring); the judge closes over
    its own reward config."""
    if config.sft_steps:
        raise ValueError(
            f"DPOConfig.sft_steps={config.sft_steps}: SFT before DPO is an offline schedule "
            "(make_offline_dpo); online DPO takes its start as `params` (e.g. rejection "
            "sampling's SFT)."
        )
    if config.pairs == "fork" and judge.needs_carries:
        raise ValueError(
            "DPOConfig.pairs='fork' splices continuations, which have no rollout carries of "
            "their own: the judge must not need carries (a PRM labelled by MC forks)."
        )
    graphdef = policy_graphdef(policy_config)
    score = make_score(env, graphdef, rollout_config)
    optimizer = make_optimizer(config)
    sample = _sampler(config, env, graphdef, rollout_config, judge.needs_carries)
    groups, size = config.num_groups, config.group_size

    def loss(params, batch, ref):
        return preference_loss(params, batch, ref, score=score, config=config)

    def init(key, judge_weights, accuracy=1.0, params=None) -> OnlineState:
        key, init_key, judge_key = jax.random.split(key, 3)
        if params is None:
            _, params = nnx.split(Policy(policy_config, rngs=nnx.Rngs(init_key)))
        return OnlineState(
            params=params, opt_state=optimizer.init(params), ref_params=params,
            judge_weights=jnp.asarray(judge_weights, jnp.float32),
            accuracy=jnp.asarray(accuracy, jnp.float32),
            judge_state=judge.init(judge_key, params), key=key, step=jnp.zeros((), jnp.int32),
        )  # fmt: skip

    def logged(state: OnlineState) -> tuple[OnlineState, tuple[Metrics, PairLog]]:
        key, sample_key, judge_key, pair_key = jax.random.split(state.key, 4)
        found = sample(state.params, sample_key)
        inputs = PRMInputs(state.params, state.ref_params, found.trajectory, found.carries)
        scores, judge_state, judge_metrics = judge.judge(
            state.judge_state, inputs, state.judge_weights, judge_key
        )
        grouped = scores.reshape(groups, size)
        chosen, rejected, weight = pairing.group_pairs(grouped, pair_key, state.accuracy)
        batch = pair_batch(found.trajectory, chosen, rejected, weight, config)
        ref = jax.lax.stop_gradient(pair_logps(score, state.ref_params, batch, config.length_norm))
        params, opt_state, stats = dpo_steps(
            loss, optimizer, (state.params, state.opt_state), (batch, ref), config.num_epochs
        )
        rows = jnp.arange(groups)
        kept = grouped[rows, chosen] > grouped[rows, rejected]
        metrics = {
            **episode_metrics(env, found.played),
            **jax.tree.map(lambda x: x[0], stats),  # before this iteration's steps
            **judge_metrics,
            "env_turns": found.turns,
            "judge_agreement": jnp.sum(weight * kept) / jnp.maximum(jnp.sum(weight), 1.0),
            "grad_norm": jnp.max(stats["grad_norm"]),
        }
        for name in ("nonfinite_loss", "nonfinite_grads"):
            metrics[name] = jnp.max(stats[name])
        new = state._replace(params=params, opt_state=opt_state, judge_state=judge_state,
                             key=key, step=state.step + 1)  # fmt: skip
        first = rows * size
        log = PairLog(found.trajectory, found.env_keys, first + chosen, first + rejected,
                      weight, scores, found.prefix_turns[first])  # fmt: skip
        return new, (metrics, log)

    def update(state: OnlineState) -> tuple[OnlineState, Metrics]:
        new, (metrics, _) = logged(state)
        return new, metrics

    def updates(state: OnlineState, length: int):
        return jax.lax.scan(lambda s, _: update(s), state, None, length=length)

    def logged_updates(state: OnlineState, length: int):
        return jax.lax.scan(lambda s, _: logged(s), state, None, length=length)

    return OnlineDPO(init, update, updates, graphdef, logged_updates)


def dpo_steps(loss, optimizer, carry, data, num_epochs: int):
    """`num_epochs` guarded optimiser steps of `loss(params, *data)` from `carry = (params,
    opt_state)`: `(params, opt_state, stats [num_epochs])`."""

    def step(carry, _):
        params, opt_state, stats = guarded_step(loss, *carry, optimizer, *data)
        return (params, opt_state), stats

    (params, opt_state), stats = jax.lax.scan(step, carry, None, length=num_epochs)
    return params, opt_state, stats


def pair_batch(trajectory, chosen, rejected, weight, config: DPOConfig) -> pairing.PairBatch:
    """The `PairBatch` of a batch's chosen / rejected rows within their groups, scored at
    `config.level`."""
    chosen_traj, rejected_traj = pairing.take_pairs(trajectory, chosen, rejected, config.group_size)
    chosen_scored, rejected_scored = pairing.scored_turns(
        chosen_traj, rejected_traj, level=config.level, segment_turns=config.segment_turns
    )
    return pairing.PairBatch(chosen_traj, rejected_traj, chosen_scored, rejected_scored, weight)


def _sampler(config: DPOConfig, env, graphdef, rollout_config, needs_carries: bool):
    """`sample(params, key) -> _Candidates` of the config's pair source."""
    groups, size = config.num_groups, config.group_size
    if config.pairs == "trajectory":
        rollout = make_rollout(env, graphdef, rollout_config, with_carries=needs_carries)

        def sample(params, key):
            env_key, policy_key = jax.random.split(key)
            env_keys = jnp.repeat(jax.random.split(env_key, groups), size, axis=0)
            out = rollout(params, env_keys, jax.random.split(policy_key, groups * size))
            traj, carries = out if needs_carries else (out, None)
            traj = jax.lax.stop_gradient(traj)
            turns = jnp.sum(traj.turn_mask).astype(jnp.float32)
            prefix = jnp.zeros((groups * size,), jnp.int32)
            return _Candidates(traj, carries, traj, turns, prefix, _key_data(env_keys))

        return sample
    rollout = make_rollout(env, graphdef, rollout_config, with_carries=True)
    branch = make_branch(env, graphdef, rollout_config)
    num_turns = env.max_turns

    def sample(params, key):
        env_key, policy_key, fork_key, branch_key = jax.random.split(key, 4)
        env_keys = jax.random.split(env_key, groups)
        traj, carries = rollout(params, env_keys, jax.random.split(policy_key, groups))
        played = jnp.sum(traj.turn_mask, axis=1)
        start = jax.random.randint(fork_key, (groups,), 0, jnp.maximum(played, 1))
        start = jnp.repeat(start, size)
        rows = jnp.repeat(jnp.arange(groups), size)
        keys = jax.random.split(branch_key, groups * size)
        spliced = jax.lax.stop_gradient(branch(params, traj, carries, rows, start, keys))
        own = jnp.arange(num_turns)[None] >= start[:, None]  # the forks' own turns
        turns = jnp.sum(traj.turn_mask) + jnp.sum(spliced.turn_mask & own)
        task_keys = _key_data(jnp.repeat(env_keys, size, axis=0))
        return _Candidates(spliced, None, traj, turns.astype(jnp.float32), start, task_keys)

    return sample


def _key_data(keys: jax.Array) -> jax.Array:
    """`[N, 2]` uint32 of reset keys, typed or raw."""
    if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(keys)
    return keys
