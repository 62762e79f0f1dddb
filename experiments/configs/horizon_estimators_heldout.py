"""The horizon study's estimator comparison at 20 seeds on held-out tasks.

Usage:
  python -m experiments.horizon_sweep \
      --config=experiments/configs/horizon_estimators_heldout.py \
      --workdir=runs/horizon_estimators_heldout

Question (pre-declared): under the clean process verdict, which estimators keep or lose a
competent start at long plans? The sweep's defaults answered it at 5 seeds on held-out
*keys* (h = 12: GRPO 0.98, GiGPO 0.97, token GAE 0.67, hierarchical 0.49, turn GAE 0.42),
where no Holm-corrected test could reject. Here: horizons 12 and 16, each warm-started on
its own tasks (as the defaults), the verdict with turn-level GAE as the reference, and the
verdict with token GAE (lambda 0.9), GRPO, GiGPO and the hierarchical estimator, plus the
outcome reward with turn GAE; 20 paired seeds (every run of a seed shares its warm start),
60 updates of 8 x 8 episodes (so every run plays the same number of episodes; the report's
AUC at equal environment turns matches turns as well), and ToolWorld's task split:
training (and the warm start's demonstrations) never holds one of the held-out quarter of
the (intent, order, item, address) cells, the evaluation after the last update plays 64
episodes that each hold at least one, sampled and greedy (`env.task_split='train'`,
`eval.tasks='heldout'`).

Family: each of the 5 conditions against the verdict with turn GAE at its horizon (10
pairs per metric), exact sign-flip test over seeds, Holm within the family; with 20 seeds
the smallest p is 2 / 2^20, and one sign in 19 of 20 seeds gives the sign test alone
p = 4e-5, below Holm's first threshold 0.05 / 10. Measured: 3,937 s on the 2-core AMD
EPYC, shared with other jobs for about half of it (docs/critic_factorial.md, "The estimators
at 20 seeds on held-out tasks").
"""

import ml_collections

from experiments.configs import horizon_sweep
from experiments.studies.envs import env_section


def get_config() -> ml_collections.ConfigDict:
    config = horizon_sweep.get_config()
    config.horizons = "12,16"
    config.conditions = "process,outcome"
    config.estimators = "gae_token@0.9,grpo,gigpo,hierarchical"
    config.estimator_reward = "process"
    config.estimator_horizons = "12,16"
    config.seeds = 20
    config.env = env_section("toolworld", task_split="train")
    config.eval.tasks = "heldout"
    return config
