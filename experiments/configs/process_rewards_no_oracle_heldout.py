"""Process rewards with no oracle anywhere in training, evaluated on held-out *tasks*.

Usage:
  python -m experiments.process_rewards --workdir=runs/process_rewards_no_oracle_heldout \
      --config=experiments/configs/process_rewards_no_oracle_heldout.py

process_rewards_no_oracle.py at the 20 seeds its committed run used, with ToolWorld's
task split: training episodes (and the PRMs' labels, which come from training rollouts)
never hold one of the held-out quarter of the (intent, order, item, address) cells, and
the evaluation after the last update plays 64 episodes that each hold at least one
(`env.task_split='train'`, `eval.tasks='heldout'`), where the committed run's held out
fresh keys. Expected time: the committed run's, 960 s on the 2-core CPU.
"""

import ml_collections

from experiments.configs import process_rewards_no_oracle


def get_config() -> ml_collections.ConfigDict:
    config = process_rewards_no_oracle.get_config()
    config.seeds = 20
    config.env.task_split = "train"
    config.eval.tasks = "heldout"
    return config
