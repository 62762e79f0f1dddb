r"""A/B test of two policy checkpoints on the same held-out tasks and keys.

  python -m experiments.ab_test --a=runs/source/rewards@30 --b=runs/source/rewards@60 \
      --workdir=runs/ab_rl
  python -m experiments.ab_test --a=CKPT --b=CKPT --guardrail_b=mask --workdir=runs/ab_rule

Each checkpoint is RUN_FOLDER[@STEP][#CONDITION/SEED] (a run folder of the host loop or
of experiments.shadow). Both arms play --config.tasks held-out tasks --config.samples
times with the same keys; writes summary.md (the verdict line first: "B better than A
on success: +0.12 [0.05, 0.19], p = 0.003"), summary.json and provenance.json
(`experiments.studies.ab_test`). Checkpoints of different environments or models are
refused naming the field; a non-empty --workdir needs --overwrite. Exits with status 1
and a one-line error when refused.
"""

from __future__ import annotations

from absl import app
from absl import flags

from experiments import launch
from experiments.studies import ab_test

_FLAGS = launch.define_flags("ab_test", multi_process=True)
_A = flags.DEFINE_string("a", None, "Checkpoint of arm A: RUN_FOLDER[@STEP][#CONDITION/SEED].")
_B = flags.DEFINE_string("b", None, "Checkpoint of arm B.")
_GUARDRAIL_A = flags.DEFINE_string("guardrail_a", None, "Guardrail mode of arm A's env.")
_GUARDRAIL_B = flags.DEFINE_string("guardrail_b", None, "Guardrail mode of arm B's env.")


def main(argv):
    del argv
    config = launch.config_value(_FLAGS)
    for name, holder in (
        ("a", _A),
        ("b", _B),
        ("guardrail_a", _GUARDRAIL_A),
        ("guardrail_b", _GUARDRAIL_B),
    ):
        if holder.value is not None:
            config[name] = holder.value
    launch.run_study(ab_test.run, _FLAGS)


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
