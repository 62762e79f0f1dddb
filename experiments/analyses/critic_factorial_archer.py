"""ArCHer's claim with every critic: token- minus turn-level GAE under the process verdict
(docs/horizon_sweep.md, docs/papers.md; the family declared in
experiments/configs/critic_factorial_archer.py).

    python -m experiments.analyses.critic_factorial_archer \
        docs/results/critic_factorial_archer/turn docs/results/critic_factorial_archer/token

Reads the two critic-factorial runs (one per estimator, the same machine, commit and
seeds) and writes analysis.md into the folder that holds both. The runs of a seed share
its warm start and its first training batch (the estimator acts only from the first update
on); the script checks that every seed's first-batch success is identical in both runs before it
pairs them. Per critic, token minus turn GAE over the paired seeds: held-out sampled
success and the AUC of training success at equal environment turns (the smallest turn
total any run of both reached), each a mean with a paired bootstrap 95% CI and an exact
sign-flip p, Holm over the 6 comparisons (`rlagent.analysis.paired.paired_family`);
greedy success, entropy and turns played beside them, without a test.
"""

import os
import sys

import numpy as np

from experiments.studies import critic_factorial
from rlagent.analysis import paired
from rlagent.analysis import report
from rlagent.analysis import stats
from rlagent.host.writers import MetricWriter

ESTIMATORS = ("turn", "token")
DESCRIBED = (("greedy_success", "held-out greedy success", 3),
             ("entropy", "entropy, last training batch", 3),
             ("env_turns", "environment turns played", 0))  # fmt: skip


def _runs(workdir, pairs):
    """{(critic, horizon, seed): row} of `critic_factorial.seed_rows`, and each run's
    success curve {(critic, horizon, seed): [(env turns, success)]}."""
    rows, missing = critic_factorial.seed_rows(workdir, pairs)
    if missing:
        raise ValueError(f"{workdir}: sweeps not finished: {', '.join(missing)}.")
    curves = {}
    for critic, horizon in pairs:
        folder = os.path.join(
            critic_factorial.sweep_dir(workdir, critic, horizon), f"h{horizon:02d}"
        )
        metrics = MetricWriter(folder, tensorboard=False).read()
        for (_, seed), curve in report.seed_curves(metrics).items():
            curves[(critic, horizon, seed)] = [
                (float(r["env_turns_total"]), float(r["success"])) for r in curve
            ]
    return {(r["critic"], r["horizon"], r["seed"]): r for r in rows}, curves


def main(turn_dir, token_dir):
    pairs = [(c, 12) for c in critic_factorial.CRITICS]
    (turn, turn_curves), (token, token_curves) = (_runs(d, pairs) for d in (turn_dir, token_dir))
    if set(turn) != set(token):
        raise ValueError(f"the runs hold different seeds: {sorted(set(turn) ^ set(token))}.")
    unpaired = [k for k in turn if turn[k]["initial_success"] != token[k]["initial_success"]]
    if unpaired:
        raise ValueError(f"first-batch success differs between the runs at {unpaired}.")
    budget = min(c[-1][0] for c in [*turn_curves.values(), *token_curves.values()])

    def auc(curve):
        turns, success = zip(*curve, strict=True)
        return stats.area_under_curve(list(success), list(turns), budget)

    comparisons = []
    for metric in ("success", "auc"):
        for critic, horizon in pairs:
            keys = sorted(k for k in turn if k[:2] == (critic, horizon))
            if metric == "success":
                a = {k[2]: float(turn[k]["success"]) for k in keys}
                b = {k[2]: float(token[k]["success"]) for k in keys}
            else:
                a = {k[2]: auc(turn_curves[k]) for k in keys}
                b = {k[2]: auc(token_curves[k]) for k in keys}
            comparisons.append((f"{metric}|{critic}|turn", f"{metric}|{critic}|token", a, b))
    family = paired.paired_family(comparisons)
    seeds = len({k[2] for k in turn})
    lines = [
        "# ArCHer with every critic: token- minus turn-level GAE under the process verdict",
        "",
        f"Runs: `{turn_dir}` (turn GAE) and `{token_dir}` (token GAE, lambda 0.9); h = 12, "
        f"{seeds} seeds paired by warm start (first-batch success identical in every seed); "
        f"AUC over the first {budget:,.0f} environment turns (the least any run played).",
        "",
        "| metric | critic | turn GAE | token GAE | token - turn [95% CI] | pairs | p | p (Holm) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    names = {"success": "held-out sampled success", "auc": "AUC at equal turns"}
    for (a, _, x, y), e in zip(comparisons, family, strict=True):
        metric, critic, _ = a.split("|")
        d, mark = e["difference"], " *" if e["significant"] else ""
        lines.append(
            f"| {names[metric]} | {critic} | {np.mean(list(x.values())):.3f} | "
            f"{np.mean(list(y.values())):.3f} | {d['value']:+.3f} [{d['low']:+.3f}, "
            f"{d['high']:+.3f}] | {e['num_pairs']} | {e['p_value']:.2g} | {e['p_holm']:.2g}{mark} |"
        )
    lines += ["", "Described, not tested: mean [95% bootstrap CI] over seeds.", "",
              "| critic | estimator | " + " | ".join(n for _, n, _ in DESCRIBED) + " |",
              "|---|---|" + "---|" * len(DESCRIBED)]  # fmt: skip
    for critic, horizon in pairs:
        for name, run in zip(ESTIMATORS, (turn, token), strict=True):
            cells = []
            for key, _, digits in DESCRIBED:
                values = [
                    float(r[key]) for k, r in sorted(run.items()) if k[:2] == (critic, horizon)
                ]
                m = paired.mean_interval(values)
                cells.append(
                    f"{m['value']:.{digits}f} [{m['low']:.{digits}f}, {m['high']:.{digits}f}]"
                )
            lines.append(f"| {critic} | {name} | " + " | ".join(cells) + " |")
    lines += ["", "Paired bootstrap 95% CIs of the mean difference, exact sign-flip p over "
              "the seeds, Holm over the 6 comparisons (* p_holm < 0.05)."]  # fmt: skip
    report.write_analysis(os.path.commonpath([turn_dir, token_dir]), lines)


if __name__ == "__main__":
    main(*sys.argv[1:3])
