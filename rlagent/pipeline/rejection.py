"""Rejection sampling from the current policy: the best-of-N source of SFT data.

`best_of_n(env, graphdef, rollout_config, train_config, config)` is a
`warm_start.DemoSource`: each call samples `config.tasks` tasks and `config.samples` (N)
episodes of each from the policy it is given (the rollout of training: temperature,
constrained decoding), scores them with a judge (`rlagent.preference.judges`: a reward
form's return, e.g. `outcome` = 1 for a solved task, `process` = the sum of oracle
verdicts, `guardrail` = outcome minus violating turns) and accepts

    keep = "best":  the first highest-scoring episode of each task, if score >= threshold;
    keep = "all":   every episode with score >= threshold.

Inside `warm_start.make_sft` each step samples from the parameters being fine-tuned, so
SFT on it is iterated rejection sampling (expert iteration, STaR / ReST-style). Every
sampled episode's turns count as cost, accepted or not.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from rlagent.envs.base import Environment
from rlagent.pipeline.warm_start import Demonstrations
from rlagent.pipeline.warm_start import DemoSource
from rlagent.preference.judges import PRM_JUDGES
from rlagent.preference.judges import judge_weights
from rlagent.preference.judges import make_judge
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_rollout
from rlagent.train.config import TrainConfig
from rlagent.train.extras import PRMInputs

KEEP_MODES = ("best", "all")


@dataclasses.dataclass(frozen=True)
class RejectionConfig:
    """Best-of-N sampling from the current policy (the threshold is data, see `make_sft`)."""

    samples: int = 8  # N episodes per task.
    tasks: int = 8  # tasks per SFT step (episodes per step: tasks * samples).
    judge: str = "outcome"  # a judge of rlagent.preference.judges (JUDGES or a reward form).
    keep: str = "best"  # 'best': the best accepted episode of a task; 'all': every one.

    def __post_init__(self):
        for name in ("samples", "tasks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"RejectionConfig.{name} must be an integer >= 1, got {value!r}.")
        if self.keep not in KEEP_MODES:
            raise ValueError(
                f"RejectionConfig.keep must be one of {KEEP_MODES}, got {self.keep!r}."
            )
        try:
            judge_weights(TrainConfig(), self.judge)
        except ValueError as error:
            raise ValueError(f"RejectionConfig.judge: {error}") from None


def best_of_n(
    env: Environment,
    graphdef: nnx.GraphDef,
    rollout_config: RolloutConfig,
    train_config: TrainConfig,
    config: RejectionConfig,
) -> DemoSource:
    """`source(params, key, threshold) -> Demonstrations` (see the module docstring).

    The judge's reward form reads `train_config` (e.g. its violation penalty); judges that
    need a process reward model are refused (nothing trains one here).
    """
    if config.judge in PRM_JUDGES:
        raise ValueError(
            f"RejectionConfig.judge={config.judge!r} reads a PRM; none is trained here."
        )
    judge = make_judge(train_config)
    weights = jnp.asarray(judge_weights(train_config, config.judge))
    rollout = make_rollout(env, graphdef, rollout_config)
    n, tasks = config.samples, config.tasks

    def source(params, key, threshold):
        env_key, policy_key, judge_key = jax.random.split(key, 3)
        # Episodes of a task share its reset key, as the trainer's groups do.
        env_keys = jnp.repeat(jax.random.split(env_key, tasks), n, axis=0)
        trajectory = rollout(params, env_keys, jax.random.split(policy_key, tasks * n))
        inputs = PRMInputs(params, params, trajectory, None)
        scores, _, _ = judge.judge((), inputs, weights, judge_key)
        return Demonstrations(
            trajectory=trajectory,
            weights=accept(scores.reshape(tasks, n), threshold, config.keep).reshape(-1),
            env_turns=jnp.sum(trajectory.turn_mask).astype(jnp.float32),
        )

    return source


def accept(scores: jax.Array, threshold: jax.Array, keep: str) -> jax.Array:
    """`[T, N]` float32 weights: which of each task's N scored episodes are cloned.

    scores: [T, N] judge scores (higher is better); threshold: [] the acceptance bar.
    keep 'all': every episode scoring >= threshold; 'best': the first episode of the
    task's highest score, if that score >= threshold.
    """
    if keep not in KEEP_MODES:
        raise ValueError(f"keep must be one of {KEEP_MODES}, got {keep!r}.")
    passed = scores >= threshold
    if keep == "all":
        return passed.astype(jnp.float32)
    best = jax.nn.one_hot(jnp.argmax(scores, axis=1), scores.shape[1], dtype=jnp.float32)
    return best * passed
