"""A curriculum driven by success: the committed run's config (docs/results/curriculum/).

  python -m experiments.curriculum --config=experiments/configs/curriculum_full.py \
      --workdir=docs/results/curriculum

Levels 1-4, 4 seeds, 100 updates of 32 episodes (4 tasks x 8), potential shaping (the
best reward form of the main study; it reads the oracle verdict), a decision every 5
updates, promotion at 0.6, held-out evaluation on level 4 (32 episodes) every 10: sized
to finish on a shared 2-core CPU within the session, so it resolves only large
differences.
"""

from experiments.configs import curriculum


def get_config():
    config = curriculum.get_config()
    config.seeds = 4
    config.train.num_updates = 100
    config.train.num_groups = 4
    config.train.reward = "potential"
    config.curriculum.promote = 0.6
    config.eval.episodes = 32
    return config
