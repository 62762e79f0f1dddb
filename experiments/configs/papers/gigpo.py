"""GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training").

Claim tested: step-level groups (GiGPO: turns that reach the same anchor state are
compared with each other) assign credit better than GRPO's episode-level groups, and the
gain grows with the horizon.

  python -m experiments.horizon_sweep --config=experiments/configs/papers/gigpo.py \
      --workdir=runs/paper_gigpo

GRPO and GiGPO against turn GAE under the clean process verdict at h = 8 and 12, from the
horizon sweep's warm start on each horizon's own tasks (its seeds, updates and budget).
The same runs are part of the horizon sweep's defaults; docs/papers.md reads those.
"""

import ml_collections

from experiments.configs import horizon_sweep


def get_config() -> ml_collections.ConfigDict:
    config = horizon_sweep.get_config()
    config.horizons = "8,12"
    config.conditions = "process"
    config.estimators = "grpo,gigpo"
    config.estimator_reward = "process"
    config.estimator_horizons = "8,12"
    return config
