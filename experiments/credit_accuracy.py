r"""How accurate is each advantage estimator's credit, as the horizon grows?

  python -m experiments.credit_accuracy --workdir=runs/credit_accuracy
  python -m experiments.credit_accuracy --config.horizons=3,10 --config.seeds=2

For policies of several skill levels x horizons x estimators x reward forms, scores every
estimator's per-turn credit against the Monte-Carlo advantage of each played turn
(`rlagent.credit`). Writes to --workdir: credit.csv (one row per policy x horizon x
estimator x reward x seed), credit_vs_horizon.png (Spearman correlation vs horizon, one
line per estimator, 95% CI over seeds), summary.md and summary.json.
"""

from __future__ import annotations

import os

from absl import app
from absl import flags
from ml_collections import config_flags

from rlagent.credit import study

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "configs", "credit_accuracy.py")
)
_WORKDIR = flags.DEFINE_string("workdir", "runs/credit_accuracy", "Output folder.")


def main(argv):
    del argv
    study.run(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
