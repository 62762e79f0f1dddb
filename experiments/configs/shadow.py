"""Shadow mode: serve a checkpoint, train its next version from the logs (experiments.shadow).

Usage:
  python -m experiments.shadow --policy=runs/source/rewards@30 --workdir=runs/shadow
"""

import ml_collections

from experiments.configs import ab_test
from experiments.studies.sections import section
from rlagent.pipeline.warm_start import WarmStartConfig
from rlagent.preference.dpo import DPOConfig


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # The served policy v0: RUN_FOLDER[@STEP][#CONDITION/SEED]; the launcher's --policy.
    config.policy = ""
    config.rounds = 4  # serving rounds: one log append (and fsync) each.
    config.tasks_per_round = 32  # tasks per round, from the traffic stream.
    config.samples = 4  # episodes per task (DPO ranks them; K >= 2).
    config.traffic_seed = 0  # which served tasks (a stream disjoint from the held-out sets).
    config.judge = "outcome"  # rlagent.host.shadow.judge_scores: outcome or guardrail.
    config.accept = 1.0  # RS-SFT keeps the episodes whose judge score reaches it.
    config.seed = 0  # PRNG seed of RS-SFT's batches and DPO's ties and batches.
    # RS-SFT on the accepted episodes (WarmStartConfig fields: the warm start's SFT).
    config.sft = section(WarmStartConfig, steps=100, batch_size=16, learning_rate=1e-3)
    # Offline DPO on the logged pairs (rlagent.preference.dpo.DPOConfig fields).
    config.dpo = section(DPOConfig, num_updates=100, pairs_per_step=16, beta=0.1,
                         learning_rate=1e-3)  # fmt: skip
    # The A/B test of v0 against each new version (experiments/configs/ab_test.py fields;
    # its a / b are set by the study).
    config.ab = ab_test.get_config()
    return config
