"""A curriculum driven by success: the committed run's config (docs/results/curriculum/).

  python -m experiments.curriculum --config=experiments/configs/curriculum_full.py \
      --workdir=docs/results/curriculum

Levels 1-4, 4 seeds, 80 updates of 64 episodes, a decision every 5 updates, held-out
evaluation on level 4 every 10.
"""

from experiments.configs import curriculum


def get_config():
    config = curriculum.get_config()
    config.seeds = 4
    config.train.num_updates = 80
    return config
