r"""PPO on the dialogue environment: reward forms, the user's feedback habit, credit.

  python -m experiments.dialogue --workdir=runs/dialogue
  python -m experiments.dialogue --config.parts=rewards --config.seeds=8
  python -m experiments.dialogue --config=experiments/configs/dialogue_full.py \
      --workdir=runs/dialogue_full

Trains PPO against the simulated user of `rlagent.envs.dialogue` with the reward forms
of --config.conditions (the dialogue mix fluency + factuality + feedback, the rating,
feedback, the outcome, potential shaping), feedback-only training at every feedback
rate x noise of --config.feedback, and runs the credit-accuracy study on dialogues
(--config.credit); --config.parts picks the parts (`experiments.studies.dialogue`).
Writes to --workdir: metrics.csv, curves.png, summary.md, summary.json (goal success,
satisfaction, factuality / coherence / format errors, turns per dialogue: per seed, IQM
and mean with bootstrap CIs, take-off rates, Holm-corrected comparisons),
provenance.json, a folder per training run (checkpoints) and credit/ (the credit
study's files). A non-empty --workdir needs `--resume` (the config must match) or
`--overwrite`. Exits with status 1 and a one-line error on a bad config value (before
anything is written), when refused, or when training diverges.
"""

from __future__ import annotations

from absl import app

from experiments import launch
from experiments.studies import dialogue

_FLAGS = launch.define_flags("dialogue", distributed=True)


def main(argv):
    del argv
    launch.run_study(dialogue.run, _FLAGS)


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
