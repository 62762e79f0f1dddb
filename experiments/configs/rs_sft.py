"""Rejection sampling -> SFT -> RL (experiments.studies.rs_sft): quick defaults.

Usage:
  python -m experiments.pipeline --config=experiments/configs/rs_sft.py \
      --config.envs=l2,l3,l4,h10 --config.seeds=5

Quick defaults (level 2, 3 seeds, scratch / oracle / best-of-4 by the outcome, 10 SFT
steps, 30 updates);
experiments/configs/rs_sft_full.py is the committed run's. Each section holds every field
of its typed config, so any field can be overridden from the command line.
"""

import ml_collections

from experiments.configs import sparse_vs_dense
from experiments.studies.sections import section
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.pipeline.rejection import RejectionConfig
from rlagent.pipeline.warm_start import WarmStartConfig
from rlagent.train.config import TrainConfig
from rlagent.train.evaluation import EvalConfig


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # Task families: 'l<k>' a ToolWorld curriculum level, 'h<H>' horizon_config(H) tasks.
    config.envs = "l2"
    config.samples = "4"  # N of best-of-N (one rs condition per N and threshold).
    config.thresholds = "outcome@1"  # judge@threshold: accepted when score >= it.
    config.seeds = 3  # seeds per condition, trained in parallel under vmap.
    config.first_seed = 0
    config.chunk_size = 10  # updates per jitted call between metric writes / checkpoints.
    config.title = ""
    # Oracle-cloning steps of the base policy every condition starts from (0: the random
    # initial policy); > 0 gives a weak policy that solves some tasks sometimes.
    config.base_steps = 0

    # SFT (rlagent.pipeline.warm_start.WarmStartConfig): steps of every SFT condition;
    # batch_size = oracle episodes per step (the oracle condition's data).
    config.sft = section(WarmStartConfig, steps=10, batch_size=16, learning_rate=3e-3)
    # Best-of-N (rlagent.pipeline.rejection.RejectionConfig); samples is set per condition.
    config.rejection = section(RejectionConfig, tasks=8, judge="outcome", keep="best")

    # The base env (ToolWorldConfig fields); each family sets its level / horizon fields.
    config.env = section(ToolWorldConfig)
    add_policy_sections(config, num_updates=30)
    # Held-out evaluation between chunks (and of every start, after SFT).
    config.eval = section(EvalConfig, every=20, episodes=64)
    return config


def add_policy_sections(config: ml_collections.ConfigDict, *, num_updates: int) -> None:
    """The `model`, `rollout` and `train` sections the pipeline studies share: the tiny
    Llama with a copy gate of the main experiment, PPO with turn-level GAE."""
    main = sparse_vs_dense.get_config()  # the tiny Llama with a copy gate, its rollout
    config.model, config.rollout = main.model, main.rollout
    config.train = section(
        TrainConfig,
        num_updates=num_updates,
        num_groups=8,
        group_size=8,
        estimator="gae_turn",
        learning_rate=1e-3,
    )
