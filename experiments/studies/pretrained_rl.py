"""RL from a pretrained checkpoint over seeds, against its start (`experiments.pretrained_rl`).

`run(config, workdir)` evaluates the checkpoint of `config.model_dir` as loaded on the
held-out evaluation episodes of `config.agent` (`start.json`; `hf_agent.evaluate_start`),
trains one `experiments.hf_agent` run per seed of `config.seeds` into `seed_<s>/` (a
finished one is kept; a partial one is resumed exactly), then reports every finished seed
of the folder (several processes may share the seeds of one folder, each with its share):

- `summary.json` / `summary.md`: per seed the evaluations (update, environment turns so
  far, held-out success sampled and greedy, the sampled turns' entropy, malformed turns);
  the last evaluation against the start, paired by seed (the start and every evaluation
  play the same tasks with the same keys): the mean difference with its percentile
  bootstrap interval over seeds, the exact sign-flip p-value, Holm over the two modes, and
  the reading those allow (`rlagent.analysis.paired.paired_family`);
- `eval.csv`: those evaluation rows, the start as update 0 of every seed;
- `curves.png`: held-out success, sampled and greedy, against environment turns (mean over
  seeds, 95% Student-t band);
- `provenance.json`: the config, the seeds reported, each seed's commit.
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Mapping
from typing import Any

import ml_collections
import numpy as np

from experiments.studies import hf_agent
from experiments.studies.common import refuse_repeats
from rlagent.analysis import paired
from rlagent.analysis import report
from rlagent.analysis import stats
from rlagent.host import provenance
from rlagent.host.workdir import prepare_workdir
from rlagent.host.writers import MetricWriter

MODES = ("sampled", "greedy")
LOCK_POLL_S = 5.0  # how often a process waiting for another's start evaluation looks.
COLUMNS = (
    "seed",
    "update",
    "env_turns_total",
    "eval_sampled_success",
    "eval_greedy_success",
    "eval_sampled_entropy",
    "eval_sampled_malformed_rate",
    "eval_greedy_malformed_rate",
)


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Trains the seeds this process was given, then reports every finished seed."""
    seeds = [int(s) for s in config.seeds]
    if not seeds or any(s < 0 for s in seeds):
        raise ValueError(f"config.seeds must be non-negative integers, got {config.seeds!r}.")
    refuse_repeats(seeds, "seeds", "seed")
    hf_agent.prepare(config.agent, model_dir=config.model_dir, env=config.env)  # refusals first.
    began = time.time()
    prepare_workdir(workdir, resume=resume, overwrite=overwrite)
    start = _start(config, workdir)
    for seed in seeds:
        folder = os.path.join(workdir, f"seed_{seed}")
        if len(_rows(folder)) >= config.agent.train.num_updates:
            continue  # finished (by this process earlier, or another one).
        agent = ml_collections.ConfigDict(config.agent.to_dict())
        agent.seed = seed
        hf_agent.run(
            agent,
            folder,
            model_dir=config.model_dir,
            env=config.env,
            resume=os.path.isdir(folder) and bool(os.listdir(folder)),
            progress=progress,
        )
    summary = summarize(start, _finished(workdir, config.agent.train.num_updates))
    write_report(summary, workdir)
    record = provenance.collect(
        config.to_dict(),
        seeds_reported=sorted(summary["seeds"]),
        commits=summary["commits"],
        wall_s=round(time.time() - began, 1),
    )
    provenance.write(workdir, provenance.finish(record))
    return summary


def _start(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
    """`start.json`: the checkpoint's evaluation as loaded, computed once per folder (its
    agent config, seed aside, must be the one stored). Processes sharing the folder take
    turns (on one machine): the one that creates `start.json.lock` evaluates, the others wait
    for the file (a lock whose process has died is taken over), so every seed is paired with
    the one start."""
    path = os.path.join(workdir, "start.json")
    agent = {k: v for k, v in config.agent.to_dict().items() if k != "seed"}
    wanted = json.loads(
        json.dumps({"model_dir": config.model_dir, "env": config.env, "agent": agent}, default=list)
    )
    while not os.path.exists(path) and not _lock(path + ".lock"):
        time.sleep(LOCK_POLL_S)
    if os.path.exists(path):
        with open(path) as f:
            stored = json.load(f)
        if stored["config"] != wanted:
            raise ValueError(f"{path} was computed under another config; use a new --workdir.")
        _unlock(path + ".lock")
        return stored["eval"]
    try:
        evaluation = hf_agent.evaluate_start(
            config.agent, model_dir=config.model_dir, env=config.env
        )
        with open(path + ".tmp", "w") as f:
            json.dump({"config": wanted, "eval": evaluation}, f, indent=2)
        os.replace(path + ".tmp", path)
    finally:
        _unlock(path + ".lock")
    return evaluation


def _lock(path: str) -> bool:
    """Creates `path` holding this process's id; False while another live process holds
    it (a lock left by a dead process is removed, and the next call may take it)."""
    try:
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            with open(path) as f:
                holder = int(f.read() or 0)
            os.kill(holder, 0)  # raises when no such process exists.
        except (ProcessLookupError, ValueError, FileNotFoundError):
            _unlock(path, mine_only=False)
        return False
    with os.fdopen(descriptor, "w") as f:
        f.write(str(os.getpid()))
    return True


def _unlock(path: str, mine_only: bool = True) -> None:
    """Removes the lock at `path` (only this process's own unless `mine_only` is False)."""
    try:
        with open(path) as f:
            holder = f.read()
        if not mine_only or holder == str(os.getpid()):
            os.remove(path)
    except FileNotFoundError:
        pass


def _rows(folder: str) -> list[dict[str, Any]]:
    """The metric rows of a seed's run folder (`metrics.csv`, or a committed result's
    `metrics.csv.xz`; [] when it has none)."""
    return MetricWriter(folder, tensorboard=False).read()


def _finished(workdir: str, num_updates: int) -> dict[int, dict[str, Any]]:
    """`{seed: {"rows": its evaluation rows, "commit"}}` of the seed folders holding
    `num_updates` rows."""
    out = {}
    for name in sorted(os.listdir(workdir)):
        if not name.startswith("seed_"):
            continue
        folder = os.path.join(workdir, name)
        rows = _rows(folder)
        if len(rows) < num_updates:
            continue
        turns, evals = 0.0, []
        for row in rows:
            turns += float(row["env_turns"])
            if np.isfinite(float(row["eval_sampled_success"])):
                evals.append(
                    {
                        "update": int(row["update"]),
                        "env_turns_total": turns,
                        **{c: float(row[c]) for c in COLUMNS[3:]},
                    }
                )
        record = provenance.read(folder) or {}
        out[int(name[5:])] = {"rows": evals, "commit": record.get("git", {}).get("commit")}
    return out


def summarize(start: Mapping[str, float], seeds: Mapping[int, Mapping[str, Any]]) -> dict:
    """The report of `run` (module docstring) from the start's evaluation and the seeds'."""
    if not seeds:
        raise ValueError("no finished seed to report.")
    order = sorted(seeds)
    begin = {"update": 0, "env_turns_total": 0.0, **{c: float(start[c]) for c in COLUMNS[3:]}}
    rows = [{"seed": s, **row} for s in order for row in [begin, *seeds[s]["rows"]]]
    last = {s: seeds[s]["rows"][-1] for s in order}
    comparisons = [
        (
            "start",
            f"rl {mode}",
            dict.fromkeys(order, begin[f"eval_{mode}_success"]),
            {s: last[s][f"eval_{mode}_success"] for s in order},
        )
        for mode in MODES
    ]
    return {
        "seeds": order,
        "commits": sorted({str(seeds[s]["commit"]) for s in order}),
        "start": begin,
        "rows": rows,
        "success": paired.paired_family(comparisons),
        "entropy": {
            "start": begin["eval_sampled_entropy"],
            "last": stats.mean_ci([last[s]["eval_sampled_entropy"] for s in order]),
        },
    }


def write_report(summary: Mapping[str, Any], workdir: str) -> None:
    """summary.json, summary.md, eval.csv and curves.png of `summarize`'s result."""
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(workdir, "eval.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({c: row[c] for c in COLUMNS} for row in summary["rows"])
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write(markdown(summary))
    _plot(summary["rows"], os.path.join(workdir, "curves.png"))


def markdown(summary: Mapping[str, Any]) -> str:
    """The start and the last evaluation, paired by seed, as a Markdown table."""
    n, entropy = len(summary["seeds"]), summary["entropy"]
    lines = [
        f"# RL from the pretrained checkpoint: {n} seeds, held-out success against the start",
        "",
        "| mode | start | after RL (mean over seeds) | difference [95% CI] | p (Holm) | reading |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for mode, entry in zip(MODES, summary["success"], strict=True):
        d = entry["difference"]
        after = summary["start"][f"eval_{mode}_success"] + d["value"]
        lines.append(
            f"| {mode} | {summary['start'][f'eval_{mode}_success']:.3f} | {after:.3f} | "
            f"{stats.format_interval(d)} | {entry['p_holm']:.4f} | {entry['reading']} |"
        )
    lines += [
        "",
        f"Sampled turns' entropy (nats a token): start {entropy['start']:.4f}, after "
        f"RL {stats.format_mean_ci(entropy['last'], 4)} (95% t-interval over seeds).",
    ]
    return "\n".join(lines) + "\n"


def _plot(rows: list[dict[str, Any]], path: str) -> None:
    curves = [
        {**row, "condition": mode, "success": row[f"eval_{mode}_success"]}
        for mode in MODES
        for row in rows
    ]
    report.plot_curves(curves, path, title="held-out success", smooth=1, band="ci95")
