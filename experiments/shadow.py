r"""Shadow mode: a served checkpoint's logs train and evaluate its next version.

  python -m experiments.shadow --policy=runs/source/rewards@30 --workdir=runs/shadow

The policy (RUN_FOLDER[@STEP][#CONDITION/SEED]) plays --config.rounds rounds of tasks,
logged to shadow_log.jsonl (crash-safe, `rlagent.host.shadow`); RS-SFT and offline DPO
train new versions from the log (saved as run folders v1_rs_sft/ and v1_dpo/),
importance sampling estimates their success from the log, and an A/B test against the
served policy on held-out tasks measures it (`experiments.studies.shadow`). Writes
summary.md, summary.json, provenance.json, pairs.jsonl; a non-empty --workdir needs
--overwrite. Exits with status 1 and a one-line error when refused.
"""

from __future__ import annotations

from absl import app
from absl import flags

from experiments import launch
from experiments.studies import shadow

_FLAGS = launch.define_flags("shadow")
_POLICY = flags.DEFINE_string("policy", None, "The served checkpoint: RUN_FOLDER[@STEP].")


def main(argv):
    del argv
    if _POLICY.value is not None:
        launch.config_value(_FLAGS).policy = _POLICY.value
    launch.run_study(shadow.run, _FLAGS)


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
