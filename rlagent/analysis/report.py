"""Summaries of training runs: per-seed values, robust intervals, comparisons, curves.

Rows are the dicts written by `rlagent.host.loop.run` (one per update, condition and
seed). Every number is computed per seed first; a condition is then summarised with the
statistics of `rlagent.analysis.stats` (see docs/studies.md and ../RESEARCH habits):
IQM and mean with stratified bootstrap CIs, the take-off rate with a Clopper-Pearson
interval, seed-inclusive sample efficiency (area under the success curve and
time-to-threshold censored at a common budget), and Holm-corrected pairwise comparisons.
The per-seed values are kept in the summary (`per_seed`) so that any other statistic can
be computed from `summary.json` alone.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlagent.analysis import stats
from rlagent.host.writers import MetricWriter
from rlagent.train.ppo import NONFINITE_METRICS

# Per-seed means over the final updates of these row metrics, when the rows carry them.
_FINAL_METRICS = ("violation_rate", "turns", "turns_over_plan", "process_score", "collapse_rate")
# Experience including the environment turns spent on process labels (`with_total_turns`).
TOTAL_TURNS = "total_turns"
_EXPERIENCE_TEXT = {
    "env_turns_total": "environment turns of experience",
    TOTAL_TURNS: "total environment turns (experience + labelling)",
}
# Held-out success (rlagent.train.evaluation): per seed, the last evaluation of the run.
EVAL_SUCCESS = ("eval_sampled_success", "eval_greedy_success")


def summarize(
    rows: Sequence[Mapping[str, Any]],
    *,
    metric: str = "success",
    thresholds: Sequence[float] = (0.5, 0.8),
    takeoff: float = 0.5,
    final_fraction: float = 0.1,
    reps: int | None = None,
    experience: str = "env_turns_total",
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """Per-condition summary and pairwise comparisons of `metric` (success by default).

    Per seed: `final_<metric>` is the mean of `metric` over the last `final_fraction` of
    updates; `auc` the normalised area under its curve over the common budget of
    experience (the least environment turns any run had, so that every seed is compared
    at equal experience and nothing is extrapolated); `turns_to_<p>` the experience at the
    first update whose value reached p, censored at the budget when never reached;
    `violation_rate`, `turns`, `turns_over_plan`, `process_score` and `collapse_rate` are
    averaged over the final updates, `violation_rate_all` over every update;
    `eval_sampled_success` / `eval_greedy_success`, when the rows carry held-out
    evaluations, are each seed's last evaluation (summarised like the final value).
    `diverged_seeds` counts seeds whose training stopped on a non-finite loss or gradient
    (their numbers end there; the table marks the condition). `experience` is the row key
    of the x-axis: `env_turns_total`, or `TOTAL_TURNS` (`with_total_turns`: labelling
    continuations counted too). `extra` names more row metrics (an env's own), each
    averaged per seed over the final updates and summarised like `final_<metric>`.

    Returns {"conditions": {name: entry}, "comparisons": [...], "settings": {...}} where
    an entry holds `num_seeds`, `seeds`, `per_seed` (lists in seed order), `final_<metric>`,
    `auc` and the `extra` keys ({"iqm", "mean"} each {"value", "low", "high"}: bootstrap
    95% CIs), `takeoff` (final value >= `takeoff`; Clopper-Pearson 95%), `turns_to_<p>`
    (`stats.censored_summary`) and the means with CIs of the other metrics; comparisons
    are `stats.pairwise_comparisons` of the final values.
    """
    curves = _curves(rows)
    if not curves:
        raise ValueError("summarize needs at least one row.")
    reps = stats.bootstrap_reps(reps)
    budget = min(float(c[-1][experience]) for seeds in curves.values() for c in seeds)
    final_key = f"final_{metric}"
    conditions = {}
    for condition, seeds in curves.items():
        per_seed: dict[str, list] = defaultdict(list)
        for seed_rows in seeds:
            values = _seed_values(
                seed_rows, metric=metric, thresholds=thresholds, final_fraction=final_fraction,
                budget=budget, experience=experience, extra=extra,
            )  # fmt: skip
            for key, value in values.items():
                per_seed[key].append(value)
        entry: dict[str, Any] = {"num_seeds": len(seeds), "seeds": per_seed.pop("seed")}
        entry["diverged_seeds"] = sum(
            any(row.get(key, 0) > 0 for row in seed_rows for key in NONFINITE_METRICS)
            for seed_rows in seeds
        )
        entry["per_seed"] = dict(per_seed)
        entry.update(_intervals(condition, per_seed, len(seeds), (final_key, *extra), reps))
        entry["takeoff"] = stats.takeoff_rate(per_seed[final_key], takeoff)
        for p in thresholds:
            entry[_turns_key(p)] = stats.censored_summary(
                per_seed[_turns_key(p)], per_seed[f"reached_{int(p * 100)}"]
            )
        for key in (*_FINAL_METRICS, "violation_rate_all"):
            if key in per_seed:
                interval = stats.interval_estimates({condition: per_seed[key]}, reps=reps)
                entry[key] = interval[condition]["mean"]
        conditions[condition] = entry
    comparisons = stats.pairwise_comparisons(
        {name: entry["per_seed"][final_key] for name, entry in conditions.items()}
    )
    settings = {"metric": metric, "final_fraction": final_fraction, "takeoff_threshold": takeoff,
                "thresholds": list(thresholds), "budget_env_turns": budget,
                "experience": experience, "bootstrap_reps": reps}  # fmt: skip
    return {"conditions": conditions, "comparisons": comparisons, "settings": settings}


def _seed_values(
    seed_rows: Sequence[Mapping[str, Any]],
    *,
    metric: str,
    thresholds: Sequence[float],
    final_fraction: float,
    budget: float,
    experience: str,
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """One seed's quantities of `summarize` (see there), in the summary's key order."""
    values = [float(r[metric]) for r in seed_rows]
    turns = [float(r[experience]) for r in seed_rows]
    out = {
        "seed": int(seed_rows[0]["seed"]),
        f"final_{metric}": final_mean(seed_rows, metric, final_fraction),
        "auc": stats.area_under_curve(values, turns, budget),
    }
    for p in thresholds:
        time, reached = stats.time_to_threshold(values, turns, p, budget)
        out[_turns_key(p)] = time
        out[f"reached_{int(p * 100)}"] = reached
    for key in _FINAL_METRICS:
        if _measured(seed_rows, key):
            out[key] = final_mean(seed_rows, key, final_fraction)
    for key in extra:
        out[key] = final_mean(seed_rows, key, final_fraction)
    for key in EVAL_SUCCESS:
        evaluated = [float(r[key]) for r in seed_rows if np.isfinite(r.get(key, np.nan))]
        if evaluated:
            out[key] = evaluated[-1]
    if _measured(seed_rows, "violation_rate"):
        out["violation_rate_all"] = float(np.mean([r["violation_rate"] for r in seed_rows]))
    return out


def _measured(seed_rows: Sequence[Mapping[str, Any]], key: str) -> bool:
    """The rows hold `key` with a value: a column that is NaN in every row (a metric
    the environment does not report, e.g. violations without a rule layer, in a file
    shared with runs that do) is not measured, and the summary leaves it out."""
    return any(isinstance(r.get(key), int | float) and math.isfinite(r[key]) for r in seed_rows)


def _intervals(condition, per_seed, num_seeds, final_keys, reps) -> dict[str, Any]:
    """Bootstrap IQM and mean of the final values (`final_keys`: the metric's and the
    extra ones), the AUC and the held-out successes every seed was evaluated on."""
    evaluated = [k for k in EVAL_SUCCESS if len(per_seed[k]) == num_seeds]
    return {
        key: stats.interval_estimates({condition: per_seed[key]}, reps=reps)[condition]
        for key in (*final_keys[:1], "auc", *evaluated, *final_keys[1:])
    }


# Rows of runs: curves per seed, final values, cells of a table ---------------------------


def last_evaluation(folder: str) -> tuple[int, dict[str, dict[int, dict[str, Any]]]]:
    """`(update, {condition: {seed: row}})`: the rows of the last update with a held-out
    evaluation (`eval_sampled_success` measured) in `folder`'s metrics.csv or, without
    it, metrics.csv.xz (the committed results'), read by `MetricWriter.read`."""
    rows = [
        r
        for r in MetricWriter(folder, tensorboard=False).read()
        if isinstance(r.get("eval_sampled_success"), float | int)
        and math.isfinite(r["eval_sampled_success"])
    ]
    if not rows:
        raise ValueError(f"{folder}: no row has an evaluation (eval_sampled_success).")
    last = max(int(r["update"]) for r in rows)
    out: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        if int(r["update"]) == last:
            out[str(r["condition"])][int(r["seed"])] = r
    return last, dict(out)


def write_analysis(folder: str, lines: Sequence[str]) -> str:
    """Writes `lines` as `analysis.md` in `folder` (the results an analysis module of
    experiments/analyses/ reads) and prints them; returns the path."""
    text = "\n".join(lines) + "\n"
    out = os.path.join(folder, "analysis.md")
    with open(out, "w") as f:
        f.write(text)
    print(text, end="")
    return out


def seed_curves(
    rows: Sequence[Mapping[str, Any]],
) -> dict[tuple[str, int], list[Mapping[str, Any]]]:
    """Rows grouped by (condition, seed), in order of appearance; each run's rows sorted by
    update (its learning curve)."""
    grouped: dict[tuple[str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        grouped[(str(row["condition"]), int(row["seed"]))].append(row)
    return {key: sorted(curve, key=lambda r: r["update"]) for key, curve in grouped.items()}


def final_rows(curve: Sequence[Mapping[str, Any]], fraction: float) -> Sequence[Mapping[str, Any]]:
    """The last `fraction` of a run's rows (sorted by update), at least one."""
    return curve[-max(1, int(round(len(curve) * fraction))) :]


def final_mean(
    curve: Sequence[Mapping[str, Any]], key: str, fraction: float, *, finite_only: bool = False
) -> float:
    """Mean of `key` over the last `fraction` of a run's updates (`final_rows`).

    `finite_only`: rows without a finite value (NaN: not measured that update) are skipped,
    NaN when none has one."""
    tail = final_rows(curve, fraction)
    if not finite_only:
        return float(np.mean([r[key] for r in tail]))
    values = [r.get(key, math.nan) for r in tail]
    finite = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def group_rows(rows: Iterable[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], Any]):
    """Rows grouped into cells by `key(row)`, in order of appearance: {key: [rows]}."""
    cells: dict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        cells[key(row)].append(row)
    return cells


def cell_mean_cis(
    cell: Sequence[Mapping[str, Any]], metrics: Sequence[str]
) -> dict[str, dict[str, float] | None]:
    """Per metric, mean and Student-t 95% CI over a cell's rows (seeds) of its finite
    values (`stats.finite_mean_ci`; None when no row measured it)."""
    return {m: stats.finite_mean_ci([float(r[m]) for r in cell]) for m in metrics}


def markdown_rows(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The lines of a Markdown table: header, separator, one line per row of cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cells) + " |" for cells in rows]


def markdown_table(summary: Mapping[str, Any]) -> str:
    """The summary as Markdown: one row per condition, then the pairwise comparisons."""
    settings = summary["settings"]
    final_key = f"final_{settings['metric']}"
    thresholds = settings["thresholds"]
    metric = settings["metric"].replace("_", " ")
    header = ["condition", "seeds", f"final {metric}: IQM [95% CI]", "mean [95% CI]"]
    header += [f"take-off (final >= {settings['takeoff_threshold']:g}) [95% CI]"]
    header += ["AUC [95% CI]", *[f"turns to {p:.0%}: median (reached)" for p in thresholds]]
    evals = [k for k in EVAL_SUCCESS if all(k in e for e in summary["conditions"].values())]
    header += [f"held-out {k.split('_')[1]} success: IQM [95% CI]" for k in evals]
    header += ["violation rate (whole run)", "collapse rate", "turns / episode"]
    lines = markdown_rows(header, [])
    for condition, entry in summary["conditions"].items():
        takeoff = entry["takeoff"]
        if entry.get("diverged_seeds"):
            condition = f"{condition} (DIVERGED: {entry['diverged_seeds']} seeds)"
        cells = [condition, str(entry["num_seeds"])]
        cells += [_interval(entry[final_key]["iqm"]), _interval(entry[final_key]["mean"])]
        cells += [stats.format_takeoff(takeoff)]
        cells += [_interval(entry["auc"]["mean"])]
        for p in thresholds:
            hit = entry[_turns_key(p)]
            median = "not reached" if hit["median"] is None else f"{hit['median']:,.0f}"
            cells.append(f"{median} ({hit['reached']})")
        cells += [_interval(entry[k]["iqm"]) for k in evals]
        for key in ("violation_rate_all", "collapse_rate", "turns"):
            cells.append(_interval(entry[key]) if key in entry else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    comparisons = summary["comparisons"]
    if comparisons:
        table += (
            f"\nPairwise comparisons of the final {metric} (P(X > Y) over seeds, two-sided "
            "Mann-Whitney U, Holm-corrected over all pairs):\n\n"
            "| X | Y | P(X > Y) | p | p (Holm) |\n|---|---|---|---|---|\n"
        )
        for c in comparisons:
            mark = " *" if c["significant"] else ""
            table += (
                f"| {c['x']} | {c['y']} | {c['prob_improvement']:.2f} | {c['p_value']:.3g} | "
                f"{c['p_holm']:.3g}{mark} |\n"
            )
    budget = settings["budget_env_turns"]
    turns = _EXPERIENCE_TEXT[settings.get("experience", "env_turns_total")]
    table += (
        f"\nFinal = mean over the last {settings['final_fraction']:.0%} of updates; IQM and "
        "mean with stratified bootstrap 95% CIs over seeds; take-off with exact "
        f"Clopper-Pearson 95% CIs; AUC = area under the {metric} curve over the first "
        f"{budget:,.0f} {turns} (the least any run had), normalised to [0, 1]; "
        "turns to p: median over all seeds, unreached seeds censored at that budget.\n"
    )
    return table


def extra_table(summary: Mapping[str, Any], headers: Mapping[str, str]) -> str:
    """Markdown: one row per condition with the IQM [95% CI] of each `extra` metric of
    `summarize` (`headers`: metric -> column title) and the mean collapse rate when every
    condition measured it."""
    entries = summary["conditions"]
    collapse = all("collapse_rate" in entry for entry in entries.values())
    header = ["condition", "seeds", *headers.values()]
    header += ["collapse rate: mean [95% CI]"] if collapse else []
    rows = []
    for condition, entry in entries.items():
        cells = [condition, str(entry["num_seeds"])]
        cells += [_interval(entry[key]["iqm"]) for key in headers]
        cells += [_interval(entry["collapse_rate"])] if collapse else []
        rows.append(cells)
    lines = markdown_rows(header, rows)
    return "\n".join(lines) + "\n"


def plot_curves(
    rows: Sequence[Mapping[str, Any]],
    path: str,
    *,
    metric: str = "success",
    title: str = "",
    smooth: int = 5,
    experience: str = "env_turns_total",
    band: str = "minmax",
) -> None:
    """Plots `metric` vs experience (`experience`, see `summarize`): mean over seeds and
    a band per condition (`draw_curves`: "minmax" or "ci95")."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    draw_curves(ax, rows, metric=metric, smooth=smooth, experience=experience, band=band)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_curves(
    ax: Any,
    rows: Sequence[Mapping[str, Any]],
    *,
    metric: str = "success",
    smooth: int = 5,
    experience: str = "env_turns_total",
    band: str = "minmax",
) -> None:
    """Draws `metric` vs `experience` on a matplotlib axis: per condition (in row order)
    the mean over seeds and a band, "minmax" (over seeds) or "ci95" (Student-t 95%
    interval of the mean, `stats.mean_ci`, clipped to [0, 1] when every value lies there:
    rates).

    Each seed's curve is first smoothed by a trailing moving average over `smooth` updates.
    """
    if band not in ("minmax", "ci95"):
        raise ValueError(f"band must be 'minmax' or 'ci95', got {band!r}.")
    for condition, curves in _curves(rows).items():
        length = min(len(c) for c in curves)
        values = np.array([[r[metric] for r in c[:length]] for c in curves])
        values = _moving_average(values, smooth)
        turns = np.mean([[r[experience] for r in c[:length]] for c in curves], axis=0)
        mean = values.mean(axis=0)
        (line,) = ax.plot(turns, mean, label=f"{condition} ({len(curves)} seeds)")
        if band == "minmax":
            low, high = values.min(axis=0), values.max(axis=0)
        else:
            half = np.array([stats.mean_ci(column)["ci95"] for column in values.T])
            low, high = mean - half, mean + half
            if np.all((values >= 0) & (values <= 1)):
                low, high = np.clip(low, 0, 1), np.clip(high, 0, 1)
        ax.fill_between(turns, low, high, alpha=0.15, color=line.get_color())
    ax.set_xlabel(f"{_EXPERIENCE_TEXT[experience]} (per seed)")
    ax.set_ylabel(f"{metric} (moving average of {smooth} updates)" if smooth > 1 else metric)
    ax.grid(alpha=0.3)


def with_total_turns(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows (in their order) with `TOTAL_TURNS`: `env_turns_total` plus the run's
    `label_turns` up to that update (the environment turns its process labels cost, 0
    when a row has none), per condition and seed."""
    spent: dict[tuple[str, int], float] = defaultdict(float)
    totals = {}
    order = sorted(range(len(rows)), key=lambda i: (str(rows[i]["condition"]), rows[i]["update"]))
    for i in order:
        row = rows[i]
        key = (str(row["condition"]), int(row["seed"]))
        label_turns = float(row.get("label_turns", 0.0) or 0.0)
        spent[key] += label_turns if np.isfinite(label_turns) else 0.0
        totals[i] = float(row["env_turns_total"]) + spent[key]
    return [{**row, TOTAL_TURNS: totals[i]} for i, row in enumerate(rows)]


def plot_profiles(summary: Mapping[str, Any], path: str) -> None:
    """Performance profiles of the final metric: fraction of seeds above tau (rliable)."""
    final_key = f"final_{summary['settings']['metric']}"
    scores = {name: e["per_seed"][final_key] for name, e in summary["conditions"].items()}
    stats.plot_performance_profiles(scores, path, xlabel=f"{final_key.replace('_', ' ')} ($\\tau$)")


def write_summary(
    summary: Mapping[str, Any], markdown_path: str, json_path: str, *, preface: str = ""
) -> None:
    with open(markdown_path, "w") as f:
        f.write(preface + markdown_table(summary))
    with open(json_path, "w") as f:
        json.dump(summary, f, indent=2)


def _curves(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[list[Mapping[str, Any]]]]:
    """Rows grouped by condition, then by seed; each seed's rows sorted by update."""
    grouped: dict[str, list[list[Mapping[str, Any]]]] = defaultdict(list)
    for (condition, _), curve in seed_curves(rows).items():
        grouped[condition].append(curve)
    return dict(grouped)


def _moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average along the last axis (shorter windows at the start)."""
    if window <= 1:
        return values
    cumulative = np.cumsum(values, axis=-1)
    shifted = np.concatenate([np.zeros_like(cumulative[..., :window]), cumulative], axis=-1)
    counts = np.minimum(np.arange(1, values.shape[-1] + 1), window)
    return (cumulative - shifted[..., : values.shape[-1]]) / counts


_interval = stats.format_interval


def _turns_key(threshold: float) -> str:
    return f"turns_to_{int(threshold * 100)}"
