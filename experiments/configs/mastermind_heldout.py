"""Mastermind from a cloned start at 20 seeds, evaluated on held-out secret codes.

Usage:
  python -m experiments.horizon_sweep --config=experiments/configs/mastermind_heldout.py \
      --workdir=runs/mastermind_heldout

The generalization study's estimators part (experiments/configs/generalization.py,
`estimators_section`: outcome, the information-gain verdict and potential shaping with
turn GAE, and GRPO and GiGPO under the verdict; 100 behaviour-cloning steps of oracle
games, then 30 updates of 8 x 8 games; 6 guesses on a code of 3 numbers of 1..4 without
repeats) with 20 paired seeds instead of 5 and Mastermind's task split: the 24 codes hold
out 6 (docs/mastermind.md, "Held-out codes"); training games and the demonstrations never
have one as their secret, the 64 evaluation games after the last update have only them,
sampled and greedy (`env.task_split='train'`, `eval.tasks='heldout'`).

Family (pre-declared): every condition against the outcome with turn GAE, and against
the verdict with turn GAE (`paired_to`), exact sign-flip test over the 20 seeds, Holm
within each metric's family (7 pairs); the 5-seed run could not reject (smallest p
0.0625). Expected time: about 15 min on the 2-core CPU.
"""

import ml_collections

from experiments.configs import generalization
from experiments.studies.envs import env_section


def get_config() -> ml_collections.ConfigDict:
    config = generalization.estimators_section()
    mastermind = generalization.get_config().kinds.mastermind
    fields = {k: v for k, v in mastermind.env.items() if k != "kind"}
    config.env = env_section("mastermind", **{**fields, "task_split": "train"})
    config.horizons = mastermind.sweep_horizons
    config.estimator_horizons = mastermind.estimator_horizons
    config.slack = int(mastermind.slack)
    config.paired_to = "process/gae_turn"
    config.seeds = 20
    config.eval.episodes = 64
    config.eval.tasks = "heldout"
    return config
