"""The long-horizon question: from a start with no success, does a reward with no oracle
anywhere reach the oracle verdict's success?

  python -m experiments.horizon_sweep --config=experiments/configs/horizon_no_oracle.py \
      --workdir=runs/horizon_no_oracle

The weak start of the horizon study's first run: every horizon warm-started on
demonstrations of 3-, 5- and 7-turn tasks only (0 sampled success at h = 12 and 16, where
the outcome reward gives no signal). Under token-level GAE (lambda 0.9, the estimator
that did best with the verdict from this start: 0.62 [0.32, 0.79] at h = 12), the oracle
verdict (`process`) against process rewards that read no oracle: the implicit PRM
(outcome labels only) and the MC-completion PRM (labels from the policy's own
continuations), both in potential form, and the outcome reward. Measured at 30ace1d: 903 s
on the 2-core CPU (docs/horizon_sweep.md, "The long-horizon question").
"""

import ml_collections

from experiments.configs import horizon_sweep


def get_config() -> ml_collections.ConfigDict:
    config = horizon_sweep.get_config()
    config.horizons = "12,16"
    config.warm_start_horizons = "3,5,7"
    config.conditions = (
        "outcome,process,learned_potential/prm=implicit,learned_potential/prm=completion"
    )
    config.estimators = ""
    config.train.estimator = "gae_token"
    config.train.lam = 0.9
    return config
