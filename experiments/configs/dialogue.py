"""PPO against the simulated user of rlagent.envs.dialogue. Defaults of experiments/dialogue.py.

Usage:
  python -m experiments.dialogue --workdir=runs/dialogue
  python -m experiments.dialogue --config.parts=rewards --config.seeds=8

The model, rollout and PPO settings are the main experiment's
(experiments/configs/sparse_vs_dense.py) over the dialogue vocabulary; every section holds
every field of its typed config, so any field can be overridden from the command line.
"""

import ml_collections

from experiments.configs import credit_accuracy
from experiments.configs import sparse_vs_dense
from experiments.studies.envs import env_section


def get_config() -> ml_collections.ConfigDict:
    config = sparse_vs_dense.get_config()
    # Parts of the experiment (experiments.studies.dialogue.PARTS): the reward forms, the
    # feedback sparsity / noise sweep, the credit-accuracy study on dialogues.
    config.parts = "rewards,feedback,credit"
    # Reward forms (rlagent.train.config.REWARDS): the brief's mix fluency + factuality +
    # feedback (train.dialogue_weights), the 1-5 rating alone, the thumbs alone, the goal
    # outcome alone, outcome + potential shaping from the process verdict.
    config.conditions = "dialogue,rating,feedback,outcome,potential"
    config.seeds = 3  # per condition (and per feedback setting), trained under one vmap.
    config.chunk_size = 20  # a divisor of train.num_updates: one compiled chunk per run.
    # The dialogue environment (rlagent.envs.dialogue DialogueConfig fields; the persona a
    # nested section). Level 1: one constraint, shortest dialogue 3 turns (query,
    # recommend, bye), patience 5; thumbs after 30% of the turns, 20% of them flipped (a
    # user of the feedback sweep, whose feedback-only run is the `feedback` condition).
    config.env = env_section(
        "dialogue", level=1, persona=dict(feedback_rate=0.3, feedback_noise=0.2)
    )
    config.model.vocab_size = None  # the env's vocabulary.
    config.train.num_updates = 40
    # Feedback-only training against users whose thumbs come after a turn with probability
    # `rate` and are flipped with probability `noise` (Persona.feedback_rate / _noise);
    # every rate x noise is a run of its own (its own compiled program, about a minute of
    # compiling on the 2-core CPU), so the quickstart sweeps the rate at the env's noise;
    # dialogue_full.py adds noise 0.
    config.feedback = ml_collections.ConfigDict()
    config.feedback.rates = "1,0.3,0.1"
    config.feedback.noises = "0.2"
    # The credit-accuracy study on dialogues (experiments/configs/credit_accuracy.py
    # fields): shortest dialogues `horizons` (rlagent.envs.dialogue.horizon_config, 3..20).
    config.credit = credit_accuracy.get_config()
    config.credit.env = ml_collections.ConfigDict({"kind": "dialogue"})
    config.credit.model.vocab_size = None
    config.credit.policies = "prover_0.9"
    config.credit.horizons = "3,5"
    config.credit.estimators = "gae_turn,hierarchical,grpo,rloo,gigpo"
    config.credit.rewards = "outcome,potential"
    config.credit.seeds = 2
    return config
