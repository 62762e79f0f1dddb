"""Held-out evaluation: the policy on fixed environment keys, sampled and greedy.

Success on training rollouts (temperature 1, tasks the learner just trained on) is not an
evaluation. `make_evaluate` plays `num_episodes` episodes on a fixed set of environment
keys drawn from their own PRNG stream (`EVAL_STREAM`), disjoint from every training key,
and the same for every run, so that conditions and seeds are compared on identical tasks.
It plays them twice: sampled at the rollout's temperature, and greedy (temperature 0).
ToolWorld's task space is finite, so a held-out task can coincide with a training task by
chance; the keys, not the tasks, are held out.

The host loop calls the jitted, run-vmapped `evaluate(params)` between chunks of updates,
every `EvalConfig.every` updates and after the last one, so training never pays for it
inside the compiled update (`rlagent.host.loop.run(evaluation=EvalConfig(...))`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rlagent.envs.base import env_name
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_rollout
from rlagent.train.config import check_fields
from rlagent.train.ppo import episode_metrics

# Root of the evaluation keys: a stream no training run draws from (training keys are
# split from PRNGKey(seed) of each run).
EVAL_STREAM = 0x5EED_E7A1
# Metrics of `episode_metrics` reported for evaluation episodes.
EVAL_METRICS = ("success", "turns", "violation_rate", "turns_over_plan", "collapse_rate")
EVAL_TASKS = ("same", "heldout")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation by the host loop between chunks of updates: every `every`
    updates and after the last one (0 = off), `episodes` episodes on fixed held-out
    environment keys, sampled and greedy."""

    every: int = 0
    episodes: int = 64
    # 'same': keys of the training distribution; 'heldout': tasks training never draws
    # (the environment's `heldout_env()`, e.g. ToolWorld with task_split='train').
    tasks: str = "same"

    def __post_init__(self):
        if int(self.every) < 0:
            raise ValueError(f"EvalConfig.every must be >= 0, got {self.every}.")
        if self.tasks not in EVAL_TASKS:
            raise ValueError(f"EvalConfig.tasks must be one of {EVAL_TASKS}, got {self.tasks!r}.")
        if int(self.episodes) < 1:
            raise ValueError(f"EvalConfig.episodes must be >= 1, got {self.episodes}.")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> EvalConfig:
        """Builds a config from a dict / ConfigDict, rejecting unknown field names."""
        check_fields(cls, values)
        return cls(**dict(values))


def eval_keys(num_episodes: int, seed: int = 0) -> tuple[jax.Array, jax.Array]:
    """(env_keys, policy_keys) `[num_episodes]` of the held-out set `seed`."""
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}.")
    root = jax.random.fold_in(jax.random.PRNGKey(EVAL_STREAM), seed)
    env_root, policy_root = jax.random.split(root)
    return jax.random.split(env_root, num_episodes), jax.random.split(policy_root, num_episodes)


def make_evaluate(
    env: Any,
    graphdef: nnx.GraphDef,
    rollout_config: RolloutConfig,
    *,
    num_episodes: int,
    seed: int = 0,
    tasks: str = "same",
) -> Callable[[nnx.State], dict[str, jax.Array]]:
    """Builds `evaluate(params) -> {"eval_sampled_<m>", "eval_greedy_<m>": [] float32}`.

    Args:
      env: the training environment.
      graphdef: the policy's graph definition (`Trainer.graphdef`).
      rollout_config: the training rollout config; the greedy pass replaces its
        temperature by 0 and keeps everything else (window, constrained decoding).
      num_episodes: evaluation episodes per pass.
      seed: which held-out set (`eval_keys`).
      tasks: 'same' (the training env on held-out keys) or 'heldout' (its
        `heldout_env()`: tasks training never draws; refused without one).
    Returns:
      A pure function of the parameters; `jax.jit(jax.vmap(evaluate))` evaluates a batch
      of runs. Metrics are those of `EVAL_METRICS` present in `episode_metrics`.
    """
    if tasks not in EVAL_TASKS:
        raise ValueError(f"tasks must be one of {EVAL_TASKS}, got {tasks!r}.")
    if tasks == "heldout":
        if not callable(getattr(env, "heldout_env", None)):
            raise ValueError(
                f"held-out tasks need an environment with heldout_env(); {env_name(env)} has "
                "no train / held-out split."
            )
        env = env.heldout_env()
    env_keys, policy_keys = eval_keys(num_episodes, seed)
    passes = {
        "sampled": make_rollout(env, graphdef, rollout_config),
        "greedy": make_rollout(env, graphdef, dataclasses.replace(rollout_config, temperature=0.0)),
    }

    def evaluate(params: nnx.State) -> dict[str, jax.Array]:
        out = {}
        for name, rollout in passes.items():
            metrics = episode_metrics(env, rollout(params, env_keys, policy_keys))
            for key in EVAL_METRICS:
                if key in metrics:
                    out[f"eval_{name}_{key}"] = jnp.asarray(metrics[key], jnp.float32)
        return out

    return evaluate
