"""Held-out user goals vs training goals in the dialogue's 20-seed reward-form run
(docs/dialogue_rl.md, "20 seeds on held-out goals").

    python -m experiments.analyses.dialogue_heldout docs/results/dialogue_heldout

Reads the folder's metrics.csv(.xz) and writes analysis.md into it: per
condition and seed, the success of the evaluation after the last update on 64 dialogues
with held-out goals (sampled, greedy) minus the goal success of the training batch of the
same update (the same policy, training goals, sampled), paired over seeds (mean,
bootstrap 95% CI, sign-flip p, Holm over the 10 comparisons).
"""

import sys

from rlagent.analysis.paired import compare
from rlagent.analysis.report import last_evaluation
from rlagent.analysis.report import write_analysis
from rlagent.analysis.stats import holm

CONDITIONS = ("dialogue", "rating", "feedback", "outcome", "potential")
MODES = ("sampled", "greedy")


def main(folder):
    _, rows = last_evaluation(folder)
    table, ps = [], []
    for condition in CONDITIONS:
        seeds = sorted(rows[condition])
        train = [float(rows[condition][s]["goal_success"]) for s in seeds]
        for mode in MODES:
            held = [float(rows[condition][s][f"eval_{mode}_success"]) for s in seeds]
            result = compare(train, held)
            table.append((condition, mode, len(seeds), result))
            ps.append(result["p_value"])
    lines = [
        "# Held-out goals minus training goals, same policy (last update)\n",
        "| condition | held-out mode | seeds | training goal success (mean) | held-out success "
        "(mean) | held-out - training [95% CI] | p (sign flip) | p (Holm, 10) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (condition, mode, n, r), p_holm in zip(table, holm(ps), strict=True):
        d = r["diff"]
        lines.append(
            f"| {condition} | {mode} | {n} | {r['a']:.3f} | {r['b']:.3f} | {d['value']:+.3f} "
            f"[{d['low']:+.3f}, {d['high']:+.3f}] | {r['p_value']:.3g} | {p_holm:.3g} |"
        )
    write_analysis(folder, lines)


if __name__ == "__main__":
    main(sys.argv[1])
