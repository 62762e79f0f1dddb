"""Held-out tasks vs held-out keys in the main experiment at 30 seeds (docs/sparse_vs_dense.md).

    python -m experiments.analyses.sparse_vs_dense_heldout \
        docs/results/sparse_vs_dense_heldout docs/results/sparse_vs_dense_full_amd

Reads each folder's metrics.csv (plain or compressed) and writes analysis.md into the first:
(1) within the held-out-tasks run, per condition and seed, the success of the last
evaluation on held-out tasks (sampled, greedy) minus the training batch's success at the
same update (the same policy), paired over seeds (mean, bootstrap 95% CI, sign-flip p,
Holm over the 8 comparisons); (2) across the two runs (same seeds and code, training on
three quarters of the task cells vs all of them), the last evaluation's success per
condition, P(tasks > keys) and the two-sided Mann-Whitney U of
`rlagent.analysis.stats.pairwise_comparisons`, Holm over the 8 comparisons.
"""

import sys

import numpy as np

from rlagent.analysis.paired import compare
from rlagent.analysis.report import last_evaluation
from rlagent.analysis.report import write_analysis
from rlagent.analysis.stats import holm
from rlagent.analysis.stats import pairwise_comparisons

CONDITIONS = ("outcome", "process", "composed", "potential")
MODES = ("sampled", "greedy")


def main(heldout, keys):
    update, tasks = last_evaluation(heldout)
    _, same = last_evaluation(keys)
    lines = [f"# Held-out tasks (`{heldout}`) vs held-out keys (`{keys}`), update {update}", ""]
    header = "| condition | mode | training | held-out tasks | difference [95% CI] | p | p (Holm) |"
    title = "## Within the held-out-tasks run: held-out success minus training success"
    lines += [title, "", header, "|---|---|---|---|---|---|---|"]
    results = []
    for c in CONDITIONS:
        seeds = sorted(tasks[c])
        train = [float(tasks[c][s]["success"]) for s in seeds]
        for m in MODES:
            held = [float(tasks[c][s][f"eval_{m}_success"]) for s in seeds]
            results.append((c, m, compare(train, held)))
    p_holm = holm([r[2]["p_value"] for r in results])
    for (c, m, r), ph in zip(results, p_holm, strict=True):
        d = r["diff"]
        lines.append(
            f"| {c} | {m} | {r['a']:.3f} | {r['b']:.3f} | {d['value']:+.3f} "
            f"[{d['low']:+.3f}, {d['high']:+.3f}] | {r['p_value']:.3g} | {ph:.3g} |"
        )
    lines += [
        "",
        "## Across runs: the last evaluation's success",
        "",
        "| condition | mode | held-out keys (all cells trained) "
        "| held-out tasks (3/4 of cells) | P(tasks > keys) | p | p (Holm) |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = []
    for c in CONDITIONS:
        for m in MODES:
            a = [float(r[f"eval_{m}_success"]) for r in same[c].values()]
            b = [float(r[f"eval_{m}_success"]) for r in tasks[c].values()]
            (pair,) = pairwise_comparisons({"tasks": b, "keys": a})
            rows.append((c, m, np.mean(a), np.mean(b), pair["prob_improvement"], pair["p_value"]))
    p_holm = holm([r[-1] for r in rows])
    for (c, m, a, b, auc, p), ph in zip(rows, p_holm, strict=True):
        lines.append(f"| {c} | {m} | {a:.3f} | {b:.3f} | {auc:.2f} | {p:.3g} | {ph:.3g} |")
    lines += ["", "Means over 30 seeds each; success of the last evaluation (64 fixed episodes)."]
    write_analysis(heldout, lines)


if __name__ == "__main__":
    main(*sys.argv[1:3])
