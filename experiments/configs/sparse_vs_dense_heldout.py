"""The main experiment at its statistical budget, evaluated on held-out *tasks*.

Usage:
  python -m experiments.sparse_vs_dense \
      --config=experiments/configs/sparse_vs_dense_heldout.py \
      --workdir=runs/sparse_vs_dense_heldout

sparse_vs_dense_full.py (30 seeds per reward form, evaluation every 30 updates on 64 fixed
episodes, sampled and greedy) with ToolWorld's task split: training episodes never hold
one of the held-out quarter of the (intent, order, item, address) cells and every
evaluation episode holds at least one (`env.task_split='train'`, `eval.tasks='heldout'`),
where the full run's evaluation held out keys over the same generator. Seeds and
everything else are the full run's, so the two differ in the task split alone (the
training distribution loses a quarter of its cells). Expected time: the full run's,
1,570 s on the 2-core Intel Xeon.
"""

import ml_collections

from experiments.configs import sparse_vs_dense_full


def get_config(kind: str = "") -> ml_collections.ConfigDict:
    """`kind` (`--config=<this file>:<kind>`): ToolWorld only (the split is ToolWorld's)."""
    if kind:
        raise ValueError(f"sparse_vs_dense_heldout.py holds ToolWorld's task split; got {kind!r}")
    config = sparse_vs_dense_full.get_config()
    config.env.task_split = "train"
    config.eval.tasks = "heldout"
    return config
