"""Training strategies on ToolWorld: PPO, GRPO, offline DPO, online DPO / RLAIF.

`run` trains, on one environment and one policy architecture:

* `ppo` and `grpo` with the outcome reward (`rlagent.host.loop.run`);
* online DPO with trajectory pairs, every judge of `config.judges` (`judge[@accuracy]`)
  side by side in one program (`online_dpo/<judge>`), with fork pairs for
  `config.fork_judges` (`fork_dpo/<judge>`), and with a PRM as the judge
  (`online_dpo/prm=<kind>`);
* offline DPO on logs of a behaviour policy ranked by `config.offline_judge`, written to
  `data/behaviour_pairs.jsonl` and loaded back through the validating loader, at every
  size of `config.data_sizes` (`offline_dpo/<pairs>`).

Every condition is evaluated on the same held-out tasks (`rlagent.train.evaluation`,
sampled and greedy) at `config.eval_points` points; its x-axis is the total number of
environment turns it consumed: its own episodes, every candidate a judge ranked, a
PRM's labelling turns and, for offline DPO, the logging turns of its data. Outputs:
`metrics.csv` (one row per evaluation, condition and seed), `curves.png`,
`summary.md` / `summary.json` (`rlagent.analysis.report`; the offline data-size
curve in a table of its own) and `provenance.json`. Resuming is not offered: a
non-empty workdir needs `overwrite`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.studies import common
from experiments.studies.envs import make_env
from experiments.studies.sections import make
from rlagent.analysis import report
from rlagent.analysis import stats
from rlagent.credit import mc
from rlagent.host import loop
from rlagent.host import provenance
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

TITLE = "ToolWorld level {level}: PPO, GRPO, offline and online DPO (held-out success)"
# Held-out metrics a row carries under the names report.summarize reads.
EVAL_AS = {
    name: f"eval_sampled_{name}" for name in ("success", "violation_rate", "collapse_rate", "turns")
}


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Trains and reports every strategy of `config` into `workdir` (module docstring)."""
    if resume:
        raise ValueError("strategies: --resume is not offered; rerun with --overwrite.")
    setup = _setup(config)  # config errors before anything is written
    common.prepare(workdir, config, overwrite=overwrite)
    start = time.time()
    record = provenance.collect(config.to_dict())
    provenance.write(workdir, record)
    timings, rows = {}, []
    for name, part in (("ppo", _ppo_rows), ("online", _online_rows), ("offline", _offline_rows)):
        began = time.time()
        rows += part(config, setup, workdir, progress=progress)
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


class _Setup(NamedTuple):
    env: Any
    policy_config: Any
    rollout_config: RolloutConfig
    online: DPOConfig
    offline: DPOConfig
    ppo: TrainConfig  # PPO's, and the reward settings every judge reads.
    seeds: list[int]
    evaluate: Any  # jitted: one run's params -> held-out metrics.


def _setup(config: ml_collections.ConfigDict) -> _Setup:
    env = make_env(config.env)
    policy_config = common.policy_config(env, config.model)
    rollout_config = make(RolloutConfig, config.rollout, "rollout")
    seeds = list(range(config.first_seed, config.first_seed + int(config.seeds)))
    if not seeds:
        raise ValueError(f"config.seeds must be >= 1, got {config.seeds}.")
    ppo = TrainConfig.from_mapping(config.ppo)
    for text, field in ((config.judges, "judges"), (config.fork_judges, "fork_judges")):
        for name, _ in _judges(text, field):
            judge_weights(ppo, name)
    common.ints(config.data_sizes, "data_sizes", "number of pairs")
    common.env_policy(env, config.behaviour)
    evaluate = make_evaluate(env, policy_graphdef(policy_config), rollout_config,
                             num_episodes=int(config.eval_episodes))  # fmt: skip
    return _Setup(
        env=env, policy_config=policy_config, rollout_config=rollout_config,
        online=DPOConfig.from_mapping(config.online),
        offline=DPOConfig.from_mapping(config.offline), ppo=ppo, seeds=seeds,
        evaluate=jax.jit(evaluate),
    )  # fmt: skip


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
        out.append((name, value))
    return out


def _points(config, num_updates: int) -> tuple[int, int]:
    """(updates between evaluations, evaluations) for a run of `num_updates`."""
    points = max(1, int(config.online.num_updates) // int(config.eval_every))
    every = max(1, num_updates // points)
    return every, num_updates // every


# --------------------------------------------------------------------------- PPO, GRPO


def _ppo_rows(config, setup, workdir, *, progress: bool) -> list[dict[str, Any]]:
    rows = []
    for name, estimator in (("ppo", setup.ppo.estimator), ("grpo", config.grpo_estimator)):
        train = dataclasses.replace(setup.ppo, estimator=estimator)
        every, _ = _points(config, train.num_updates)
        out = loop.run(
            train, setup.env, setup.policy_config, setup.rollout_config,
            seeds=setup.seeds, workdir=os.path.join(workdir, name), conditions=[train.reward],
            evaluation=EvalConfig(every=every, episodes=int(config.eval_episodes)),
            chunk_size=every, progress=progress, checkpoint=False, tensorboard=False,
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


def _online_rows(config, setup, workdir, *, progress: bool) -> list[dict[str, Any]]:
    del workdir
    online, train = setup.online, setup.ppo
    groups = [
        ("online_dpo", online, _judges(config.judges, "judges"), None),
        ("fork_dpo", dataclasses.replace(online, pairs="fork", level="segment"),
         _judges(config.fork_judges, "fork_judges"), None),
        ("online_dpo", online, [("prm", 1.0)], config.prm_kind),
    ]  # fmt: skip
    rows = []
    for prefix, dpo_config, judges, prm_kind in groups:
        prm = None
        if prm_kind:
            prm = make_prm(PRMConfig(kind=prm_kind), train, setup.env,
                           policy_graphdef(setup.policy_config), setup.rollout_config)  # fmt: skip
        judge = make_judge(train, prm)
        trainer = make_online_dpo(dpo_config, setup.env, setup.policy_config,
                                  setup.rollout_config, judge=judge)  # fmt: skip
        runs = [(name, accuracy, seed) for name, accuracy in judges for seed in setup.seeds]
        keys = jnp.stack([jax.random.PRNGKey(seed) for *_, seed in runs])
        weights = jnp.stack([judge_weights(train, name) for name, _, _ in runs])
        accuracy = jnp.asarray([a for _, a, _ in runs], jnp.float32)
        states = jax.jit(jax.vmap(trainer.init))(keys, weights, accuracy)
        labels = [_label(prefix, name, a, prm_kind) for name, a, _ in runs]
        rows += _train_and_evaluate(trainer.updates, states, labels, [s for *_, s in runs],
                                    num_updates=dpo_config.num_updates, config=config,
                                    setup=setup, progress=progress)  # fmt: skip
    return rows


def _label(prefix: str, judge: str, accuracy: float, prm_kind: str | None) -> str:
    if prm_kind:
        return f"{prefix}/prm={prm_kind}"
    return f"{prefix}/{judge}" + ("" if accuracy == 1.0 else f"@{accuracy:g}")


def _train_and_evaluate(updates, states, labels, seeds, *, num_updates, config, setup,
                        progress: bool, base_turns=None) -> list[dict[str, Any]]:  # fmt: skip
    """Chunks of `updates` for every run (`jit(vmap)`), a held-out evaluation of each run
    after every chunk; rows per evaluation with the run's total environment turns so far
    (`base_turns [R]`: turns spent before training, e.g. logging)."""
    every, points = _points(config, num_updates)
    chunk = jax.jit(jax.vmap(lambda state: updates(state, every)))
    total = np.zeros(len(labels)) if base_turns is None else np.asarray(base_turns, float)
    rows = []
    for point in range(points):
        began = time.time()
        states, metrics = chunk(states)
        metrics = jax.device_get(metrics)
        for name in ("env_turns", "label_turns"):
            if name in metrics:
                total += np.nansum(metrics[name], axis=1)
        for i, label in enumerate(labels):
            params = jax.tree.map(lambda x, i=i: x[i], states.params)
            held_out = jax.device_get(setup.evaluate(params))
            row = _eval_row(label, seeds[i], (point + 1) * every, total[i], held_out)
            for name in ("success", "dpo_loss", "pref_accuracy", "judge_agreement", "pairs"):
                if name in metrics:
                    row[f"train_{name}"] = float(np.nanmean(metrics[name][i]))
            rows.append(row)
        if progress:
            done = [r for r in rows if r["update"] == (point + 1) * every]
            print(f"{labels[0].split('/')[0]}: {(point + 1) * every}/{every * points} updates, "
                  f"held-out success {np.mean([r['success'] for r in done]):.2f} "
                  f"({time.time() - began:.0f} s)", flush=True)  # fmt: skip
    return rows


# --------------------------------------------------------------------------- offline DPO


def _offline_rows(config, setup, workdir, *, progress: bool) -> list[dict[str, Any]]:
    env, offline = setup.env, setup.offline
    sizes = common.ints(config.data_sizes, "data_sizes", "number of pairs")
    path = os.path.join(workdir, "data", "behaviour_pairs.jsonl")
    cost = _log_behaviour(config, setup, path, max(sizes))
    records = pref_data.load_records(path)[: max(sizes)]
    batch = pairs.records_to_pairs(
        records,
        env,
        constrained=setup.rollout_config.constrained,
        level=offline.level,
        segment_turns=offline.segment_turns,
    )
    trainer = make_offline_dpo(offline, env, setup.policy_config, setup.rollout_config)
    runs = [(size, seed) for size in sizes for seed in setup.seeds]
    keys = jnp.stack([jax.random.PRNGKey(seed) for _, seed in runs])
    states = jax.jit(jax.vmap(trainer.init))(keys, jnp.asarray([n for n, _ in runs]))

    def updates(state, length):
        return trainer.updates(state, batch, trainer.reference(state, batch), length)

    labels = [f"offline_dpo/{n}" for n, _ in runs]
    return _train_and_evaluate(
        updates,
        states,
        labels,
        [s for _, s in runs],
        num_updates=offline.num_updates,
        config=config,
        setup=setup,
        progress=progress,
        base_turns=[cost[n] for n, _ in runs],
    )


def _log_behaviour(config, setup, path: str, wanted: int) -> dict[int, float]:
    """Logs groups of behaviour episodes (4 per task) until `wanted` pairs are ranked and
    written to `path`; returns, per data size, the environment turns logged until its
    last pair (every logged episode counts, paired or not)."""
    env, train = setup.env, setup.ppo
    policy = common.env_policy(env, config.behaviour)
    weights = judge_weights(train, config.offline_judge)
    judge = make_judge(train)
    groups, size = 64, 4

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


# --------------------------------------------------------------------------- report


def _report(rows, config, workdir) -> dict[str, Any]:
    """metrics.csv, curves.png, summary.md / .json: online strategies against total turns;
    offline DPO's data-size curve in its own table (its turns are logging turns, spent
    before training: one x per data size)."""
    writer = MetricWriter(workdir, tensorboard=False)
    writer.clear()
    writer.write(rows)
    title = TITLE.format(level=config.env.level)
    online = [r for r in rows if not r["condition"].startswith("offline_dpo")]
    offline = [r for r in rows if r["condition"].startswith("offline_dpo")]
    report.plot_curves(online + offline, os.path.join(workdir, "curves.png"), title=title, smooth=1)
    summary = report.summarize(online)
    data_curve = report.summarize(offline)
    text = f"# {title}\n\n" + report.markdown_table(summary)
    text += "\n## Offline DPO on behaviour-policy logs: the data-size curve\n\n"
    text += _offline_table(data_curve, offline)
    with open(os.path.join(workdir, "summary.md"), "w") as handle:
        handle.write(text)
    print(text)
    return {**summary, "offline": data_curve}


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
