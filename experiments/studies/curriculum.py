"""A curriculum driven by success against the final task from the start and a fixed schedule.

The stages of `config.stages` (`l<k>`: ToolWorld level k, `h<H>`: `horizon_config(H)`;
`rs_sft.family_config`) are one environment, `rlagent.pipeline.curriculum.StageMixture`,
whose stage probabilities are data: every schedule of `config.schedules` trains the same
compiled program (`rlagent.host.loop.run(curriculum=)`), with

* `success`: the scheduler of `config.curriculum` (promotion at a success threshold with
  hysteresis, sampling near 50% success with plateau detection);
* `fixed`: stage `floor(update * K / num_updates)`, set in advance;
* `final`: the last stage from the start;
* any of them with fields of `config.curriculum` changed: `success/frontier_share=0.5`
  (`schedule_config`; its run folder is `success_frontier_share0.5`).

Every schedule is evaluated on held-out episodes of the last stage (the target task),
sampled and greedy, every `config.eval.every` updates, and compared at equal environment
turns of experience (the budget every run reached): area under the held-out success
curve, turns to 50%, held-out success at the budget (IQM / mean with bootstrap CIs,
Holm-corrected comparisons), and the stage each run reached.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from experiments.studies import common
from experiments.studies import rs_sft
from experiments.studies.sections import make
from rlagent import parallel
from rlagent.analysis import report
from rlagent.analysis import stats
from rlagent.envs.toolworld.types import Progress
from rlagent.host import loop
from rlagent.host import provenance
from rlagent.pipeline.curriculum import KINDS
from rlagent.pipeline.curriculum import CurriculumConfig
from rlagent.pipeline.curriculum import Scheduler
from rlagent.pipeline.curriculum import StageMixture

HELD_OUT = "eval_sampled_success"


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
    mesh: jax.sharding.Mesh | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Trains every schedule (seeds in parallel) and writes the report into `workdir`.
    `mesh`: the episodes of every batch are split over its devices, which may span
    processes (docs/distributed.md); process 0 writes the report."""
    common.check_counts(config, common.RUN_COUNTS)
    stages = common.names(config.stages, "stages", "stage")
    schedules = common.names(config.schedules, "schedules", "schedule")
    base = make(CurriculumConfig, config.curriculum, "curriculum")
    schedulers = {name: schedule_config(base, name) for name in schedules}  # errors first
    common.distinct(list(schedulers.items()), "schedules", "schedule")
    families = {name: rs_sft.family_config(config, name, "stages") for name in stages}
    common.distinct([(n, f.env.to_dict()) for n, f in families.items()], "stages", "stage")
    setup = common.build(config)
    if not setup.eval_config.every:
        raise ValueError("config.eval.every must be > 0: schedules are compared held out.")
    # Pad absent tasks' markers as settled: a short stage shows no open task beyond its own.
    mixture = StageMixture(
        [common.build(family).env for family in families.values()],
        pad_progress=int(Progress.DONE),
    )
    resuming = common.prepare(workdir, config, resume=resume, overwrite=overwrite)
    start = time.time()
    record = common.start_record(workdir, resuming, config.to_dict(), schedules=schedules)
    seeds = list(range(config.first_seed, config.first_seed + config.seeds))
    rows = []
    for schedule in schedules:
        scheduler = Scheduler(schedulers[schedule], mixture, setup.train_config.num_updates)
        folder = os.path.join(workdir, schedule.replace("/", "_").replace("=", ""))
        run_rows = loop.run(
            setup.train_config, mixture, setup.policy_config, setup.rollout_config,
            evaluation=setup.eval_config, seeds=seeds, workdir=folder,
            chunk_size=config.chunk_size, resume=resume, overwrite=overwrite,
            progress=progress, curriculum=scheduler, mesh=mesh,
        )  # fmt: skip
        rows += [{**row, "condition": schedule} for row in run_rows]
    summary = parallel.primary_decides(
        lambda: write_report(rows, stages, workdir, title=config.get("title", ""))
    )  # process 0 writes, the others wait for its summary.
    wall = round(time.time() - start, 1)
    provenance.write(workdir, provenance.finish({**record, "wall_s": wall}))
    return summary


def schedule_config(base: CurriculumConfig, name: str) -> CurriculumConfig:
    """The scheduler of schedule `name`: a kind of KINDS, optionally with field overrides
    of `config.curriculum` (`success/frontier_share=0.5/promote=0.6`), refused naming
    `config.schedules`."""
    kind, *overrides = name.split("/")
    if kind not in KINDS:
        raise ValueError(f"config.schedules: unknown {kind!r} in {name!r}; known: {KINDS}.")
    fields = {}
    for override in overrides:
        key, _, text = override.partition("=")
        if key in ("", "kind") or key not in base.__dataclass_fields__ or not text:
            known = ", ".join(f for f in base.__dataclass_fields__ if f != "kind")
            raise ValueError(
                f"config.schedules: {override!r} in {name!r} is not field=value of a "
                f"CurriculumConfig field ({known})."
            )
        kind_of = type(getattr(base, key))
        try:
            fields[key] = kind_of(text)
        except ValueError:
            raise ValueError(
                f"config.schedules: {override!r} in {name!r}: {text!r} is no {kind_of.__name__}."
            ) from None
    try:
        return dataclasses.replace(base, kind=kind, **fields)
    except ValueError as error:
        raise ValueError(f"config.schedules: {name!r}: {error}") from None


def held_out_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The evaluated updates only, `success` = held-out sampled success on the target."""
    keep = ("condition", "seed", "update", "env_turns_total", HELD_OUT, "eval_greedy_success")
    return [
        {**{k: row[k] for k in keep}, "success": row[HELD_OUT]}
        for row in rows
        if np.isfinite(row.get(HELD_OUT, np.nan))
    ]


def write_report(
    rows: Sequence[Mapping[str, Any]], stages: Sequence[str], workdir: str, *, title: str = ""
) -> dict[str, Any]:
    """metrics.csv (every training row), curves.png (held-out target success vs turns),
    stages.png (frontier vs turns), summary.md and summary.json."""
    common.write_metrics(rows, workdir)
    evaluated = held_out_rows(rows)
    title = title or f"Curriculum over {', '.join(stages)}: held-out success on {stages[-1]}"
    report.plot_curves(evaluated, os.path.join(workdir, "curves.png"), title=title)
    summary = report.summarize(evaluated)
    budget = summary["settings"]["budget_env_turns"]
    at_budget = rs_sft.success_at_budget(evaluated, budget, experience="env_turns_total")
    reached = stage_reached(rows, stages)
    plot_stages(rows, stages, os.path.join(workdir, "stages.png"))
    lines = [f"# {title}", "", report.markdown_table(summary), ""]
    header = ["schedule", f"held-out success at {budget:,.0f} turns: IQM [95% CI]",
              "mean [95% CI]", "stage at the end (per seed)"]  # fmt: skip
    table = [
        [name, stats.format_interval(estimate["iqm"]), stats.format_interval(estimate["mean"]),
         ", ".join(reached[name])]
        for name, estimate in at_budget["estimates"].items()
    ]  # fmt: skip
    lines += report.markdown_rows(header, table)
    lines += ["", "Pairwise comparisons of the held-out success at the budget (Holm):", ""]
    lines += report.markdown_rows(
        ["X", "Y", "P(X > Y)", "p (Holm)"],
        [[c["x"], c["y"], f"{c['prob_improvement']:.2f}", f"{c['p_holm']:.3g}"]
         for c in at_budget["comparisons"]],
    )  # fmt: skip
    lines += ["", "Held-out: sampled episodes of the last stage on the evaluation keys; the "
              "budget is the least environment turns of experience any run had."]  # fmt: skip
    out = {"summary": summary, "at_budget": at_budget, "stage_reached": reached}
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(out, f, indent=1, default=float)
    print("\n".join(lines))
    return out


def stage_reached(rows: Sequence[Mapping[str, Any]], stages: Sequence[str]) -> dict[str, list]:
    """Per schedule, each seed's frontier stage at its last update."""
    out: dict[str, list[str]] = {}
    for (condition, _), curve in report.seed_curves(rows).items():
        out.setdefault(condition, []).append(stages[int(curve[-1]["curriculum_frontier"])])
    return out


def plot_stages(rows: Sequence[Mapping[str, Any]], stages: Sequence[str], path: str) -> None:
    """The frontier stage of every seed against environment turns, one panel per schedule."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = report.seed_curves(rows)
    schedules = list(dict.fromkeys(c for c, _ in curves))
    fig, axes = plt.subplots(1, len(schedules), figsize=(4 * len(schedules), 3), squeeze=False)
    for ax, schedule in zip(axes[0], schedules, strict=True):
        for (condition, _), curve in curves.items():
            if condition == schedule:
                turns = [r["env_turns_total"] for r in curve]
                frontier = [r["curriculum_frontier"] for r in curve]
                ax.step(turns, frontier, where="post", alpha=0.7)
        ax.set_yticks(range(len(stages)), stages)
        ax.set_title(f"{schedule}: frontier stage (per seed)")
        ax.set_xlabel("environment turns of experience")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
