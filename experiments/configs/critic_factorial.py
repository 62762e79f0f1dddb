"""The critic factorial on the 2-core CPU (defaults of experiments/critic_factorial.py).

Usage:
  python -m experiments.critic_factorial --workdir=runs/critic_factorial
  python -m experiments.critic_factorial --config.seeds=4 --config.horizons=5,12

Budget: critics shared / separate / normalized x the sparse outcome, the clean process
verdict and potential shaping (turn-level GAE) x horizons 5, 12, 16; 20 seeds, 60
updates of 8 x 8 episodes, each horizon warm-started on its own tasks (200 behaviour-
cloning steps) as in the horizon sweep, whose config this extends (every field of
experiments/configs/horizon_sweep.py applies; `estimators` is ignored). With 20 paired
seeds the smallest two-sided sign-flip p-value is about 1e-5 (1/(draws+1)), so Holm over
the 18 comparisons of a family can reject a difference that all seeds agree on.
Measured: see docs/horizon_sweep.md (the critic factorial section).
"""

import ml_collections

from experiments.configs import horizon_sweep


def get_config() -> ml_collections.ConfigDict:
    config = horizon_sweep.get_config()
    # experiments.studies.critic_factorial.CRITICS; `shared` is the critic family's reference.
    config.critics = "shared,separate,normalized"
    config.horizons = "5,12,16"
    # The first is the reference of the reward family (each form against it).
    config.conditions = "outcome,process,potential"
    config.estimators = ""
    config.seeds = 20
    return config
