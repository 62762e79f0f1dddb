"""Tree-GRPO (Ji et al. 2025, "Tree Search for LLM Agent Reinforcement Learning").

Claim tested: tree rollouts (episodes branched at a turn, the siblings continued from the
same state and compared with each other) give better credit than independent episodes
with group baselines, at a smaller budget of environment turns.

  python -m experiments.horizon_sweep --config=experiments/configs/papers/tree_grpo.py \
      --workdir=runs/paper_tree_grpo

Tree-GRPO (`tree_grpo`, rlagent.train.tree) against GRPO, GiGPO and turn GAE under the
sparse outcome reward at h = 8 and 12 from the horizon sweep's warm start: the runs of
experiments/configs/tree_rollouts.py, which docs/papers.md reads.
"""

import ml_collections

from experiments.configs import tree_rollouts


def get_config() -> ml_collections.ConfigDict:
    return tree_rollouts.get_config()
