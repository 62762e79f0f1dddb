r"""Which findings hold: the three studies on Mastermind (and ToolWorld) with one budget.

  python -m experiments.generalization --workdir=runs/generalization
  python -m experiments.generalization --config=experiments/configs/generalization_full.py
  python -m experiments.generalization --config.envs=mastermind,toolworld --config.seeds=2

Runs process_rewards (sparse outcome vs the verdict, potential shaping and a learned PRM
on Monte-Carlo labels), credit_accuracy (each estimator's credit against Monte-Carlo truth
over horizons) and horizon_sweep (the estimator comparison in training) on every
environment of `--config.envs` (`experiments.studies.generalization`). Writes to
--workdir: `<env>/<part>/` (each study's own outputs and provenance), summary.md and
summary.json (each ToolWorld finding per environment: measurement with its interval and
verdict), findings.png and provenance.json. A non-empty --workdir needs `--resume`
(finished parts are kept; the config must match except `envs` and `references`, so a
resume with fewer environments reports those) or `--overwrite`. Exits with status 1
and a one-line error when refused or when training diverges.
"""

from __future__ import annotations

from absl import app

from experiments import launch
from experiments.studies import generalization

_FLAGS = launch.define_flags("generalization", distributed=True)


def main(argv):
    del argv
    launch.run_study(generalization.run, _FLAGS)


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
