"""The dialogue experiment at a statistical budget: 20 seeds, held-out eval, a wider credit study.

Usage:
  python -m experiments.dialogue \
      --config=experiments/configs/dialogue_full.py --workdir=runs/dialogue_full

(`--config=...` must come before any `--config.<field>=...` override.)

Training is the quickstart's (experiments/configs/dialogue.py) with 20 seeds per
condition and per feedback setting and feedback noise 0 and 0.2 (no held-out evaluation:
it would cost each of the six programs another compile on the 2-core CPU;
`--config.eval.every=40` adds it); the credit study covers shortest dialogues of 3, 5
and 8 turns with every estimator and four reward forms, 5 seeds. 20 seeds per arm
separate take-off rates of 0.4 and 0.9 (about 13 needed), not 0.4 and 0.7 (about 40).
"""

import ml_collections

from experiments.configs import dialogue


def get_config() -> ml_collections.ConfigDict:
    config = dialogue.get_config()
    config.seeds = 20  # per condition; all conditions x seeds of a user train under one vmap.
    config.feedback.noises = "0,0.2"
    config.credit.horizons = "3,5,8"
    config.credit.estimators = (
        "gae_token@0.9,gae_token@1.0,gae_turn,hierarchical,grpo,rloo,reinforce_pp,gigpo"
    )
    config.credit.rewards = "outcome,potential,dialogue,rating"
    config.credit.seeds = 5
    return config
