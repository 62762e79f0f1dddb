"""Host loop: jitted chunks of updates for several seeds, progress, metrics, checkpoints.

The device program is `jit(vmap(scan(update)))`: `chunk_size` PPO updates for every run
(reward condition x seed) in one call. Between chunks the host writes metrics and an
Orbax checkpoint of the runner states; `resume=True` restores the newest checkpoint and
continues exactly (the PRNG key lives in the state, so the continued run equals an
uninterrupted one).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from tqdm.auto import tqdm

from rlagent.train.config import TrainConfig
from rlagent.train.ppo import RunnerState
from rlagent.train.ppo import Trainer
from rlagent.train.ppo import make_train
from rlagent.train.rewards import reward_weights
from rlagent.train.writers import MetricWriter


def run(
    config: TrainConfig,
    env: Any,
    policy_config: Any,
    rollout_config: Any,
    *,
    seeds: Sequence[int],
    workdir: str,
    conditions: Sequence[str] | None = None,
    chunk_size: int = 10,
    resume: bool = False,
    stop_after: int | None = None,
    mesh: jax.sharding.Mesh | None = None,
    progress: bool = True,
    tensorboard: bool = True,
    checkpoint: bool = True,
) -> list[dict[str, Any]]:
    """Trains every (reward condition, seed) pair in parallel; returns all metric rows.

    `conditions` names reward forms (`rlagent.train.config.REWARDS`; default
    `[config.reward]`): they differ only in the reward weights carried in the runner
    state, so all runs share one compiled program. Each row is one (update, condition,
    seed): the metrics of `rlagent.train.ppo` plus `update` (1-based), `condition`,
    `seed`, `env_turns_total` (turns of experience so far in that run) and
    `turns_per_sec` (the chunk's throughput over all runs). `stop_after` ends this call
    after that many updates in total (a checkpoint is written; `resume=True` continues).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
    conditions = list(conditions) if conditions else [config.reward]
    runs = [(condition, int(seed)) for condition in conditions for seed in seeds]
    trainer = _trainer(config, env, policy_config, rollout_config, mesh)
    writer = MetricWriter(workdir, tensorboard=tensorboard)
    manager = _checkpoint_manager(workdir) if checkpoint else None
    keys = jnp.stack([jax.random.PRNGKey(seed) for _, seed in runs])
    weights = jnp.stack([reward_weights(config, condition) for condition, _ in runs])
    state = jax.jit(jax.vmap(trainer.init))(keys, weights)
    rows: list[dict[str, Any]] = []
    done = 0
    if resume and manager is not None and manager.latest_step() is not None:
        done = int(manager.latest_step())
        state = manager.restore(done, args=ocp.args.StandardRestore(state))
        rows = writer.truncate(done)
    else:
        writer.clear()
    totals = dict.fromkeys(runs, 0.0)
    for row in rows:
        totals[(row["condition"], int(row["seed"]))] = float(row["env_turns_total"])
    last = config.num_updates if stop_after is None else min(stop_after, config.num_updates)
    bar = tqdm(total=last, initial=done, desc=",".join(conditions), disable=not progress)
    while done < last:
        length = min(chunk_size, last - done)
        chunk = _chunk(trainer, length)
        start = time.perf_counter()
        state, metrics = chunk(state)
        metrics = jax.device_get(metrics)  # [runs, length] per metric; waits for the device.
        seconds = time.perf_counter() - start
        throughput = float(np.sum(metrics["env_turns"])) / seconds
        new_rows = []
        for t in range(length):
            for i, (condition, seed) in enumerate(runs):
                totals[(condition, seed)] += float(metrics["env_turns"][i, t])
                row = {"condition": condition, "update": done + t + 1, "seed": seed}
                row.update({k: float(v[i, t]) for k, v in sorted(metrics.items())})
                row["env_turns_total"] = totals[(condition, seed)]
                row["turns_per_sec"] = throughput
                new_rows.append(row)
        done += length
        writer.write(new_rows)
        rows.extend(new_rows)
        if manager is not None:
            manager.save(done, args=ocp.args.StandardSave(state))
            manager.wait_until_finished()
        bar.update(length)
        bar.set_postfix(success=f"{np.mean(metrics['success'][:, -1]):.2f}")
    bar.close()
    writer.close()
    if manager is not None:
        manager.close()
    return rows


@functools.lru_cache(maxsize=16)
def _trainer(config, env, policy_config, rollout_config, mesh) -> Trainer:
    # Cached so that repeated runs of one setup (resume, several calls in a notebook or a
    # test) reuse the compiled chunks below instead of tracing a new closure.
    return make_train(config, env, policy_config, rollout_config, mesh=mesh)


@functools.lru_cache(maxsize=32)
def _chunk(trainer: Trainer, length: int):
    """`jit(vmap(scan(update)))`: `length` updates of every run in one device call."""

    def chunk(state: RunnerState):
        return jax.lax.scan(lambda s, _: trainer.update(s), state, None, length=length)

    return jax.jit(jax.vmap(chunk))


def _checkpoint_manager(workdir: str) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(
        os.path.abspath(os.path.join(workdir, "checkpoints")),
        options=ocp.CheckpointManagerOptions(max_to_keep=2),
    )
