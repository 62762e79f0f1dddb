"""Math-Shepherd (Wang et al. 2024, "Math-Shepherd: Verify and Reinforce LLMs Step-by-step
without Human Annotations").

Claim tested: Monte-Carlo completion labels (a step is good when continuations from it
succeed) approach the quality of hand labels as the number of continuations N grows.

  python -m experiments.process_rewards --config=experiments/configs/papers/math_shepherd.py \
      --workdir=runs/paper_math_shepherd

The label study of the process-rewards study (AUROC of soft completion labels against
ToolWorld's oracle step verdict, standing in for hand labels, at N = 1, 2, 4, 8, 16, and
the environment turns they cost), with one outcome PPO run (the study always trains).
The same label study is part of that study's defaults; docs/papers.md reads it.
"""

import ml_collections

from experiments.configs import process_rewards


def get_config() -> ml_collections.ConfigDict:
    config = process_rewards.get_config()
    config.conditions = "outcome"
    config.labels.completers = "random,policy,oracle"
    return config
