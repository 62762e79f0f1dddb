"""Which findings hold on Mastermind, beside ToolWorld: the committed run's config.

Usage:
  python -m experiments.generalization --config=experiments/configs/generalization_full.py

The quick defaults (generalization.py) on both environments, Mastermind and ToolWorld
level 2, with more seeds per condition; everything else is the same, so the two
environments are measured with one budget, model and set of statistics.
"""

import ml_collections

from experiments.configs import generalization


def get_config() -> ml_collections.ConfigDict:
    config = generalization.get_config()
    config.envs = "mastermind,toolworld"
    config.seeds = 5
    return config
