"""The shared critic's sensitivity at h = 12: is the process verdict's loss to the outcome
(turn GAE, trunk-shared critic; docs/critic_factorial.md) a matter of how the critic is
weighted or clipped?

Usage:
  python -m experiments.critic_factorial --config=experiments/configs/critic_sensitivity.py \\
      --workdir=runs/critic_sensitivity

Declared before it runs: critics `shared` (the reference: value_coef 0.5, value clip
0.2), `value_coef_0.1`, `value_coef_2` and `no_value_clip` (experiments.studies.
critic_factorial.CRITICS) x the sparse outcome (reference) and the clean process verdict,
turn-level GAE, horizon 12 only, 10 seeds (0-9, paired: every cell of a seed starts from
the same warm start), the critic factorial's budget otherwise (60 updates of 8 x 8
episodes). The credit probe (every 30 updates: updates 0 and 30, 4 episodes x 4
continuations) also logs the critic's error against the Monte-Carlo V(s)
(`credit_value_rmse`, `credit_value_bias`) and the cosine between the policy part's and
the value part's gradients on the shared trunk (`credit_grad_cosine`).

Questions, in this order: (1) the `reward` family: for each critic, process minus outcome
in held-out sampled success (sign-flip test, Holm over the 4 critics); (2) the `critic`
family: each variant minus `shared` per reward form (Holm over 6); greedy success and
entropy beside every sampled figure; the value error at the last probe beside them. A
variant "removes" the loss only if its process-minus-outcome interval excludes the
shared critic's difference; otherwise the reading is "cannot tell at 10 seeds".
"""

import ml_collections

from experiments.configs import critic_factorial


def get_config() -> ml_collections.ConfigDict:
    config = critic_factorial.get_config()
    config.critics = "shared,value_coef_0.1,value_coef_2,no_value_clip"
    config.horizons = "12"
    config.conditions = "outcome,process"
    config.seeds = 10
    return config
