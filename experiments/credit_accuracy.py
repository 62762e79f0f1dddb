r"""How accurate is each advantage estimator's credit, as the horizon grows?

  python -m experiments.credit_accuracy --workdir=runs/credit_accuracy
  python -m experiments.credit_accuracy --config.horizons=3,10 --config.seeds=2

For policies of several skill levels x horizons x estimators x reward forms, scores every
estimator's per-turn credit against the Monte-Carlo advantage of each played turn
(`experiments.studies.credit_accuracy`). Writes to --workdir: credit.csv (one row per
policy x horizon x estimator x reward x seed), credit_vs_horizon.png (Spearman
correlation vs horizon, one line per estimator, 95% CI over seeds), summary.md and
summary.json. A non-empty --workdir needs `--overwrite` (the study keeps no checkpoints:
`--resume` is refused). Exits with status 1 and a one-line error when refused or on a
bad config value.
"""

from __future__ import annotations

from absl import app

from experiments import launch
from experiments.studies import credit_accuracy

_FLAGS = launch.define_flags("credit_accuracy", multi_process=True)


def main(argv):
    del argv
    launch.run_study(credit_accuracy.run, _FLAGS)


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
