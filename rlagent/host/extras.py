"""The trainer's extras of a run: its PRM and credit probe, built by their packages from
their own configs, and the checks across those configs and the `TrainConfig`."""

from __future__ import annotations

from typing import Any

from rlagent.credit.probe import ProbeConfig
from rlagent.credit.probe import probe_factory
from rlagent.prm.config import PRMConfig
from rlagent.prm.factory import prm_factory
from rlagent.rollout import RolloutConfig
from rlagent.train.config import TrainConfig


def trainer_extras(
    config: TrainConfig,
    env: Any,
    rollout_config: RolloutConfig,
    *,
    prm: PRMConfig = PRMConfig(),
    probe: ProbeConfig = ProbeConfig(),
) -> dict:
    """`make_train(**trainer_extras(...))`: the PRM of `prm.kind` and the credit probe of
    `probe.every` (each None when off). Refuses, naming the field, configs that do not fit
    together (`check_extras`) and a PRM kind without a model, at once."""
    check_extras(config, prm, probe)
    return {
        "prm": prm_factory(prm, config, env, rollout_config),
        "credit_probe": probe_factory(env, rollout_config, config, probe),
    }


def check_extras(config: TrainConfig, prm: PRMConfig, probe: ProbeConfig) -> None:
    """The PRM's and the probe's settings fit the run of `config` and each other."""
    batch = config.batch_size
    # Monte-Carlo credit targets cannot score continuations with a PRM.
    if prm.kind != "none" and probe.every:
        raise ValueError(
            f"ProbeConfig.every must be 0 with PRMConfig.kind={prm.kind!r}: Monte-Carlo "
            f"credit targets see no PRM scores (got every={probe.every})."
        )
    if prm.labels and prm.label_episodes > batch:
        raise ValueError(
            f"PRMConfig.label_episodes must be in [1, TrainConfig.batch_size={batch}], "
            f"got {prm.label_episodes}."
        )
    # A tree batch is probed on its roots (the rollout carries it keeps).
    probed, limit = batch, "TrainConfig.batch_size"
    if config.uses_trees:
        probed = batch // config.tree_branches
        limit = "the roots of a tree batch, TrainConfig.batch_size / tree_branches"
    if probe.every and probe.episodes > probed:
        raise ValueError(
            f"ProbeConfig.episodes must be in [1, {limit}={probed}], got {probe.episodes}."
        )
