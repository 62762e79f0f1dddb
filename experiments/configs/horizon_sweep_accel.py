"""The long-horizon study at an accelerator's budget.

Usage:
  python -m experiments.horizon_sweep --config=experiments/configs/horizon_sweep_accel.py \
      --workdir=runs/horizon_sweep_accel

(`--config=...` must come before any `--config.<field>=...` override.) Everything not set
here is the CPU defaults' (experiments/configs/horizon_sweep.py): horizons up to 25 turns,
the estimator comparison at every horizon, 20 seeds, 200 updates, held-out evaluation
every 50 updates and credit accuracy every 50.
"""

import ml_collections

from experiments.configs import horizon_sweep


def get_config() -> ml_collections.ConfigDict:
    config = horizon_sweep.get_config()
    config.horizons = "3,5,8,12,16,20,25"
    config.estimator_horizons = config.horizons
    config.seeds = 20
    config.train.num_updates = 200
    config.eval.every = 50
    config.eval.episodes = 128
    config.probe.every = 50
    config.probe.episodes = 8
    config.probe.samples = 8
    config.chunk_size = 25
    return config
