r"""The long-horizon study: reward forms and estimators from 3- to 16-turn plans.

  python -m experiments.horizon_sweep --workdir=runs/horizon_sweep
  python -m experiments.horizon_sweep --config.horizons=3,8,16 --config.seeds=3
  python -m experiments.horizon_sweep --config=experiments/configs/horizon_sweep_accel.py
  python -m experiments.horizon_sweep --workdir=runs/horizon_sweep --report_only  # redraw

Writes to --workdir: horizon.csv (one row per horizon, condition and seed), horizon.png
(held-out success, sample efficiency and credit accuracy vs horizon, one line per
condition, 95% CI bands), summary.md, summary.json, provenance.json, and per horizon a
folder h<h> with that horizon's metrics.csv, curves, summaries and checkpoints
(`experiments.studies.horizon_sweep` defines every number). A non-empty --workdir needs
`--resume` (continue; the config must match) or `--overwrite` (start clean). Exits with
status 1 and a one-line error when refused, on a bad config value, or when training
diverges (after the report).
"""

from __future__ import annotations

from absl import app
from absl import flags

from experiments import launch
from experiments.studies import horizon_sweep

_FLAGS = launch.define_flags("horizon_sweep", distributed=True)
_REPORT_ONLY = flags.DEFINE_bool(
    "report_only",
    False,
    "Only rewrite summary.md, summary.json and horizon.png from --workdir's horizon.csv.",
)


def main(argv):
    del argv
    launch.run_study(horizon_sweep.run, _FLAGS, report_only=_REPORT_ONLY.value)


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
