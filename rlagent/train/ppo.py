"""PPO for multi-turn agents, as one pure function (PureJaxRL shape).

`make_train(config, env, policy_config, rollout_config)` closes over the environment and
the policy architecture and returns a `Trainer` of pure functions:

    state = trainer.init(key)                  # params, optimiser, frozen reference, key
    state, metrics = trainer.update(state)     # rollout -> rewards -> advantages -> PPO
    state, metrics = trainer.train(key)        # init + lax.scan over config.num_updates

Everything is jit-able and vmap-able over seeds: `jax.jit(jax.vmap(trainer.train))(keys)`.
With a `jax.sharding.Mesh`, the episodes of every batch are laid along its data axis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rlagent import advantages as adv_lib
from rlagent import losses
from rlagent import returns as returns_lib
from rlagent.models import Policy
from rlagent.models import PolicyConfig
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_rollout
from rlagent.rollout import make_score
from rlagent.train.config import TrainConfig
from rlagent.train.rewards import reward_weights
from rlagent.train.rewards import turn_rewards
from rlagent.types import Trajectory

Metrics = dict[str, jax.Array]


class RunnerState(NamedTuple):
    """Everything a run carries from one update to the next (one seed)."""

    params: Any  # policy parameters (nnx.State).
    opt_state: Any  # optax state.
    ref_params: Any  # frozen initial policy, the KL anchor.
    kl_coef: jax.Array  # [] float32, adaptive when config.kl_target is set.
    reward_weights: jax.Array  # [C] float32 weights of rewards.COMPONENTS (the reward form).
    key: jax.Array  # PRNG key.
    step: jax.Array  # [] int32, updates done.


class Trainer(NamedTuple):
    init: Callable[..., RunnerState]  # init(key, reward_weights=None)
    update: Callable[[RunnerState], tuple[RunnerState, Metrics]]
    train: Callable[[jax.Array], tuple[RunnerState, Metrics]]
    rollout: Callable[..., Trajectory]
    graphdef: Any


class _Batch(NamedTuple):
    trajectory: Trajectory
    advantages: jax.Array  # [B, S, L] float32.
    value_targets: jax.Array  # [B, S, L] float32.
    ref_logp: jax.Array  # [B, S, L] float32.


def make_train(
    config: TrainConfig,
    env: Any,
    policy_config: PolicyConfig,
    rollout_config: RolloutConfig,
    *,
    mesh: jax.sharding.Mesh | None = None,
    data_axis: str = "data",
) -> Trainer:
    """Builds the pure PPO training functions for `env` and a `Policy(policy_config)`."""
    abstract = nnx.eval_shape(lambda: Policy(policy_config, rngs=nnx.Rngs(0)))
    graphdef, _ = nnx.split(abstract)
    rollout = make_rollout(env, graphdef, rollout_config)
    score = make_score(env, graphdef, rollout_config)
    optimizer = _make_optimizer(config)
    batch_size = config.batch_size
    minibatch_size = batch_size // config.num_minibatches
    # The frozen reference costs a teacher-forced pass per update: skipped when nothing
    # reads it (then `kl_to_ref` and `kl_loss` are not measured and not reported).
    needs_ref = config.kl_placement != "none" and (
        config.kl_coef != 0 or config.kl_target is not None
    )
    default_weights = reward_weights(config)

    def shard(tree):
        if mesh is None:
            return tree
        spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(data_axis))
        return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, spec), tree)

    def init(key: jax.Array, reward_weights: jax.Array | None = None) -> RunnerState:
        """A fresh run; `reward_weights [C]` default to those of `config.reward`."""
        if reward_weights is None:
            reward_weights = default_weights
        key, init_key = jax.random.split(key)
        _, params = nnx.split(Policy(policy_config, rngs=nnx.Rngs(init_key)))
        return RunnerState(
            params=params,
            opt_state=optimizer.init(params),
            ref_params=params,
            kl_coef=jnp.asarray(config.kl_coef, jnp.float32),
            reward_weights=jnp.asarray(reward_weights, jnp.float32),
            key=key,
            step=jnp.zeros((), jnp.int32),
        )

    def update(state: RunnerState) -> tuple[RunnerState, Metrics]:
        key, env_key, policy_key, shuffle_key = jax.random.split(state.key, 4)
        # Episodes of a group share the environment key, hence the task.
        env_keys = jnp.repeat(jax.random.split(env_key, config.num_groups), config.group_size, 0)
        policy_keys = jax.random.split(policy_key, batch_size)
        trajectory = rollout(state.params, shard(env_keys), shard(policy_keys))
        trajectory = shard(jax.lax.stop_gradient(trajectory))
        if not config.bootstrap_truncated:
            trajectory = trajectory._replace(
                bootstrap_value=jnp.zeros_like(trajectory.bootstrap_value)
            )
        token_mask = trajectory.action_mask & trajectory.turn_mask[..., None]
        if needs_ref:
            ref_logp = jax.lax.stop_gradient(score(state.ref_params, trajectory)[0])
        else:
            ref_logp = trajectory.logp
        rewards = turn_rewards(trajectory, config, state.reward_weights)
        kl_tokens = (
            losses.kl_penalty(_rows(trajectory.logp), _rows(ref_logp), kind=config.kl_kind).reshape(
                token_mask.shape
            )
            * token_mask
        )
        if config.kl_placement == "reward":
            kl_reward = -state.kl_coef * kl_tokens
        else:
            kl_reward = jnp.zeros_like(kl_tokens)
        advantages, value_targets = estimate_advantages(trajectory, rewards, kl_reward, config)
        batch = _Batch(trajectory, advantages, value_targets, ref_logp)

        def epoch(carry, epoch_key):
            params, opt_state = carry
            order = jax.random.permutation(epoch_key, batch_size)
            minibatches = jax.tree.map(
                lambda x: x[order].reshape(config.num_minibatches, minibatch_size, *x.shape[1:]),
                batch,
            )
            (params, opt_state), stats = jax.lax.scan(
                minibatch_step, (params, opt_state), minibatches
            )
            return (params, opt_state), stats

        def minibatch_step(carry, minibatch):
            params, opt_state = carry
            grads, stats = jax.grad(_loss, has_aux=True)(params, minibatch, state.kl_coef)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            stats["grad_norm"] = optax.tree_utils.tree_norm(grads)
            return (params, opt_state), stats

        (params, opt_state), stats = jax.lax.scan(
            epoch, (state.params, state.opt_state), jax.random.split(shuffle_key, config.num_epochs)
        )
        stats = jax.tree.map(jnp.mean, stats)
        kl_now = jnp.sum(kl_tokens) / jnp.maximum(jnp.sum(token_mask), 1)
        kl_coef = _adapt_kl_coef(state.kl_coef, kl_now, config)
        metrics = {
            **episode_metrics(trajectory),
            **stats,
            "kl_coef": state.kl_coef,
            "train_return": jnp.mean(jnp.sum(rewards, axis=1)),
        }
        if needs_ref:
            metrics["kl_to_ref"] = kl_now
        new_state = state._replace(
            params=params, opt_state=opt_state, kl_coef=kl_coef, key=key, step=state.step + 1
        )
        return new_state, metrics

    def _loss(params, minibatch: _Batch, kl_coef):
        trajectory = minibatch.trajectory
        mask = _rows(trajectory.action_mask & trajectory.turn_mask[..., None])
        logp, values, token_entropy = score(params, trajectory)
        policy_loss, policy_stats = losses.ppo_policy_loss(
            _rows(logp),
            _rows(trajectory.logp),
            _rows(minibatch.advantages),
            mask,
            clip_low=config.clip_low,
            clip_high=config.clip_high,
            dual_clip=config.dual_clip,
            agg=config.agg,
        )
        entropy = losses.aggregate(_rows(token_entropy), mask, config.agg)
        total = policy_loss - config.entropy_coef * entropy
        stats = {
            "policy_loss": policy_loss,
            "entropy": entropy,
            "clip_fraction": policy_stats.clip_fraction,
            "approx_kl": policy_stats.approx_kl,
        }
        if config.uses_critic:
            value_loss = losses.value_loss(
                _rows(values),
                _rows(trajectory.values),
                _rows(minibatch.value_targets),
                mask,
                clip=config.value_clip,
                agg=config.agg,
            )
            total = total + config.value_coef * value_loss
            stats["value_loss"] = value_loss
        if needs_ref and config.kl_placement == "loss":
            kl = losses.kl_penalty(_rows(logp), _rows(minibatch.ref_logp), kind=config.kl_kind)
            kl_loss = losses.aggregate(kl, mask, config.agg)
            total = total + kl_coef * kl_loss
            stats["kl_loss"] = kl_loss
        return total, stats

    def train(key: jax.Array) -> tuple[RunnerState, Metrics]:
        state = init(key)
        return jax.lax.scan(lambda s, _: update(s), state, None, length=config.num_updates)

    return Trainer(init=init, update=update, train=train, rollout=rollout, graphdef=graphdef)


def estimate_advantages(
    trajectory: Trajectory,
    rewards: jax.Array,
    kl_reward: jax.Array,
    config: TrainConfig,
) -> tuple[jax.Array, jax.Array]:
    """Token advantages and value targets `[B, S, L]` for `config.estimator`.

    `rewards [B, S]` are per-turn rewards; `kl_reward [B, S, L]` is a per-token reward
    (the KL penalty when it is placed in the reward, else zeros). Token-level estimators
    see a turn's reward on the last generated token of the turn (DESIGN.md); turn-level
    and episode-level estimators add the turn's summed KL reward to the turn.
    """
    token_mask = trajectory.action_mask & trajectory.turn_mask[..., None]
    batch, turns, turn_len = token_mask.shape
    turn_mask = trajectory.turn_mask
    last_token = jnp.clip(jnp.sum(trajectory.action_mask, axis=-1) - 1, 0, turn_len - 1)
    on_last = jax.nn.one_hot(last_token, turn_len, dtype=jnp.float32) * token_mask
    token_rewards = rewards[..., None] * on_last + kl_reward
    rewards_per_turn = rewards + jnp.sum(kl_reward, axis=-1)
    values = trajectory.values
    zeros = jnp.zeros_like(values)
    group_ids = jnp.arange(batch, dtype=jnp.int32) // config.group_size

    def to_tokens(per_turn):
        return per_turn[..., None] * token_mask

    if config.estimator == "gae_token":
        out = adv_lib.gae(
            _rows(token_rewards),
            _rows(values),
            _rows(token_mask),
            gamma=config.gamma,
            lam=config.lam,
            bootstrap_value=trajectory.bootstrap_value,
        )
        advantages = out.advantages.reshape(values.shape)
        targets = out.returns.reshape(values.shape)
    elif config.estimator == "gae_turn":
        turn_values = values[:, :, 0]  # the value before the turn's first token.
        out = adv_lib.gae(
            rewards_per_turn,
            turn_values,
            turn_mask,
            gamma=config.gamma,
            lam=config.lam,
            bootstrap_value=trajectory.bootstrap_value,
        )
        advantages, targets = to_tokens(out.advantages), to_tokens(out.returns)
    elif config.estimator == "hierarchical":
        out = adv_lib.hierarchical_advantages(
            rewards_per_turn,
            values[:, :, 0],
            turn_mask,
            _turn_ids(token_mask),
            gamma=config.gamma,
            lam=config.lam,
            token_values=_rows(values),
            bootstrap_value=trajectory.bootstrap_value,
        )
        advantages = out.token_advantages.reshape(values.shape)
        targets = to_tokens(out.turn_returns)
    elif config.estimator in ("grpo", "drgrpo", "rloo"):
        scores = jnp.sum(rewards_per_turn, axis=1)
        if config.estimator == "rloo":
            episode_adv = adv_lib.rloo_advantages(scores, group_ids, num_groups=config.num_groups)
        else:
            scale = "std" if config.estimator == "grpo" else "none"
            episode_adv = adv_lib.grpo_advantages(
                scores, group_ids, num_groups=config.num_groups, scale=scale
            )
        advantages, targets = episode_adv[:, None, None] * token_mask, zeros
    elif config.estimator == "reinforce_pp":
        out = adv_lib.reinforce_pp_returns(
            _rows(token_rewards), _rows(token_mask), gamma=config.gamma
        )
        advantages, targets = out.advantages.reshape(values.shape), zeros
    elif config.estimator == "gigpo":
        step_returns = returns_lib.discounted_returns(
            rewards_per_turn, turn_mask, gamma=config.gamma
        )
        out = adv_lib.gigpo_advantages(
            jnp.sum(rewards_per_turn, axis=1),
            step_returns,
            anchor_ids(trajectory),
            turn_mask,
            group_ids,
            num_groups=config.num_groups,
            omega=config.gigpo_omega,
        )
        advantages, targets = to_tokens(out.advantages), zeros
    else:
        raise ValueError(f"Unknown estimator {config.estimator!r}.")
    if config.normalize_advantages and config.uses_critic:
        advantages = adv_lib.whiten(_rows(advantages), _rows(token_mask)).reshape(values.shape)
    return jax.lax.stop_gradient(advantages), jax.lax.stop_gradient(targets)


def anchor_ids(trajectory: Trajectory) -> jax.Array:
    """`[B, S]` int32 ids equal for turns that start from identical observations.

    The anchor state of turn s is what the environment showed: the observation tokens and
    the task-progress markers. The id is a polynomial hash (wrapping int32 arithmetic);
    GiGPO only compares anchors within a group of episodes that share a task.
    """
    features = jnp.concatenate([trajectory.obs_tokens, trajectory.progress], axis=-1)
    features = features.astype(jnp.uint32)
    powers = jnp.uint32(1000003) ** jnp.arange(features.shape[-1], dtype=jnp.uint32)
    digest = jnp.sum(features * powers, axis=-1, dtype=jnp.uint32)
    return (digest >> 1).astype(jnp.int32)


def episode_metrics(trajectory: Trajectory) -> Metrics:
    """Per-iteration means over the batch of episodes, all float32 scalars."""
    valid = trajectory.turn_mask.astype(jnp.float32)
    turns = jnp.sum(valid, axis=1)
    tokens = jnp.sum(trajectory.action_mask & trajectory.turn_mask[..., None], axis=(1, 2))
    violations = jnp.sum(trajectory.violations * valid, axis=1)
    return {
        "success": jnp.mean(jnp.sum(trajectory.outcome * valid, axis=1) > 0),
        "outcome": jnp.mean(jnp.sum(trajectory.outcome * valid, axis=1)),
        "process_score": jnp.sum(trajectory.verdict * valid) / jnp.maximum(jnp.sum(valid), 1.0),
        "turns_over_plan": jnp.mean(-jnp.sum(trajectory.efficiency * valid, axis=1)),
        "violations": jnp.mean(violations),
        "violation_rate": jnp.mean(violations > 0),
        "turns": jnp.mean(turns),
        "tokens": jnp.mean(tokens.astype(jnp.float32)),
        "env_turns": jnp.sum(turns),
    }


def _make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    steps = config.num_updates * config.num_epochs * config.num_minibatches
    warmup = config.warmup_updates * config.num_epochs * config.num_minibatches
    if config.lr_schedule == "constant":
        schedule = optax.constant_schedule(config.learning_rate)
    elif config.lr_schedule == "linear":
        schedule = optax.linear_schedule(config.learning_rate, 0.0, max(steps - warmup, 1))
    else:
        schedule = optax.cosine_decay_schedule(config.learning_rate, max(steps - warmup, 1))
    if warmup:
        schedule = optax.join_schedules(
            [optax.linear_schedule(0.0, config.learning_rate, warmup), schedule], [warmup]
        )
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adamw(schedule, weight_decay=config.weight_decay),
    )


def _adapt_kl_coef(kl_coef: jax.Array, kl: jax.Array, config: TrainConfig) -> jax.Array:
    """Adaptive KL controller of Ziegler et al. (2019): beta *= 1 + clip(e) * n / horizon."""
    if config.kl_target is None:
        return kl_coef
    error = jnp.clip(kl / config.kl_target - 1.0, -0.2, 0.2)
    return kl_coef * (1.0 + error * config.batch_size / config.kl_horizon)


def _rows(x: jax.Array) -> jax.Array:
    """`[B, S, L]` -> `[B, S * L]`: kernels take rows, an episode is one row."""
    return x.reshape(x.shape[0], -1)


def _turn_ids(token_mask: jax.Array) -> jax.Array:
    batch, turns, turn_len = token_mask.shape
    ids = jnp.broadcast_to(jnp.arange(turns, dtype=jnp.int32)[None, :, None], token_mask.shape)
    return jnp.where(token_mask, ids, -1).reshape(batch, turns * turn_len)
