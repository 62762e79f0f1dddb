"""How accurate is each estimator's credit? Defaults of experiments/credit_accuracy.py.

Usage:
  python -m experiments.credit_accuracy --workdir=runs/credit_accuracy \
      --config.horizons=3,10 --config.seeds=2
"""

import ml_collections

from experiments.configs import sparse_vs_dense


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # Behaviour (and continuation) policies: 'random', 'prover_<eps>' (the oracle with
    # probability eps per turn, else uniform random over the grammar), 'ppo_<k>' (the
    # main experiment's tiny LM after k PPO updates on the horizon's task; 0 = untrained).
    config.policies = "random,prover_0.5,prover_0.9,ppo_0,ppo_30"
    # Shortest plans in turns (rlagent.envs.horizon_config); 25 is the longest reachable.
    config.horizons = "3,6,12,25"
    # Trainer estimators; `name@lam` sets GAE's lambda.
    config.estimators = (
        "gae_token@0.9,gae_token@1.0,gae_turn,hierarchical,grpo,rloo,reinforce_pp,gigpo"
    )
    config.rewards = "outcome,process,potential"  # rlagent.train.config.REWARDS
    config.seeds = 3
    config.first_seed = 0
    config.num_groups = 4  # tasks per batch ...
    config.group_size = 8  # ... times episodes per task (GRPO / RLOO / GiGPO groups).
    config.num_samples = 16  # N continuations per MC value (V and Q each).
    config.critic_samples = 2  # continuations behind the noisy critic of GAE-type estimators.
    config.chunk_size = 4096  # continuations played at once (memory bound).
    # The LM policies: model and rollout of the main experiment, and the short PPO run
    # whose checkpoints are the 'ppo_<k>' policies (TrainConfig fields).
    main = sparse_vs_dense.get_config()
    config.model = main.model
    config.rollout = main.rollout
    config.ppo = ml_collections.ConfigDict()
    config.ppo.estimator = "gae_turn"
    config.ppo.reward = "potential"
    config.ppo.learning_rate = 1e-3
    config.ppo.num_groups = 8
    config.ppo.group_size = 8
    # Other TrainConfig fields shared by every estimator (gamma, lam, normalisation, agg).
    config.train = ml_collections.ConfigDict()
    config.train.gamma = 1.0
    config.train.lam = 0.95
    return config
