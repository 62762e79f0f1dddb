"""ArCHer (Zhou et al. 2024, "ArCHer: Training Language Model Agents via Hierarchical
Multi-Turn RL").

Claim tested: a turn-level critic (one value per turn, the token policy trained on its
turn advantages) beats token-level credit on multi-turn tasks, more so on long ones.

  python -m experiments.horizon_sweep --config=experiments/configs/papers/archer.py \
      --workdir=runs/paper_archer

Turn-level GAE (`gae_turn`, the sweep's train.estimator) and the hierarchical estimator
against token-level GAE (lambda 0.9) under the clean process verdict at h = 8 and 12,
from the horizon sweep's warm start. The same runs are part of the horizon sweep's
defaults; docs/papers.md reads those.
"""

import ml_collections

from experiments.configs import horizon_sweep


def get_config() -> ml_collections.ConfigDict:
    config = horizon_sweep.get_config()
    config.horizons = "8,12"
    config.conditions = "process"
    config.estimators = "gae_token@0.9,hierarchical"
    config.estimator_reward = "process"
    config.estimator_horizons = "8,12"
    return config
