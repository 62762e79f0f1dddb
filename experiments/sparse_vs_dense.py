r"""Sparse outcome reward vs dense process rewards on ToolWorld (the main experiment).

  python -m experiments.sparse_vs_dense --workdir=runs/sparse_vs_dense
  python -m experiments.sparse_vs_dense --config.train.num_updates=100 --config.seeds=5
  python -m experiments.sparse_vs_dense --guardrail_sweep   # rule layer off/penalise/mask

Writes to --workdir: metrics.csv (every update of every seed and condition), curves.png
(success vs environment turns, mean and min-max band over seeds), summary.md and
summary.json (final success, turns of experience to 50% / 80% success, violation rate,
turns vs shortest plan; mean ± 95% CI over seeds), provenance.json, TensorBoard events
and Orbax checkpoints per condition (`experiments.studies.sparse_vs_dense`). A non-empty
--workdir needs `--resume` (continue an interrupted run exactly; the config must match)
or `--overwrite` (start clean). Exits with status 1 and a one-line error when refused or
when training diverges.
"""

from __future__ import annotations

from absl import app
from absl import flags

from experiments import launch
from experiments.studies import sparse_vs_dense

_FLAGS = launch.define_flags("sparse_vs_dense", distributed=True)
_GUARDRAIL_SWEEP = flags.DEFINE_bool(
    "guardrail_sweep",
    False,
    "Train the first condition with the guardrail rule layer off / penalise / mask and "
    "report violation rates, instead of comparing reward forms.",
)


def main(argv):
    del argv
    launch.run_study(sparse_vs_dense.run, _FLAGS, guardrail_sweep=_GUARDRAIL_SWEEP.value)


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
