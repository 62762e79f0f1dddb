"""A policy-gradient update on text-mode trajectories (GRPO, REINFORCE++, PPO with a critic).

The text loop plays episodes on the host (`rlagent.text.loop`) and lays them out as the
trainer's `Trajectory`; this update trains on such a batch with the trainer's own pieces:

    values     = critic(trajectory)                                      # [B, S, L], if any
    rewards    = train.rewards.turn_rewards(trajectory, config)          # [B, S]
    rewards    = train.rewards.scale_rewards(rewards, ...)   # normalize_returns, else as is
    advantages = train.estimators.estimate_advantages(...)               # [B, S, L]
    loss       = losses.ppo_policy_loss(log pi, behaviour log pi, A, loss_mask)
                 + kl_coef * aggregate(losses.kl_penalty(log pi, log pi_ref))   # 'loss'
    critic     : losses.value_loss(V, V_old, value targets, loss_mask), its own optimiser

with `config` a `TrainConfig`, log pi from a teacher-forced scorer such as
`rlagent.text.score.make_text_score` (the policy's generated tokens only: `loss_mask`),
and the frozen reference's log-probs computed by `TextUpdate.reference`, a program of
its own, so that the reference may live on its own mesh (`rlagent.models.sharding`).
A critic-free estimator (`grpo`, `drgrpo`, `rloo`, `reinforce_pp`, `gigpo`) needs no
values; a critic-based one (`gae_token`, `gae_turn`, `hierarchical`) needs `values`, a
separate critic model (`rlagent.text.score.make_text_values` of a
`rlagent.models.policy.ValueLM`, as InstructGPT-style PPO keeps one), whose values at
sampling time (`V_old`, computed once before the epochs) feed the estimator and the value
clipping. Each call runs `num_epochs` passes over `num_minibatches` contiguous minibatches
(a group's episodes stay together), one AdamW step of the policy and one of the critic
each (`train.ppo.guarded_apply`: a non-finite step leaves that state as it was). With
`micro_batch_size` a minibatch's gradient is accumulated over micro-batches of that many
episodes (`_accumulated`: the same gradient, one step), and the reference's and the
critic's V_old passes run micro-batch by micro-batch (`micro_mapped`), so the memory of
a pass is set by the micro-batch, not the batch. During
the first `critic_warmup` updates only the critic steps (the policy's step is discarded).

With a mesh the parameters and optimiser states stay in their FSDP layout through the
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
from rlagent.train.config import ESTIMATOR_TABLE
from rlagent.train.config import TrainConfig
from rlagent.train.estimators import estimate_advantages
from rlagent.train.ppo import guarded_apply
from rlagent.train.ppo import make_optimizer
from rlagent.train.rewards import ReturnStats
from rlagent.train.rewards import scale_rewards
from rlagent.train.rewards import turn_rewards
from rlagent.types import Trajectory
from rlagent.types import action_rows

Metrics = dict[str, jax.Array]
Score = Callable[[nnx.State, Trajectory], jax.Array]  # (params, trajectory) -> [B, S, L]


class TextTrainState(NamedTuple):
    """The trained side of a text-mode run between updates."""

    params: Any  # policy parameters (nnx.State).
    opt_state: Any  # optax state.
    step: jax.Array  # [] int32, updates done.
    critic: Any = None  # the critic's parameters (nnx.State) when the estimator reads values.
    critic_opt_state: Any = None  # its optax state.
    # The run's episode-return statistics (`TrainConfig.normalize_returns`, `scale_rewards`).
    return_stats: ReturnStats | None = None


class TextUpdate(NamedTuple):
    """Programs of `make_text_update` (each jitted)."""

    # init(params, critic=None) -> the state before the first update.
    init: Callable[..., TextTrainState]
    # reference(ref_params, trajectory) -> [B, S, L] float32 log pi_ref of generated ids.
    reference: Callable[[nnx.State, Trajectory], jax.Array]
    # update(state, trajectory, ref_logp) -> (state, metrics): the state is donated.
    update: Callable[[TextTrainState, Trajectory, jax.Array], tuple[TextTrainState, Metrics]]


def make_text_update(
    config: TrainConfig,
    score: Score,
    *,
    values: Score | None = None,
    optimizer: optax.GradientTransformation | None = None,
    critic_optimizer: optax.GradientTransformation | None = None,
    critic_warmup: int = 0,
    mesh: jax.sharding.Mesh | None = None,
    reference_mesh: jax.sharding.Mesh | None = None,
) -> TextUpdate:
    """The update of a text policy (see the module docstring).

    Args:
      config: reads reward (and its weights), estimator and its settings, num_groups x
        group_size (= the batch's episodes, for grouped estimators), num_epochs,
        num_minibatches, micro_batch_size, clip_low / clip_high / dual_clip, agg,
        kl_placement / kl_kind / kl_coef, learning_rate, weight_decay, max_grad_norm,
        value_clip (`check_config` says what is refused).
      score: teacher-forced log-probs of the trajectory's generated ids, differentiable.
      values: `values(critic_params, trajectory) -> [B, S, L]` the critic's V at the
        generated ids, differentiable; required by a critic-based estimator and refused
        with a critic-free one.
      optimizer: default: `train.ppo.make_optimizer(config)` (clip_by_global_norm, then
        AdamW on the config's learning-rate schedule, as the compiled trainer's).
      critic_optimizer: the critic's (default: as `optimizer`'s default).
      critic_warmup: updates (from step 0) in which only the critic learns.
      mesh: the policy's (and critic's) mesh: parameters and optimiser states in FSDP
        layout, the batch split along its episodes (a minibatch's episodes, B /
        num_minibatches, must be a multiple of the mesh's devices); None: wherever the
        inputs are.
      reference_mesh: the reference's mesh (default: `mesh`).
    """
    check_config(config, critic=values is not None)
    if critic_warmup < 0 or (critic_warmup and values is None):
        raise ValueError(f"critic_warmup={critic_warmup} needs a critic and must be >= 0")
    optimizer = optimizer or make_optimizer(config)
    critic_optimizer = critic_optimizer or make_optimizer(config)
    reference_mesh = mesh if reference_mesh is None else reference_mesh
    micro = config.micro_batch_size
    loss = _accumulated(_policy_objective(config), score, micro)
    value_loss = None if values is None else _accumulated(_value_objective(config), values, micro)

    def init(params: nnx.State, critic: nnx.State | None = None) -> TextTrainState:
        if (critic is None) != (values is None):
            raise ValueError("init takes critic parameters exactly when the update has values")
        critic_opt_state = None if critic is None else critic_optimizer.init(critic)
        step = jnp.zeros((), jnp.int32)
        state = TextTrainState(
            params, optimizer.init(params), step, critic, critic_opt_state, ReturnStats.zeros()
        )
        return sharding.constrain_params(state, mesh)

    def reference(ref_params: nnx.State, trajectory: Trajectory) -> jax.Array:
        trajectory = sharding.constrain_batch(trajectory, reference_mesh)
        ref_logp = micro_mapped(score, micro)(ref_params, trajectory)
        return sharding.constrain_batch(ref_logp, reference_mesh)

    def update(state: TextTrainState, trajectory: Trajectory, ref_logp: jax.Array):
        trajectory, ref_logp = sharding.constrain_batch((trajectory, ref_logp), mesh)
        _check_batch(trajectory, config)
        if values is not None:  # V_old: the critic before this update's steps.
            old = jax.lax.stop_gradient(micro_mapped(values, micro)(state.critic, trajectory))
            trajectory = trajectory._replace(values=jnp.where(trajectory.loss_mask, old, 0.0))
        raw_rewards = turn_rewards(trajectory, config)
        rewards, return_stats = scale_rewards(raw_rewards, state.return_stats, config)
        kl_reward = jnp.zeros(trajectory.logp.shape, jnp.float32)
        if config.kl_placement == "reward" and config.kl_coef:
            kl = losses.kl_penalty(trajectory.logp, ref_logp, kind=config.kl_kind)
            kl_reward = -config.kl_coef * kl * trajectory.loss_mask
        estimate = estimate_advantages(trajectory, rewards, kl_reward, config)
        targets = estimate.value_targets
        batch = _chunks(
            (trajectory, estimate.advantages, targets, ref_logp), config.num_minibatches
        )

        def step(carry, minibatch):
            params, opt_state, critic, critic_opt_state = carry
            part, advantages, targets, part_ref = sharding.constrain_batch(minibatch, mesh)
            gradient = loss(params, part, advantages, part_ref)
            stepped = guarded_apply(gradient, params, opt_state, optimizer)
            if critic_warmup:  # the policy steps once past the critic's warm-up.
                learns = state.step >= critic_warmup
                params, opt_state = _select(learns, stepped[:2], (params, opt_state))
            else:
                params, opt_state = stepped[:2]
            stats = stepped[2]
            if value_loss is not None:
                critic, critic_opt_state, critic_stats = guarded_apply(
                    value_loss(critic, part, targets), critic, critic_opt_state, critic_optimizer
                )
                stats = _with_critic(stats, critic_stats)
            carry = (params, opt_state, critic, critic_opt_state)
            return sharding.constrain_params(carry, mesh), stats

        def epoch(carry, _):
            return jax.lax.scan(step, carry, batch)

        carry = (state.params, state.opt_state, state.critic, state.critic_opt_state)
        carry, stats = jax.lax.scan(epoch, carry, None, length=config.num_epochs)
        metrics = {name: jnp.mean(value) for name, value in stats.items()}
        metrics["reward"] = jnp.mean(jnp.sum(raw_rewards, axis=1))
        if config.normalize_returns:
            metrics["return_std"] = jnp.sqrt(return_stats.m2 / return_stats.count)
        metrics["tokens"] = jnp.sum(trajectory.loss_mask).astype(jnp.float32)
        if values is not None:
            metrics |= _value_metrics(trajectory, targets)
        state = TextTrainState(carry[0], carry[1], state.step + 1, *carry[2:], return_stats)
        return state, metrics

    return TextUpdate(
        init=jax.jit(init),
        reference=jax.jit(reference),
        update=jax.jit(update, donate_argnums=0),
    )


def _select(keep_new: jax.Array, new: Any, old: Any) -> Any:
    return jax.tree.map(lambda a, b: jnp.where(keep_new, a, b), new, old)


def _with_critic(stats: Metrics, critic_stats: Metrics) -> Metrics:
    """The policy step's stats with the critic's: its loss and gradient norm, and the
    non-finite flags of either step (the host loop stops on them)."""
    stats = dict(stats, value_loss=critic_stats["value_loss"])
    stats["critic_grad_norm"] = critic_stats["grad_norm"]
    for name in ("nonfinite_loss", "nonfinite_grads"):
        stats[name] = jnp.maximum(stats[name], critic_stats[name])
    return stats


def _value_metrics(trajectory: Trajectory, targets: jax.Array) -> Metrics:
    """Mean V_old over generated tokens and the explained variance of the targets by it."""
    mask = trajectory.loss_mask.astype(jnp.float32)
    count = jnp.maximum(jnp.sum(mask), 1.0)
    mean = lambda x: jnp.sum(x * mask) / count  # noqa: E731
    residual = mean((targets - trajectory.values) ** 2) - mean(targets - trajectory.values) ** 2
    variance = mean(targets**2) - mean(targets) ** 2
    explained = jnp.where(variance > 0, 1.0 - residual / jnp.maximum(variance, 1e-12), jnp.nan)
    return {"value_mean": mean(trajectory.values), "explained_variance": explained}


def micro_mapped(model: Score, micro: int | None) -> Score:
    """`model(params, trajectory) -> [B, ...]` run over micro-batches of `micro` episodes
    one after the other (`lax.map`), outputs concatenated; `model` itself when None."""
    if micro is None:
        return model

    def mapped(params: nnx.State, trajectory: Trajectory) -> jax.Array:
        parts = _chunks(trajectory, trajectory.turn_mask.shape[0] // micro)
        return _unchunk(jax.lax.map(lambda part: model(params, part), parts))

    return mapped


def _accumulated(objective, model: Score, micro: int | None):
    """`value_and_grad(params, trajectory, *args) -> ((value, stats), grads)` of
    `objective(model(params, trajectory), trajectory, *args)`, with `micro` episodes
    through `model` at a time (None: all at once).

    The model's outputs y = model(params, x) of every micro-batch come first (forward
    only, `micro_mapped`), then the objective's cotangent g = dL/dy of the whole minibatch,
    and the gradient dL/dparams = sum_m (dy_m/dparams)^T g_m, one micro-batch's
    vector-Jacobian product at a time, summed in float32: the objective (its token-mean
    normalisers, clipping and statistics) sees the whole minibatch, as without
    micro-batches, for one more forward pass of the model.
    """

    def full(params, trajectory, *args):
        value = lambda p: objective(model(p, trajectory), trajectory, *args)  # noqa: E731
        return jax.value_and_grad(value, has_aux=True)(params)

    if micro is None:
        return full

    def accumulated(params, trajectory, *args):
        count = trajectory.turn_mask.shape[0] // micro
        outputs = micro_mapped(model, micro)(params, trajectory)
        (value, stats), cotangent = jax.value_and_grad(objective, has_aux=True)(
            outputs, trajectory, *args
        )

        def accumulate(total, part):
            inputs, part_cotangent = part
            _, pullback = jax.vjp(lambda p: model(p, inputs), params)
            grads = pullback(part_cotangent)[0]
            return jax.tree.map(lambda t, g: t + g.astype(jnp.float32), total, grads), None

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        parts = (_chunks(trajectory, count), _chunks(cotangent, count))
        total, _ = jax.lax.scan(accumulate, zeros, parts)
        return (value, stats), jax.tree.map(lambda g, p: g.astype(p.dtype), total, params)

    return accumulated


def _policy_objective(config: TrainConfig):
    """`objective(logp, trajectory, advantages, ref_logp) -> (scalar, stats)` of a
    minibatch's teacher-forced log-probs `logp [B, S, L]`."""
    with_kl = config.kl_placement == "loss" and config.kl_coef != 0

    def objective(logp, trajectory: Trajectory, advantages: jax.Array, ref_logp: jax.Array):
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

    return objective


def _value_objective(config: TrainConfig):
    """`objective(values, trajectory, targets) -> (scalar, stats)`: the clipped value loss
    of a minibatch's critic values `[B, S, L]` on its generated tokens (`trajectory.values`
    = V_old)."""

    def objective(value, trajectory: Trajectory, targets: jax.Array):
        loss = losses.value_loss(
            action_rows(value), action_rows(trajectory.values), action_rows(targets),
            action_rows(trajectory.loss_mask), clip=config.value_clip, agg=config.agg,
        )  # fmt: skip
        return loss, {"value_loss": jax.lax.stop_gradient(loss)}

    return objective


def _chunks(batch: Any, count: int) -> Any:
    """`[B, ...]` leaves -> `[count, B / count, ...]`, in order."""
    return jax.tree.map(lambda x: x.reshape(count, x.shape[0] // count, *x.shape[1:]), batch)


def _unchunk(batch: Any) -> Any:
    """`_chunks`' inverse: `[count, B / count, ...]` -> `[B, ...]`."""
    return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), batch)


def check_config(config: TrainConfig, *, critic: bool) -> None:
    """Refuses what a text batch cannot serve: a critic-based estimator without a critic
    (or a critic beside a critic-free one), bootstrapping a truncated episode (the loop
    scores no state after the last turn), an entropy bonus (the scorer gives log pi of the
    sampled ids only), an adaptive KL and a tree estimator (no tree rollouts)."""
    if config.uses_critic and not critic:
        raise ValueError(
            f"TrainConfig.estimator={config.estimator!r} reads a critic's values: give the "
            "update a critic (`values`), or use a critic-free estimator (grpo, drgrpo, rloo, "
            "reinforce_pp, gigpo)"
        )
    if critic and not config.uses_critic:
        raise ValueError(
            f"TrainConfig.estimator={config.estimator!r} reads no values: a critic would train "
            "for nothing; use gae_token, gae_turn or hierarchical, or no critic"
        )
    if critic and config.bootstrap_truncated:
        raise ValueError(
            "TrainConfig.bootstrap_truncated: the text loop has no value of the state after "
            "the last turn; set it to False"
        )
    if config.entropy_coef != 0:
        raise ValueError(
            f"TrainConfig.entropy_coef={config.entropy_coef}: the text update scores the "
            "sampled ids only (no entropy); set it to 0"
        )
    if config.kl_target is not None:
        raise ValueError("TrainConfig.kl_target (an adaptive KL) is not supported in text mode")
    if ESTIMATOR_TABLE[config.estimator].tree:
        raise ValueError(
            f"TrainConfig.estimator={config.estimator!r} trains on tree rollouts (leaves "
            "forked from a root at a branch turn, rlagent.train.tree), which the text loop "
            "does not play; use grpo, gigpo, rloo or reinforce_pp"
        )


def _check_batch(trajectory: Trajectory, config: TrainConfig) -> None:
    episodes = trajectory.turn_mask.shape[0]
    if episodes != config.batch_size:
        raise ValueError(
            f"the trajectory has {episodes} episodes, TrainConfig num_groups x group_size = "
            f"{config.batch_size}"
        )
