"""Paired comparisons of two policies on the same tasks (an A/B test), and pass@k / pass^k.

In an A/B test both arms play the same held-out tasks with the same keys, so the unit of
analysis is the task: per task i a score `a_i` of arm A and `b_i` of arm B (a success
rate over k samples, violations per episode, ...). Pairing removes the between-task
variance (an easy task is easy for both arms), which an unpaired comparison would count
as noise.

- `mean_interval`: one arm's mean over tasks with a percentile bootstrap CI over tasks.
- `paired_bootstrap`: mean difference `mean(b - a)` with a percentile bootstrap CI that
  resamples tasks, keeping each task's pair together (Efron & Tibshirani 1993, ch. 13).
- `sign_flip_test`: the paired permutation test of `mean(b - a) = 0`: under the null the
  sign of each task's difference is exchangeable (Fisher 1935; Good 2005, ch. 3); exact
  over all `2^n` sign vectors when n is small, Monte-Carlo otherwise with the
  `(hits + 1) / (draws + 1)` p-value that never reads 0 (Phipson & Smyth 2010).
- `pass_at_k`: the unbiased estimator `1 - C(n - c, k) / C(n, k)` of the probability that
  at least one of k samples succeeds, from n >= k samples with c successes (Chen et al.
  2021, "Evaluating large language models trained on code").
- `pass_hat_k`: the unbiased estimator `C(c, k) / C(n, k)` of the probability that all
  k samples succeed, the reliability metric pass^k of tau-bench (Yao et al. 2024).
- `compare`: one metric of both arms: means, the paired difference with its CI, the
  sign-flip p-value; `verdict` turns it into one line.
- `equivalence_test`: two one-sided paired t-tests (TOST; Schuirmann 1987) of
  |mean(b - a)| < margin, for a margin fixed before the data; `detectable_difference`:
  the smallest |mean difference| a two-sided paired test at level alpha would detect with
  80% power, given the pairs' spread (the power statement of a non-rejection).
- `reading`: the words a report may use for one comparison, and only these: "above" /
  "below" when the test rejects, "equivalent within +-m" when TOST with a declared
  margin rejects, else "cannot tell at N pairs (detectable +-d)". Report code writes
  them, so no page writes "the same", "matches" or "holds" by hand.
- `paired_family`: a pre-declared family of such comparisons over seeds (runs of two
  conditions that share a seed share its start), Holm-corrected within the family;
  `summary_families` builds one per metric from a study summary's per-seed values
  (`report.summarize`), `families_markdown` prints them as one table.

Everything runs on the host in NumPy; nothing here is traced.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from rlagent.analysis.stats import holm

# Tasks up to which `sign_flip_test` enumerates every sign vector (2^16 = 65,536).
EXACT_LIMIT = 16


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    *,
    reps: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """`mean(b - a)` over tasks with a percentile bootstrap CI that resamples tasks.

    Args:
      a, b: `[n]` per-task scores of arms A and B on the same tasks (pairs by index).
      reps: bootstrap resamples.
      confidence: interval size.
      seed: NumPy seed (reproducible intervals).
    Returns:
      {"value", "low", "high"}: the observed mean difference and its interval.
    """
    return mean_interval(_differences(a, b), reps=reps, confidence=confidence, seed=seed)


def mean_interval(
    values: Sequence[float], *, reps: int = 10_000, confidence: float = 0.95, seed: int = 0
) -> dict[str, float]:
    """`{"value", "low", "high"}`: the mean of per-task `values [n]` with a percentile
    bootstrap CI over tasks (one arm's score, or the paired differences)."""
    x = np.asarray(values, np.float64)
    if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"values must be a non-empty finite 1-D array, got shape {x.shape}.")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(reps, x.size))].mean(axis=1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return {"value": float(x.mean()), "low": float(low), "high": float(high)}


def sign_flip_test(
    a: Sequence[float], b: Sequence[float], *, draws: int = 100_000, seed: int = 0
) -> float:
    """Two-sided p-value of the paired permutation (sign-flip) test of `mean(b - a) = 0`.

    The statistic is `|mean(d)|`, `d = b - a`; under the null each `d_i` is as likely as
    `-d_i`. Tasks with `d_i = 0` move no sum, so the test is exact (every sign vector of
    the nonzero differences) for at most `EXACT_LIMIT` of them, else `draws` random sign
    vectors give p = (hits + 1) / (draws + 1). Ties of the statistic count as hits
    (within a relative 1e-9, so that float rounding of equal sums does not split them).
    """
    diff = _differences(a, b)
    diff = diff[diff != 0]
    if not diff.size:
        return 1.0
    observed = abs(diff.sum()) * (1 - 1e-9)
    if diff.size <= EXACT_LIMIT:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=diff.size)))
        return float(np.mean(np.abs(signs @ diff) >= observed))
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, draws, 10_000):  # chunks keep the sign matrix small
        size = min(10_000, draws - start)
        signs = rng.choice((-1.0, 1.0), size=(size, diff.size))
        hits += int(np.sum(np.abs(signs @ diff) >= observed))
    return (hits + 1) / (draws + 1)


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples succeeds), unbiased from n samples with c successes:
    `1 - C(n - c, k) / C(n, k)` (Chen et al. 2021); needs `1 <= k <= n`, `0 <= c <= n`."""
    _check_counts(n, c, k)
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """P(all k samples succeed), unbiased from n samples with c successes:
    `C(c, k) / C(n, k)` (pass^k, Yao et al. 2024); needs `1 <= k <= n`, `0 <= c <= n`."""
    _check_counts(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def per_task_pass(successes: np.ndarray, k: int) -> dict[str, np.ndarray]:
    """`{"pass@k", "pass^k"}`: `[tasks]` estimates from `successes [tasks, n]` (bool)."""
    successes = np.asarray(successes, bool)
    if successes.ndim != 2:
        raise ValueError(f"successes must be [tasks, samples], got shape {successes.shape}.")
    n = successes.shape[1]
    counts = successes.sum(axis=1)
    return {
        f"pass@{k}": np.array([pass_at_k(n, int(c), k) for c in counts]),
        f"pass^{k}": np.array([pass_hat_k(n, int(c), k) for c in counts]),
    }


def compare(
    a: Sequence[float],
    b: Sequence[float],
    *,
    higher_is_better: bool | None = True,
    reps: int = 10_000,
    seed: int = 0,
    margin: float | None = None,
) -> dict[str, Any]:
    """One metric of both arms on the same tasks.

    Returns {"a", "b": mean per arm, "a_interval", "b_interval": their `mean_interval`,
    "diff": `paired_bootstrap` of b - a, "p_value": `sign_flip_test`, "higher_is_better",
    "tasks", "detectable": `detectable_difference`, "margin", "equivalence_p":
    `equivalence_test` (None without a margin)}.
    """
    return {
        "detectable": detectable_difference(a, b),
        "margin": margin,
        "equivalence_p": None if margin is None else equivalence_test(a, b, margin),
        "a": float(np.mean(a)),
        "b": float(np.mean(b)),
        "a_interval": mean_interval(a, reps=reps, seed=seed),
        "b_interval": mean_interval(b, reps=reps, seed=seed),
        "diff": paired_bootstrap(a, b, reps=reps, seed=seed),
        "p_value": sign_flip_test(a, b, seed=seed),
        "higher_is_better": higher_is_better,
        "tasks": int(np.size(a)),
    }


def paired_family(
    comparisons: Sequence[tuple[str, str, dict[int, float], dict[int, float]]],
    *,
    reps: int = 10_000,
    draws: int = 100_000,
    margin: float | None = None,
) -> list[dict[str, Any]]:
    """Each `(a, b, {seed: value of a}, {seed: value of b})`: the mean paired difference
    `b - a` over the seeds both hold (`paired_bootstrap`), its `sign_flip_test` p-value and
    `p_holm`, Holm's adjustment over the family (`significant`: p_holm < 0.05), the
    `detectable` difference, `equivalence_p` (TOST against the declared `margin`, Holm
    over the family too; None without one) and the `reading` those allow."""
    out = []
    for a, b, a_seeds, b_seeds in comparisons:
        seeds = sorted(set(a_seeds) & set(b_seeds))
        x, y = [a_seeds[s] for s in seeds], [b_seeds[s] for s in seeds]
        out.append({
            "a": a, "b": b, "num_pairs": len(seeds),
            "difference": paired_bootstrap(x, y, reps=reps),
            "p_value": sign_flip_test(x, y, draws=draws),
            "detectable": detectable_difference(x, y),
            "margin": margin,
            "equivalence_p": None if margin is None else equivalence_test(x, y, margin),
        })  # fmt: skip
    for entry, p in zip(out, holm([e["p_value"] for e in out]) if out else [], strict=True):
        entry["p_holm"] = float(p)
        entry["significant"] = bool(p < 0.05)
    if margin is not None and out:
        for entry, p in zip(out, holm([e["equivalence_p"] for e in out]), strict=True):
            entry["equivalence_p_holm"] = float(p)
    for entry in out:
        entry["reading"] = reading(
            entry["difference"]["value"], entry["p_holm"], entry["num_pairs"],
            entry["detectable"], margin=margin,
            equivalence_p=entry.get("equivalence_p_holm"), unit="seeds",
        )  # fmt: skip
    return out


def equivalence_test(a: Sequence[float], b: Sequence[float], margin: float) -> float:
    """TOST p-value of |mean(b - a)| < `margin` (two one-sided paired t-tests, the larger
    p; Schuirmann 1987): small when the difference is shown to lie inside the margin.

    The margin must be fixed before the data are seen (a study's config); with zero spread
    the p-value is 0 inside the margin and 1 outside it."""
    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin}.")
    d = _differences(a, b)
    if d.size < 2:
        return 1.0
    if np.ptp(d) <= 1e-12 * max(1.0, float(np.abs(d).max())):  # no spread (to rounding)
        return 0.0 if abs(d.mean()) < margin else 1.0
    lower = scipy_stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    upper = scipy_stats.ttest_1samp(d, margin, alternative="less").pvalue
    return float(max(lower, upper))


def detectable_difference(
    a: Sequence[float], b: Sequence[float], *, alpha: float = 0.05, power: float = 0.8
) -> float:
    """The smallest |mean(b - a)| a two-sided paired t-test at level `alpha` detects with
    probability `power`, at the pairs' observed spread: `(t_{1-alpha/2} + t_{power}) * sd /
    sqrt(n)` with n - 1 degrees of freedom (NaN with fewer than 2 pairs). What a
    non-rejection at these pairs can rule out, roughly: effects well above it."""
    d = _differences(a, b)
    n = d.size
    if n < 2:
        return float("nan")
    quantiles = scipy_stats.t.ppf(1 - alpha / 2, n - 1) + scipy_stats.t.ppf(power, n - 1)
    return float(quantiles * np.std(d, ddof=1) / math.sqrt(n))


def reading(
    difference: float,
    p: float,
    pairs: int,
    detectable: float,
    *,
    alpha: float = 0.05,
    margin: float | None = None,
    equivalence_p: float | None = None,
    unit: str = "pairs",
) -> str:
    """The verdict words of one comparison of B against A (B - A = `difference`): "B
    above A" / "B below A" when `p` < alpha; "equivalent within +-margin" when a margin
    was declared and `equivalence_p` < alpha; otherwise "cannot tell at N <unit>
    (detectable +-d)", the smallest difference the test could have found."""
    if p < alpha and difference != 0:
        return f"B {'above' if difference > 0 else 'below'} A"
    if margin is not None and equivalence_p is not None and equivalence_p < alpha:
        return f"equivalent within +-{margin:g}"
    return f"cannot tell at {pairs} {unit} (detectable +-{detectable:.3g})"


def summary_families(
    conditions: Mapping[str, Mapping[str, Any]],
    pairs: Sequence[tuple[str, str]],
    metrics: Sequence[str],
    *,
    reps: int = 10_000,
) -> dict[str, list[dict[str, Any]]]:
    """Per metric, `paired_family` over `pairs` `(a, b)` of `conditions` (each
    `{"seeds": [...], "per_seed": {metric: [...]}}`, as `report.summarize` writes them),
    matched by seed; a pair is left out of a metric one of its conditions lacks."""
    out = {}
    for metric in metrics:
        by_seed = {
            name: dict(zip(entry["seeds"], entry["per_seed"][metric], strict=True))
            for name, entry in conditions.items()
            if metric in entry["per_seed"]
        }
        comparisons = [(a, b, by_seed[a], by_seed[b]) for a, b in pairs if {a, b} <= set(by_seed)]
        out[metric] = paired_family(comparisons, reps=reps)
    return out


def families_markdown(
    families: Mapping[str, list[dict[str, Any]]], names: Mapping[str, str]
) -> str:
    """`summary_families` as one Markdown table, a row per comparison, metrics in the
    order of `names` (metric -> its name in the table); "" when there is nothing."""
    rows = [(metric, e) for metric in names for e in families.get(metric, [])]
    if not rows:
        return ""
    lines = [
        "\nPaired over seeds (a seed's runs share its initial policy): B minus A, mean [95% "
        "paired bootstrap CI], sign-flip p, Holm within each metric's family (* p_holm < "
        '0.05); reading: `paired.reading` (a non-rejection reads "cannot tell" with the '
        "smallest difference a paired t-test detects with 80% power):\n",
        "| metric | B | A | B - A | pairs | p | p (Holm) | reading |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for metric, e in rows:
        d, mark = e["difference"], " *" if e["significant"] else ""
        lines.append(
            f"| {names[metric]} | {e['b']} | {e['a']} | {d['value']:+.3f} [{d['low']:+.3f}, "
            f"{d['high']:+.3f}] | {e['num_pairs']} | {e['p_value']:.3g} | {e['p_holm']:.3g}{mark} "
            f"| {e['reading']} |"
        )
    return "\n".join(lines) + "\n"


def verdict(
    metric: str, comparison: dict[str, Any], *, alpha: float = 0.05, p_key: str = "p_value"
) -> str:
    """One line: `B better than A on success: +0.12 [0.05, 0.19], p = 0.003`.

    "better" / "worse" follow the metric's direction (`higher_is_better`; None: a metric
    with no better direction, e.g. turns, which a policy that gives up shortens: "differs
    from") and need `comparison[p_key] < alpha`; otherwise, B equals A within the
    comparison's declared margin when its TOST rejects, else the line says the test
    cannot tell them apart at that many tasks and gives the smallest difference it could
    have detected (`reading`).
    """
    diff, p = comparison["diff"], comparison[p_key]
    numbers = f"{diff['value']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}], p = {p:.3g}"
    if p >= alpha or diff["value"] == 0:
        words = reading(
            0.0, 1.0, comparison["tasks"], comparison.get("detectable", float("nan")),
            alpha=alpha, margin=comparison.get("margin"),
            equivalence_p=comparison.get("equivalence_p"), unit="tasks",
        )  # fmt: skip
        if words.startswith("equivalent"):
            return f"B {words} of A on {metric}: {numbers}"
        return f"Cannot tell B from A on {metric}: {words[len('cannot tell ') :]}; {numbers}"
    if comparison["higher_is_better"] is None:
        return f"B differs from A on {metric}: {numbers}"
    improved = (diff["value"] > 0) == comparison["higher_is_better"]
    return f"B {'better' if improved else 'worse'} than A on {metric}: {numbers}"


def _differences(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if x.ndim != 1 or x.shape != y.shape or x.size == 0:
        raise ValueError(
            f"a and b must be non-empty 1-D arrays of one length, got {x.shape}, {y.shape}."
        )
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("a and b must be finite.")
    return y - x


def _check_counts(n: int, c: int, k: int) -> None:
    if not 1 <= k <= n:
        raise ValueError(f"pass estimates need 1 <= k <= n, got k={k}, n={n}.")
    if not 0 <= c <= n:
        raise ValueError(f"successes c must be in [0, n], got c={c}, n={n}.")
