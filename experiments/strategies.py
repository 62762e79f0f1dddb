r"""Training strategies on ToolWorld level 2: PPO, GRPO, offline DPO, online DPO / RLAIF.

  python -m experiments.strategies --workdir=runs/strategies
  python -m experiments.strategies --workdir=runs/strategies --resume   # after a kill
  python -m experiments.strategies --config.seeds=20 --overwrite
  python -m experiments.strategies --config.groups=online_dpo,offline_dpo
  python -m experiments.strategies --workdir=runs/strategies --report_only  # rewrite report

Writes to --workdir: metrics.csv (one row per held-out evaluation, condition and seed),
curves.png (held-out success vs total environment turns), summary.md and summary.json
(`rlagent.analysis.report`, offline DPO's data-size curve in its own table),
provenance.json, data/behaviour_pairs.jsonl (the offline pairs, rlagent.preference.data)
with data/logging.json (their logging turns, written once they are complete), and one
folder per group of runs (`ppo`, `grpo`: `rlagent.host.loop` run folders; `online_dpo`,
`fork_dpo`, `online_dpo_prm` and each offline group: the group's metrics.csv and a
checkpoint of its whole state after every chunk; `experiments.studies.strategies`).

A non-empty --workdir needs `--overwrite` (start again) or `--resume`: a killed run
continues from every group's newest checkpoint and ends with the results of an
uninterrupted one; finished groups and complete logs are read back. `--resume` refuses
a config that differs from the stored one (nothing may change); on a missing or empty
--workdir it starts from scratch.
"""

from __future__ import annotations

from absl import app
from absl import flags

from experiments import launch
from experiments.studies import strategies

_FLAGS = launch.define_flags("strategies")
_REPORT_ONLY = flags.DEFINE_bool(
    "report_only",
    False,
    "Only rewrite summary.md, summary.json and curves.png from --workdir's metrics.csv.",
)


def main(argv):
    del argv
    launch.run_study(strategies.run, _FLAGS, report_only=_REPORT_ONLY.value)


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
