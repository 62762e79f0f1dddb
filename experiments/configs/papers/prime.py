"""PRIME (Cui et al. 2025, "Process Reinforcement through Implicit Rewards"; the implicit
PRM of Yuan et al. 2024, "Free Process Rewards without Process Labels").

Claim tested: dense rewards from an implicit PRM trained online on outcomes only improve
RL over the outcome reward alone.

  python -m experiments.process_rewards --config=experiments/configs/papers/prime.py \
      --workdir=runs/paper_prime

The implicit PRM's scores in sum form (PRIME adds them to the return) and in potential
form against the outcome reward (the process-rewards study's seeds and budget); its
long-horizon behaviour is the horizon sweep's `learned_potential/prm=implicit`. The same
runs are part of those studies' defaults; docs/papers.md reads those.
"""

import ml_collections

from experiments.configs import process_rewards


def get_config() -> ml_collections.ConfigDict:
    config = process_rewards.get_config()
    config.conditions = "outcome,learned_sum/prm=implicit,learned_potential/prm=implicit"
    return config
