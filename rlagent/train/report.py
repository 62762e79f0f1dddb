"""Summaries of training runs: per-condition tables with confidence intervals, and curves.

Rows are the dicts written by `rlagent.train.loop.run` (one per update and seed). A
condition's numbers are computed per seed first, then summarised over seeds as
mean, standard deviation and a 95% Student-t confidence half-width.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlagent.train.ppo import NONFINITE_METRICS

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30; 1.96 beyond.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def mean_ci(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample std and 95% t-interval half-width of per-seed values."""
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    std = float(x.std(ddof=1)) if n > 1 else 0.0
    t = _T975[n - 2] if 2 <= n <= 31 else 1.96
    return {"mean": float(x.mean()), "std": std, "ci95": t * std / math.sqrt(n) if n > 1 else 0.0}


def summarize(
    rows: Sequence[Mapping[str, Any]],
    *,
    thresholds: Sequence[float] = (0.5, 0.8),
    final_fraction: float = 0.1,
) -> dict[str, dict[str, Any]]:
    """Per-condition summary.

    For each seed: `final_success` is the mean success over the last `final_fraction` of
    updates; `turns_to_<p>` is the experience (environment turns) after the first update
    whose success reached p (None when never reached); `violation_rate`, `turns`,
    `turns_over_plan` are averaged over the same final updates, `violation_rate_all` over
    every update (violations made while learning). `diverged_seeds` counts seeds whose
    training stopped on a non-finite loss or gradient (their numbers end there).
    """
    summary = {}
    for condition, seeds in _curves(rows).items():
        per_seed = defaultdict(list)
        reached = {p: [] for p in thresholds}
        for seed_rows in seeds:
            tail = seed_rows[-max(1, int(round(len(seed_rows) * final_fraction))) :]
            for key in ("success", "violation_rate", "turns", "turns_over_plan", "process_score"):
                per_seed[key].append(float(np.mean([r[key] for r in tail])))
            per_seed["violation_rate_all"].append(
                float(np.mean([r["violation_rate"] for r in seed_rows]))
            )
            for p in thresholds:
                first = next((r for r in seed_rows if r["success"] >= p), None)
                reached[p].append(None if first is None else float(first["env_turns_total"]))
        entry: dict[str, Any] = {"num_seeds": len(seeds)}
        entry["diverged_seeds"] = sum(
            any(row.get(key, 0) > 0 for row in seed_rows for key in NONFINITE_METRICS)
            for seed_rows in seeds
        )
        entry["final_success"] = mean_ci(per_seed["success"])
        for key in ("violation_rate", "violation_rate_all", "turns", "turns_over_plan"):
            entry[key] = mean_ci(per_seed[key])
        entry["process_score"] = mean_ci(per_seed["process_score"])
        for p in thresholds:
            hits = [v for v in reached[p] if v is not None]
            entry[f"turns_to_{int(p * 100)}"] = {
                "mean": float(np.mean(hits)) if hits else None,
                "reached": f"{len(hits)}/{len(reached[p])}",
            }
        summary[condition] = entry
    return summary


def markdown_table(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """The summary as a Markdown table (mean ± 95% CI over seeds)."""
    keys = [k for k in next(iter(summary.values())) if k.startswith("turns_to_")]
    header = ["condition", "seeds", "final success", *[k.replace("_", " ") for k in keys]]
    header += ["violation rate", "violation rate (whole run)", "turns / episode"]
    header += ["turns over plan"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for condition, entry in summary.items():
        if entry.get("diverged_seeds"):
            condition = f"{condition} (DIVERGED: {entry['diverged_seeds']} seeds)"
        cells = [condition, str(entry["num_seeds"]), _pm(entry["final_success"])]
        for k in keys:
            hit = entry[k]
            mean = "never" if hit["mean"] is None else f"{hit['mean']:,.0f}"
            cells.append(f"{mean} ({hit['reached']} seeds)")
        cells += [_pm(entry[k]) for k in ("violation_rate", "violation_rate_all", "turns")]
        cells.append(_pm(entry["turns_over_plan"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_curves(
    rows: Sequence[Mapping[str, Any]],
    path: str,
    *,
    metric: str = "success",
    title: str = "",
    smooth: int = 5,
) -> None:
    """Plots `metric` vs environment turns: mean over seeds, min-max band, per condition.

    Each seed's curve is first smoothed by a trailing moving average over `smooth` updates.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for condition, curves in _curves(rows).items():
        length = min(len(c) for c in curves)
        values = np.array([[r[metric] for r in c[:length]] for c in curves])
        values = _moving_average(values, smooth)
        turns = np.mean([[r["env_turns_total"] for r in c[:length]] for c in curves], axis=0)
        mean = values.mean(axis=0)
        (line,) = ax.plot(turns, mean, label=f"{condition} ({len(curves)} seeds)")
        ax.fill_between(
            turns, values.min(axis=0), values.max(axis=0), alpha=0.15, color=line.get_color()
        )
    ax.set_xlabel("environment turns of experience (per seed)")
    ax.set_ylabel(f"{metric} (moving average of {smooth} updates)" if smooth > 1 else metric)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_summary(
    summary: Mapping[str, Any], markdown_path: str, json_path: str, *, preface: str = ""
) -> None:
    with open(markdown_path, "w") as f:
        f.write(preface + markdown_table(summary))
    with open(json_path, "w") as f:
        json.dump(summary, f, indent=2)


def _curves(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[list[Mapping[str, Any]]]]:
    """Rows grouped by condition, then by seed; each seed's rows sorted by update."""
    grouped: dict[str, dict[int, list[Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        grouped[str(row["condition"])][int(row["seed"])].append(row)
    return {
        condition: [sorted(r, key=lambda x: x["update"]) for r in seeds.values()]
        for condition, seeds in grouped.items()
    }


def _moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average along the last axis (shorter windows at the start)."""
    if window <= 1:
        return values
    cumulative = np.cumsum(values, axis=-1)
    shifted = np.concatenate([np.zeros_like(cumulative[..., :window]), cumulative], axis=-1)
    counts = np.minimum(np.arange(1, values.shape[-1] + 1), window)
    return (cumulative - shifted[..., : values.shape[-1]]) / counts


def _pm(stats: Mapping[str, float]) -> str:
    return f"{stats['mean']:.3f} ± {stats['ci95']:.3f}"
