"""Supervised fine-tuning before RL: one SFT loop for every source of demonstrations.

The seed recipe for long tasks is rejection sampling -> SFT -> RL. `make_sft` returns a
pure `sft(params, key, threshold) -> (params, SFTTrace)` that takes `steps` AdamW steps
on minus the weighted mean log-likelihood of demonstrated action tokens
(teacher-forced, `rollout.make_score`),

    loss = -sum_b w_b sum_{s,i} m_{bsi} log pi(a_{bsi}) / sum_b w_b sum_{s,i} m_{bsi},

each step on a fresh batch from every `DemoSource` (one per environment, e.g. short
horizons, so that a long task is learned by RL from a policy that only saw short ones).
A source is `source(params, key, threshold) -> Demonstrations`: episodes, their weights
`w_b` (1 = cloned, 0 = rejected) and the environment turns they cost. Two sources exist:

* `oracle_demonstrations(env, n)`: the oracle's shortest correct plans, all accepted
  (`make_warm_start`, the behaviour-cloning warm start);
* `rlagent.pipeline.rejection.best_of_n`: N samples per task from the *current* policy,
  kept when a judge's score reaches `threshold` (rejection sampling / expert iteration);
* `given_demonstrations(trajectory, n)`: `n` of a fixed set of episodes (e.g. accepted
  episodes of a shadow-mode log, `rlagent.host.shadow`) drawn at random each step.

Oracle episodes carry no sampling mask, so they are cloned under the unconstrained
softmax (raising the oracle tokens' likelihood also favours them under the grammar mask);
policy samples keep theirs, so they are cloned under the distribution that drew them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rlagent import losses
from rlagent.credit import mc
from rlagent.envs.base import Environment
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_score
from rlagent.types import Trajectory


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """Supervised fine-tuning before RL; `steps = 0` is no warm start."""

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


class Demonstrations(NamedTuple):
    """One step's episodes of a source, and what drawing them cost."""

    trajectory: Trajectory  # [B, S, ...] the episodes played.
    weights: jax.Array  # [B] float32: 1 for an episode to clone, 0 for a rejected one.
    env_turns: jax.Array  # [] float32: environment turns played to draw them (all B).


# source(params, key, threshold []) -> Demonstrations.
DemoSource = Callable[[nnx.State, jax.Array, jax.Array], Demonstrations]


class SFTTrace(NamedTuple):
    """Per step of `make_sft`, summed over the sources."""

    loss: jax.Array  # [steps] weighted NLL before the step's update.
    env_turns: jax.Array  # [steps] environment turns the step's demonstrations cost.
    accepted: jax.Array  # [steps] episodes cloned (weight sum).
    episodes: jax.Array  # [steps] episodes drawn.


def make_sft(
    config: WarmStartConfig,
    envs: Sequence[Environment],
    sources: Sequence[DemoSource],
    graphdef: nnx.GraphDef,
    rollout_config: RolloutConfig,
) -> Callable[[nnx.State, jax.Array, jax.Array], tuple[nnx.State, SFTTrace]]:
    """`sft(params, key, threshold=1.0) -> (params, SFTTrace)`, pure and vmappable.

    `sources[i]` draws episodes of `envs[i]`; `threshold` (a traced scalar) is handed to
    every source (the oracle's ignores it), so one compiled program serves every
    acceptance threshold.
    """
    if not envs or len(envs) != len(sources):
        raise ValueError(
            f"make_sft needs one source per environment and at least one, got "
            f"{len(envs)} environments and {len(sources)} sources."
        )
    optimizer = optax.adamw(config.learning_rate, weight_decay=config.weight_decay)
    scores = [make_score(env, graphdef, rollout_config) for env in envs]

    def loss(params, demos: Sequence[Demonstrations]):
        total = 0.0
        for score, demo in zip(scores, demos, strict=True):
            total -= losses.weighted_log_likelihood(
                score(params, demo.trajectory)[0], demo.trajectory.loss_mask, demo.weights
            )
        return total

    def step(carry, key):
        params, opt_state, threshold = carry
        keys = jax.random.split(key, len(sources))
        demos = [
            jax.lax.stop_gradient(f(params, k, threshold))
            for f, k in zip(sources, keys, strict=True)
        ]
        value, grads = jax.value_and_grad(loss)(params, demos)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        trace = SFTTrace(
            loss=value,
            env_turns=sum(d.env_turns for d in demos),
            accepted=sum(jnp.sum(d.weights) for d in demos),
            episodes=jnp.asarray(sum(d.weights.shape[0] for d in demos), jnp.float32),
        )
        return (optax.apply_updates(params, updates), opt_state, threshold), trace

    def sft(params, key, threshold=1.0):
        keys = jax.random.split(key, config.steps)
        carry = (params, optimizer.init(params), jnp.asarray(threshold, jnp.float32))
        (params, _, _), trace = jax.lax.scan(step, carry, keys)
        return params, trace

    return sft


def oracle_demonstrations(env: Environment, num_episodes: int) -> DemoSource:
    """The oracle's episodes of `env`, every one accepted (parameters and threshold
    unused); their cost is the turns the oracle played."""
    oracle = mc.oracle(env)

    def source(params, key, threshold):
        del params, threshold
        trajectory = mc.env_trajectory(env, mc.sample_env_episodes(env, oracle, key, num_episodes))
        return Demonstrations(
            trajectory=trajectory,
            weights=jnp.ones((num_episodes,), jnp.float32),
            env_turns=jnp.sum(trajectory.turn_mask).astype(jnp.float32),
        )

    return source


def given_demonstrations(trajectory: Trajectory, batch_size: int) -> DemoSource:
    """`batch_size` episodes of `trajectory` (`[N, ...]`, already played: no environment
    turns cost) drawn uniformly with replacement each step, all accepted."""
    size = trajectory.turn_mask.shape[0]

    def source(params, key, threshold):
        del params, threshold
        index = jax.random.randint(key, (batch_size,), 0, size)
        return Demonstrations(
            trajectory=jax.tree.map(lambda x: x[index], trajectory),
            weights=jnp.ones((batch_size,), jnp.float32),
            env_turns=jnp.zeros((), jnp.float32),
        )

    return source


def make_warm_start(
    config: WarmStartConfig,
    envs: Sequence[Environment],
    graphdef: nnx.GraphDef,
    rollout_config: RolloutConfig,
) -> Callable[[nnx.State, jax.Array], tuple[nnx.State, jax.Array]]:
    """Behaviour cloning of oracle demonstrations: `clone(params, key) -> (params,
    losses [steps])`, `make_sft` over `oracle_demonstrations(env, config.batch_size)`.

    `losses[i]` is the demonstration NLL (mean over the oracle's action tokens, summed
    over `envs`) at step i, before its parameter update.
    """
    if not envs:
        raise ValueError("make_warm_start needs at least one demonstration environment.")
    sources = [oracle_demonstrations(env, config.batch_size) for env in envs]
    sft = make_sft(config, envs, sources, graphdef, rollout_config)

    def clone(params, key):
        params, trace = sft(params, key)
        return params, trace.loss

    return clone


def make_oracle_log_likelihood(
    env: Environment, graphdef: nnx.GraphDef, rollout_config: RolloutConfig
) -> Callable[[nnx.State, jax.Array, int], jax.Array]:
    """`f(params, key, num_episodes) -> []`: mean log pi(a) over the action tokens of
    `num_episodes` fresh oracle episodes of `env` (END included), teacher-forced."""
    score = make_score(env, graphdef, rollout_config)

    def log_likelihood(params, key, num_episodes):
        demos = oracle_demonstrations(env, num_episodes)(params, key, 0.0)
        logp = score(params, demos.trajectory)[0]
        return losses.weighted_log_likelihood(logp, demos.trajectory.loss_mask, demos.weights)

    return log_likelihood
