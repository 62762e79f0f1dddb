r"""The critic factorial: critic x reward form x horizon, 20 paired seeds.

  python -m experiments.critic_factorial --workdir=runs/critic_factorial
  python -m experiments.critic_factorial --config.critics=shared,separate --config.seeds=4
  python -m experiments.critic_factorial --workdir=runs/critic_factorial --report_only

Writes to --workdir: factorial.csv (one row per critic, horizon, reward form and seed),
factorial.png, summary.md, summary.json, provenance.json, and per critic the folder of
its horizon sweep (`experiments.studies.critic_factorial` defines every number). A
non-empty --workdir needs `--resume` (continue; the config must match) or `--overwrite`.
Exits with status 1 and a one-line error when refused, on a bad config value, or when
training diverges (after the report).
"""

from __future__ import annotations

from absl import app
from absl import flags

from experiments import launch
from experiments.studies import critic_factorial

_FLAGS = launch.define_flags("critic_factorial", distributed=True)
_REPORT_ONLY = flags.DEFINE_bool(
    "report_only",
    False,
    "Only rewrite summary.md, summary.json and factorial.png from --workdir's factorial.csv.",
)


def main(argv):
    del argv
    launch.run_study(critic_factorial.run, _FLAGS, report_only=_REPORT_ONLY.value)


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
