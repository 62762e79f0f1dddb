"""Host loop: jitted chunks of updates for several seeds, progress, metrics, checkpoints.

The device program is `jit(vmap(scan(update)))`: `chunk_size` PPO updates for every run
(reward condition x seed) in one call. Between chunks the host writes metrics and an
Orbax checkpoint of the runner states; `resume=True` restores the newest readable
checkpoint and continues exactly (the PRNG key lives in the state, so the continued run
equals an uninterrupted one).

What a run folder guarantees:
- A new run refuses a folder that holds anything unless `overwrite=True` (which empties
  it first) or `resume=True` (`rlagent.host.workdir`, shared with every study).
- `provenance.json` stores the resolved config (the typed configs: train, env, model,
  rollout, prm, probe, eval; seeds and conditions); `resume=True` refuses a different one
  with a one-line diff. Only `RESUMABLE_FIELDS` may change (`train.num_updates` only with
  a constant learning rate, since decaying schedules span `num_updates`); the arguments
  `chunk_size`, `stop_after`, `progress`, `tensorboard` and `mesh` are not part of it.
- A checkpoint that cannot be read is named, removed, and the newest readable one is
  used; metrics past the restored step are dropped.
- Step 0, the start (after `initial_params`, before the first update), is checkpointed
  and kept beside the newest two, so the policy before RL can be served or A/B tested
  (`rlagent.host.shadow.load_checkpoint("RUN_FOLDER@0")`).
- A non-finite loss or gradient (flagged inside the compiled update, which then skips
  that parameter update) stops the run at the next metric write with `Diverged`; the
  state of that chunk is not checkpointed, so the last checkpoint is finite.

With `curriculum=` (a scheduler, e.g. `rlagent.pipeline.curriculum.Scheduler`) the env is a
mixture of stages whose stage probabilities are an argument of the compiled chunk (one
program for every distribution); the scheduler sees every update's metrics, decides every
`curriculum.every` updates (chunks end there) and its state is checkpointed beside the
runner states, so a resumed run continues it exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import dataclasses
import functools
import os
import shutil
import time
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from orbax.checkpoint import checkpoint_managers
from tqdm.auto import tqdm

from rlagent import parallel
from rlagent.credit.probe import ProbeConfig
from rlagent.host import provenance
from rlagent.host.extras import trainer_extras
from rlagent.host.workdir import RESUMABLE_FIELDS
from rlagent.host.workdir import RunError
from rlagent.host.workdir import prepare_workdir
from rlagent.host.workdir import resumable_fields
from rlagent.host.writers import MetricWriter
from rlagent.prm.config import PRMConfig
from rlagent.train.config import LEARNED_REWARDS
from rlagent.train.config import TrainConfig
from rlagent.train.evaluation import EVAL_METRICS
from rlagent.train.evaluation import EvalConfig
from rlagent.train.evaluation import make_evaluate
from rlagent.train.ppo import INPUT_CHECKS
from rlagent.train.ppo import NONFINITE_METRICS
from rlagent.train.ppo import RunnerState
from rlagent.train.ppo import Trainer
from rlagent.train.ppo import make_train
from rlagent.train.rewards import check_forms
from rlagent.train.rewards import reward_weights

__all__ = [
    "CHECKPOINT_FIELDS", "RESUMABLE_FIELDS", "CheckpointConfig", "Diverged", "RunError",
    "RunFiles", "check_arguments", "check_finite", "checkpoint_manager", "clear_compiled",
    "clear_compiled_if_crowded", "held_out_evaluator", "open_run", "quiet_closed_loops",
    "resume_state", "run", "run_files", "save_start", "save_state", "wait_for_saves",
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """When a trainer that saves update by update (`rlagent.text.train`) checkpoints, and
    what `checkpoint_manager` keeps. None of it changes a result, so a resumed run may
    change it (`CHECKPOINT_FIELDS`)."""

    every: int = 1  # save after every `every`-th update, and after the last one.
    keep: int = 2  # the newest checkpoints kept; step 0 (the start) is kept beside them.
    # Orbax's asynchronous saves: `save` returns once the arrays are copied to host memory
    # and a background thread writes them while the next update runs; the next save, and
    # the run's end (`wait_for_saves`), wait for it and raise its error.
    asynchronous: bool = True

    def __post_init__(self):
        for name in ("every", "keep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CheckpointConfig.{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.asynchronous, bool):
            raise ValueError(
                f"CheckpointConfig.asynchronous must be True or False, got {self.asynchronous!r}"
            )

    def due(self, done: int, total: int) -> bool:
        """Whether the state after `done` of `total` updates is checkpointed."""
        return done % self.every == 0 or done == total


# Settings that change no result: a resumed run may change them (`open_run`).
CHECKPOINT_FIELDS = tuple(f"checkpoint.{f.name}" for f in dataclasses.fields(CheckpointConfig))
# The host loop's own: it waits for each chunk's checkpoint, and a full or unwritable disk
# is raised at the save that hit it.
_CHUNK_CHECKPOINTS = CheckpointConfig(asynchronous=False)


class Diverged(RunError):
    """Training hit a non-finite loss or gradient; `rows` are the metrics written."""

    def __init__(self, message: str, rows: list[dict[str, Any]]):
        super().__init__(message)
        self.rows = rows


def run(
    config: TrainConfig,
    env: Any,
    policy_config: Any,
    rollout_config: Any,
    *,
    seeds: Sequence[int],
    workdir: str,
    prm: PRMConfig = PRMConfig(),
    probe: ProbeConfig = ProbeConfig(),
    evaluation: EvalConfig = EvalConfig(),
    conditions: Sequence[str] | None = None,
    chunk_size: int = 10,
    resume: bool = False,
    overwrite: bool = False,
    stop_after: int | None = None,
    mesh: jax.sharding.Mesh | None = None,
    progress: bool = True,
    tensorboard: bool = True,
    checkpoint: bool = True,
    initial_params: Any = None,
    initial_params_config: Any = None,
    curriculum: Any = None,
) -> list[dict[str, Any]]:
    """Trains every (reward condition, seed) pair in parallel; returns all metric rows.
    `conditions` names reward forms (`rlagent.train.config.REWARDS`; default
    `[config.reward]`): they differ only in the reward weights carried in the runner
    state, so all runs share one compiled program. Each row is one (update, condition,
    seed): the metrics of `rlagent.train.ppo` plus `update` (1-based), `condition`,
    `seed`, `env_turns_total` (turns of experience so far in that run) and
    `turns_per_sec` (the chunk's throughput over all runs). The extras' configs, off by
    default and part of the resolved config: `prm` (the PRM the `learned_*` conditions
    read), `probe` (credit accuracy every `probe.every` updates), `evaluation` (rows also
    carry held-out evaluation metrics, NaN on updates not evaluated; chunks end at every
    evaluation). `stop_after` ends this call after that many updates in total (a
    checkpoint is written; `resume=True` continues). `initial_params` (`[len(seeds)]`-led,
    e.g. from `rlagent.pipeline.warm_start`) replace each seed's initial policy and KL
    reference, alike for every condition; `initial_params_config` (how they were made)
    joins the resolved config; `resume`, `overwrite`, `curriculum`: module docstring.
    """
    conditions = list(conditions) if conditions else [config.reward]
    check_arguments(config, env, rollout_config, seeds, conditions, prm=prm, probe=probe,
                     chunk_size=chunk_size, resume=resume, overwrite=overwrite,
                     curriculum=curriculum)  # fmt: skip
    runs = [(condition, int(seed)) for condition in conditions for seed in seeds]
    resolved = provenance.resolved(
        train=config, env=getattr(env, "config", repr(env)), model=policy_config,
        rollout=rollout_config, prm=prm, probe=probe, eval=evaluation,
        seeds=[int(seed) for seed in seeds], conditions=conditions,
        **({} if initial_params is None else {"initial_params": initial_params_config}),
        **({} if curriculum is None else {"curriculum": curriculum.config}),
    )  # fmt: skip
    resume, record = open_run(
        workdir, resolved, lr_schedule=config.lr_schedule, extra=("train.check_inputs",),
        resume=resume, overwrite=overwrite, chunk_size=chunk_size,
    )  # fmt: skip
    clear_compiled_if_crowded()  # before this run compiles its programs
    trainer = _trainer(config, env, policy_config, rollout_config, mesh, prm=prm, probe=probe)
    state, chunks = _initial_state(trainer, config, runs, seeds, initial_params), trainer
    if mesh is not None:  # on every device of the mesh (which may span processes).
        state = parallel.replicate(state, mesh)
    if curriculum is not None:  # the chunks' stage probabilities come from the scheduler
        chunks = _CurriculumTrainer(config, env, policy_config, rollout_config, mesh, curriculum)
        state, env = chunks.start(state, len(runs)), curriculum.eval_env  # env: evaluation's
    with run_files(
        workdir, state, runs, resume=resume, tensorboard=tensorboard, checkpoint=checkpoint
    ) as files:
        evaluate = _evaluator(trainer, env, rollout_config, evaluation)
        rows = _train(
            chunks, evaluate, files.state, done=files.done, rows=files.rows, runs=runs,
            config=config, writer=files.writer, manager=files.manager, chunk_size=chunk_size,
            stop_after=stop_after, progress=progress, eval_every=evaluation.every,
            credit_every=probe.every,
        )  # fmt: skip
        updates = [files.done, max((int(row["update"]) for row in rows), default=files.done)]
        # The checkout at the end, and the updates this process ran (a resume's segment).
        provenance.write(workdir, provenance.finish({**record, "updates": updates}))
        return rows


def open_run(
    workdir: str, resolved: dict[str, Any], *, lr_schedule: str, extra: Sequence[str] = (),
    resume: bool = False, overwrite: bool = False, **facts: Any,
) -> tuple[bool, dict[str, Any]]:  # fmt: skip
    """Readies `workdir` for a run of the resolved config (`provenance.resolved`) and writes
    its `provenance.json` (a resume leaves it alone; its record joins
    `provenance.SEGMENTS` when it finishes): `(resumed, the provenance record)`. A resumed
    folder must hold the same config except `resumable_fields(lr_schedule, extra)` and
    `CHECKPOINT_FIELDS`; `facts` join the record (not the config). `run` starts through it,
    and so does any other trainer that keeps the run-folder guarantees of the module
    docstring (`rlagent.text.train`)."""
    may_change, note = resumable_fields(lr_schedule, extra=(*extra, *CHECKPOINT_FIELDS))
    resume = prepare_workdir(
        workdir, resume=resume, overwrite=overwrite, config=resolved, may_change=may_change,
        note=note,
    )  # fmt: skip
    record = provenance.collect(resolved, **facts)
    if not resume:  # a resume records itself when it finishes (`provenance.write`).
        provenance.write(workdir, record)
    return resume, record


class RunFiles(NamedTuple):
    """A run folder's writers and where the run stands (`run_files`)."""

    writer: MetricWriter  # metrics.csv (and TensorBoard events).
    manager: ocp.CheckpointManager | None  # <workdir>/checkpoints; None without.
    done: int  # updates done (restored from the newest readable checkpoint, or 0).
    state: Any  # the state to go on from (restored, or the fresh one).
    rows: list[dict[str, Any]]  # the metric rows kept (up to `done`).


@contextlib.contextmanager
def run_files(
    workdir: str, state: Any, runs: Sequence[tuple[str, int]], *, resume: bool,
    tensorboard: bool = True, checkpoint: bool = True,
    checkpoints: CheckpointConfig = _CHUNK_CHECKPOINTS,
):  # fmt: skip
    """The metric writer and checkpoint manager of `workdir` (closed on exit; the manager
    of `checkpoints`), the state restored from them when resuming (`resume_state`: `state`
    is the fresh one and the template) and step 0, the start, checkpointed once per
    folder."""
    writer, manager = MetricWriter(workdir, tensorboard=tensorboard), None
    try:
        manager = checkpoint_manager(workdir, checkpoints) if checkpoint else None
        done, state, rows = resume_state(manager, writer, state, runs, resume=resume)
        save_start(manager, done, state)
        yield RunFiles(writer, manager, done, state, rows)
    finally:
        writer.close()
        if manager is not None:
            manager.close()


class Curriculum(NamedTuple):
    """What a curriculum run checkpoints: the runner states and the scheduler's."""

    runner: RunnerState
    scheduler: Any  # the scheduler's state (NumPy arrays with a leading runs axis).
    # [runs, stages] the probabilities decided last, held until the next decision (a run
    # stopped between decisions resumes with them).
    probs: np.ndarray


class _CurriculumTrainer(NamedTuple):
    """Chunks of a curriculum run: `chunk(state, length, done)` runs `length` updates with
    the scheduler's stage probabilities and feeds it every update's metrics."""

    config: TrainConfig
    env: Any
    policy_config: Any
    rollout_config: Any
    mesh: Any
    curriculum: Any

    def start(self, state: RunnerState, num_runs: int) -> Curriculum:
        schedule = self.curriculum.init(num_runs)
        return Curriculum(state, schedule, self.curriculum.probs(schedule, 0))

    def chunk(self, state: Curriculum, length: int, done: int):
        scheduler, schedule, probs = self.curriculum, state.scheduler, state.probs
        if done % scheduler.every == 0:
            probs = scheduler.probs(schedule, done)
        program = _curriculum_chunk(
            self.config, self.env, self.policy_config, self.rollout_config, self.mesh, length
        )
        runner, metrics = program(state.runner, jnp.asarray(probs))
        metrics = parallel.fetch(metrics)
        checks = {k: metrics.pop(k) for k in (INPUT_CHECKS,) if k in metrics}  # for _train
        columns = []
        for t in range(length):
            schedule = scheduler.observe(schedule, {k: v[:, t] for k, v in metrics.items()})
            columns.append(scheduler.columns(schedule, probs))
        if (done + length) % scheduler.every == 0:
            schedule = scheduler.decide(schedule)
        metrics.update({k: np.stack([c[k] for c in columns], 1) for k in columns[0]}, **checks)
        return Curriculum(runner, schedule, probs), metrics


def resume_state(
    manager: ocp.CheckpointManager | None, writer: MetricWriter, state: Any,
    runs: Sequence[tuple[str, int]], *, resume: bool,
) -> tuple[int, Any, list[dict[str, Any]]]:  # fmt: skip
    """`(updates done, state, rows kept)` for any state pytree (`state`: the fresh one, also
    the template restored into) whose metric rows in `writer` carry `condition`, `seed` and
    `update`: when resuming, the newest readable checkpoint that every run's rows reach
    (unreadable ones and those past the rows named and removed, rows past it dropped);
    else, or without a checkpoint, a fresh start with an empty metrics.csv. `run` resumes
    through it, and so can a study that checkpoints a state of its own chunk by chunk
    (`checkpoint_manager`, `save_state`)."""
    done = 0
    if resume and manager is not None:
        done, state = _restore(manager, state, reach=_stored_reach(writer, list(runs)))
    rows = writer.truncate(done) if done else []
    if not done:
        writer.clear()
    return done, state, rows


def check_arguments(
    config, env, rollout_config, seeds, conditions, *, prm=PRMConfig(), probe=ProbeConfig(),
    chunk_size=10, resume=False, overwrite=False, curriculum=None, field="condition",
) -> None:  # fmt: skip
    """Refuses bad arguments of `run` before anything is written (a reward form the env
    cannot pay or without the PRM it reads, extras' configs that do not fit the run); a
    study calls it before it writes its own folder, naming its config's `field`."""
    if curriculum is not None and (prm.kind != "none" or probe.every):
        raise ValueError("curriculum= runs take no PRM and no credit probe.")
    if resume and overwrite:
        raise ValueError("resume=True and overwrite=True exclude each other.")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
    if not seeds:
        raise ValueError("seeds must name at least one seed.")
    check_forms(env, config, conditions, field)
    for condition in conditions:
        if condition in LEARNED_REWARDS and prm.kind == "none":
            raise ValueError(
                f"condition {condition!r} reads a process reward model's scores: "
                "PRMConfig.kind must name one, got 'none'."
            )
    trainer_extras(config, env, rollout_config, prm=prm, probe=probe)


def _initial_state(trainer, config, runs, seeds, initial_params) -> RunnerState:
    """Every run's fresh state; `initial_params` (`[len(seeds)]`) replace the policy and
    its KL reference per seed, alike for every condition."""
    keys = jnp.stack([jax.random.PRNGKey(seed) for _, seed in runs])
    weights = jnp.stack([reward_weights(config, condition) for condition, _ in runs])
    state = _init(trainer)(keys, weights)
    if initial_params is None:
        return state
    # Adam's moments start at zero whatever the parameters, so opt_state stays valid.
    index = jnp.asarray([list(seeds).index(seed) for _, seed in runs])
    params = jax.tree.map(lambda x: jnp.asarray(x)[index], initial_params)
    return state._replace(params=params, ref_params=params)


def _train(
    trainer,
    evaluate,
    state,
    *,
    done,
    rows,
    runs,
    config,
    writer,
    manager,
    chunk_size,
    stop_after,
    progress,
    eval_every,
    credit_every,
) -> list[dict[str, Any]]:
    totals = dict.fromkeys(runs, 0.0)
    for row in rows:
        totals[(row["condition"], int(row["seed"]))] = float(row["env_turns_total"])
    last = config.num_updates if stop_after is None else min(stop_after, config.num_updates)
    conditions = list(dict.fromkeys(condition for condition, _ in runs))
    bar = tqdm(
        total=last, initial=done, desc=",".join(conditions),
        disable=not (progress and parallel.is_primary()),
    )  # fmt: skip
    try:
        while done < last:
            length = min(chunk_size, last - done)
            if evaluate is not None:  # end the chunk at the next evaluation
                length = min(length, eval_every - done % eval_every)
            start = time.perf_counter()
            if isinstance(trainer, _CurriculumTrainer):  # chunks end at its decisions
                length = min(length, trainer.curriculum.every - done % trainer.curriculum.every)
                state, metrics = trainer.chunk(state, length, done)
            else:
                chunk = _chunk(trainer, length, done % credit_every if credit_every else 0)
                state, metrics = chunk(state)
                metrics = parallel.fetch(metrics)  # [runs, length] per metric; waits.
            _raise_failed_checks(metrics.pop(INPUT_CHECKS, None), done, length, runs)
            seconds = time.perf_counter() - start
            throughput = float(np.sum(metrics["env_turns"])) / seconds
            diverged = _first_nonfinite(metrics)
            new_rows = []
            for t in range(length if diverged is None else diverged + 1):
                for i, (condition, seed) in enumerate(runs):
                    totals[(condition, seed)] += float(metrics["env_turns"][i, t])
                    row = {"condition": condition, "update": done + t + 1, "seed": seed}
                    row.update({k: float(v[i, t]) for k, v in sorted(metrics.items())})
                    row["env_turns_total"] = totals[(condition, seed)]
                    row["turns_per_sec"] = throughput
                    new_rows.append(row)
            if evaluate is not None:
                evaluated = diverged is None and (
                    (done + length) % eval_every == 0 or done + length == config.num_updates
                )
                params = (state.runner if isinstance(state, Curriculum) else state).params
                _add_evaluation(new_rows, runs, evaluate(params) if evaluated else None)
            writer.write(new_rows)
            rows.extend(new_rows)
            if diverged is not None:
                raise Diverged(_divergence_message(metrics, diverged, done, runs, manager), rows)
            done += length
            if manager is not None:
                save_state(manager, done, state)
            bar.update(length)
            bar.set_postfix(success=f"{np.mean(metrics['success'][:, -1]):.2f}")
    finally:
        bar.close()
    return rows


def _stored_reach(writer: MetricWriter, runs: list[tuple[str, int]]) -> int:
    """`_metrics_reach` of the rows on disk; a metrics.csv that cannot be parsed (not
    one cut short by a kill, which `MetricWriter.read` handles) is refused naming it."""
    try:
        return _metrics_reach(writer.read(), runs)
    except (TypeError, ValueError, KeyError, csv.Error) as error:
        raise RunError(
            f"--resume: {writer.path} is damaged ({type(error).__name__}: "
            f"{str(error)[:200]}); pass --overwrite to start the run again."
        ) from None


def _metrics_reach(rows: list[dict[str, Any]], runs: list[tuple[str, int]]) -> int:
    """The last update that every run has a metric row for (0 without rows)."""
    last = {}
    for row in rows:
        run = (row["condition"], int(row["seed"]))
        last[run] = max(last.get(run, 0), int(row["update"]))
    return min((last.get(run, 0) for run in runs), default=0)


def _placed_like(template: Any, restored: Any) -> Any:
    """`restored` (a checkpoint's leaf) placed as the fresh state's leaf `template` is."""
    if isinstance(restored, jax.Array) and not restored.is_fully_addressable:
        return restored  # restored into the template's sharding over several processes.
    if isinstance(template, jax.Array) and template.committed:
        return jax.device_put(np.asarray(restored), template.sharding)
    return jnp.asarray(np.asarray(restored))


def _restore(
    manager: ocp.CheckpointManager, state: RunnerState | Curriculum, *, reach: int
) -> tuple[int, RunnerState | Curriculum]:
    """The newest readable checkpoint that the metrics reach (`reach`: the last update
    with every run's row); unreadable ones and those past the metrics (rows lost from a
    cut metrics.csv) are named and removed. Refuses when checkpoints after the start exist
    but none is at or before `reach` (every metric row lost: a start over needs
    `--overwrite`)."""
    steps = sorted(manager.all_steps(), reverse=True)
    trained = [step for step in steps if step > 0]  # step 0 is the start, always kept
    if trained and min(trained) > reach:  # refused before anything is removed
        raise RunError(
            f"--resume: metrics.csv in {os.path.dirname(manager.directory)} holds every run's "
            f"rows up to update {reach} only, and no checkpoint after the start is at or "
            f"before it (oldest {min(trained)}); pass --overwrite to start the run again."
        )
    for step in steps:
        if step > reach:
            logging.warning(
                "Checkpoint step %d in %s is past the last update metrics.csv holds for "
                "every run (%d); removing it so that no update goes missing.",
                step, manager.directory, reach,
            )  # fmt: skip
            _remove_step(manager, step)
            continue
        try:
            with quiet_closed_loops():
                restored = manager.restore(step, args=ocp.args.StandardRestore(state))
        except Exception as error:  # noqa: BLE001 - any failure to read means a broken step.
            logging.warning(
                "Checkpoint step %d in %s is unreadable (%s: %s); removing it and "
                "trying an older one.",
                step,
                manager.directory,
                type(error).__name__,
                str(error).splitlines()[0][:200],
            )
            _remove_step(manager, step)
            continue
        logging.warning("Resuming %s from checkpoint step %d.", manager.directory, step)
        # Restored arrays are committed to a device, fresh ones are not; as a jit cache key
        # that difference would recompile the chunk (a full compile on every resume). A
        # template leaf placed on a mesh (committed) keeps its sharding: the programs then
        # run as they did before the stop (the same layout, the same rounding).
        restored = jax.tree.map(_placed_like, state, restored)
        if isinstance(state, Curriculum):  # the scheduler's state lives on the host
            restored = restored._replace(
                scheduler=jax.tree.map(np.asarray, restored.scheduler),
                probs=np.asarray(restored.probs),
            )
        return int(step), restored
    logging.warning(
        "--resume: no readable checkpoint in %s; starting from scratch.", manager.directory
    )
    return 0, state


def _remove_step(manager: ocp.CheckpointManager, step: int) -> None:
    """Deletes checkpoint `step` (process 0 of a multi-process run, the others waiting)."""
    if parallel.is_primary():
        shutil.rmtree(os.path.join(manager.directory, str(step)))
    parallel.sync(f"removed checkpoint {step}")
    manager.reload()


class _QuietLoop(asyncio.SelectorEventLoop):
    """An event loop that drops callbacks scheduled onto it after it closed."""

    def call_soon_threadsafe(self, callback, *args, context=None):
        try:
            return super().call_soon_threadsafe(callback, *args, context=context)
        except RuntimeError:
            if self.is_closed():
                return None  # a completion nobody awaits any more
            raise


class _QuietPolicy(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return _QuietLoop()


@contextlib.contextmanager
def quiet_closed_loops():
    """Event loops made inside drop callbacks that arrive after they closed.

    Orbax runs every restore on a fresh event loop and closes it when the restore returns
    or raises. When one array of a broken checkpoint fails to read, the restore raises
    while TensorStore's reads of the other arrays are still in flight; as each finishes,
    TensorStore's thread schedules its completion onto the closed loop, and every one
    printed a 'RuntimeError: Event loop is closed' traceback (past sys.excepthook; a race,
    so from none to hundreds per broken step). Those completions have no awaiter left.
    """
    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_QuietPolicy())
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(previous)


def save_start(manager: ocp.CheckpointManager | None, done: int, state: Any) -> None:
    """Checkpoints step 0, the start (the policy before RL), once per run folder."""
    if manager is not None and done == 0 and 0 not in manager.all_steps():
        save_state(manager, 0, state)


def save_state(manager: ocp.CheckpointManager, step: int, state: Any) -> None:
    """Checkpoints `state` at `step` (`RunError` naming both when it cannot be written)."""
    try:
        manager.save(step, args=ocp.args.StandardSave(state))
    except Exception as error:
        raise RunError(
            f"Could not write checkpoint step {step} to {manager.directory}: "
            f"{type(error).__name__}: {error}"
        ) from error


def wait_for_saves(manager: ocp.CheckpointManager) -> None:
    """Waits for the asynchronous saves in flight (`RunError` naming the folder when one
    could not be written)."""
    try:
        manager.wait_until_finished()
    except Exception as error:
        raise RunError(
            f"Could not write a checkpoint to {manager.directory}: {type(error).__name__}: {error}"
        ) from error


def check_finite(metrics, done: int, runs, manager, rows) -> None:
    """Raises `Diverged` (with `rows`) when a chunk's `metrics [runs, updates]` flag a
    non-finite loss or gradient (`NONFINITE_METRICS`, which they must hold); `done`
    updates came before the chunk, `manager` kept the last good checkpoint. For trainers
    outside `run` (e.g. the DPO groups of the strategies study)."""
    missing = [name for name in NONFINITE_METRICS if name not in metrics]
    if missing:
        raise ValueError(f"check_finite: the chunk's metrics lack {missing}.")
    flags = {name: np.asarray(metrics[name]) for name in NONFINITE_METRICS}
    diverged = _first_nonfinite(flags)
    if diverged is not None:
        raise Diverged(_divergence_message(flags, diverged, done, runs, manager), rows)


def _first_nonfinite(metrics: dict[str, np.ndarray]) -> int | None:
    """Index of the first update of the chunk whose flags report a non-finite value."""
    flags = np.any([metrics[name] > 0 for name in NONFINITE_METRICS], axis=(0, 1))
    return int(np.argmax(flags)) if flags.any() else None


def _divergence_message(metrics, t, done, runs, manager) -> str:
    bad = [
        f"{condition}/seed {seed}: "
        + ", ".join(
            name.removeprefix("nonfinite_") for name in NONFINITE_METRICS if metrics[name][i, t] > 0
        )
        for i, (condition, seed) in enumerate(runs)
        if any(metrics[name][i, t] > 0 for name in NONFINITE_METRICS)
    ]
    kept = manager.latest_step() if manager is not None else None
    where = "no checkpoint kept" if kept is None else f"checkpoint of update {kept} kept"
    return (
        f"Diverged at update {done + t + 1}: non-finite {'; '.join(bad)}. Training "
        f"stopped ({where}); lower the learning rate or check the rewards."
    )


def clear_compiled() -> None:
    """Drops the cached trainers and compiled programs (and jax's caches): a long sweep of
    many programs, each compiled once, would otherwise keep every executable in memory."""
    for cached in (_trainer, _init, _chunk, _curriculum_chunk, _evaluator):
        cached.cache_clear()
    jax.clear_caches()


# `clear_compiled_if_crowded` clears past this fraction of the kernel's memory-map limit.
CROWDED_MAPS = 0.5


def clear_compiled_if_crowded(fraction: float = CROWDED_MAPS) -> bool:
    """Clears the compiled programs (`clear_compiled`) when this process holds more than
    `fraction` of the kernel's limit on memory maps (Linux `vm.max_map_count`, 65,530 by
    default); True when it cleared. XLA CPU maps every compiled program's code in many
    regions, and a sweep that keeps dozens of programs in one process (the horizon sweep's
    6 estimators x 2 horizons) otherwise dies past the limit with `LLVM compilation
    error: Cannot allocate memory` (or a failed `dlopen`) while memory is still free.
    Without /proc (not Linux) nothing is cleared."""
    counts = memory_maps()
    if counts is None:
        return False
    regions, allowed = counts
    if regions <= fraction * allowed:
        return False
    logging.info("%d of %d memory maps in use: clearing compiled programs.", regions, allowed)
    clear_compiled()
    return True


def memory_maps() -> tuple[int, int] | None:
    """(memory maps this process holds, the kernel's limit), None where /proc cannot say."""
    try:
        with open("/proc/self/maps") as maps:
            regions = sum(1 for _ in maps)
        with open("/proc/sys/vm/max_map_count") as limit:
            return regions, int(limit.read())
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=16)
def _trainer(
    config, env, policy_config, rollout_config, mesh, *, prm=PRMConfig(), probe=ProbeConfig()
) -> Trainer:
    # Cached so that repeated runs of one setup (resume, several calls in a notebook or a
    # test) reuse the compiled chunks below instead of tracing a new closure.
    extras = trainer_extras(config, env, rollout_config, prm=prm, probe=probe)
    return make_train(config, env, policy_config, rollout_config, mesh=mesh, **extras)


def _add_evaluation(new_rows, runs, metrics) -> None:
    """Puts the evaluation `metrics` ([runs] per name) on each run's last row of the chunk.

    Every row gets every evaluation column (NaN where not evaluated, or not measured by the
    environment's `episode_metrics`), so that the CSV keeps one set of keys.
    """
    names = [f"eval_{p}_{m}" for p in ("sampled", "greedy") for m in EVAL_METRICS]
    last_update = max(row["update"] for row in new_rows)
    values = None if metrics is None else parallel.fetch(metrics)
    for row in new_rows:
        i = runs.index((row["condition"], row["seed"]))
        for name in names:
            evaluated = values is not None and row["update"] == last_update and name in values
            row[name] = float(values[name][i]) if evaluated else float("nan")


def held_out_evaluator(
    config: TrainConfig,
    env: Any,
    policy_config: Any,
    rollout_config: Any,
    evaluation: EvalConfig,
) -> Any:
    """The `jit(vmap(evaluate))` that `run` evaluates its runs' parameters `[runs]` with
    (for a one-device run of the same arguments): a study that also evaluates its
    starting policies shares the compiled program. Also with `evaluation.every` 0 (when
    `run` evaluates nothing): the schedule is not part of the program."""
    evaluation = dataclasses.replace(evaluation, every=evaluation.every or 1)
    trainer = _trainer(config, env, policy_config, rollout_config, None)
    return _evaluator(trainer, env, rollout_config, evaluation)


@functools.lru_cache(maxsize=16)
def _evaluator(trainer: Trainer, env, rollout_config, evaluation: EvalConfig):
    """`jit(vmap(evaluate))` over the runs' parameters (`rlagent.train.evaluation`), None
    when `evaluation.every` is 0."""
    if not evaluation.every:
        return None
    evaluate = make_evaluate(
        env, trainer.graphdef, rollout_config, num_episodes=evaluation.episodes,
        tasks=evaluation.tasks,
    )  # fmt: skip
    return jax.jit(jax.vmap(evaluate))


@functools.lru_cache(maxsize=16)
def _init(trainer: Trainer):
    return jax.jit(jax.vmap(trainer.init))


@functools.lru_cache(maxsize=16)
def _curriculum_chunk(config, env, policy_config, rollout_config, mesh, length: int):
    """`jit(vmap(chunk))(states, probs [runs, stages])`: `length` updates of every run on
    `env.with_probs(probs)`; the probabilities are data, so one program serves them all."""

    def chunk(state: RunnerState, probs: jax.Array):
        trainer = make_train(
            config, env.with_probs(probs), policy_config, rollout_config, mesh=mesh
        )
        return trainer.updates(state, length)

    return jax.jit(jax.vmap(chunk))


@functools.lru_cache(maxsize=32)
def _chunk(trainer: Trainer, length: int, phase: int = 0):
    """`jit(vmap(scan(update)))`: `length` updates of every run in one device call, from a
    step whose remainder modulo the probe's `every` is `phase` (which updates probe credit)."""

    def chunk(state: RunnerState):
        return trainer.updates(state, length, first_step=phase)

    return jax.jit(jax.vmap(chunk))


def _raise_failed_checks(error, done: int, length: int, runs) -> None:
    """`TrainConfig.check_inputs`: a failed kernel input check stops the run before the
    chunk's rows or checkpoint are written, naming its updates and runs."""
    message = None if error is None else error.get()
    if message is not None:
        raise RunError(
            f"check_inputs: a kernel input check failed in updates {done + 1}-{done + length} "
            f"(nothing of them written; 'mapped index' = run, update within them; runs "
            f"{[f'{condition}/seed {seed}' for condition, seed in runs]}): {message}"
        )


def checkpoint_manager(
    workdir: str, config: CheckpointConfig = _CHUNK_CHECKPOINTS
) -> ocp.CheckpointManager:
    """The Orbax manager of `<workdir>/checkpoints`: the newest `config.keep` kept (two for
    the host loop), and step 0 (the start, before any update: `run` writes it) kept
    always, so that a run's policy before and after RL can be served or A/B tested.
    Synchronous saves unless `config.asynchronous`: the host loop waits for each chunk's
    checkpoint anyway, and an error (a full or unwritable disk) is raised at its save
    instead of in a background thread."""
    policy = checkpoint_managers.AnyPreservationPolicy(
        [checkpoint_managers.LatestN(config.keep), checkpoint_managers.CustomSteps([0])]
    )
    return ocp.CheckpointManager(
        os.path.abspath(os.path.join(workdir, "checkpoints")),
        options=ocp.CheckpointManagerOptions(
            preservation_policy=policy, enable_async_checkpointing=config.asynchronous
        ),
    )
