"""Sparse outcome reward vs dense process rewards on ToolWorld.

Usage:
  python -m experiments.sparse_vs_dense --config=experiments/configs/sparse_vs_dense.py \
      --config.train.num_updates=80 --config.seeds=3
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # Reward forms compared (rlagent.train.config.REWARDS); one training run each.
    config.conditions = "outcome,process,composed,potential"
    config.seeds = 3  # seeds per condition, trained in parallel under vmap.
    config.first_seed = 0
    config.chunk_size = 10  # updates per jitted call between metric writes / checkpoints.

    # ToolWorld (rlagent.envs.ToolWorldConfig fields).
    config.env = ml_collections.ConfigDict()
    config.env.level = 2  # several tools: where sparse and dense rewards part ways.

    # Policy LM (rlagent.models.PolicyConfig fields): a tiny Llama.
    config.model = ml_collections.ConfigDict()

    # Rollout (rlagent.rollout.RolloutConfig fields).
    config.rollout = ml_collections.ConfigDict()
    config.rollout.window = 2  # sliding window of turns; None = full context.
    config.rollout.constrained = True  # DSL grammar mask while sampling.

    # PPO (rlagent.train.TrainConfig fields).
    config.train = ml_collections.ConfigDict()
    config.train.num_updates = 60
    config.train.num_groups = 8
    config.train.group_size = 8
    config.train.estimator = "gae_turn"
    config.train.learning_rate = 3e-3
    return config
