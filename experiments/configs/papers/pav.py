"""PAV (Setlur et al. 2024, "Rewarding Progress: Scaling Automated Process Verifiers for
LLM Reasoning").

Claim tested: rewarding progress (the step's change in a prover's success probability)
is more sample-efficient than the outcome reward alone.

  python -m experiments.process_rewards --config=experiments/configs/papers/pav.py \
      --workdir=runs/paper_pav

The PAV PRM (`progress`, prover = the policy mixed with the oracle at
`prm.prover_epsilon`) in potential and sum form against the outcome reward, efficiency
read in environment turns (the process-rewards study's seeds and budget). The same runs
are part of that study's defaults; docs/papers.md reads those.
"""

import ml_collections

from experiments.configs import process_rewards


def get_config() -> ml_collections.ConfigDict:
    config = process_rewards.get_config()
    config.conditions = "outcome,learned_potential/prm=progress,learned_sum/prm=progress"
    return config
