"""The strategies study at a statistical budget: 20 seeds, three times the turns.

Usage:
  python -m experiments.strategies \
      --config=experiments/configs/strategies_full.py --workdir=runs/strategies_full

(`--config=...` must come before any `--config.<field>=...` override.) 1,539 s on the
2-core AMD EPYC CPU (docs/results/strategies_full, docs/preference_results.md); 20 seeds per arm
separate take-off rates of 0.4 and 0.9 (about 13 needed), not 0.4 and 0.7 (about 40).
"""

import ml_collections

from experiments.configs import strategies


def get_config() -> ml_collections.ConfigDict:
    config = strategies.get_config()
    config.seeds = 20
    config.ppo.num_updates = 120
    config.online.num_updates = 240
    config.eval_every = 40
    config.offline.num_updates = 600
    config.data_sizes = "32,128,512,2048"
    return config
