"""Which findings hold on Mastermind: defaults of experiments/generalization.py (quick).

Usage:
  python -m experiments.generalization --workdir=runs/generalization
  python -m experiments.generalization --config.envs=mastermind --config.seeds=2

The three studies (experiments.studies.generalization: `rewards` = process_rewards,
`credit` = credit_accuracy, `estimators` = horizon_sweep) run on every environment of
`envs` with one budget, so their numbers compare like for like; the budgets are far
below the ToolWorld studies' own (docs/generalization.md sets them side by side). Sized
to finish within 15 minutes on the 2-core CPU (compiling dominates: every part, horizon,
estimator and PRM is its own program); generalization_full.py adds ToolWorld and seeds.
"""

import ml_collections

from experiments.configs import credit_accuracy
from experiments.configs import horizon_sweep
from experiments.configs import process_rewards
from experiments.studies.envs import env_section


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # Environment kinds (experiments.studies.envs.KINDS), each with a section in `kinds`.
    config.envs = "mastermind"
    config.seeds = 3  # seeds per condition of every part (and of the label study).
    config.first_seed = 0
    # The credit cells the findings and findings.png read (reward form, behaviour policy).
    config.credit_reward = "outcome"
    config.credit_policy = "prover_0.9"
    config.kinds = ml_collections.ConfigDict()
    config.kinds.mastermind = kind_section(
        # A code of 3 numbers of 1..4 without repeats (24 codes) and 4 guesses: uniform
        # random play over the grammar wins 16% of games, the oracle every one in 3.1
        # guesses (512 games each).
        env_section("mastermind", code_length=3, num_numbers=4, max_turns=3),
        credit_horizons="3,12",  # guess limits (the game's turn limit).
        sweep_horizons="6",
        estimator_horizons="6",
        slack=0,  # Mastermind's horizon is its turn limit: no turns to spare.
    )
    config.kinds.toolworld = kind_section(
        env_section("toolworld", level=2),  # the main experiment's task.
        credit_horizons="3,12",  # shortest plans (rlagent.envs.toolworld.horizon_config).
        sweep_horizons="12",  # where the ToolWorld sweep's effects appear.
        estimator_horizons="12",
        slack=2,  # max_turns = shortest plan + 2, as in the horizon sweep.
    )
    # Finished studies read like parts, beside the kinds run (their own budgets and seeds):
    # the ToolWorld studies' committed summaries, paths from the repository root.
    config.references = ml_collections.ConfigDict()
    config.references.toolworld_studies = ml_collections.ConfigDict(
        dict(
            title="ToolWorld, the committed studies at their own budgets (docs/results/)",
            rewards="docs/results/process_rewards/summary.json",  # level 2, 5 seeds.
            credit="docs/results/credit_accuracy/summary.json",  # h = 3..25, 3 seeds.
            estimators="docs/results/horizon_sweep/summary.json",  # h = 3..16, 5 seeds.
        )
    )
    config.references.toolworld_30_seeds = ml_collections.ConfigDict(
        dict(
            title="ToolWorld level 2, the main experiment at 30 seeds (no learned PRM)",
            rewards="docs/results/sparse_vs_dense_full_summary.json",
        )
    )
    config.rewards = rewards_section()
    config.credit = credit_section()
    config.estimators = estimators_section()
    return config


def kind_section(env, **fields) -> ml_collections.ConfigDict:
    """An environment's section: `env` (experiments.studies.envs.env_section) and the
    horizons of its two horizon studies."""
    return ml_collections.ConfigDict(dict(env=env, **fields))


def rewards_section() -> ml_collections.ConfigDict:
    """The process_rewards study: outcome, the verdict, potential shaping from it and the
    learned PRM on MC completion labels in potential form (its best form on ToolWorld)."""
    config = process_rewards.get_config()
    del config["env"]  # each kind's own (kinds.<kind>.env).
    config.conditions = "outcome,process,potential,learned_potential/prm=completion"
    config.model.vocab_size = None  # the environment's vocabulary.
    config.train.num_updates = 40
    config.chunk_size = 20
    config.prm.label_episodes = 4  # of the 64 episodes per update, labelled by MC ...
    config.prm.label_samples = 2  # ... with 2 continuations per label.
    labels = config.labels
    labels.model = config.model
    labels.behaviours = "prover_0.5"
    labels.completers = "policy"
    labels.samples = "1,4"
    labels.num_episodes = 16
    return config


def credit_section() -> ml_collections.ConfigDict:
    """The credit_accuracy study: the epsilon = 0.9 prover (the policy of ToolWorld's
    findings; no LM checkpoints: their PPO runs would cost more than the rest of the part;
    every policy x horizon is a compiled program)."""
    config = credit_accuracy.get_config()
    config.model.vocab_size = None
    config.policies = "prover_0.9"
    config.estimators = "gae_token@0.9,gae_turn,hierarchical,grpo,rloo,gigpo"
    config.rewards = "outcome,process"
    config.num_groups = 4
    config.group_size = 4
    config.num_samples = 8
    return config


def estimators_section() -> ml_collections.ConfigDict:
    """The horizon_sweep study: outcome, verdict and potential with turn GAE at every
    horizon; GRPO and GiGPO against it under the verdict at the estimator horizons."""
    config = horizon_sweep.get_config()
    config.model.vocab_size = None
    config.conditions = "outcome,process,potential"
    config.estimators = "grpo,gigpo"
    config.estimator_reward = "process"
    config.train.num_updates = 30
    config.chunk_size = 30
    config.warm_start.steps = 100
    config.eval.every = 30
    config.eval.episodes = 32
    config.probe.every = 0  # credit in training is the credit part's question.
    return config
