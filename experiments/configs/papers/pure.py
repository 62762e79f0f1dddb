"""PURE (Cheng et al. 2025, "Stop Summation: Min-Form Credit Assignment Is All Process
Reward Model Needs for Reasoning").

Claim tested: a PRM's scores summed into the return get hacked; the min form (each turn's
reward the minimum of the remaining scores) resists it.

  python -m experiments.process_rewards --config=experiments/configs/papers/pure.py \
      --workdir=runs/paper_pure

Sum and min forms of the automatic-label PRMs (MC completion, PAV progress) and of the
implicit PRM, with the outcome reward as the baseline (the process-rewards study's
seeds and budget; its label study runs too). The same runs are part of that study's
defaults; docs/papers.md reads those.
"""

import ml_collections

from experiments.configs import process_rewards


def get_config() -> ml_collections.ConfigDict:
    config = process_rewards.get_config()
    kinds = ("completion", "progress", "implicit")
    forms = [f"{form}/prm={kind}" for kind in kinds for form in ("learned_sum", "learned_min")]
    config.conditions = ",".join(["outcome", *forms])
    return config
