"""Credit accuracy measured during training (`TrainConfig.credit_every`).

Every `credit_every` updates, the trainer forks the first `credit_episodes` episodes of
its batch at every played turn, continues them `credit_samples` times with the current
policy (`rlagent.credit.lm`), and scores the configured estimator's credit on them (the
advantages the update trains on, aggregated to turns as the loss weighs them) against the
Monte-Carlo advantages under the run's reward form. Other updates log NaN. Off (0) by
default; when off nothing of this is built or traced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rlagent.credit import accuracy
from rlagent.credit import lm
from rlagent.credit import mc
from rlagent.envs import ToolWorld
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_rollout
from rlagent.train.config import TrainConfig
from rlagent.types import Trajectory


class CreditProbe(NamedTuple):
    rollout: Callable[..., tuple[Trajectory, Any]]  # make_rollout(..., with_carries=True)
    # measure(params, carries, trajectory, advantages [B,S,L], reward_weights [C], key, step)
    measure: Callable[..., dict[str, jax.Array]]


def make_credit_probe(
    env: ToolWorld, graphdef: nnx.GraphDef, rollout_config: RolloutConfig, config: TrainConfig
) -> CreditProbe:
    """The rollout that keeps its carries, and the periodic credit measurement."""
    episodes = config.credit_episodes

    def measure(params, carries, trajectory, advantages, reward_weights, key, step):
        def run():
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
                prefix.verdict,
            )
            return jnp.stack([jnp.asarray(v, jnp.float32) for v in scores])

        nan = jnp.full((len(accuracy.CreditAccuracy._fields),), jnp.nan, jnp.float32)
        scores = jax.lax.cond(step % config.credit_every == 0, run, lambda: nan)
        return {
            f"credit_{name}": scores[i] for i, name in enumerate(accuracy.CreditAccuracy._fields)
        }

    return CreditProbe(
        rollout=make_rollout(env, graphdef, rollout_config, with_carries=True), measure=measure
    )
