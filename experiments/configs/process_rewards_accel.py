"""Process rewards without hand labels, sized for an accelerator.

Usage:
  python -m experiments.process_rewards \
      --config=experiments/configs/process_rewards_accel.py --workdir=runs/process_rewards

The CPU defaults (experiments/configs/process_rewards.py) scaled up: 10 seeds, 120 updates
(the main experiment's length), the noisy-oracle curve at four noise levels, more labelled
episodes and continuations per update, and a label study with an LM behaviour too.
"""

import ml_collections

from experiments.configs import process_rewards
from experiments.configs.process_rewards import FORMS


def get_config() -> ml_collections.ConfigDict:
    config = process_rewards.get_config()
    config.conditions = process_rewards.conditions(
        ("completion", "progress", "implicit"), (0.0, 0.1, 0.2, 0.3, 0.4), noise_forms=FORMS
    )
    config.seeds = 10
    config.train.num_updates = 120
    config.prm.label_episodes = 16
    config.prm.label_samples = 8
    config.labels.behaviours = "prover_0.5,ppo_30"
    config.labels.seeds = 5
    config.labels.num_episodes = 64
    return config
