r"""Rejection sampling -> SFT -> RL against RL from scratch and oracle cloning.

  python -m experiments.pipeline --config=experiments/configs/rs_sft.py --workdir=runs/rs_sft
  python -m experiments.pipeline --config=experiments/configs/rs_sft_full.py

Writes to --workdir: metrics.csv, curves_<family>.png (success vs total environment turns,
SFT included), sweep.png (AUC and head start over N per threshold), summary.md,
summary.json, provenance.json, and per family and condition the loop's run folder
(`experiments.studies.rs_sft`). A non-empty --workdir needs --resume or --overwrite;
`--report_only` rewrites the report of a finished study.
"""

from __future__ import annotations

from absl import app
from absl import flags

from experiments import launch
from experiments.studies import rs_sft

_FLAGS = launch.define_flags("rs_sft", distributed=True)
_REPORT_ONLY = flags.DEFINE_bool(
    "report_only",
    False,
    "Only rewrite summary.md, summary.json and the plots of a finished study in --workdir "
    "from its metrics.csv and summary.json's head starts.",
)


def main(argv):
    del argv
    launch.run_study(rs_sft.run, _FLAGS, report_only=_REPORT_ONLY.value)


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
