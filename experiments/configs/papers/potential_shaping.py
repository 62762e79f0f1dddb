"""Ng, Harada and Russell 1999, "Policy invariance under reward transformations".

Claim tested: shaping with a potential, F = gamma Phi(s') - Phi(s), leaves the optimal
policy unchanged (the return changes by -Phi(s_0) only; tests/test_returns.py checks the
telescoping), so it can speed learning without changing what is learned.

  python -m experiments.sparse_vs_dense --config=experiments/configs/papers/potential_shaping.py \
      --workdir=runs/paper_potential_shaping

Potential shaping (Phi = 0.5 x valid plan steps taken) against the sparse outcome reward
at the main experiment's 30-seed size; docs/papers.md reads the 30-seed main run
(experiments/configs/sparse_vs_dense_full.py), which holds these two arms.
"""

import ml_collections

from experiments.configs import sparse_vs_dense_full


def get_config() -> ml_collections.ConfigDict:
    config = sparse_vs_dense_full.get_config()
    config.conditions = "outcome,potential"
    return config
