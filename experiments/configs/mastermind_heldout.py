"""Mastermind from a cloned start at 20 seeds, evaluated on held-out secret codes.

Usage:
  python -m experiments.horizon_sweep --config=experiments/configs/mastermind_heldout.py \
      --workdir=runs/mastermind_heldout

The generalization study's estimators part (experiments/configs/generalization.py,
`estimators_section`: outcome, the information-gain verdict and potential shaping with
turn GAE, and GRPO and GiGPO under the verdict; 100 behaviour-cloning steps of oracle
games, then 30 updates of 8 x 8 games; 6 guesses on a code of 3 numbers of 1..4 without
repeats) with 20 paired seeds instead of 5 and Mastermind's task split: the 24 codes hold
out 6 (docs/mastermind.md, "Held-out codes"); training games and the demonstrations never
have one as their secret, the 64 evaluation games after the last update have only them,
sampled and greedy (`env.task_split='train'`, `eval.tasks='heldout'`).

Family (pre-declared): every condition against the outcome with turn GAE, and against
the verdict with turn GAE (`paired_to`), exact sign-flip test over the 20 seeds, Holm
within each metric's family (7 pairs); the 5-seed run could not reject (smallest p
0.0625). Measured: 373 s on the 2-core AMD EPYC (docs/generalization.md, "20 seeds on
held-out secret codes").

`--config=experiments/configs/mastermind_heldout.py:v0`: the same on Mastermind-v0's code
(4 numbers of 1..6 without repeats: 360 codes, 95 held out) with 8 guesses (the oracle
needs at most 6), where remembering the 265 training secrets is far harder for the tiny
policy than remembering 18. Everything else is the same. Measured: 415 s; 100 cloning
steps gave no competent start there (training success 0.02), so it compares nothing.
"""

import ml_collections

from experiments.configs import generalization
from experiments.studies.envs import env_section

# Variants (`--config=<this file>:<variant>`): the code, and the guess limit of the sweep.
CODES = {
    "": (dict(code_length=3, num_numbers=4), None),
    "v0": (dict(code_length=4, num_numbers=6), "8"),
}


def get_config(code: str = "") -> ml_collections.ConfigDict:
    if code not in CODES:
        raise ValueError(f"mastermind_heldout.py: unknown code {code!r}; known: {sorted(CODES)}")
    config = generalization.estimators_section()
    mastermind = generalization.get_config().kinds.mastermind
    size, guesses = CODES[code]
    fields = {k: v for k, v in mastermind.env.items() if k != "kind"} | size
    config.env = env_section("mastermind", **{**fields, "task_split": "train"})
    config.horizons = guesses or mastermind.sweep_horizons
    config.estimator_horizons = guesses or mastermind.estimator_horizons
    config.slack = int(mastermind.slack)
    config.paired_to = "process/gae_turn"
    config.seeds = 20
    config.eval.episodes = 64
    config.eval.tasks = "heldout"
    return config
