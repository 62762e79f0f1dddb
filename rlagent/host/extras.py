"""The trainer's extras of a config: its PRM and credit probe, built by their packages."""

from __future__ import annotations

from typing import Any

from rlagent.credit.probe import probe_factory
from rlagent.prm.factory import prm_factory
from rlagent.rollout import RolloutConfig
from rlagent.train.config import TrainConfig


def trainer_extras(config: TrainConfig, env: Any, rollout_config: RolloutConfig) -> dict:
    """`make_train(**trainer_extras(...))`: the PRM of `config.prm` and the credit probe of
    `config.credit_every` (each None when off). Refuses an unknown PRM kind at once."""
    return {
        "prm": prm_factory(config, env, rollout_config),
        "credit_probe": probe_factory(env, rollout_config, config),
    }
