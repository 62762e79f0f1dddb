"""Why no reward without an oracle leaves 0 from the weak start (docs/horizon_sweep.md,
"The long-horizon question at 20 seeds on held-out tasks").

    python -m experiments.analyses.horizon_no_oracle_heldout docs/results/horizon_no_oracle_heldout

Reads each horizon's metrics.csv(.xz) and writes analysis.md into the folder: per horizon and
condition, over the 20 seeds, the seeds with any success in a training batch and the
largest batch success; the policy's entropy and the share of episodes without a tool
call (ToolWorld's collapse rate) at the first and the last update; turns per episode at
the last; environment turns played in training and in PRM labelling per run (mean over
seeds); and, for the PRM runs, the labels' and the PRM's AUROC against the verdict
(measured, never trained on) and the PRM's loss, averaged over the last 10 updates.
"""

import os
import sys
from collections import defaultdict

import numpy as np

from rlagent.analysis.report import write_analysis
from rlagent.host.writers import MetricWriter


def _measured(rows, key):
    """The finite values of `key` in `rows` (a run logs NaN for what it does not measure)."""
    return [r[key] for r in rows if np.isfinite(r.get(key, np.nan))]


def _mean(rows, key):
    values = _measured(rows, key)
    return float(np.mean(values)) if values else float("nan")


def _per_run(rows, key):
    """`key` summed over `rows`, divided by the number of seeds they hold."""
    return sum(_measured(rows, key)) / len({r["seed"] for r in rows})


def main(folder):
    lines = ["# No oracle from the weak start: what each run saw", ""]
    header = ("| h | condition | seeds with a success | largest batch success | entropy first -> "
              "last | no-tool-call share first -> last | turns / episode | training turns "
              "/ run | label turns / run | label AUROC | PRM AUROC | PRM loss |")  # fmt: skip
    lines += [header, "|" + "---|" * 12]
    for horizon in sorted(d for d in os.listdir(folder) if d.startswith("h") and d[1:].isdigit()):
        rows = MetricWriter(os.path.join(folder, horizon), tensorboard=False).read()
        runs = defaultdict(list)
        for r in rows:
            runs[r["condition"]].append(r)
        for condition, rs in runs.items():
            seeds = {r["seed"] for r in rs}
            first, last = min(r["update"] for r in rs), max(r["update"] for r in rs)
            at = {u: [r for r in rs if r["update"] == u] for u in (first, last)}
            tail = [r for r in rs if r["update"] > last - 10]
            batch = _measured(rs, "success")
            lucky = {r["seed"] for r in rs if r["success"] > 0}
            lines.append(
                f"| {horizon[1:]} | {condition} | {len(lucky)}/{len(seeds)} | {max(batch):.3f} | "
                f"{_mean(at[first], 'entropy'):.3f} -> {_mean(at[last], 'entropy'):.3f} | "
                f"{_mean(at[first], 'collapse_rate'):.3f} -> "
                f"{_mean(at[last], 'collapse_rate'):.3f} | "
                f"{_mean(at[last], 'turns'):.1f} | {_per_run(rs, 'env_turns'):,.0f} | "
                f"{_per_run(rs, 'label_turns'):,.0f} | {_mean(tail, 'label_auroc'):.3f} | "
                f"{_mean(tail, 'prm_auroc'):.3f} | {_mean(tail, 'prm_loss'):.4f} |"
            )
    lines += ["", "Means over the seeds (nan: not measured in that run). AUROC against the "
              "oracle verdict is a measurement only; no run trains on it."]  # fmt: skip
    write_analysis(folder, lines)


if __name__ == "__main__":
    main(sys.argv[1])
