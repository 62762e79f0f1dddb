"""Warm start by behaviour cloning of oracle demonstrations (SFT before RL).

The seed recipe for long tasks is rejection sampling -> SFT -> RL. In ToolWorld the
oracle plays the shortest correct plan, so its episodes are the accepted samples:
`make_warm_start` returns a pure `clone(params, key) -> params` that takes `steps` AdamW
steps on minus the mean log-likelihood of the oracle's action tokens (teacher-forced,
`rollout.make_score`), each step on a fresh batch of demonstrations from every
environment of `envs` (e.g. short horizons, so that a long task is learned by RL from a
policy that only saw short ones). The grammar mask of constrained sampling is not applied
while cloning; it only renormalises over grammatical tokens, which raising the oracle
tokens' unconstrained likelihood also favours.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rlagent.credit import mc
from rlagent.envs.base import Environment
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_score


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """Behaviour cloning before RL; `steps = 0` is no warm start."""

    steps: int = 0  # AdamW steps (0 = off: training starts from the random initial policy).
    batch_size: int = 16  # oracle episodes per step and demonstration environment.
    learning_rate: float = 3e-3
    weight_decay: float = 1e-4

    def __post_init__(self):
        if self.steps < 0:
            raise ValueError(f"WarmStartConfig.steps must be >= 0, got {self.steps}.")
        if self.batch_size < 1:
            raise ValueError(f"WarmStartConfig.batch_size must be >= 1, got {self.batch_size}.")
        if self.learning_rate <= 0:
            raise ValueError(
                f"WarmStartConfig.learning_rate must be > 0, got {self.learning_rate}."
            )


def make_warm_start(
    config: WarmStartConfig,
    envs: Sequence[Environment],
    graphdef: nnx.GraphDef,
    rollout_config: RolloutConfig,
) -> Callable[[nnx.State, jax.Array], tuple[nnx.State, jax.Array]]:
    """`clone(params, key) -> (params, losses [steps])`, pure and vmappable over seeds.

    `losses[i]` is the demonstration NLL (mean over the oracle's action tokens, summed
    over `envs`) at step i, before its parameter update.
    """
    if not envs:
        raise ValueError("make_warm_start needs at least one demonstration environment.")
    optimizer = optax.adamw(config.learning_rate, weight_decay=config.weight_decay)
    likelihoods = [make_oracle_log_likelihood(env, graphdef, rollout_config) for env in envs]

    def loss(params, key):
        keys = jax.random.split(key, len(envs))
        return -sum(f(params, k, config.batch_size) for f, k in zip(likelihoods, keys, strict=True))

    def step(carry, key):
        params, opt_state = carry
        value, grads = jax.value_and_grad(loss)(params, key)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), value

    def clone(params, key):
        keys = jax.random.split(key, config.steps)
        (params, _), losses = jax.lax.scan(step, (params, optimizer.init(params)), keys)
        return params, losses

    return clone


def make_oracle_log_likelihood(
    env: Environment, graphdef: nnx.GraphDef, rollout_config: RolloutConfig
) -> Callable[[nnx.State, jax.Array, int], jax.Array]:
    """`f(params, key, num_episodes) -> []`: mean log pi(a) over the action tokens of
    `num_episodes` fresh oracle episodes of `env` (END included), teacher-forced."""
    score = make_score(env, graphdef, rollout_config)
    oracle = mc.oracle(env)

    def log_likelihood(params, key, num_episodes):
        trajectory = mc.env_trajectory(env, mc.sample_env_episodes(env, oracle, key, num_episodes))
        logp = score(params, trajectory)[0]
        mask = trajectory.loss_mask
        return jnp.sum(logp * mask) / jnp.maximum(jnp.sum(mask), 1)

    return log_likelihood
