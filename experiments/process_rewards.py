r"""Process rewards without hand labels: label quality, PRM-weighted PPO, reward hacking.

  python -m experiments.process_rewards --workdir=runs/process_rewards
  python -m experiments.process_rewards --config=experiments/configs/process_rewards_accel.py
  python -m experiments.process_rewards --config.seeds=2 --config.train.num_updates=20

Trains PPO with the outcome reward, the oracle verdict (process, potential), the noisy
oracle and learned process reward models (completion, progress, implicit; sum / min /
potential forms), then scores automatic step labels against the oracle verdict
(`rlagent.prm.experiment`). Writes to --workdir: metrics.csv, curves.png (success vs total
environment turns, labelling continuations counted, 95% CI over seeds), label_quality.csv
and label_quality.png (AUROC and accuracy vs N continuations per labeller and completer),
summary.md and summary.json (training statistics, label quality, the reward-hacking
table), provenance.json, and a folder per PRM kind (TensorBoard, checkpoints). A non-empty
--workdir needs `--resume` (the config must match) or `--overwrite`. Exits with status 1
and a one-line error when refused or when training diverges.
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from experiments.configs import process_rewards as default_config
from rlagent import parallel
from rlagent.prm import experiment as prm_experiment
from rlagent.train import experiment
from rlagent.train import loop

try:
    _CONFIG = config_flags.DEFINE_config_file(
        "config", os.path.join(os.path.dirname(__file__), "configs", "process_rewards.py")
    )
except (AttributeError, KeyError) as error:  # a --config.x override names no field.
    sys.exit(
        f"error: {experiment.unknown_override(default_config.get_config(), sys.argv) or error}"
    )
_WORKDIR = flags.DEFINE_string("workdir", "runs/process_rewards", "Output folder.")
_RESUME = flags.DEFINE_bool(
    "resume", False, "Continue from the newest checkpoints (the config must match)."
)
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace the results in a non-empty --workdir (refused otherwise)."
)
parallel.define_distributed_flags()


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # keep Orbax's per-checkpoint INFO lines out.
    parallel.maybe_initialize_distributed()
    num_devices = flags.FLAGS.num_devices
    try:
        prm_experiment.run(
            _CONFIG.value,
            _WORKDIR.value,
            resume=_RESUME.value,
            overwrite=_OVERWRITE.value,
            mesh=parallel.data_mesh(num_devices) if num_devices else None,
        )
    except (loop.RunError, ValueError) as error:  # refused, diverged or a bad config value.
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    app.run(main)
