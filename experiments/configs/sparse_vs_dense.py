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
    config.seeds = 5  # seeds per condition, trained in parallel under vmap.
    config.first_seed = 0
    config.chunk_size = 10  # updates per jitted call between metric writes / checkpoints.

    # ToolWorld (rlagent.envs.ToolWorldConfig fields).
    config.env = ml_collections.ConfigDict()
    config.env.level = 2  # several tools: where sparse and dense rewards part ways.

    # Policy LM (rlagent.models.PolicyConfig fields): a tiny Llama with a copy gate.
    config.model = ml_collections.ConfigDict()
    config.model.d_model = 32
    config.model.num_layers = 1
    config.model.num_heads = 2
    config.model.num_kv_heads = 1
    config.model.mlp_dim = 64
    config.model.summary_dim = 32
    config.model.num_summary_slots = 2
    config.model.copy_prior = 3.0  # learned pointer prior towards observed tokens.

    # Rollout (rlagent.rollout.RolloutConfig fields).
    config.rollout = ml_collections.ConfigDict()
    config.rollout.window = 1  # sliding window of turns kept verbatim; None = full context.
    config.rollout.constrained = True  # DSL grammar mask while sampling.

    # PPO (rlagent.train.TrainConfig fields).
    config.train = ml_collections.ConfigDict()
    config.train.num_updates = 120
    config.train.num_groups = 8  # tasks per update ...
    config.train.group_size = 8  # ... times episodes per task.
    config.train.estimator = "gae_turn"
    config.train.learning_rate = 1e-3
    return config
