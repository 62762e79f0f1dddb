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
        critic = first(trajectory.values) if config.uses_critic else None
        return {**_named(scores), **_value_error(critic, values, prefix)}

    def skipped():
        nan = [jnp.nan] * len(accuracy.CreditAccuracy._fields)
        return {**_named(nan), **_value_error(None, None, None)}

    return CreditProbe(
        rollout=make_rollout(env, graphdef, rollout_config, with_carries=True),
        measure=measure,
        skipped=skipped,
        every=probe.every,
    )


# The critic against the Monte-Carlo V(s) of the same turns (`_value_error`).
VALUE_METRICS = ("credit_value_rmse", "credit_value_bias")


def _value_error(
    values: jax.Array | None, mc_values: mc.MCValues | None, prefix: mc.TurnSignals | None
) -> dict[str, jax.Array]:
    """The critic's V before each played turn (`values[:, :, 0]`, what turn-level GAE
    reads) against the Monte-Carlo V(s) of the policy under the run's reward form:
    root-mean-square error and mean error (critic minus Monte Carlo) over the played
    turns. NaN without a critic (`values` None: a critic-free estimator trains no value
    head). A critic trained on normalised returns (`normalize_returns`) predicts returns
    in units of the running std, so its error is in those units, not the reward's."""
    if values is None:
        return {name: jnp.full((), jnp.nan, jnp.float32) for name in VALUE_METRICS}
    mask = prefix.turn_mask.astype(jnp.float32)
    count = jnp.maximum(jnp.sum(mask), 1.0)
    error = (values[:, :, 0] - mc_values.value) * mask
    return {
        "credit_value_rmse": jnp.sqrt(jnp.sum(jnp.square(error)) / count),
        "credit_value_bias": jnp.sum(error) / count,
    }


def _named(scores) -> dict[str, jax.Array]:
    """`credit_<field>` float32 scalars of the `accuracy.CreditAccuracy` scores."""
    return {
        f"credit_{name}": jnp.asarray(value, jnp.float32)
        for name, value in zip(accuracy.CreditAccuracy._fields, scores, strict=True)
    }
