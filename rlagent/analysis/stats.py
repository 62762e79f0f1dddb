"""Statistics a reviewer accepts for RL results over seeds (Agarwal et al., 2021).

Per-seed outcomes of RL runs are often bimodal (a seed takes off or it does not), so a
mean +- t-interval over a handful of seeds hides the shape and can extend outside the
metric's range. This module provides, for per-seed scores of several conditions:

- `interval_estimates`: IQM and mean with stratified bootstrap confidence intervals
  (`rliable.library.get_interval_estimates`);
- `takeoff_rate`: the fraction of seeds above a threshold with an exact Clopper-Pearson
  interval (`scipy.stats.binomtest`);
- `pairwise_comparisons`: probability of improvement P(X > Y) + P(X = Y) / 2
  (`rliable.metrics.probability_of_improvement`, the normalised Mann-Whitney U statistic)
  with the two-sided Mann-Whitney U p-value and Holm's step-down correction over all pairs;
- seed-inclusive sample efficiency from one seed's learning curve: `area_under_curve`
  (normalised area under the success curve over a fixed budget of experience) and
  `time_to_threshold` (experience until the first success >= p, censored at the budget
  for seeds that never reach it, never averaged over the reaching seeds only);
- `plot_performance_profiles`: score distributions with bootstrap bands (rliable);
- for roughly normal per-seed quantities, `mean_ci` / `finite_mean_ci` (Student-t) and
  `bootstrap_mean_difference` (unpaired difference of means), and the one formatter of
  each kind of interval for tables: `format_mean_ci`, `format_interval`, `format_takeoff`.

Everything runs on the host in NumPy / SciPy; nothing here is traced. SciPy's and
rliable's modules are imported where they are used: `scipy.stats` alone takes over a
second to import, which every launcher and test process would pay at start-up.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

REPS_ENV = "RLAGENT_BOOTSTRAP_REPS"
DEFAULT_REPS = 2000


def bootstrap_reps(reps: int | None = None) -> int:
    """`reps`, or the default number of bootstrap resamples: `DEFAULT_REPS`, or the value
    of the environment variable RLAGENT_BOOTSTRAP_REPS when it is set (the test suite sets
    a few hundred: its runs have two seeds, and the resampling was most of its report
    time). Summaries record the number they used."""
    if reps is None:
        text = os.environ.get(REPS_ENV, "").strip()
        try:
            reps = int(text) if text else DEFAULT_REPS
        except ValueError:
            raise ValueError(f"{REPS_ENV}={text!r}: expected an integer >= 1.") from None
        name = REPS_ENV
    else:
        name = "reps"
    if int(reps) < 1:
        raise ValueError(f"{name}={reps}: bootstrap resamples must be >= 1.")
    return int(reps)


def interval_estimates(
    scores: Mapping[str, Sequence[float]],
    *,
    reps: int | None = None,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, dict[str, dict[str, float]]]:
    """IQM and mean of per-seed scores with stratified bootstrap CIs, per condition.

    Args:
      scores: condition -> per-seed scores (one task, so the bootstrap resamples seeds).
      reps: bootstrap resamples (`bootstrap_reps()` when None).
      confidence: interval size.
      seed: NumPy seed of the bootstrap (results are reproducible).
    Returns:
      condition -> {"iqm": {"value", "low", "high"}, "mean": {...}}.
    """
    from rliable import library as rly
    from rliable import metrics

    score_dict = {name: _column(values, name) for name, values in scores.items()}

    def aggregate(x):
        return np.array([iqm(x), metrics.aggregate_mean(x)])

    with _seeded_numpy(seed):
        points, intervals = rly.get_interval_estimates(
            score_dict, aggregate, reps=bootstrap_reps(reps), confidence_interval_size=confidence
        )
    out = {}
    for name in score_dict:
        out[name] = {
            metric: {
                "value": float(points[name][i]),
                "low": float(intervals[name][0, i]),
                "high": float(intervals[name][1, i]),
            }
            for i, metric in enumerate(("iqm", "mean"))
        }
    return out


def iqm(scores: np.ndarray) -> float:
    """rliable's `metrics.aggregate_iqm`, the 25% trimmed mean over every score, computed
    as `scipy.stats.trim_mean(scores, 0.25, axis=None)` computes it (the same partition and
    mean, so the same float) without scipy's per-call argument handling, which took about
    nine tenths of a bootstrap's time (2,000 calls per interval)."""
    flat = np.asarray(scores).ravel()
    cut = int(0.25 * flat.shape[0])
    kept = np.partition(flat, (cut, flat.shape[0] - cut - 1))[cut : flat.shape[0] - cut]
    return np.mean(kept)


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> dict[str, float]:
    """Mean, sample std and Student-t interval half-width (`ci95`) of per-seed values.

    For roughly normal per-seed quantities (correlations, biases); success rates, which are
    often bimodal over seeds, get `interval_estimates` and `takeoff_rate` instead.
    """
    from scipy import stats as scipy_stats

    x = np.asarray(values, np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {x.shape}.")
    if x.size == 1:
        return {"mean": float(x[0]), "std": 0.0, "ci95": 0.0}
    std = float(x.std(ddof=1))
    quantile = float(scipy_stats.t.ppf(0.5 + confidence / 2, df=x.size - 1))
    return {"mean": float(x.mean()), "std": std, "ci95": quantile * std / np.sqrt(x.size)}


def finite_mean_ci(values: Sequence[float], *, count: bool = False) -> dict[str, float] | None:
    """`mean_ci` of the finite values (NaN marks "not measured"); None when there is none.
    `count=True` adds their number `n`."""
    finite = [float(v) for v in values if math.isfinite(float(v))]
    if not finite:
        return None
    return {**mean_ci(finite), "n": len(finite)} if count else mean_ci(finite)


def format_mean_ci(estimate: Mapping[str, float] | None, digits: int = 2) -> str:
    """`"mean ± ci95"` of a `mean_ci` result (`"n/a"` for None), for Markdown tables."""
    if estimate is None:
        return "n/a"
    return f"{estimate['mean']:.{digits}f} ± {estimate['ci95']:.{digits}f}"


def format_interval(estimate: Mapping[str, float], digits: int = 3) -> str:
    """`"value [low, high]"` of an interval estimate (`interval_estimates`' iqm / mean)."""
    value, low, high = estimate["value"], estimate["low"], estimate["high"]
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def format_takeoff(takeoff: Mapping[str, Any]) -> str:
    """`"k/n [low, high]"` of a `takeoff_rate` result."""
    return f"{takeoff['k']}/{takeoff['n']} [{takeoff['low']:.2f}, {takeoff['high']:.2f}]"


def bootstrap_mean_difference(
    values: Sequence[float], reference: Sequence[float], *, reps: int | None = None, seed: int = 0
) -> dict[str, float]:
    """Mean of `values` minus mean of `reference` with a 95% percentile bootstrap CI, the
    two samples resampled independently (unpaired seeds): {"value", "low", "high"}."""
    rng = np.random.default_rng(seed)
    x, y = np.asarray(values, np.float64), np.asarray(reference, np.float64)
    boot = [
        rng.choice(x, x.size).mean() - rng.choice(y, y.size).mean()
        for _ in range(bootstrap_reps(reps))
    ]
    low, high = np.percentile(boot, [2.5, 97.5])
    return {"value": float(x.mean() - y.mean()), "low": float(low), "high": float(high)}


def takeoff_rate(values: Sequence[float], threshold: float, confidence: float = 0.95):
    """Fraction of seeds with value >= threshold, with an exact Clopper-Pearson interval.

    Returns {"rate", "low", "high", "k", "n", "threshold"}.
    """
    from scipy import stats as scipy_stats

    x = np.asarray(values, np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {x.shape}.")
    k, n = int(np.sum(x >= threshold)), int(x.size)
    interval = scipy_stats.binomtest(k, n).proportion_ci(
        confidence_level=confidence, method="exact"
    )
    return {
        "rate": k / n,
        "low": float(interval.low),
        "high": float(interval.high),
        "k": k,
        "n": n,
        "threshold": float(threshold),
    }


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control), in input order.

    p_(i) (sorted ascending, i = 1..m) becomes max_{j <= i} min(1, (m - j + 1) p_(j)).
    """
    p = np.asarray(p_values, np.float64)
    if p.ndim != 1:
        raise ValueError(f"p_values must be 1-D, got shape {p.shape}.")
    if np.any((p < 0) | (p > 1) | ~np.isfinite(p)):
        raise ValueError(f"p_values must lie in [0, 1], got {p}.")
    m = p.size
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


def pairwise_comparisons(
    scores: Mapping[str, Sequence[float]], *, alpha: float = 0.05
) -> list[dict[str, Any]]:
    """Every pair of conditions: probability of improvement and a Holm-corrected test.

    For conditions X, Y (in the order given): `prob_improvement` = P(X > Y) + P(X = Y) / 2
    over per-seed scores (rliable), `p_value` of the two-sided Mann-Whitney U test (exact
    for small samples without ties, SciPy's choice otherwise), `p_holm` adjusted over all
    pairs, and `significant` = p_holm < alpha.
    """
    from rliable import metrics
    from scipy import stats as scipy_stats

    names = list(scores)
    pairs = list(itertools.combinations(names, 2))
    results = []
    for x_name, y_name in pairs:
        x, y = _column(scores[x_name], x_name), _column(scores[y_name], y_name)
        prob = float(metrics.probability_of_improvement(x, y))
        if np.all(x == x[0]) and np.all(y == x[0]):
            p_value = 1.0  # identical constant samples: no evidence of a difference.
        else:
            p_value = float(scipy_stats.mannwhitneyu(x[:, 0], y[:, 0]).pvalue)
        results.append({"x": x_name, "y": y_name, "prob_improvement": prob, "p_value": p_value})
    if results:
        adjusted = holm([r["p_value"] for r in results])
        for r, p in zip(results, adjusted, strict=True):
            r["p_holm"] = float(p)
            r["significant"] = bool(p < alpha)
    return results


def area_under_curve(success: Sequence[float], experience: Sequence[float], budget: float):
    """Normalised area under one seed's success curve over [0, budget] of experience.

    `success[i]` is measured after `experience[i]` (increasing, e.g. environment turns);
    the curve is a step function holding each value until the next measurement, 0 before
    the first one and the last value until the budget. 1.0 means success 1 from the start;
    every seed counts, whether or not it learned.
    """
    s, e = _curve(success, experience)
    if budget <= 0:
        raise ValueError(f"budget must be > 0, got {budget}.")
    edges = np.minimum(np.append(e, budget), budget)
    widths = np.diff(edges)
    return float(np.sum(s * widths) / budget)


def time_to_threshold(
    success: Sequence[float], experience: Sequence[float], threshold: float, budget: float
) -> tuple[float, bool]:
    """(experience at the first success >= threshold, reached); the budget if never."""
    s, e = _curve(success, experience)
    hit = np.flatnonzero(s >= threshold)
    if hit.size:
        return float(e[hit[0]]), True
    return float(budget), False


def censored_summary(times: Sequence[float], reached: Sequence[bool]) -> dict[str, Any]:
    """Median time-to-threshold over all seeds, unreached seeds censored at the budget.

    Censored values sit at the budget, above every observed time, so the median is
    exact when at least half the seeds reached the threshold and is reported as None
    (not reached) otherwise. The mean over all seeds (censored included) is a lower
    bound of the true mean.
    """
    t = np.asarray(times, np.float64)
    r = np.asarray(reached, bool)
    median = float(np.median(t)) if 2 * np.sum(r) > t.size else None
    return {
        "median": median,
        "mean_lower_bound": float(np.mean(t)),
        "reached": f"{int(np.sum(r))}/{t.size}",
    }


def plot_performance_profiles(
    scores: Mapping[str, Sequence[float]],
    path: str,
    *,
    taus: Sequence[float] | None = None,
    xlabel: str = "final success ($\\tau$)",
    reps: int | None = None,
    seed: int = 0,
) -> None:
    """Fraction of seeds with score > tau, per condition, with bootstrap bands (rliable)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import library as rly
    from rliable import plot_utils

    score_dict = {name: _column(values, name) for name, values in scores.items()}
    taus = np.linspace(0.0, 1.0, 41) if taus is None else np.asarray(taus)
    with _seeded_numpy(seed):
        profiles, cis = rly.create_performance_profile(score_dict, taus, reps=bootstrap_reps(reps))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    plot_utils.plot_performance_profiles(
        profiles,
        taus,
        performance_profile_cis=cis,
        ax=ax,
        colors=dict(zip(score_dict, itertools.cycle(palette), strict=False)),
        xlabel=xlabel,
        ylabel="fraction of seeds with score > $\\tau$",
    )
    ax.legend([f"{name} ({len(score_dict[name])} seeds)" for name in score_dict], loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@contextlib.contextmanager
def _seeded_numpy(seed: int):
    """Seeds NumPy's global generator for the duration, then restores it.

    rliable's stratified bootstrap draws its resampling indices from `np.random` (the
    global generator), not from the `random_state` it accepts, so this is what makes its
    intervals reproducible.
    """
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def _column(values: Sequence[float], name: str) -> np.ndarray:
    """Per-seed scores as rliable's [runs, tasks] matrix with one task."""
    x = np.asarray(values, np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"scores[{name!r}] must be a non-empty 1-D sequence, got {x.shape}.")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"scores[{name!r}] has non-finite values: {x}.")
    return x[:, None]


def _curve(success: Sequence[float], experience: Sequence[float]):
    s = np.asarray(success, np.float64)
    e = np.asarray(experience, np.float64)
    if s.shape != e.shape or s.ndim != 1 or s.size == 0:
        raise ValueError(f"success {s.shape} and experience {e.shape} must be equal 1-D shapes.")
    if np.any(np.diff(e) < 0) or e[0] < 0:
        raise ValueError("experience must be non-negative and non-decreasing.")
    return s, e
