"""The critic factorial on the 2-core CPU (defaults of experiments/critic_factorial.py).

Usage:
  python -m experiments.critic_factorial --workdir=runs/critic_factorial
  python -m experiments.critic_factorial --config.seeds=4 --config.horizons=5,12

Budget: critics shared / separate / normalized x the sparse outcome, the clean process
verdict and potential shaping (turn-level GAE) x horizons 12, 16, 5 (run in that order,
every critic at a horizon before the next); 10 seeds, 60 updates of 8 x 8 episodes, each
horizon warm-started on its own tasks (200 behaviour-cloning steps) as in the horizon
sweep, whose config this extends (every field of experiments/configs/horizon_sweep.py
applies; `estimators` is ignored). 10 seeds, not the 20 the issue asks for, so that the
defaults finish within one 3-hour session on the 2-core CPU (20 seeds at h = 5 took 8.6 s
per update, ~2x the 10-seed rate). What 10 paired seeds can resolve: the exact sign-flip
test's smallest two-sided p is 2 / 2^10 = 0.002, so after Holm over a family's 18
comparisons (3 horizons x 3 critics x 2 forms) the first rejection needs a difference
with the same sign in all 10 seeds (18 x 0.002 = 0.035; with 9 of 10 the exact p is at
least 0.021, x 18 > 0.05); intervals are the finding where the test cannot reject.
`--config.seeds=20` is the full size.
Measured: 2,901 s (48 min) at 8473abd on the 2-core CPU beside light editing
(docs/critic_factorial.md, "The critic factorial"; docs/results/critic_factorial/).
"""

import ml_collections

from experiments.configs import horizon_sweep


def get_config() -> ml_collections.ConfigDict:
    config = horizon_sweep.get_config()
    # experiments.studies.critic_factorial.CRITICS; `shared` is the critic family's reference.
    config.critics = "shared,separate,normalized"
    config.horizons = "12,16,5"
    # The first is the reference of the reward family (each form against it).
    config.conditions = "outcome,process,potential"
    config.estimators = ""
    config.seeds = 10
    return config
