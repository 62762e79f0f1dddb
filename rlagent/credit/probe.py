"""Credit accuracy measured during training (`ProbeConfig`).

Every `ProbeConfig.every` updates, the trainer forks the first `episodes` episodes of
its batch at every played turn, continues them `samples` times with the current
policy (`rlagent.credit.lm`), and scores the configured estimator's credit on them (the
advantages the update trains on, aggregated to turns as the loss weighs them) against the
Monte-Carlo advantages under the run's reward form. Other updates log NaN (`skipped`).
Off (0) by default; when off nothing of this is built or traced.

Which updates measure is decided outside the compiled update (`Trainer.update(state,
measure_credit=True)`, a static flag; `ppo._scan_updates` and the host loop call it on
steps divisible by `CreditProbe.every`): a `lax.cond` on the step would be batched under the
vmap over runs and then runs both branches, i.e. the Monte-Carlo cost on every update.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rlagent.credit import accuracy
from rlagent.credit import lm
from rlagent.credit import mc
from rlagent.envs.base import Environment
from rlagent.envs.base import verdict_of
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_rollout
from rlagent.train.config import TrainConfig
from rlagent.train.config import check_fields
from rlagent.train.extras import CreditProbe


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    """Credit accuracy in training: every `every` updates (0 = off), the configured
    estimator's credit on the first `episodes` episodes of the batch (at most
    `TrainConfig.batch_size`, checked by `rlagent.host.extras`) against Monte-Carlo
    advantages from `samples` policy continuations per value."""

    every: int = 0
    episodes: int = 8
    samples: int = 8

    def __post_init__(self):
        if int(self.every) < 0:
            raise ValueError(f"ProbeConfig.every must be >= 0, got {self.every}.")
        if int(self.episodes) < 1:
            raise ValueError(f"ProbeConfig.episodes must be >= 1, got {self.episodes}.")
        if int(self.samples) < 2:
            raise ValueError(f"ProbeConfig.samples must be >= 2, got {self.samples}.")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ProbeConfig:
        """Builds a config from a dict / ConfigDict, rejecting unknown field names."""
        check_fields(cls, values)
        return cls(**dict(values))


def probe_factory(
    env: Environment, rollout_config: RolloutConfig, config: TrainConfig, probe: ProbeConfig
) -> Callable[[nnx.GraphDef], CreditProbe] | None:
    """`make_train(credit_probe=)` for `probe.every > 0` (None when it is 0); `config`
    gives the reward's settings (`gamma`, `prm_temperature`) and `agg`."""
    if not probe.every:
        return None
    return lambda graphdef: make_credit_probe(env, graphdef, rollout_config, config, probe)


def make_credit_probe(
    env: Environment,
    graphdef: nnx.GraphDef,
    rollout_config: RolloutConfig,
    config: TrainConfig,
    probe: ProbeConfig,
) -> CreditProbe:
    """The rollout that keeps its carries, and the credit measurement every `probe.every`
    updates."""
    episodes = probe.episodes

    def measure(params, carries, trajectory, advantages, reward_weights, key):
        first = lambda x: x[:episodes]  # noqa: E731
        forks = jax.tree.map(first, lm.forks_from_carries(carries))
        prefix = jax.tree.map(first, mc.trajectory_signals(trajectory))
        play = lm.play_policy(env, graphdef, rollout_config, params)
        values = mc.mc_values(
            play,
            forks,
            prefix,
            key,
            num_samples=probe.samples,
            reward_weights=reward_weights,
            config=config,
        )
        token_mask = first(trajectory.loss_mask)
        credit = accuracy.turn_credit(first(advantages), token_mask, agg=config.agg)
        scores = accuracy.credit_accuracy(
            credit,
            values.advantage,
            values.advantage_se,
            prefix.turn_mask,
            verdict_of(prefix),
        )
        return _named(scores)

    def skipped():
        return _named([jnp.nan] * len(accuracy.CreditAccuracy._fields))

    return CreditProbe(
        rollout=make_rollout(env, graphdef, rollout_config, with_carries=True),
        measure=measure,
        skipped=skipped,
        every=probe.every,
    )


def _named(scores) -> dict[str, jax.Array]:
    """`credit_<field>` float32 scalars of the `accuracy.CreditAccuracy` scores."""
    return {
        f"credit_{name}": jnp.asarray(value, jnp.float32)
        for name, value in zip(accuracy.CreditAccuracy._fields, scores, strict=True)
    }
