r"""Training strategies on ToolWorld level 2: PPO, GRPO, offline DPO, online DPO / RLAIF.

  python -m experiments.strategies --workdir=runs/strategies
  python -m experiments.strategies --config.seeds=20 --overwrite

Writes to --workdir: metrics.csv (one row per held-out evaluation, condition and seed),
curves.png (held-out success vs total environment turns), summary.md and summary.json
(`rlagent.analysis.report`, offline DPO's data-size curve in its own table),
provenance.json, data/behaviour_pairs.jsonl (the offline pairs, rlagent.preference.data)
and the PPO / GRPO run folders (`experiments.studies.strategies`). A non-empty
--workdir needs `--overwrite`; resuming is not offered.
"""

from __future__ import annotations

from absl import app

from experiments import launch
from experiments.studies import strategies

_FLAGS = launch.define_flags("strategies")


def main(argv):
    del argv
    launch.run_study(strategies.run, _FLAGS)


if __name__ == "__main__":
    app.run(main)
