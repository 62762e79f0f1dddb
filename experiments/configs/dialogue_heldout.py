"""The dialogue study's reward forms at 20 seeds, evaluated on held-out user goals.

Usage:
  python -m experiments.dialogue --config=experiments/configs/dialogue_heldout.py \
      --workdir=runs/dialogue_heldout

dialogue_full.py's reward-form part (the brief's mix `dialogue`, `rating`, `feedback`,
`outcome`, `potential`; 20 seeds each, 40 updates of 64 dialogues, level 1, thumbs after
30% of the turns, 20% flipped), with the dialogue's task split: training never draws a
held-out goal and the evaluation after the last update plays 64 dialogues whose goals
are all held out, sampled and greedy (`env.task_split='train'`, `eval.tasks='heldout'`).
The committed 20-seed run had no evaluation at all (training rollouts at temperature 1).
Level 1's goal is one constraint (attribute and value) over a 3-attribute, 4-value
catalogue: 12 goals, of which the split holds out 2 (docs/dialogue.md, "Held-out goals"),
so the held-out test is a new attribute-value pair, on catalogues drawn fresh as always.
The feedback sweep and the credit part are left out (five more programs; the credit part
has no training). Measured: 358 s on the 2-core AMD EPYC (docs/dialogue_rl.md, "20 seeds
on held-out goals").
"""

import ml_collections

from experiments.configs import dialogue_full


def get_config() -> ml_collections.ConfigDict:
    config = dialogue_full.get_config()
    config.parts = "rewards"
    config.env.task_split = "train"
    config.eval.every = int(config.train.num_updates)
    config.eval.episodes = 64
    config.eval.tasks = "heldout"
    return config
