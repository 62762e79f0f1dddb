"""Host loop: jitted chunks of updates for several seeds, progress, metrics, checkpoints.

The device program is `jit(vmap(scan(update)))`: `chunk_size` PPO updates for every seed
in one call. Between chunks the host writes metrics and an Orbax checkpoint of the
runner states; `resume=True` restores the newest checkpoint and continues exactly (the
PRNG key lives in the state, so the continued run equals an uninterrupted one).
"""

from __future__ import annotations

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
from rlagent.train.writers import MetricWriter


def run(
    config: TrainConfig,
    env: Any,
    policy_config: Any,
    rollout_config: Any,
    *,
    seeds: Sequence[int],
    workdir: str,
    chunk_size: int = 10,
    resume: bool = False,
    condition: str = "run",
    mesh: jax.sharding.Mesh | None = None,
    progress: bool = True,
    tensorboard: bool = True,
    checkpoint: bool = True,
) -> list[dict[str, Any]]:
    """Trains `len(seeds)` seeds in parallel; returns the metric rows of the whole run.

    Each row is one (update, seed): the metrics of `rlagent.train.ppo.update` plus
    `update` (1-based), `seed`, `condition`, `env_turns_total` (turns of experience so far
    in that seed) and `turns_per_sec` (the chunk's throughput over all seeds).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
    trainer = make_train(config, env, policy_config, rollout_config, mesh=mesh)
    writer = MetricWriter(workdir, tensorboard=tensorboard)
    manager = _checkpoint_manager(workdir) if checkpoint else None
    keys = jnp.stack([jax.random.PRNGKey(seed) for seed in seeds])
    state = jax.jit(jax.vmap(trainer.init))(keys)
    rows: list[dict[str, Any]] = []
    done = 0
    if resume and manager is not None and manager.latest_step() is not None:
        done = int(manager.latest_step())
        state = manager.restore(done, args=ocp.args.StandardRestore(state))
        rows = writer.truncate(done)
    elif os.path.exists(writer.path):
        os.remove(writer.path)
    totals = {seed: 0.0 for seed in seeds}
    for row in rows:
        totals[int(row["seed"])] = float(row["env_turns_total"])
    chunks = {}
    bar = tqdm(total=config.num_updates, initial=done, desc=condition, disable=not progress)
    while done < config.num_updates:
        length = min(chunk_size, config.num_updates - done)
        if length not in chunks:
            chunks[length] = _compile_chunk(trainer, length).lower(state).compile()
        start = time.perf_counter()
        state, metrics = chunks[length](state)
        metrics = jax.device_get(metrics)  # [num_seeds, length] per metric; waits for device.
        seconds = time.perf_counter() - start
        throughput = float(np.sum(metrics["env_turns"])) / seconds
        new_rows = []
        for t in range(length):
            for i, seed in enumerate(seeds):
                totals[seed] += float(metrics["env_turns"][i, t])
                row = {"condition": condition, "update": done + t + 1, "seed": int(seed)}
                row.update({k: float(v[i, t]) for k, v in sorted(metrics.items())})
                row["env_turns_total"] = totals[seed]
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


def _compile_chunk(trainer: Trainer, length: int):
    def chunk(state: RunnerState):
        return jax.lax.scan(lambda s, _: trainer.update(s), state, None, length=length)

    return jax.jit(jax.vmap(chunk))


def _checkpoint_manager(workdir: str) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(
        os.path.abspath(os.path.join(workdir, "checkpoints")),
        options=ocp.CheckpointManagerOptions(max_to_keep=2),
    )
