"""The critic factorial over the horizon: is the dense rewards' loss the shared critic's?

The long-horizon study (`experiments.studies.horizon_sweep`) found that from a competent
start the dense rewards with turn-level GAE lose success at long horizons while the
sparse outcome reward does not, and two 5-seed controls at one horizon pointed at the
value head sharing the policy's trunk. This study crosses the critic with the reward
form and the horizon, with enough seeds for a real effect to reject:

- critics (`config.critics`, `CRITICS`): `shared` (the value head on the policy's trunk,
  the default), `separate` (its own critic LM, `PolicyConfig.value_head='separate'`),
  `normalized` (shared head, returns divided by a running standard deviation,
  `TrainConfig.normalize_returns`); and the shared critic's sensitivity variants
  `value_coef_0.1`, `value_coef_2` (the value loss's weight) and `no_value_clip`;
- reward forms (`config.conditions`, the first is the reference, e.g. the sparse
  outcome) and horizons (`config.horizons`) as in the horizon sweep, with
  `train.estimator` and no estimator comparison.

Horizons run in the order of `config.horizons`, every critic at one horizon before the
next, each (critic, horizon) a one-horizon sweep in `<workdir>/<critic>/h<h>`
(`horizon_sweep.run`; its own warm start per seed, identical between critics that share
the model), so a study stopped early still reports every pair it finished. The study
then writes `factorial.csv` (one row per critic, horizon, reward form and seed),
`factorial.png`, `summary.md`, `summary.json` and `provenance.json` (`summarize`
defines every number; `settings.missing` names the pairs not finished). Two comparison
families are declared before any data (the seeds of a horizon and critic share their
warm start, so every test pairs by seed):

- `reward`: each reward form against the reference at its horizon and critic;
- `critic`: each critic against `shared` at the same horizon and reward form.

Each comparison is the paired sign-flip test of the mean difference of held-out sampled
success (`rlagent.analysis.paired`), Holm-corrected over its family. Budgets: every run
trains the same number of updates; sample efficiency at equal environment turns is the
AUC of training success over the smallest turn count any run of that horizon reached
(all critics and reward forms), and the mean turns played are reported beside it.
"""

from __future__ import annotations

import copy
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
from experiments.studies import horizon_sweep
from experiments.studies.common import names
from rlagent import parallel
from rlagent.analysis import paired
from rlagent.analysis import report
from rlagent.analysis import stats
from rlagent.host import loop
from rlagent.host import provenance
from rlagent.host.writers import MetricWriter

FILES = ("factorial.csv", "factorial.png", "summary.md", "summary.json", provenance.FILENAME)
# Config overrides of each critic, {section: {field: value}} on the horizon sweep's config.
CRITICS: dict[str, dict[str, dict[str, Any]]] = {
    "shared": {},
    "separate": {"model": {"value_head": "separate"}},
    "normalized": {"train": {"normalize_returns": True}},
    # The shared critic's sensitivity (experiments/configs/critic_sensitivity.py): the
    # value loss's weight beside the policy loss in the one trunk (there is one AdamW, so
    # this is the critic's step size relative to the policy's), and no value clipping.
    "value_coef_0.1": {"train": {"value_coef": 0.1}},
    "value_coef_2": {"train": {"value_coef": 2.0}},
    "no_value_clip": {"train": {"value_clip": None}},
}
REFERENCE_CRITIC = "shared"
# Per-seed values of factorial.csv that the summary gives an interval for.
METRICS = ("success", "greedy_success", "gain", "auc_turns", "entropy", "env_turns")
# Credit-accuracy scores of the probe kept per seed (horizon_sweep.CREDIT_METRICS).
CREDIT = ("spearman", "sign_agreement", "value_rmse", "grad_cosine")
# Random sign vectors of the sign-flip test (p-values >= 1 / (draws + 1), about 1e-5).
SIGN_FLIP_DRAWS = 100_000


def critic_names(config: ml_collections.ConfigDict) -> list[str]:
    """`config.critics` as names of `CRITICS`, in order."""
    critics = names(config.critics, "critics", "critic")
    unknown = [c for c in critics if c not in CRITICS]
    if unknown:
        raise ValueError(
            f"config.critics: unknown critic(s) {unknown}; choose from {', '.join(CRITICS)}."
        )
    return critics


def sweep_config(config: ml_collections.ConfigDict, critic: str) -> ml_collections.ConfigDict:
    """The horizon sweep of one critic: `config` without `critics`, with `CRITICS[critic]`
    applied and no estimator comparison."""
    values = copy.deepcopy(config.to_dict())
    values.pop("critics")
    values["estimators"] = ""
    for section, fields in CRITICS[critic].items():
        values[section].update(fields)
    return ml_collections.ConfigDict(values)


def plan(config: ml_collections.ConfigDict) -> list[tuple[str, int, ml_collections.ConfigDict]]:
    """`[(critic, horizon, one-horizon sweep config)]` in run order (horizon-major); every
    config error (of any critic's sweep) is raised here."""
    if "critics" not in config:
        raise ValueError("config.critics is missing (e.g. 'shared,separate,normalized').")
    critics = critic_names(config)
    sweeps = {critic: sweep_config(config, critic) for critic in critics}
    plans = []
    for critic, sweep in sweeps.items():
        for horizon, _ in horizon_sweep.plan(sweep):
            one = ml_collections.ConfigDict(sweep.to_dict())
            one.horizons = str(horizon)
            plans.append((critic, horizon, one))
    order = {h: i for i, h in enumerate(dict.fromkeys(h for _, h, _ in plans))}
    return sorted(plans, key=lambda p: (order[p[1]], critics.index(p[0])))


def sweep_dir(workdir: str, critic: str, horizon: int) -> str:
    """The one-horizon sweep of `critic` at `horizon`."""
    return os.path.join(workdir, critic, f"h{horizon:02d}")


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
    mesh: jax.sharding.Mesh | None = None,
    progress: bool = True,
    report_only: bool = False,
) -> dict[str, Any]:
    """Runs every critic's sweep (module docstring); returns the summary of `summarize`.
    `mesh`: each sweep splits its batches' episodes over it (`horizon_sweep.run`), and
    process 0 writes the report.

    A non-empty `workdir` needs `resume` (continue; the config must match the stored one)
    or `overwrite`. A diverged sweep is reported with the others and `loop.Diverged`
    raised at the end. `report_only` only rewrites the report from the sweeps finished so
    far (`write_report`).
    """
    plans = plan(config)
    if report_only:
        return parallel.primary_decides(lambda: write_report(workdir, config, plans))
    resuming = common.prepare(workdir, config, resume=resume, overwrite=overwrite)
    start = time.time()
    pairs = [f"{critic}/h{horizon}" for critic, horizon, _ in plans]
    record = common.start_record(workdir, resuming, config.to_dict(), runs=pairs)
    diverged = []
    for critic, horizon, sweep in plans:
        print(f"[critic_factorial {time.time() - start:6.0f}s] {critic}, h={horizon}", flush=True)
        try:
            horizon_sweep.run(
                sweep, sweep_dir(workdir, critic, horizon), resume=resume,
                overwrite=overwrite, progress=progress, mesh=mesh,
            )  # fmt: skip
        except loop.Diverged as error:  # its rows are in its horizon.csv
            diverged.append(f"{critic}, h={horizon}: {error}")
    summary = parallel.primary_decides(lambda: write_report(workdir, config, plans))
    provenance.write(workdir, {**record, "wall_s": round(time.time() - start, 1)})
    if diverged:
        raise loop.Diverged(" ".join(diverged), [])
    return summary


def seed_rows(
    workdir: str, pairs: Sequence[tuple[str, int]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """(one row per critic, horizon, reward form and seed, the `critic/h<h>` pairs of
    `pairs` whose sweep has not finished), from each finished one-horizon sweep.

    From its `horizon.csv`: `success` (held-out sampled), `greedy_success`, `initial_success`
    and `gain` (success minus it). From the horizon's metrics.csv: `entropy` (policy
    entropy of the last training batch), `env_turns` (turns played in training), and
    `auc_turns`, the AUC of training success over `turn_budget`, the smallest total of
    turns any run of that horizon reached across every critic; the last credit accuracy
    and sign agreement of the trained estimator's credit with Monte-Carlo advantages at the
    first and the last probe (`credit_<m>_first` / `_last`, NaN where not measured).
    """
    curves, horizon_rows, missing = {}, [], []
    for critic, horizon in pairs:
        folder = sweep_dir(workdir, critic, horizon)
        rows = MetricWriter(folder, tensorboard=False, filename="horizon.csv").read()
        if not rows:
            missing.append(f"{critic}/h{horizon}")
            continue
        horizon_rows += [(critic, row) for row in rows]
        metrics = MetricWriter(os.path.join(folder, f"h{horizon:02d}"), tensorboard=False).read()
        curves[(critic, horizon)] = report.seed_curves(metrics)
    if not horizon_rows:
        raise ValueError(f"{workdir}: no critic's sweep has finished (no horizon.csv).")
    budgets: dict[int, float] = {}
    for (_, horizon), by_run in curves.items():
        reached = min(float(c[-1]["env_turns_total"]) for c in by_run.values())
        budgets[horizon] = min(budgets.get(horizon, np.inf), reached)
    out = []
    for critic, row in horizon_rows:
        horizon, condition, seed = int(row["horizon"]), str(row["condition"]), int(row["seed"])
        curve = curves[(critic, horizon)][(condition, seed)]
        success = float(row["eval_sampled_success"])
        auc = stats.area_under_curve(
            [float(r["success"]) for r in curve],
            [float(r["env_turns_total"]) for r in curve],
            budgets[horizon],
        )
        out.append(
            dict(
                critic=critic,
                horizon=horizon,
                reward=str(row["reward"]),
                estimator=str(row["estimator"]),
                seed=seed,
                updates=int(row["updates"]),
                success=success,
                greedy_success=float(row["eval_greedy_success"]),
                initial_success=float(row["initial_success"]),
                gain=success - float(row["initial_success"]),
                entropy=float(curve[-1]["entropy"]),
                env_turns=float(row["env_turns"]),
                auc_turns=auc,
                turn_budget=budgets[horizon],
                **{
                    # Runs written before the value error was measured lack its column.
                    f"credit_{m}_{when}": float(row.get(f"credit_{m}_{when}", "nan"))
                    for m in CREDIT
                    for when in ("first", "last")
                },
            )  # fmt: skip
        )
    return out, missing


def write_report(
    workdir: str, config: ml_collections.ConfigDict, plans: Sequence[tuple] | None = None
) -> dict[str, Any]:
    """factorial.csv from every finished sweep (`seed_rows`), then summary.md, summary.json
    and factorial.png (also alone, on a study stopped early); `plans`: `plan(config)`, when
    the caller has it."""
    plans = plan(config) if plans is None else plans
    pairs = [(critic, horizon) for critic, horizon, _ in plans]
    rows, missing = seed_rows(workdir, pairs)
    writer = MetricWriter(workdir, tensorboard=False, filename="factorial.csv")
    writer.clear()
    writer.write(rows)
    summary = summarize(rows, reference=names(config.conditions)[0])
    summary["settings"]["missing"] = missing
    plot(summary, os.path.join(workdir, "factorial.png"))
    table = markdown(summary)
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write(table)
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(table, flush=True)
    return summary


def summarize(
    rows: Sequence[Mapping[str, Any]],
    *,
    reference: str,
    reps: int | None = None,
    draws: int = SIGN_FLIP_DRAWS,
) -> dict[str, Any]:
    """Per cell (critic, horizon, reward): mean with a 95% percentile bootstrap CI over
    seeds of every `METRICS` value, IQM [95% CI] of success (rliable), take-off
    (success >= 0.5), mean last credit Spearman where measured. Families (module
    docstring): `reward` and `critic` comparisons, each the mean paired difference
    (`paired.paired_bootstrap`) and the sign-flip p-value over the seeds both cells hold,
    Holm-corrected within the family (`significant`: p_holm < 0.05)."""
    if not rows:
        raise ValueError("summarize needs at least one row.")
    reps = stats.bootstrap_reps(reps)
    cells = report.group_rows(
        rows, lambda r: (str(r["critic"]), int(r["horizon"]), str(r["reward"]))
    )
    summary_cells = {}
    for (critic, horizon, reward), seeds in sorted(cells.items()):
        entry: dict[str, Any] = {"num_seeds": len(seeds)}
        for key in METRICS:
            entry[key] = paired.mean_interval([float(r[key]) for r in seeds], reps=reps)
        success = [float(r["success"]) for r in seeds]
        entry["success_iqm"] = stats.interval_estimates({"x": success}, reps=reps)["x"]["iqm"]
        entry["takeoff"] = stats.takeoff_rate(success, 0.5)
        entry["initial_success"] = float(np.mean([float(r["initial_success"]) for r in seeds]))
        for name in (f"credit_{m}_{when}" for m in CREDIT for when in ("first", "last")):
            credit = stats.finite_mean_ci([float(r[name]) for r in seeds])
            if credit is not None:
                entry[name] = credit
        entry["per_seed"] = {
            "seed": [int(r["seed"]) for r in seeds],
            "success": success,
        }
        summary_cells[f"{critic}|{horizon}|{reward}"] = entry
    keys = sorted(cells)
    critics = list(dict.fromkeys(c for c, _, _ in keys))
    reward_pairs = [
        ((c, h, reference), (c, h, r))
        for c, h, r in keys
        if r != reference and (c, h, reference) in cells
    ]
    critic_pairs = [
        ((REFERENCE_CRITIC, h, r), (c, h, r))
        for c, h, r in keys
        if c != REFERENCE_CRITIC and (REFERENCE_CRITIC, h, r) in cells
    ]
    families = {
        "reward": _family(reward_pairs, summary_cells, reps, draws),
        "critic": _family(critic_pairs, summary_cells, reps, draws),
    }
    settings = {
        "success": "eval_sampled_success", "reference": reference,
        "reference_critic": REFERENCE_CRITIC, "critics": critics, "bootstrap_reps": reps,
        "sign_flip_draws": draws, "takeoff_threshold": 0.5,
        "estimators": sorted({str(r["estimator"]) for r in rows}),
    }  # fmt: skip
    return {"cells": summary_cells, "families": families, "settings": settings}


def _family(pairs, cells, reps: int, draws: int) -> list[dict[str, Any]]:
    """Paired comparisons `b - a` of each (a, b) cell key pair, Holm over the list."""

    def by_seed(key):
        seeds = cells["|".join(map(str, key))]["per_seed"]
        return dict(zip(seeds["seed"], seeds["success"], strict=True))

    comparisons = [("|".join(map(str, a)), "|".join(map(str, b)), by_seed(a), by_seed(b))
                   for a, b in pairs]  # fmt: skip
    return paired.paired_family(comparisons, reps=reps, draws=draws)


def markdown(summary: Mapping[str, Any]) -> str:
    """One table per metric (rows reward / critic, columns horizons), then both families."""
    cells = summary["cells"]
    settings = summary["settings"]
    keys = [tuple(k.split("|")) for k in cells]
    horizons = sorted({int(h) for _, h, _ in keys})
    rewards = list(dict.fromkeys(r for _, _, r in keys))
    lines = ["# Critic factorial: reward form x critic x horizon", ""]
    estimators = ", ".join(settings.get("estimators", ())) or "estimator"
    if settings.get("missing"):
        lines += [f"Not finished (no rows): {', '.join(settings['missing'])}.", ""]
    tables = [
        ("held-out sampled success: mean [95% CI]", lambda e: _interval(e["success"])),
        ("held-out sampled success: IQM [95% CI]", lambda e: _interval(e["success_iqm"])),
        ("take-off (held-out sampled success >= 0.5): k/n", _takeoff),
        ("held-out greedy success: mean [95% CI]", lambda e: _interval(e["greedy_success"])),
        ("policy entropy, last training batch: mean [95% CI]",
         lambda e: _interval(e["entropy"], 3)),
        ("gain over the starting policy (sampled success minus first batch): mean [95% CI]",
         lambda e: _interval(e["gain"])),
        ("AUC of training success at equal environment turns: mean [95% CI]",
         lambda e: _interval(e["auc_turns"])),
        ("environment turns played in training (mean)", lambda e: f"{e['env_turns']['value']:.0f}"),
        (f"credit accuracy of the trained critic's {estimators} (Spearman with MC advantages), "
         "first probe -> last probe: mean ± 95% CI", lambda e: _credit(e, "spearman")),
        ("sign agreement of that credit with MC advantages (|A| > 2 SE), first -> last probe",
         lambda e: _credit(e, "sign_agreement")),
    ]  # fmt: skip
    for title, show in tables:
        lines += [f"### {title}", "", "| reward / critic | " + " | ".join(
            f"h={h}" for h in horizons) + " |", "|---|" + "---|" * len(horizons)]  # fmt: skip
        for reward in rewards:
            for critic in settings["critics"]:
                shown = [
                    show(cells[f"{critic}|{h}|{reward}"]) if f"{critic}|{h}|{reward}" in cells
                    else "" for h in horizons
                ]  # fmt: skip
                lines.append(f"| {reward} / {critic} | " + " | ".join(shown) + " |")
        lines.append("")
    titles = {
        "reward": f"each reward form minus {settings['reference']} at its horizon and critic",
        "critic": f"each critic minus {settings['reference_critic']} at its horizon and reward",
    }
    for name, family in summary["families"].items():
        lines += [f"### family `{name}`: {titles[name]} (held-out sampled success)", ""]
        lines += ["| b | a | pairs | mean difference b - a [95% CI] | p | p (Holm) |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for c in family:
            mark = " *" if c["significant"] else ""
            lines.append(
                f"| {_cell_name(c['b'])} | {_cell_name(c['a'])} | {c['num_pairs']} | "
                f"{_interval(c['difference'])} | {c['p_value']:.2g} | {c['p_holm']:.2g}{mark} |"
            )
        lines.append("")
    lines.append(
        "Means with 95% percentile bootstrap CIs over seeds, IQM with rliable's stratified "
        "bootstrap; comparisons pair seeds (same warm start), two-sided sign-flip test "
        f"({settings['sign_flip_draws']:,} random sign vectors), Holm-corrected within each "
        "family (* p < 0.05). AUC at equal turns: training success over the smallest "
        "turn total any run of the horizon reached."
    )
    return "\n".join(lines) + "\n"


def plot(summary: Mapping[str, Any], path: str) -> None:
    """Held-out sampled and greedy success, entropy and AUC at equal turns vs horizon; colour
    is the reward form, line style the critic; bands are 95% CIs of the mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = summary["cells"]
    keys = [tuple(k.split("|")) for k in cells]
    rewards = list(dict.fromkeys(r for _, _, r in keys))
    styles = dict(zip(summary["settings"]["critics"], ["-", "--", ":", "-."], strict=False))
    panels = [
        ("success", "held-out sampled success"),
        ("greedy_success", "held-out greedy success"),
        ("entropy", "policy entropy (last batch)"),
        ("auc_turns", "AUC at equal turns"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (key, label) in zip(axes, panels, strict=True):
        for i, reward in enumerate(rewards):
            for critic, style in styles.items():
                points = sorted(
                    (int(h), cells[f"{c}|{h}|{r}"][key]) for c, h, r in keys
                    if c == critic and r == reward
                )  # fmt: skip
                if not points:
                    continue
                x = [h for h, _ in points]
                low, high = [p["low"] for _, p in points], [p["high"] for _, p in points]
                ax.plot(x, [p["value"] for _, p in points], style, marker="o", color=f"C{i}",
                        label=f"{reward} / {critic}")  # fmt: skip
                ax.fill_between(x, low, high, alpha=0.1, color=f"C{i}")
        ax.set_xlabel("shortest plan (turns)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _credit(entry: Mapping[str, Any], metric: str) -> str:
    first, last = (entry.get(f"credit_{metric}_{when}") for when in ("first", "last"))
    return f"{stats.format_mean_ci(first)} -> {stats.format_mean_ci(last)}"


def _cell_name(key: str) -> str:
    critic, horizon, reward = key.split("|")
    return f"{reward} / {critic} / h={horizon}"


def _takeoff(entry: Mapping[str, Any]) -> str:
    return stats.format_takeoff(entry["takeoff"])


def _interval(estimate: Mapping[str, float], digits: int = 2) -> str:
    return stats.format_interval(estimate, digits)
