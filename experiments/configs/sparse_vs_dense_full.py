"""The main experiment at a statistical budget: 30 seeds per reward form, held-out eval.

Usage:
  python -m experiments.sparse_vs_dense \
      --config=experiments/configs/sparse_vs_dense_full.py --workdir=runs/sparse_vs_dense_full
  python -m experiments.sparse_vs_dense --config=experiments/configs/sparse_vs_dense_full.py \
      --guardrail_sweep --config.conditions=potential --workdir=runs/guardrail_full

(`--config=...` must come before any `--config.<field>=...` override.)

Everything else is the quickstart's defaults (experiments/configs/sparse_vs_dense.py), so
the two differ only in seeds and evaluation. 30 seeds per arm separate take-off rates of
0.4 and 0.9 (about 13 needed) but not 0.4 and 0.7 (about 40).
"""

import ml_collections

from experiments.configs import sparse_vs_dense


def get_config(kind: str = "") -> ml_collections.ConfigDict:
    """`kind` (`--config=<this file>:<kind>`): the environment, as in sparse_vs_dense.py."""
    config = sparse_vs_dense.get_config(kind)
    config.seeds = 30  # per condition; all conditions x seeds train under one vmap.
    # Held-out evaluation (rlagent.train.evaluation): sampled and greedy, every 30 updates
    # and after the last, on 64 fixed held-out episodes shared by every run.
    config.eval.every = 30
    config.eval.episodes = 64
    return config
