r"""The long-horizon study: reward forms and estimators from 3- to 16-turn plans.

  python -m experiments.horizon_sweep --workdir=runs/horizon_sweep
  python -m experiments.horizon_sweep --config.horizons=3,8,16 --config.seeds=3
  python -m experiments.horizon_sweep --config=experiments/configs/horizon_sweep_accel.py
  python -m experiments.horizon_sweep --workdir=runs/horizon_sweep --report_only  # redraw

Writes to --workdir: horizon.csv (one row per horizon, condition and seed), horizon.png
(held-out success, sample efficiency and credit accuracy vs horizon, one line per
condition, 95% CI bands), summary.md, summary.json, provenance.json, and per horizon a
folder h<h> with that horizon's metrics.csv, curves, summaries and checkpoints
(`rlagent.train.horizon_sweep` defines every number). A non-empty --workdir needs
`--resume` (continue; the config must match) or `--overwrite` (start clean). Exits with
status 1 and a one-line error when refused, on a bad config value, or when training
diverges (after the report).
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from experiments.configs import horizon_sweep as default_config
from rlagent.train import experiment
from rlagent.train import horizon_sweep
from rlagent.train import loop

try:
    _CONFIG = config_flags.DEFINE_config_file(
        "config", os.path.join(os.path.dirname(__file__), "configs", "horizon_sweep.py")
    )
except (AttributeError, KeyError) as error:  # a --config.x override names no field.
    sys.exit(
        f"error: {experiment.unknown_override(default_config.get_config(), sys.argv) or error}"
    )
_WORKDIR = flags.DEFINE_string("workdir", "runs/horizon_sweep", "Output folder.")
_RESUME = flags.DEFINE_bool(
    "resume", False, "Continue from the newest checkpoints (the config must match)."
)
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace the results in a non-empty --workdir (refused otherwise)."
)
_REPORT_ONLY = flags.DEFINE_bool(
    "report_only",
    False,
    "Only rewrite summary.md, summary.json and horizon.png from --workdir's horizon.csv.",
)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # keep Orbax's per-checkpoint INFO lines out.
    try:
        if _REPORT_ONLY.value:
            horizon_sweep.write_report(_WORKDIR.value, _CONFIG.value)
            return
        horizon_sweep.run(
            _CONFIG.value, _WORKDIR.value, resume=_RESUME.value, overwrite=_OVERWRITE.value
        )
    except (loop.RunError, ValueError) as error:  # refused, diverged or a bad config value.
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    app.run(main)
