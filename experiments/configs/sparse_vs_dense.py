"""Sparse outcome reward vs dense process rewards on ToolWorld.

Usage:
  python -m experiments.sparse_vs_dense --config=experiments/configs/sparse_vs_dense.py \
      --config.train.num_updates=80 --config.seeds=3

  python -m experiments.sparse_vs_dense --config=experiments/configs/sparse_vs_dense.py:mastermind

Each section holds every field of its typed config (defaults unless set here), so any
field can be overridden from the command line. A kind after the file name (`:mastermind`,
`:dialogue`; experiments.studies.envs.KINDS) swaps the env section for that
environment's, on its config's defaults (then `--config.env.<field>` sets its fields),
and the model reads that environment's vocabulary; everything else stays as here.
"""

import ml_collections

from experiments.studies.envs import env_section
from experiments.studies.sections import section
from rlagent.credit.probe import ProbeConfig
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.envs.toolworld import dsl
from rlagent.models import PolicyConfig
from rlagent.prm.config import PRMConfig
from rlagent.rollout import RolloutConfig
from rlagent.train.config import TrainConfig
from rlagent.train.evaluation import EvalConfig


def get_config(kind: str = "") -> ml_collections.ConfigDict:
    """The main experiment; `kind` (`--config=<this file>:<kind>`): its environment."""
    config = ml_collections.ConfigDict()
    # Reward forms compared (rlagent.train.config.REWARDS); one training run each.
    config.conditions = "outcome,process,composed,potential"
    config.seeds = 5  # seeds per condition, trained in parallel under vmap.
    config.first_seed = 0
    config.chunk_size = 10  # updates per jitted call between metric writes / checkpoints.

    # ToolWorld (rlagent.envs.ToolWorldConfig fields).
    config.env = section(
        ToolWorldConfig,
        level=2,  # several tools: where sparse and dense rewards part ways.
    )

    # Policy LM (rlagent.models.PolicyConfig fields): a tiny Llama with a copy gate.
    config.model = section(
        PolicyConfig,
        vocab_size=dsl.VOCAB_SIZE,
        d_model=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        mlp_dim=64,
        summary_dim=32,
        num_summary_slots=2,
        copy_prior=3.0,  # learned pointer prior towards observed tokens.
    )

    # Rollout (rlagent.rollout.RolloutConfig fields).
    config.rollout = section(
        RolloutConfig,
        window=1,  # sliding window of turns kept verbatim; None = full context.
        constrained=True,  # DSL grammar mask while sampling.
    )

    # PPO (rlagent.train.TrainConfig fields).
    config.train = section(
        TrainConfig,
        num_updates=120,
        num_groups=8,  # tasks per update ...
        group_size=8,  # ... times episodes per task.
        estimator="gae_turn",
        learning_rate=1e-3,
    )

    # The trainer's extras, each off by default: a process reward model (rlagent.prm
    # PRMConfig fields; the learned_* reward forms read its scores), credit accuracy in
    # training (rlagent.credit.probe ProbeConfig fields) and held-out evaluation between
    # chunks (rlagent.train.evaluation EvalConfig fields).
    config.prm = section(PRMConfig)
    config.probe = section(ProbeConfig)
    config.eval = section(EvalConfig)
    if kind:  # another environment, on its defaults; the model takes its vocabulary.
        config.env = env_section(kind, **({"level": 2} if kind == "toolworld" else {}))
        config.model.vocab_size = None
    return config
