"""Training strategies on ToolWorld: PPO, GRPO, offline DPO, online DPO / RLAIF.

`run` trains, on one environment and one policy architecture:

* `ppo` and `grpo` with the outcome reward (`rlagent.host.loop.run`);
* online DPO with trajectory pairs, every judge of `config.judges` (`judge[@accuracy]`)
  side by side in one program (`online_dpo/<judge>`), with fork pairs for
  `config.fork_judges` (`fork_dpo/<judge>`), and with a PRM as the judge
  (`online_dpo/prm=<kind>`);
* offline DPO on logs of a behaviour policy ranked by `config.offline_judge`, written to
  `data/behaviour_pairs.jsonl` and loaded back through the validating loader, at every
  size of `config.data_sizes` (`offline_dpo/<pairs>`), and the other offline groups of
  `offline_arms` on the same pairs and steps: DPO at the trajectory level, SFT on the
  chosen sides, SFT then trajectory DPO (`<group>/<pairs>`).

Every condition is evaluated on the same held-out tasks (`rlagent.train.evaluation`,
sampled and greedy) at `online.num_updates // eval_every` points, evenly spaced over its
updates; its x-axis is the total number of environment turns it consumed: its own
episodes, every candidate a judge ranked, a PRM's labelling turns and, for offline
DPO, the logging turns of its data. Outputs:
`metrics.csv` (one row per evaluation, condition and seed), `curves.png`,
`summary.md` / `summary.json` (`rlagent.analysis.report`; the offline data-size
curve in a table of its own) and `provenance.json`. `config.groups` names the groups
of runs trained (`GROUPS`, default all), each one program and one folder.

Every group of runs trained together checkpoints after each chunk (each held-out
evaluation), so `resume` continues a killed run exactly: `ppo/` and `grpo/` are
`rlagent.host.loop.run` folders; `online_dpo/`, `fork_dpo/`, `online_dpo_prm/` and every
offline group's folder hold the group's rows so far (`metrics.csv`) and Orbax
checkpoints of its whole vmapped state (`checkpoints/<updates>`: parameters, optimizer
states, reference, judge weights and accuracy, the judge's or PRM's state, PRNG keys),
written after the rows (`loop.resume_state` restores the newest checkpoint every run's
rows reach and drops rows past it); a finished group is read back, not trained again.
The behaviour logs are written to a temporary file renamed when complete, then
`data/logging.json` (their logging turns per data size and sha256): a resumed run reuses
logs it finds complete and logs again when that file is absent (a kill while logging). A
non-empty workdir needs `resume` (the config must equal the stored one; nothing may
change) or `overwrite`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from experiments.studies import common
from experiments.studies.envs import env_config
from experiments.studies.envs import kind_of
from experiments.studies.envs import study_kind
from experiments.studies.sections import make
from rlagent.analysis import paired
from rlagent.analysis import report
from rlagent.analysis import stats
from rlagent.credit import mc
from rlagent.host import loop
from rlagent.host import provenance
from rlagent.host.workdir import RunError
from rlagent.host.workdir import prepare_workdir
from rlagent.host.writers import MetricWriter
from rlagent.preference import data as pref_data
from rlagent.preference import pairs
from rlagent.preference.dpo import DPOConfig
from rlagent.preference.dpo import make_offline_dpo
from rlagent.preference.judges import PRM_JUDGES
from rlagent.preference.judges import judge_weights
from rlagent.preference.judges import make_judge
from rlagent.preference.online import make_online_dpo
from rlagent.prm.config import PRMConfig
from rlagent.prm.factory import make_prm
from rlagent.rollout import RolloutConfig
from rlagent.train.config import TrainConfig
from rlagent.train.evaluation import EvalConfig
from rlagent.train.evaluation import make_evaluate
from rlagent.train.extras import PRMInputs
from rlagent.train.ppo import policy_graphdef

TITLE = "{env}: PPO, GRPO, offline and online DPO (held-out success)"
# Held-out metrics a row carries under the names report.summarize reads.
EVAL_AS = {
    name: f"eval_sampled_{name}" for name in ("success", "violation_rate", "collapse_rate", "turns")
}
# The groups of runs `config.groups` may name, in the order they train; each trains in
# one program (PPO and GRPO: `loop.run`) and has a folder of that name in the workdir.
OFFLINE = ("offline_dpo", "offline_dpo_trajectory", "offline_sft", "offline_sft_dpo")
GROUPS = ("ppo", "grpo", "online_dpo", "fork_dpo", "online_dpo_prm", *OFFLINE)
# The offline family, pre-declared: (A, B) compared as B - A at each data size, paired over
# seeds (an offline group's run of a seed starts from the seed's policy and draws the same
# pairs at every step), Holm within each metric's family.
OFFLINE_PAIRS = (
    # SDPO: segment pairs over whole trajectories (the same loss unless
    # config.offline.segment_turns bounds the segment: docs/preference.md)
    ("offline_dpo_trajectory", "offline_dpo"),
    ("offline_sft", "offline_sft_dpo"),  # ETO: SFT then DPO over SFT alone
    ("offline_sft", "offline_dpo_trajectory"),  # DPO's rejected sides over SFT, equal steps
)
OFFLINE_METRICS = {
    "eval_sampled_success": "held-out sampled success",
    "eval_greedy_success": "held-out greedy success",
}
# The counts of the config (`common.check_counts`): seeds, the first seed, online
# iterations between evaluations, held-out episodes per evaluation.
COUNTS = {"seeds": 1, "first_seed": None, "eval_every": 1, "eval_episodes": 1}
LOG_SHAPE = (64, 4)  # behaviour logging: tasks per call, episodes per task.
# Beside the behaviour logs, written once they are complete: their logging turns, sha256.
LOGGING = "logging.json"


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    report_only: bool = False,
) -> dict[str, Any]:
    """Trains and reports every strategy of `config` into `workdir` (module docstring);
    `resume` continues a killed run exactly, refusing another config. `report_only`
    rewrites summary.md, summary.json and curves.png from a finished run's metrics.csv
    (its timings kept), training nothing."""
    if report_only:
        return _rewrite_report(config, workdir)
    setup = _setup(config)  # config errors before anything is written
    resume = prepare_workdir(
        workdir, resume=resume, overwrite=overwrite,
        config=provenance.resolved(**config.to_dict()), note="nothing may change on resume",
    )  # fmt: skip
    start = time.time()
    record = common.start_record(workdir, resume, config.to_dict())
    timings, rows = {}, []
    for name, part in (("ppo", _ppo_rows), ("online", _online_rows), ("offline", _offline_rows)):
        began = time.time()
        rows += part(config, setup, workdir, resume=resume, progress=progress)
        timings[name] = round(time.time() - began, 1)
    summary = _report(rows, config, workdir)
    summary["wall_s"] = timings
    with open(os.path.join(workdir, "summary.json"), "w") as handle:
        json.dump(summary, handle, indent=2)
    provenance.write(
        workdir,
        provenance.finish({**record, "wall_s": round(time.time() - start, 1), "parts_s": timings}),
    )
    return summary


def _rewrite_report(config, workdir: str) -> dict[str, Any]:
    path = os.path.join(workdir, "summary.json")
    if not os.path.exists(path):
        raise RunError(f"--report_only: {path} is missing: the run in {workdir} has not finished.")
    with open(path) as handle:
        timings = json.load(handle).get("wall_s")
    summary = _report(MetricWriter(workdir, tensorboard=False).read(), config, workdir)
    summary["wall_s"] = timings
    with open(path, "w") as handle:
        json.dump(summary, handle, indent=2)
    return summary


class _Setup(NamedTuple):
    env: Any
    policy_config: Any
    rollout_config: RolloutConfig
    online: DPOConfig
    offline: DPOConfig
    ppo: TrainConfig  # PPO's, and the reward settings every judge reads.
    seeds: list[int]
    groups: tuple[str, ...]  # GROUPS that `config.groups` names, in GROUPS' order.
    evaluate: Any  # jitted: one run's params -> held-out metrics.
    evaluation: EvalConfig  # its episodes and tasks (`every` set per group).


def _setup(config: ml_collections.ConfigDict) -> _Setup:
    env = _environment(config.env.get("kind", "toolworld"), env_config(config.env))
    policy_config = common.policy_config(env, config.model)
    rollout_config = make(RolloutConfig, config.rollout, "rollout")
    common.check_counts(config, COUNTS)
    seeds = list(range(config.first_seed, config.first_seed + config.seeds))
    evaluation = make(
        EvalConfig, dict(episodes=int(config.eval_episodes), tasks=config.eval_tasks), "eval"
    )
    ppo = TrainConfig.from_mapping(config.ppo)
    _check_fields(config, env, ppo)
    groups = common.names(config.groups, "groups", "group")
    unknown = [name for name in groups if name not in GROUPS]
    if unknown:
        raise ValueError(f"config.groups: unknown {unknown}; known: {list(GROUPS)}.")
    offline = DPOConfig.from_mapping(config.offline)
    if not 0 <= config.sft_dpo_steps <= offline.num_updates:
        raise ValueError(
            f"config.sft_dpo_steps must be in [0, offline.num_updates={offline.num_updates}], "
            f"got {config.sft_dpo_steps}."
        )
    return _Setup(
        env=env, policy_config=policy_config, rollout_config=rollout_config,
        online=DPOConfig.from_mapping(config.online),
        offline=offline, ppo=ppo, seeds=seeds,
        groups=tuple(name for name in GROUPS if name in groups),
        evaluate=_evaluator(env, policy_config, rollout_config, evaluation),
        evaluation=evaluation,
    )  # fmt: skip


def _check_fields(config: ml_collections.ConfigDict, env, ppo: TrainConfig) -> None:
    """The judges, data sizes, behaviour policy, GRPO estimator and PRM kind of `config`,
    refused naming the field before anything is written."""
    judges = [(field, name) for text, field in
              ((config.judges, "judges"), (config.fork_judges, "fork_judges"))
              for name, _ in _judges(text, field)]  # fmt: skip
    if config.offline_judge in PRM_JUDGES:
        raise ValueError(f"config.offline_judge: {config.offline_judge!r} reads a PRM.")
    checks = [(field, functools.partial(judge_weights, ppo, name)) for field, name in judges]
    checks += [
        ("offline_judge", functools.partial(judge_weights, ppo, config.offline_judge)),
        ("data_sizes", lambda: common.ints(config.data_sizes, "data_sizes", "pair count", 1)),
        ("behaviour", functools.partial(common.env_policy, env, config.behaviour)),
        ("grpo_estimator", lambda: dataclasses.replace(ppo, estimator=config.grpo_estimator)),
        ("prm_kind", lambda: PRMConfig(kind=config.prm_kind)),
    ]
    for field, check in checks:
        try:
            check()
        except ValueError as error:
            message = str(error)
            if not message.startswith(f"config.{field}"):
                message = f"config.{field}: {message}"
            raise ValueError(message) from None
    if config.prm_kind == "none":
        raise ValueError("config.prm_kind must name a PRM (online_dpo_prm's judge), not 'none'.")


@functools.lru_cache(maxsize=4)
def _environment(kind: str, env_config):
    """One environment per kind and config: environments hash by identity, and the
    programs cached here and in `loop` key on them (a run resumed in this process, or
    run again, compiles nothing again)."""
    return kind_of(kind).make(env_config)


@functools.lru_cache(maxsize=4)
def _evaluator(env, policy_config, rollout_config, evaluation: EvalConfig):
    """`jit(evaluate)`: one run's params -> held-out metrics (cached, as the programs
    below: a run resumed in the same process compiles nothing again)."""
    graphdef = policy_graphdef(policy_config)
    return jax.jit(
        make_evaluate(
            env, graphdef, rollout_config, num_episodes=evaluation.episodes, tasks=evaluation.tasks
        )
    )


def _judges(text: str, field: str) -> list[tuple[str, float]]:
    """`judge[@accuracy]` names of config field `field`."""
    out = []
    for label in common.names(text, field, "judge"):
        name, _, accuracy = label.partition("@")
        try:
            value = float(accuracy or 1.0)
        except ValueError:
            raise ValueError(
                f"config.{field}: {label!r}: accuracy {accuracy!r} is no number."
            ) from None
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"config.{field}: {label!r}: accuracy must be in [0, 1].")
        if name in PRM_JUDGES:
            raise ValueError(f"config.{field}: {label!r} reads a PRM; set config.prm_kind instead.")
        if (name, value) in out:  # e.g. 'outcome,outcome@1': one judge trained twice
            raise ValueError(f"config.{field} names judge {label!r} twice.")
        out.append((name, value))
    return out


def _points(config, num_updates: int) -> tuple[int, int]:
    """(updates between evaluations, evaluations) for a run of `num_updates`."""
    points = max(1, int(config.online.num_updates) // int(config.eval_every))
    every = max(1, num_updates // points)
    return every, num_updates // every


# --------------------------------------------------------------------------- PPO, GRPO


def _ppo_rows(config, setup, workdir, *, resume: bool, progress: bool) -> list[dict[str, Any]]:
    rows = []
    for name, estimator in (("ppo", setup.ppo.estimator), ("grpo", config.grpo_estimator)):
        if name not in setup.groups:
            continue
        train = dataclasses.replace(setup.ppo, estimator=estimator)
        every, _ = _points(config, train.num_updates)
        out = loop.run(
            train, setup.env, setup.policy_config, setup.rollout_config,
            seeds=setup.seeds, workdir=os.path.join(workdir, name), conditions=[train.reward],
            evaluation=dataclasses.replace(setup.evaluation, every=every),
            chunk_size=every, resume=resume, progress=progress, tensorboard=False,
        )  # fmt: skip
        for row in out:
            if np.isfinite(row.get("eval_sampled_success", np.nan)):
                rows.append(
                    _eval_row(name, row["seed"], row["update"], row["env_turns_total"], row)
                )
    return rows


def _eval_row(condition, seed, update, turns, metrics) -> dict[str, Any]:
    """A row of one held-out evaluation, under the names `report.summarize` reads."""
    row = {"condition": condition, "seed": int(seed), "update": int(update),
           "env_turns_total": float(turns)}  # fmt: skip
    row.update({k: float(v) for k, v in metrics.items() if k.startswith("eval_")})
    row.update({name: row[source] for name, source in EVAL_AS.items() if source in row})
    return row


# --------------------------------------------------------------------------- online DPO


def _online_rows(config, setup, workdir, *, resume: bool, progress: bool) -> list[dict[str, Any]]:
    online, train = setup.online, setup.ppo
    groups = [  # (folder, label prefix, DPO config, judges, PRM kind): one program each
        ("online_dpo", "online_dpo", online, _judges(config.judges, "judges"), None),
        ("fork_dpo", "fork_dpo", dataclasses.replace(online, pairs="fork", level="segment"),
         _judges(config.fork_judges, "fork_judges"), None),
        ("online_dpo_prm", "online_dpo", online, [("prm", 1.0)], config.prm_kind),
    ]  # fmt: skip
    rows = []
    for folder, prefix, dpo_config, judges, prm_kind in groups:
        if folder not in setup.groups:
            continue
        every, points = _points(config, dpo_config.num_updates)
        init, chunk = _online_programs(dpo_config, train, setup.env,
                                       policy_config=setup.policy_config,
                                       rollout_config=setup.rollout_config, prm_kind=prm_kind,
                                       every=every, log=config.log_pairs)  # fmt: skip
        runs = [(name, accuracy, seed) for name, accuracy in judges for seed in setup.seeds]
        keys = jnp.stack([jax.random.PRNGKey(seed) for *_, seed in runs])
        weights = jnp.stack([judge_weights(train, name) for name, _, _ in runs])
        accuracy = jnp.asarray([a for _, a, _ in runs], jnp.float32)
        labels = [(_label(prefix, name, a, prm_kind), seed) for name, a, seed in runs]
        log = None
        if config.log_pairs:
            log = _PairsLog(os.path.join(workdir, folder, PAIRS_FILE),
                            [_label(prefix, name, a, None) for name, a, _ in runs])  # fmt: skip
        rows += _train_and_evaluate(chunk, (init, (keys, weights, accuracy)), labels,
                                    every=every, points=points, setup=setup,
                                    folder=os.path.join(workdir, folder), resume=resume,
                                    progress=progress, log=log)  # fmt: skip
    return rows


PAIRS_FILE = "pairs.jsonl"  # an online group's judged pairs (config.log_pairs)


class _PairsLog(NamedTuple):
    path: str  # the group's PAIRS_FILE.
    judges: list[str]  # each run's judge, as records name it.


def _log_pairs(log: _PairsLog, logs, first_update: int, runs, env) -> None:
    """Appends a chunk's pairs (`online.PairLog` [R, updates]) to `log.path` as records
    of `rlagent.preference.data`: id `<run label>/<seed>/<update>/<pair>`, the policy that
    played them `<label>/seed<seed>` after `<update>` updates, the run's judge."""
    logs = jax.device_get(logs)
    records = []
    for i, ((label, seed), judge) in enumerate(zip(runs, log.judges, strict=True)):
        for u in range(logs.weight.shape[1]):
            update = first_update + u
            meta = {
                "id": f"{label}/{seed}/{update}",
                "judge": judge,
                "policy": {"name": f"{label}/seed{seed}", "version": f"update {update}"},
            }
            one = jax.tree.map(lambda x, i=i, u=u: x[i, u], logs)
            records += pairs.log_records(one, env=env, meta=meta)
    pref_data.write_records(log.path, records, append=True)


def _keep_pairs(path: str, done: int) -> None:
    """On resume: the pairs log keeps the records of the updates the restored state had
    made (`done`; a record's update is its id's second last part), and drops a last line
    that a kill cut short; the file is replaced atomically."""
    if not os.path.exists(path):
        return
    with open(path) as handle:
        lines = handle.readlines()
    kept = [
        line for line in lines
        if line.endswith("\n") and int(json.loads(line)["id"].split("/")[-2]) < done
    ]  # fmt: skip
    with open(path + ".tmp", "w") as handle:
        handle.writelines(kept)
    os.replace(path + ".tmp", path)


@functools.lru_cache(maxsize=8)
def _online_programs(dpo_config, train, env, *, policy_config, rollout_config, prm_kind, every,
                     log=False):  # fmt: skip
    """`(jit(vmap(init)), jit(vmap(every updates)))` of one online group (the judges'
    weights and accuracies are data in the states), cached for a resume in-process; with
    `log` the chunk also returns its pairs (`(metrics, PairLog)`)."""
    prm = None
    if prm_kind:
        prm = make_prm(PRMConfig(kind=prm_kind), train, env, policy_graphdef(policy_config),
                       rollout_config)  # fmt: skip
    trainer = make_online_dpo(dpo_config, env, policy_config, rollout_config,
                              judge=make_judge(train, prm))  # fmt: skip
    updates = trainer.logged_updates if log else trainer.updates
    chunk = jax.vmap(lambda state: updates(state, every))
    return jax.jit(jax.vmap(trainer.init)), jax.jit(chunk)


def _label(prefix: str, judge: str, accuracy: float, prm_kind: str | None) -> str:
    if prm_kind:
        return f"{prefix}/prm={prm_kind}"
    return f"{prefix}/{judge}" + ("" if accuracy == 1.0 else f"@{accuracy:g}")


def _train_and_evaluate(chunk, init, runs, *, every, points, setup, folder, resume,
                        progress: bool, base_turns=None,
                        log: _PairsLog | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """`points` calls of `chunk` (`every` updates of every run, `(label, seed)`, on the
    vmapped states that `init = (function, arguments)` makes), a held-out evaluation of
    each run after every chunk; rows per evaluation with the run's total environment
    turns so far (`base_turns [R]`: turns spent before training, e.g. logging). After
    each chunk its rows go to `<folder>/metrics.csv`, then the states to
    `<folder>/checkpoints/<updates>`; with `resume` the newest checkpoint the rows reach
    is restored (`loop.resume_state`) and training continues from it. With `log` the
    chunk returns `(metrics, logs)`, and its pairs are appended to `log.path` before its
    rows (on resume the file is cut back to the restored state: `_keep_pairs`)."""
    writer, manager = MetricWriter(folder, tensorboard=False), loop.checkpoint_manager(folder)
    try:  # the template's shapes suffice to restore: a resumed group compiles no init
        done, states, rows = loop.resume_state(manager, writer, jax.eval_shape(init[0], *init[1]),
                                               runs, resume=resume)  # fmt: skip
        states = states if done else init[0](*init[1])
        if log is not None:
            _keep_pairs(log.path, done)
        total = np.zeros(len(runs)) if base_turns is None else np.asarray(base_turns, float)
        for row in rows:  # the turns so far, as the checkpointed chunk left them
            total[runs.index((row["condition"], int(row["seed"])))] = row["env_turns_total"]
        for point in range(done // every, points):
            began = time.time()
            states, metrics = chunk(states)
            if log is not None:
                metrics, logs = metrics
                _log_pairs(log, logs, point * every, runs, setup.env)
            metrics = jax.device_get(metrics)
            new_rows = _chunk_rows(metrics, states.params, runs, total,
                                   update=(point + 1) * every, evaluate=setup.evaluate)  # fmt: skip
            writer.write(new_rows)
            rows += new_rows
            # A non-finite step was skipped by the guarded update; stop as `loop.run` does.
            loop.check_finite(metrics, point * every, runs, manager, rows)
            loop.save_state(manager, (point + 1) * every, states)
            if progress:
                print(f"{runs[0][0].split('/')[0]}: {(point + 1) * every}/{every * points} "
                      f"updates, held-out success {np.mean([r['success'] for r in new_rows]):.2f}"
                      f" ({time.time() - began:.0f} s)", flush=True)  # fmt: skip
    finally:
        writer.close()
        manager.close()
    return rows


def _chunk_rows(metrics, params, runs, total, *, update: int, evaluate) -> list[dict[str, Any]]:
    """One row per run after a chunk (its `metrics` [R, updates] per name): the held-out
    evaluation of its `params`, the chunk's training means; adds the chunk's turns to
    `total [R]` in place."""
    for name in ("env_turns", "label_turns"):
        if name in metrics:
            total += np.nansum(metrics[name], axis=1)
    rows = []
    for i, (label, seed) in enumerate(runs):
        held_out = jax.device_get(evaluate(jax.tree.map(lambda x, i=i: x[i], params)))
        row = _eval_row(label, seed, update, total[i], held_out)
        for name in ("success", "dpo_loss", "pref_accuracy", "judge_agreement", "pairs",
                     "sft_nll"):  # fmt: skip
            if name in metrics:  # NaN where the chunk took none (SFT's steps: no DPO loss)
                values = metrics[name][i]
                finite = np.isfinite(values).any()
                row[f"train_{name}"] = float(np.nanmean(values)) if finite else math.nan
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- offline DPO


def offline_arms(config, offline: DPOConfig) -> dict[str, DPOConfig]:
    """Each offline group's DPOConfig, all trained on the same logged pairs for the same
    `offline.num_updates` steps: `offline_dpo` as `config.offline` sets it (segment level
    by default: the trajectory loss unless `segment_turns` bounds it, SDPO's),
    `offline_dpo_trajectory` at the trajectory level (ETO's), `offline_sft` SFT on the
    chosen sides for every step, `offline_sft_dpo` SFT for `config.sft_dpo_steps` steps,
    then trajectory DPO against the policy SFT left (ETO's pipeline on fixed logs)."""
    trajectory = dataclasses.replace(offline, level="trajectory", sft_steps=0)
    return {
        "offline_dpo": offline,
        "offline_dpo_trajectory": trajectory,
        "offline_sft": dataclasses.replace(trajectory, sft_steps=offline.num_updates),
        "offline_sft_dpo": dataclasses.replace(trajectory, sft_steps=config.sft_dpo_steps),
    }


def _offline_rows(config, setup, workdir, *, resume: bool, progress: bool) -> list[dict[str, Any]]:
    arms = {g: c for g, c in offline_arms(config, setup.offline).items() if g in setup.groups}
    if not arms:
        return []
    sizes = common.ints(config.data_sizes, "data_sizes", "number of pairs")
    path = os.path.join(workdir, "data", "behaviour_pairs.jsonl")
    cost = _behaviour_logs(config, setup, path, max(sizes), resume=resume)
    records = pref_data.load_records(path)[: max(sizes)]
    rows = []
    for group, offline in arms.items():
        batch = pairs.records_to_pairs(
            records, setup.env, constrained=setup.rollout_config.constrained,
            level=offline.level, segment_turns=offline.segment_turns,
        )  # fmt: skip
        rows += _offline_group(group, offline, batch, [(n, cost[n]) for n in sizes],
                               config=config, setup=setup, workdir=workdir, resume=resume,
                               progress=progress)  # fmt: skip
    return rows


def _offline_group(group, offline, batch, sizes, *, config, setup, workdir, resume, progress):
    """One offline group's runs, every `(data size, its logging turns)` x seed in one
    vmapped program, into `<workdir>/<group>`."""
    trainer = make_offline_dpo(offline, setup.env, setup.policy_config, setup.rollout_config)
    runs = [(size, seed) for size, _ in sizes for seed in setup.seeds]
    keys = jnp.stack([jax.random.PRNGKey(seed) for _, seed in runs])
    init = (jax.jit(jax.vmap(trainer.init)), (keys, jnp.asarray([n for n, _ in runs])))
    every, points = _points(config, offline.num_updates)

    def updates(state):
        return trainer.updates(state, batch, trainer.reference(state, batch), every)

    turns = dict(sizes)
    return _train_and_evaluate(
        jax.jit(jax.vmap(updates)),
        init,
        [(f"{group}/{n}", seed) for n, seed in runs],
        every=every,
        points=points,
        setup=setup,
        folder=os.path.join(workdir, group),
        resume=resume,
        progress=progress,
        base_turns=[turns[n] for n, _ in runs],
    )


def _behaviour_logs(config, setup, path: str, wanted: int, *, resume: bool) -> dict[int, float]:
    """The behaviour pairs at `path` and, per data size, the environment turns logged
    until its last pair. A resumed run reuses logs that `data/logging.json` (their turns
    and sha256, written once they are complete) marks complete; otherwise they are logged
    into a temporary file, renamed when complete, then the marker is written (a kill
    while logging leaves no marker: the resumed run logs again, never using half)."""
    marker = os.path.join(os.path.dirname(path), LOGGING)
    if resume and os.path.exists(marker):
        with open(marker) as handle:
            stored = json.load(handle)
        if not os.path.exists(path) or provenance.file_sha256(path) != stored["sha256"]:
            raise RunError(
                f"--resume: {path} is missing or is not the file logged before "
                f"({marker} holds another sha256); pass --overwrite to start again."
            )
        return {int(n): float(turns) for n, turns in stored["logging_turns"].items()}
    if resume and os.path.exists(path + ".partial"):
        logging.warning("--resume: %s was cut short by a kill; logging it again.", path)
    cost = _log_behaviour(config, setup, path + ".partial", wanted)
    os.replace(path + ".partial", path)
    turns = {str(n): value for n, value in cost.items()}
    _write_json(marker, {"sha256": provenance.file_sha256(path), "logging_turns": turns})
    return cost


def _write_json(path: str, value: Any) -> None:
    """`path` written atomically: a kill leaves the old file or the new one."""
    with open(path + ".tmp", "w") as handle:
        json.dump(value, handle, indent=1)
    os.replace(path + ".tmp", path)


def _log_behaviour(config, setup, path: str, wanted: int) -> dict[int, float]:
    """Logs groups of behaviour episodes (4 per task) until `wanted` pairs are ranked and
    written to `path`; returns, per data size, the environment turns logged until its
    last pair (every logged episode counts, paired or not)."""
    env, (groups, size) = setup.env, LOG_SHAPE
    log = _log_program(env, setup.ppo, config.behaviour, config.offline_judge)
    sizes = common.ints(config.data_sizes, "data_sizes", "number of pairs")
    found, turns, cost, chunk = 0, 0.0, {}, 0
    key = jax.random.PRNGKey(int(config.first_seed) + 0x10C5)
    while found < wanted:
        traj, env_keys, scores, (chosen, rejected, weight) = log(jax.random.fold_in(key, chunk))
        rows = np.arange(groups) * size
        group_turns = np.asarray(traj.turn_mask).reshape(groups, -1).sum(1)
        weight = np.asarray(weight) * (np.cumsum(np.asarray(weight)) <= wanted - found)
        for g in range(groups):
            turns += float(group_turns[g])
            found_before = found
            found += int(weight[g])
            for n in sizes:
                if found_before < n <= found:
                    cost[n] = turns
        meta = {"id": f"{config.behaviour}/chunk{chunk}", "judge": config.offline_judge,
                "policy": {"name": config.behaviour, "version": "environment-level"}}  # fmt: skip
        records = pairs.trajectory_records(
            traj, env_keys, (rows + np.asarray(chosen), rows + np.asarray(rejected), weight),
            scores, env=env, meta=meta,
        )  # fmt: skip
        pref_data.write_records(path, records, append=chunk > 0)
        chunk += 1
    return cost


@functools.lru_cache(maxsize=4)
def _log_program(env, train: TrainConfig, behaviour: str, judge_name: str):
    """`jit(log)(key) -> (trajectory, env keys, scores, (chosen, rejected, weight))`:
    LOG_SHAPE episodes of `behaviour`, scored by the judge `judge_name` and paired best
    against worst per task."""
    policy = common.env_policy(env, behaviour)
    weights = judge_weights(train, judge_name)
    judge = make_judge(train)
    groups, size = LOG_SHAPE

    @jax.jit
    def log(key):
        env_key, policy_key, pair_key = jax.random.split(key, 3)
        env_keys = jnp.repeat(jax.random.split(env_key, groups), size, axis=0)
        episodes = mc.rollout_env_policy(env, policy, env_keys,
                                         jax.random.split(policy_key, groups * size))  # fmt: skip
        traj = mc.env_trajectory(env, episodes)
        scores, _, _ = judge.judge((), PRMInputs(None, None, traj, None), weights, None)
        chosen, rejected, weight = pairs.group_pairs(scores.reshape(groups, size), pair_key)
        return traj, env_keys, scores, (chosen, rejected, weight)

    return log


# --------------------------------------------------------------------------- report


def _report(rows, config, workdir) -> dict[str, Any]:
    """metrics.csv, curves.png, summary.md / .json: online strategies against total turns;
    offline DPO's data-size curve in its own table (its turns are logging turns, spent
    before training: one x per data size)."""
    writer = MetricWriter(workdir, tensorboard=False)
    writer.clear()
    writer.write(rows)
    kind = study_kind(config)
    title = TITLE.format(env=f"ToolWorld level {config.env.level}" if kind == "toolworld" else kind)
    offline = [r for r in rows if r["condition"].split("/")[0] in OFFLINE]
    online = [r for r in rows if r["condition"].split("/")[0] not in OFFLINE]
    report.plot_curves(online + offline, os.path.join(workdir, "curves.png"), title=title, smooth=1)
    summary, data_curve, text = {}, {}, f"# {title}\n\n"  # `config.groups` may omit a part
    if online:
        summary = report.summarize(online)
        text += report.markdown_table(summary)
    if offline:
        data_curve = report.summarize(offline)
        text += "\n## Offline DPO and SFT on behaviour-policy logs: the data-size curve\n\n"
        text += _offline_table(data_curve, offline)
        data_curve["family"] = offline_family(data_curve)
        text += paired.families_markdown(data_curve["family"], OFFLINE_METRICS)
    with open(os.path.join(workdir, "summary.md"), "w") as handle:
        handle.write(text)
    print(text)
    return {**summary, "offline": data_curve}


def offline_family(summary, *, reps: int = 10_000) -> dict[str, list[dict[str, Any]]]:
    """The pre-declared offline family (`OFFLINE_PAIRS` at every data size both groups
    ran) of the offline data-size `summary` (`report.summarize`), per metric of
    `OFFLINE_METRICS` (`paired.summary_families`: paired bootstrap, sign-flip p, Holm)."""
    conditions = summary["conditions"]
    pairs = [
        (name, f"{b}/{name.split('/')[1]}")
        for a, b in OFFLINE_PAIRS
        for name in conditions
        if name.split("/")[0] == a and f"{b}/{name.split('/')[1]}" in conditions
    ]
    return paired.summary_families(conditions, pairs, list(OFFLINE_METRICS), reps=reps)


def _offline_table(summary, rows) -> str:
    header = ["condition", "pairs", "logging turns", "seeds", "final held-out sampled success: "
              "mean [95% CI]", "greedy: mean [95% CI]", "per seed (sampled)"]  # fmt: skip
    cells = []
    for name, entry in summary["conditions"].items():
        turns = next(r["env_turns_total"] for r in rows if r["condition"] == name)
        per_seed = ", ".join(f"{v:.3f}" for v in entry["per_seed"]["final_success"])
        greedy = entry.get("eval_greedy_success", {}).get("mean")
        cells.append([
            name, name.split("/")[1], f"{turns:,.0f}", str(entry["num_seeds"]),
            stats.format_interval(entry["final_success"]["mean"]),
            stats.format_interval(greedy) if greedy else "n/a", per_seed,
        ])  # fmt: skip
    return "\n".join(report.markdown_rows(header, cells)) + "\n"
