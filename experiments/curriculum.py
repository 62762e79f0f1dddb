r"""A curriculum driven by success vs the final level from the start vs a fixed schedule.

  python -m experiments.curriculum --workdir=runs/curriculum
  python -m experiments.curriculum --config=experiments/configs/curriculum_full.py

Writes to --workdir: metrics.csv, curves.png (held-out success on the last stage vs
environment turns), stages.png (the frontier stage of each seed), summary.md,
summary.json, provenance.json and a loop run folder per schedule
(`experiments.studies.curriculum`). A non-empty --workdir needs --resume or --overwrite.
"""

from __future__ import annotations

from absl import app

from experiments import launch
from experiments.studies import curriculum

_FLAGS = launch.define_flags("curriculum", distributed=True)


def main(argv):
    del argv
    launch.run_study(curriculum.run, _FLAGS)


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
