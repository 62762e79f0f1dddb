"""Credit accuracy measured during training (`TrainConfig.credit_every`).

Every `credit_every` updates, the trainer forks the first `credit_episodes` episodes of
its batch at every played turn, continues them `credit_samples` times with the current
policy (`rlagent.credit.lm`), and scores the configured estimator's credit on them (the
advantages the update trains on, aggregated to turns as the loss weighs them) against the
Monte-Carlo advantages under the run's reward form. Other updates log NaN (`skipped`).
Off (0) by default; when off nothing of this is built or traced.

Which updates measure is decided outside the compiled update (`Trainer.update(state,
measure_credit=True)`, a static flag; `ppo.scan_updates` and the host loop call it on
steps divisible by `credit_every`): a `lax.cond` on the step would be batched under the
vmap over runs and then runs both branches, i.e. the Monte-Carlo cost on every update.
"""

from __future__ import annotations

from collections.abc import Callable

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
from rlagent.train.extras import CreditProbe


def probe_factory(
    env: Environment, rollout_config: RolloutConfig, config: TrainConfig
) -> Callable[[nnx.GraphDef], CreditProbe]:
    """`make_train(credit_probe=)` for `config.credit_every > 0` (None when it is 0)."""
    if not config.credit_every:
        return None
    return lambda graphdef: make_credit_probe(env, graphdef, rollout_config, config)


def make_credit_probe(
    env: Environment, graphdef: nnx.GraphDef, rollout_config: RolloutConfig, config: TrainConfig
) -> CreditProbe:
    """The rollout that keeps its carries, and the periodic credit measurement."""
    episodes = config.credit_episodes

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
            num_samples=config.credit_samples,
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
    )


def _named(scores) -> dict[str, jax.Array]:
    """`credit_<field>` float32 scalars of the `accuracy.CreditAccuracy` scores."""
    return {
        f"credit_{name}": jnp.asarray(value, jnp.float32)
        for name, value in zip(accuracy.CreditAccuracy._fields, scores, strict=True)
    }
