"""The critic factorial at the issue's full size, on held-out tasks.

Usage:
  python -m experiments.critic_factorial --workdir=runs/critic_factorial_full \
      --config=experiments/configs/critic_factorial_full.py

Budget: the defaults of experiments/configs/critic_factorial.py (critics shared /
separate / normalized x outcome, process verdict, potential shaping with turn-level GAE x
horizons 12, 16, 5; 60 updates of 8 x 8 episodes, each horizon warm-started on its own
tasks) with 20 paired seeds, and ToolWorld's task split: training episodes (and the
warm start's demonstrations) never hold one of the held-out quarter of the (intent,
order, item, address) cells, and the evaluation after the last update plays 64 episodes
that each hold at least one (`env.task_split='train'`, `eval.tasks='heldout'`).

Power: with 20 paired seeds the exact sign-flip test's smallest two-sided p is 2 / 2^20,
so after Holm over a family's 18 comparisons the first rejection needs p < 0.05 / 18 =
0.0028, which one sign in all 20 seeds reaches whatever the sizes (the sign test alone
with 17 of 20: 0.0026), where 10 seeds needed all 10. Expected time: about twice the
10-seed defaults (2,901 s), ~1.6 h on the 2-core CPU. Measured: 8,325 s at 9607f07,
sharing the CPU with another study for most of it (docs/critic_factorial.md, "The factorial
at 20 seeds on held-out tasks"; docs/results/critic_factorial_full/).
"""

import ml_collections

from experiments.configs import critic_factorial
from experiments.studies.envs import env_section


def get_config() -> ml_collections.ConfigDict:
    config = critic_factorial.get_config()
    config.seeds = 20
    config.env = env_section("toolworld", task_split="train")
    config.eval.tasks = "heldout"
    return config
