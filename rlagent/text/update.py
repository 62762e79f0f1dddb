"""A policy-gradient update on text-mode trajectories (GRPO / PPO-clip, critic-free).

The text loop plays episodes on the host (`rlagent.text.loop`) and lays them out as the
trainer's `Trajectory`; this update trains on such a batch with the trainer's own pieces:

    rewards    = train.rewards.turn_rewards(trajectory, config)          # [B, S]
    advantages = train.estimators.estimate_advantages(...)               # [B, S, L]
    loss       = losses.ppo_policy_loss(log pi, behaviour log pi, A, loss_mask)
                 + kl_coef * aggregate(losses.kl_penalty(log pi, log pi_ref))   # 'loss'

with `config` a `TrainConfig` (estimator `grpo`, `drgrpo`, `rloo`, `reinforce_pp`,
`gigpo`: a text batch has no values), log pi from a teacher-forced scorer such as
`rlagent.text.score.make_text_score` (the policy's generated tokens only: `loss_mask`),
and the frozen reference's log-probs computed by `TextUpdate.reference`, a program of
its own, so that the reference may live on its own mesh (`rlagent.models.sharding`).
Each call runs `num_epochs` passes over `num_minibatches` contiguous minibatches (a
group's episodes stay together), one AdamW step each (`train.ppo.guarded_step`: a
non-finite step leaves the state as it was).

With a mesh the parameters and optimiser state stay in their FSDP layout through the
update (`sharding.constrain_params`) and the batch is split along its episodes
(`sharding.constrain_batch`); the result equals the single-device update up to float
rounding (`tests/test_text_update.py`, 8 host devices).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rlagent import losses
from rlagent.models import sharding
from rlagent.train.config import TrainConfig
from rlagent.train.estimators import estimate_advantages
from rlagent.train.ppo import guarded_step
from rlagent.train.rewards import turn_rewards
from rlagent.types import Trajectory
from rlagent.types import action_rows

Metrics = dict[str, jax.Array]
Score = Callable[[nnx.State, Trajectory], jax.Array]  # (params, trajectory) -> [B, S, L]


class TextTrainState(NamedTuple):
    """The policy's side of a text-mode run between updates."""

    params: Any  # policy parameters (nnx.State).
    opt_state: Any  # optax state.
    step: jax.Array  # [] int32, updates done.


class TextUpdate(NamedTuple):
    """Programs of `make_text_update` (each jitted)."""

    init: Callable[[nnx.State], TextTrainState]
    # reference(ref_params, trajectory) -> [B, S, L] float32 log pi_ref of generated ids.
    reference: Callable[[nnx.State, Trajectory], jax.Array]
    # update(state, trajectory, ref_logp) -> (state, metrics): the state is donated.
    update: Callable[[TextTrainState, Trajectory, jax.Array], tuple[TextTrainState, Metrics]]


def make_text_update(
    config: TrainConfig,
    score: Score,
    *,
    optimizer: optax.GradientTransformation | None = None,
    mesh: jax.sharding.Mesh | None = None,
    reference_mesh: jax.sharding.Mesh | None = None,
) -> TextUpdate:
    """The update of a text policy (see the module docstring).

    Args:
      config: reads reward (and its weights), estimator and its settings, num_groups x
        group_size (= the batch's episodes, for grouped estimators), num_epochs,
        num_minibatches, clip_low / clip_high / dual_clip, agg, kl_placement / kl_kind /
        kl_coef, learning_rate, weight_decay, max_grad_norm. Refused: a critic-based
        estimator (text batches have no values), entropy_coef != 0 (the scorer gives log
        pi of the sampled ids only) and an adaptive KL (kl_target).
      score: teacher-forced log-probs of the trajectory's generated ids, differentiable.
      optimizer: default: clip_by_global_norm(max_grad_norm) then AdamW at a constant
        learning_rate (the trainer's, without a schedule).
      mesh: the policy's mesh: parameters and optimiser state in FSDP layout, the batch
        split along its episodes (a minibatch's episodes, B / num_minibatches, must be a
        multiple of the mesh's devices); None: wherever the inputs are.
      reference_mesh: the reference's mesh (default: `mesh`).
    """
    check_config(config)
    if optimizer is None:
        optimizer = optax.chain(
            optax.clip_by_global_norm(config.max_grad_norm),
            optax.adamw(config.learning_rate, weight_decay=config.weight_decay),
        )
    reference_mesh = mesh if reference_mesh is None else reference_mesh
    loss = _make_loss(config, score)

    def init(params: nnx.State) -> TextTrainState:
        state = TextTrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))
        return sharding.constrain_params(state, mesh)

    def reference(ref_params: nnx.State, trajectory: Trajectory) -> jax.Array:
        trajectory = sharding.constrain_batch(trajectory, reference_mesh)
        return sharding.constrain_batch(score(ref_params, trajectory), reference_mesh)

    def update(state: TextTrainState, trajectory: Trajectory, ref_logp: jax.Array):
        trajectory, ref_logp = sharding.constrain_batch((trajectory, ref_logp), mesh)
        _check_batch(trajectory, config)
        rewards = turn_rewards(trajectory, config)
        kl_reward = jnp.zeros(trajectory.logp.shape, jnp.float32)
        if config.kl_placement == "reward" and config.kl_coef:
            kl = losses.kl_penalty(trajectory.logp, ref_logp, kind=config.kl_kind)
            kl_reward = -config.kl_coef * kl * trajectory.loss_mask
        estimate = estimate_advantages(trajectory, rewards, kl_reward, config)
        batch = _minibatches((trajectory, estimate.advantages, ref_logp), config)

        def step(carry, minibatch):
            params, opt_state = carry
            minibatch = sharding.constrain_batch(minibatch, mesh)
            params, opt_state, stats = guarded_step(loss, params, opt_state, optimizer, *minibatch)
            return sharding.constrain_params((params, opt_state), mesh), stats

        def epoch(carry, _):
            return jax.lax.scan(step, carry, batch)

        carry = (state.params, state.opt_state)
        (params, opt_state), stats = jax.lax.scan(epoch, carry, None, length=config.num_epochs)
        metrics = {name: jnp.mean(value) for name, value in stats.items()}
        metrics["reward"] = jnp.mean(jnp.sum(rewards, axis=1))
        metrics["tokens"] = jnp.sum(trajectory.loss_mask).astype(jnp.float32)
        return TextTrainState(params, opt_state, state.step + 1), metrics

    return TextUpdate(
        init=jax.jit(init),
        reference=jax.jit(reference),
        update=jax.jit(update, donate_argnums=0),
    )


def _make_loss(config: TrainConfig, score: Score):
    """`loss(params, trajectory, advantages, ref_logp) -> (scalar, stats)` of a minibatch."""
    with_kl = config.kl_placement == "loss" and config.kl_coef != 0

    def loss(params, trajectory: Trajectory, advantages: jax.Array, ref_logp: jax.Array):
        logp = score(params, trajectory)
        mask = action_rows(trajectory.loss_mask)
        policy_loss, ppo_stats = losses.ppo_policy_loss(
            action_rows(logp), action_rows(trajectory.logp), action_rows(advantages), mask,
            clip_low=config.clip_low, clip_high=config.clip_high, dual_clip=config.dual_clip,
            agg=config.agg,
        )  # fmt: skip
        stats = {"policy_loss": policy_loss, **ppo_stats._asdict()}
        total = policy_loss
        if with_kl:
            kl = losses.kl_penalty(logp, ref_logp, kind=config.kl_kind)
            stats["kl_loss"] = losses.aggregate(action_rows(kl), mask, config.agg)
            total = total + config.kl_coef * stats["kl_loss"]
        stats["loss"] = total
        return total, jax.tree.map(jax.lax.stop_gradient, stats)

    return loss


def _minibatches(batch: Any, config: TrainConfig) -> Any:
    """`[B, ...]` leaves -> `[num_minibatches, B / num_minibatches, ...]`, in order."""
    count = config.num_minibatches
    return jax.tree.map(lambda x: x.reshape(count, x.shape[0] // count, *x.shape[1:]), batch)


def check_config(config: TrainConfig) -> None:
    if config.uses_critic:
        raise ValueError(
            f"TrainConfig.estimator={config.estimator!r} reads a critic's values, which a text "
            "Trajectory does not have; use a critic-free one (grpo, drgrpo, rloo, reinforce_pp)"
        )
    if config.entropy_coef != 0:
        raise ValueError(
            f"TrainConfig.entropy_coef={config.entropy_coef}: the text update scores the "
            "sampled ids only (no entropy); set it to 0"
        )
    if config.kl_target is not None:
        raise ValueError("TrainConfig.kl_target (an adaptive KL) is not supported in text mode")


def _check_batch(trajectory: Trajectory, config: TrainConfig) -> None:
    episodes = trajectory.turn_mask.shape[0]
    if episodes != config.batch_size:
        raise ValueError(
            f"the trajectory has {episodes} episodes, TrainConfig num_groups x group_size = "
            f"{config.batch_size}"
        )
