r"""Process rewards without hand labels: label quality, PRM-weighted PPO, reward hacking.

  python -m experiments.process_rewards --workdir=runs/process_rewards
  python -m experiments.process_rewards --config=experiments/configs/process_rewards_accel.py
  python -m experiments.process_rewards --config.seeds=2 --config.train.num_updates=20
  python -m experiments.process_rewards --workdir=runs/process_rewards --report_only

Trains PPO with the outcome reward, the oracle verdict (process, potential), the noisy
oracle and learned process reward models (completion, progress, implicit; sum / min /
potential forms), then scores automatic step labels against the oracle verdict
(`experiments.studies.process_rewards`). Writes to --workdir: metrics.csv, curves.png
(success vs total environment turns, labelling continuations counted, 95% CI over seeds),
label_quality.csv and label_quality.png (AUROC and accuracy vs N continuations per
labeller and completer), summary.md and summary.json (training statistics, label quality,
the reward-hacking table), provenance.json, and a folder per PRM kind (TensorBoard,
checkpoints). A non-empty --workdir needs `--resume` (the config must match) or
`--overwrite`. Exits with status 1 and a one-line error when refused or when training
diverges.
"""

from __future__ import annotations

from absl import app
from absl import flags

from experiments import launch
from experiments.studies import process_rewards

_FLAGS = launch.define_flags("process_rewards", distributed=True)
_REPORT_ONLY = flags.DEFINE_bool(
    "report_only",
    False,
    "Only rewrite the report (summary.md, summary.json, the plots) of a finished study in "
    "--workdir from its metrics.csv and label_quality.csv.",
)


def main(argv):
    del argv
    launch.run_study(process_rewards.run, _FLAGS, report_only=_REPORT_ONLY.value)


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
