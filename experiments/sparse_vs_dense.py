r"""Sparse outcome reward vs dense process rewards on ToolWorld (the main experiment).

  python -m experiments.sparse_vs_dense --workdir=runs/sparse_vs_dense
  python -m experiments.sparse_vs_dense --config.train.num_updates=100 --config.seeds=5
  python -m experiments.sparse_vs_dense --guardrail_sweep   # rule layer off/penalise/mask

Writes to --workdir: metrics.csv (every update of every seed and condition), curves.png
(success vs environment turns, mean and min-max band over seeds), summary.md and
summary.json (final success, turns of experience to 50% / 80% success, violation rate,
turns vs shortest plan; mean ± 95% CI over seeds), provenance.json, TensorBoard events
and Orbax checkpoints per condition. A non-empty --workdir needs `--resume` (continue an
interrupted run exactly; the config must match) or `--overwrite` (start clean). Exits
with status 1 and a one-line error when refused or when training diverges.
"""

from __future__ import annotations

from absl import app
from absl import flags

from experiments import launch
from rlagent import parallel
from rlagent.train import experiment

_FLAGS = launch.define_flags("sparse_vs_dense")
_GUARDRAIL_SWEEP = flags.DEFINE_bool(
    "guardrail_sweep",
    False,
    "Train the first condition with the guardrail rule layer off / penalise / mask and "
    "report violation rates, instead of comparing reward forms.",
)
parallel.define_distributed_flags()


def main(argv):
    del argv
    launch.run_reported(lambda: run(_FLAGS.config.value))


def run(config) -> None:
    parallel.maybe_initialize_distributed()
    if _GUARDRAIL_SWEEP.value:
        runs = experiment.guardrail_runs(config)
        title = "ToolWorld: guardrail rule layer off / penalise / mask"
    else:
        runs = experiment.reward_runs(config)
        title = f"ToolWorld level {config.env.level}: sparse outcome vs dense process rewards"
    num_devices = flags.FLAGS.num_devices
    mesh = parallel.data_mesh(num_devices) if num_devices else None
    experiment.run_and_report(
        runs, config, workdir=_FLAGS.workdir.value, resume=_FLAGS.resume.value,
        overwrite=_FLAGS.overwrite.value, title=title, mesh=mesh,
    )  # fmt: skip


if __name__ == "__main__":
    app.run(main)
