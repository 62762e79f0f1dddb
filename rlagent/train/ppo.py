"""PPO for multi-turn agents, as one pure function (PureJaxRL shape).

`make_train(config, env, policy_config, rollout_config)` closes over the environment and
the policy architecture and returns a `Trainer` of pure functions:

    state = trainer.init(key)                  # params, optimiser, frozen reference, key
    state, metrics = trainer.update(state)     # rollout -> rewards -> advantages -> PPO
    state, metrics = trainer.updates(state, n)  # n updates under lax.scan (credit probe placed)
    state, metrics = trainer.train(key)        # init + lax.scan over config.num_updates

Everything is jit-able and vmap-able over seeds: `jax.jit(jax.vmap(trainer.train))(keys)`.
With a `jax.sharding.Mesh`, the episodes of every batch are laid along its data axis.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.experimental import checkify

from rlagent import losses
from rlagent.models import Policy
from rlagent.models import PolicyConfig
from rlagent.rollout import RolloutConfig
from rlagent.rollout import TokenScores
from rlagent.rollout import make_rollout
from rlagent.rollout import make_score
from rlagent.rollout import make_score_sum
from rlagent.train.config import LEARNED_REWARDS
from rlagent.train.config import TrainConfig
from rlagent.train.estimators import estimate_advantages
from rlagent.train.extras import CreditProbe
from rlagent.train.extras import PRMFactory
from rlagent.train.extras import PRMInputs
from rlagent.train.extras import PRMState
from rlagent.train.extras import ProbeFactory
from rlagent.train.extras import ProcessRewardModel
from rlagent.train.rewards import ReturnStats
from rlagent.train.rewards import check_reward
from rlagent.train.rewards import reward_weights
from rlagent.train.rewards import scale_rewards
from rlagent.train.rewards import turn_rewards
from rlagent.train.tree import TreeBatch
from rlagent.train.tree import make_tree_rollout
from rlagent.train.tree import roots_of
from rlagent.types import Trajectory
from rlagent.types import action_rows

Metrics = dict[str, jax.Array]
# Fractions of an update's minibatch steps whose loss / gradients were not finite; such a
# step leaves parameters and optimiser state unchanged (the host loop stops the run).
NONFINITE_METRICS = ("nonfinite_loss", "nonfinite_grads")
# With `TrainConfig.check_inputs`, metrics[INPUT_CHECKS] is the `checkify.Error` of the
# estimator's kernel input checks (`Error.get()` names the first failing run and update).
INPUT_CHECKS = "input_checks"
_NO_PROBE = "measure_credit needs make_train(credit_probe=) of a ProbeConfig with every > 0."


class RunnerState(NamedTuple):
    """Everything a run carries from one update to the next (one seed)."""

    params: Any  # policy parameters (nnx.State).
    opt_state: Any  # optax state.
    ref_params: Any  # frozen initial policy, the KL anchor.
    kl_coef: jax.Array  # [] float32, adaptive when config.kl_target is set.
    reward_weights: jax.Array  # [C] float32 weights of rewards.COMPONENTS (the reward form).
    return_stats: ReturnStats  # episode-return statistics (config.normalize_returns).
    prm_state: PRMState  # the process reward model's (make_train(prm=)); empty without one.
    key: jax.Array  # PRNG key.
    step: jax.Array  # [] int32, updates done.


class Trainer(NamedTuple):
    init: Callable[..., RunnerState]  # init(key, reward_weights=None)
    # update(state, measure_credit=False): one iteration; the static flag runs the credit
    # probe (make_train(credit_probe=); otherwise its metrics are NaN).
    update: Callable[..., tuple[RunnerState, Metrics]]
    # updates(state, length, first_step=0): `length` updates under lax.scan, measuring
    # credit on the steps divisible by the probe's `every` (`first_step`: static, the step
    # of state). Metrics [length] per name.
    updates: Callable[..., tuple[RunnerState, Metrics]]
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
    prm: PRMFactory | None = None,
    credit_probe: ProbeFactory | None = None,
    mesh: jax.sharding.Mesh | None = None,
    data_axis: str = "data",
) -> Trainer:
    """Builds the pure PPO training functions for `env` and a `Policy(policy_config)`.

    The extras are passed in, built by their own packages from their own configs as
    factories of the policy's graph definition: `prm` (its scores feed the `learned_*`
    reward forms; `rlagent.prm.prm_factory` of a `PRMConfig`) and `credit_probe` (credit
    accuracy every `CreditProbe.every` updates; `rlagent.credit.probe.probe_factory` of a
    `ProbeConfig`); `rlagent.host.extras.trainer_extras` builds both. A `learned_*`
    `config.reward` without a PRM is refused.

    Longer than most functions here on purpose: `init`, `update` and `train` are closures
    over the same rollout, score and optimiser, and `update` reads top-down as one PPO
    iteration (rollout, rewards, KL, advantages, optimisation, metrics); the loss and the
    minibatch loop live in `_ppo_loss` and `_optimise`.
    """
    _check_extras(config, prm)
    graphdef = policy_graphdef(policy_config)
    rollout = make_rollout(env, graphdef, rollout_config)
    # Tree estimators train on tree rollouts (rlagent.train.tree): B / K roots, K leaves each.
    tree_rollout = None
    if config.uses_trees:
        tree_rollout = make_tree_rollout(
            env, graphdef, rollout_config,
            branches=config.tree_branches, branch_at=config.tree_branch_at,
        )  # fmt: skip
    score = make_score(env, graphdef, rollout_config)
    score_sum = make_score_sum(env, graphdef, rollout_config, _token_loss(config))
    probe = None if credit_probe is None else credit_probe(graphdef)
    # With a critic, the probe's updates also measure how the policy's and the value's
    # gradients meet (`_gradient_cosine`): the loss without its value term.
    policy_sum = None
    if probe is not None and config.uses_critic and config.value_coef > 0:
        policy_only = _token_loss(dataclasses.replace(config, value_coef=0.0))
        policy_sum = make_score_sum(env, graphdef, rollout_config, policy_only)
    prm = None if prm is None else prm(graphdef)
    _check_tree_extras(config, prm)
    credit_every = 0 if probe is None else _probe_period(probe)
    # One rollout that keeps its carries serves the credit probe and the PRM's labels.
    if probe is not None:
        carry_rollout = probe.rollout
    elif prm is not None and prm.needs_carries:
        carry_rollout = make_rollout(env, graphdef, rollout_config, with_carries=True)
    else:
        carry_rollout = None
    optimizer = make_optimizer(config)
    batch_size = config.batch_size
    # The frozen reference costs a teacher-forced pass per update: skipped when nothing
    # reads it (then `kl_to_ref` and `kl_loss` are not measured and not reported).
    needs_ref = _needs_reference(config)
    default_weights = reward_weights(config)
    check_reward(env, default_weights, f"TrainConfig.reward={config.reward!r}")

    shard = _sharder(mesh, data_axis)

    def init(key: jax.Array, reward_weights: jax.Array | None = None) -> RunnerState:
        """A fresh run; `reward_weights [C]` default to those of `config.reward`."""
        if reward_weights is None:
            reward_weights = default_weights
        key, init_key = jax.random.split(key)
        _, params = nnx.split(Policy(policy_config, rngs=nnx.Rngs(init_key)))
        prm_key = jax.random.fold_in(init_key, 0x9B3)  # the policy's keys stay as they are
        return RunnerState(
            params=params,
            opt_state=optimizer.init(params),
            ref_params=params,
            kl_coef=jnp.asarray(config.kl_coef, jnp.float32),
            reward_weights=jnp.asarray(reward_weights, jnp.float32),
            return_stats=ReturnStats.zeros(),
            prm_state=PRMState((), ()) if prm is None else prm.init(prm_key, params),
            key=key,
            step=jnp.zeros((), jnp.int32),
        )

    def play(params, env_key, policy_key, with_carries: bool):
        """The update's episodes: `(trajectory, carries or None, TreeBatch or None)`.
        Episodes of a group share the environment key, hence the task; a tree batch's
        roots take every K-th key (their group's) and keep their carries."""
        env_keys = jnp.repeat(jax.random.split(env_key, config.num_groups), config.group_size, 0)
        policy_keys = jax.random.split(policy_key, batch_size)
        if tree_rollout is not None:
            k = config.tree_branches
            tree = tree_rollout(
                params, shard(env_keys[::k]), shard(policy_keys[: batch_size // k]),
                jax.random.fold_in(policy_key, 0x7EE),  # the run's keys stay as they are
            )  # fmt: skip
            return tree.trajectory, tree.root_carries, tree
        if with_carries:
            return *carry_rollout(params, shard(env_keys), shard(policy_keys)), None
        return rollout(params, shard(env_keys), shard(policy_keys)), None, None

    def gradient_metrics(state: RunnerState, batch: _Batch, measured: bool) -> Metrics:
        """`credit_grad_cosine` with a critic and a probe (NaN on unmeasured updates)."""
        if policy_sum is None:
            return {}
        if not measured:
            return {"credit_grad_cosine": jnp.full((), jnp.nan, jnp.float32)}
        cosine = _gradient_cosine(state.params, batch, state.kl_coef, score_sum, policy_sum, config)
        return {"credit_grad_cosine": cosine}

    def update(state: RunnerState, measure_credit: bool = False) -> tuple[RunnerState, Metrics]:
        if measure_credit and probe is None:
            raise ValueError(_NO_PROBE)
        key, env_key, policy_key, shuffle_key = jax.random.split(state.key, 4)
        with_carries = measure_credit or (prm is not None and prm.needs_carries)
        trajectory, carries, tree = play(state.params, env_key, policy_key, with_carries)
        trajectory = shard(jax.lax.stop_gradient(trajectory))
        if not config.bootstrap_truncated:
            trajectory = trajectory._replace(
                bootstrap_value=jnp.zeros_like(trajectory.bootstrap_value)
            )
        loss_mask = trajectory.loss_mask
        if needs_ref:
            ref_logp = jax.lax.stop_gradient(score(state.ref_params, trajectory)[0])
        else:
            ref_logp = trajectory.logp
        prm_key = jax.random.fold_in(shuffle_key, 0x9B3)  # the run's keys stay as they are
        prm_inputs = PRMInputs(state.params, state.ref_params, trajectory, carries)
        prm_scores, prm_state, prm_metrics = _process_rewards(
            prm, state.prm_state, prm_inputs, prm_key
        )
        raw_rewards = turn_rewards(trajectory, config, state.reward_weights, prm_scores)
        rewards, return_stats = scale_rewards(raw_rewards, state.return_stats, config)
        kl_tokens = (
            losses.kl_penalty(
                action_rows(trajectory.logp), action_rows(ref_logp), kind=config.kl_kind
            ).reshape(loss_mask.shape)
            * loss_mask
        )
        if config.kl_placement == "reward":
            kl_reward = -state.kl_coef * kl_tokens
        else:
            kl_reward = jnp.zeros_like(kl_tokens)
        advantages, value_targets, checks = _estimate(
            trajectory, rewards, kl_reward, config, None if tree is None else tree.branch_turn
        )
        batch = _Batch(trajectory, advantages, value_targets, ref_logp)

        (params, opt_state), stats = _optimise(
            state.params, state.opt_state, batch, shuffle_key, state.kl_coef,
            loss=functools.partial(_ppo_loss, score_sum=score_sum, config=config),
            optimizer=optimizer, config=config,
        )  # fmt: skip
        stats = jax.tree.map(jnp.mean, stats)
        kl_now = jnp.sum(kl_tokens) / jnp.maximum(jnp.sum(loss_mask), 1)
        kl_coef = _adapt_kl_coef(state.kl_coef, kl_now, config)
        metrics = {
            **episode_metrics(env, trajectory),
            **stats,
            **prm_metrics,
            **checks,
            "kl_coef": state.kl_coef,
            "train_return": jnp.mean(jnp.sum(raw_rewards, axis=1)),
            **_tree_metrics(tree),
        }
        if config.normalize_returns:
            metrics["return_std"] = jnp.sqrt(return_stats.m2 / return_stats.count)
        if measure_credit:
            probe_key = jax.random.fold_in(shuffle_key, 0xC4ED)  # the run's keys stay as they are
            probed = (trajectory, advantages)  # a tree's carries are its roots': their rows
            probed = probed if tree is None else roots_of(probed, config.tree_branches)
            metrics.update(
                probe.measure(state.params, carries, *probed, state.reward_weights, probe_key)
            )
        elif probe is not None:
            metrics.update(probe.skipped())
        metrics.update(gradient_metrics(state, batch, measure_credit))
        if needs_ref:
            metrics["kl_to_ref"] = kl_now
        new_state = state._replace(
            params=params,
            opt_state=opt_state,
            kl_coef=kl_coef,
            return_stats=return_stats,
            prm_state=prm_state,
            key=key,
            step=state.step + 1,
        )
        return new_state, metrics

    def updates(state: RunnerState, length: int, first_step: int = 0):
        return _scan_updates(update, state, length, first_step, credit_every)

    def train(key: jax.Array) -> tuple[RunnerState, Metrics]:
        return updates(init(key), config.num_updates)

    return Trainer(
        init=init, update=update, updates=updates, train=train, rollout=rollout, graphdef=graphdef
    )


def _gradient_cosine(
    params: nnx.State,
    batch: _Batch,
    kl_coef: jax.Array,
    score_sum: Callable,
    policy_sum: Callable,
    config: TrainConfig,
) -> jax.Array:
    """Cosine between the gradients of the loss's policy part (clipped objective, entropy,
    KL) and of its value part, on the parameters both reach, for the whole batch at the
    update's starting parameters. The value part's gradient is the full loss's minus the
    policy part's, over `value_coef`. "Both reach" is leaf by leaf: the LM head gets no
    value gradient and the value head no policy gradient, so with a trunk-shared critic
    the cosine is over the trunk (embeddings, blocks, state encoder); with a separate
    critic no leaf is shared and it is NaN. Negative: the two losses pull the shared
    weights apart."""

    def grad(summed):
        loss = functools.partial(_ppo_loss, score_sum=summed, config=config)
        return jax.grad(lambda p: loss(p, batch, kl_coef)[0])(params)

    full, policy = grad(score_sum), grad(policy_sum)
    value = jax.tree.map(lambda f, p: (f - p) / config.value_coef, full, policy)
    dots, policy_sq, value_sq = [], [], []
    for p, v in zip(jax.tree.leaves(policy), jax.tree.leaves(value), strict=True):
        p, v = p.astype(jnp.float32).ravel(), v.astype(jnp.float32).ravel()
        shared = (jnp.any(p != 0) & jnp.any(v != 0)).astype(jnp.float32)
        dots.append(shared * jnp.dot(p, v))
        policy_sq.append(shared * jnp.dot(p, p))
        value_sq.append(shared * jnp.dot(v, v))
    norms = jnp.sqrt(sum(policy_sq) * sum(value_sq))
    return jnp.where(norms > 0, sum(dots) / jnp.where(norms > 0, norms, 1.0), jnp.nan)


def policy_graphdef(policy_config: PolicyConfig) -> nnx.GraphDef:
    """The graph definition of `Policy(policy_config)` (no parameters are allocated)."""
    abstract = nnx.eval_shape(lambda: Policy(policy_config, rngs=nnx.Rngs(0)))
    graphdef, _ = nnx.split(abstract)
    return graphdef


def _check_extras(config: TrainConfig, prm: PRMFactory | None) -> None:
    """The extras passed serve the config: a `learned_*` reward reads a PRM's scores.
    Gradient accumulation (`micro_batch_size`) is the text update's only.

    Only the config's own reward form can be checked here (the forms of `init`'s
    `reward_weights` are data; `rlagent.host.loop.run` checks its conditions)."""
    if config.micro_batch_size is not None:
        raise ValueError(
            f"TrainConfig.micro_batch_size={config.micro_batch_size}: the token-level "
            "trainer takes one pass per minibatch (set num_minibatches); micro-batches are "
            "the text update's (rlagent.text.update). Set it to None."
        )
    if config.reward in LEARNED_REWARDS and prm is None:
        raise ValueError(
            f"TrainConfig.reward={config.reward!r} reads a process reward model's scores: "
            "make_train(prm=) must be a PRM factory (rlagent.prm.prm_factory of a PRMConfig "
            "whose kind is not 'none'), got None."
        )


def _tree_metrics(tree: TreeBatch | None) -> Metrics:
    """A tree batch's `env_turns` (a sibling's prefix turns were the root's, not played
    again; overrides `episode_metrics`') and mean `branch_turn`; none without a tree."""
    if tree is None:
        return {}
    return {
        "env_turns": jnp.sum(tree.env_turns),
        "branch_turn": jnp.mean(tree.branch_turn.astype(jnp.float32)),
    }


def _check_tree_extras(config: TrainConfig, prm: ProcessRewardModel | None) -> None:
    """Tree rollouts keep the carries of their roots only: a PRM that labels from carries
    (Monte-Carlo labels of every episode) cannot train on a tree batch."""
    if config.uses_trees and prm is not None and prm.needs_carries:
        raise ValueError(
            f"TrainConfig.estimator={config.estimator!r} trains on tree rollouts, which keep "
            "the rollout carries of their roots only; this PRM labels from every episode's "
            "carries (PRMConfig.kind 'completion' / 'progress'): use a PRM without "
            "carries ('oracle', 'implicit') or an estimator without trees."
        )


def _probe_period(probe: CreditProbe) -> int:
    """The probe's `every` (updates between credit measurements), refused unless >= 1."""
    if int(probe.every) < 1:
        raise ValueError(f"CreditProbe.every must be >= 1, got {probe.every}.")
    return int(probe.every)


def _estimate(trajectory, rewards, kl_reward, config: TrainConfig, branch_turn=None):
    """`(advantages, value targets, metrics)`: with `config.check_inputs` the estimator's
    kernels run their input checks, functionalised by checkify (the estimator alone:
    checkify cannot take the rollout's batched while loops), and the metrics carry the
    `checkify.Error` as `INPUT_CHECKS`; else no metric."""
    if not config.check_inputs:
        return *estimate_advantages(trajectory, rewards, kl_reward, config, branch_turn), {}
    checked = checkify.checkify(estimate_advantages, errors=checkify.user_checks)
    error, (advantages, value_targets) = checked(
        trajectory, rewards, kl_reward, config, branch_turn
    )
    return advantages, value_targets, {INPUT_CHECKS: error}


def _scan_updates(update, state, length: int, first_step: int, credit_every: int):
    """`length` updates under lax.scan; those at steps divisible by `credit_every` (0: none)
    measure credit. The measured updates are placed statically (a head of plain updates,
    scanned blocks of one measured update and credit_every - 1 plain ones, a tail block),
    since a traced step condition would run the probe on every update under vmap."""
    plain = lambda s, _: update(s)  # noqa: E731
    if not credit_every:
        return jax.lax.scan(plain, state, None, length=length)

    def block(s, size):
        s, measured = update(s, measure_credit=True)
        s, rest = jax.lax.scan(plain, s, None, length=size - 1)
        return s, jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), measured, rest)

    head = min(-first_step % credit_every, length)
    blocks, tail = divmod(length - head, credit_every)
    parts = []
    if head:
        state, metrics = jax.lax.scan(plain, state, None, length=head)
        parts.append(metrics)
    if blocks:
        state, metrics = jax.lax.scan(
            lambda s, _: block(s, credit_every), state, None, length=blocks
        )
        parts.append(jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), metrics))
    if tail:
        state, metrics = block(state, tail)
        parts.append(metrics)
    return state, jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)


def _process_rewards(
    prm: ProcessRewardModel | None, prm_state: PRMState, inputs: PRMInputs, key: jax.Array
) -> tuple[jax.Array | None, PRMState, Metrics]:
    """`(scores [B, S] or None, prm_state, metrics)`: the PRM scores the batch, then learns.

    Scored before its update on this batch, so no reward comes from a PRM that trained on
    the episodes it scores. Without a PRM: no scores, and `label_turns` 0.
    """
    if prm is None:
        return None, prm_state, {"label_turns": jnp.zeros((), jnp.float32)}
    score_key, update_key = jax.random.split(key)
    scores = prm.scores(prm_state, inputs, score_key)
    prm_state, metrics = prm.update(prm_state, inputs._replace(scores=scores), update_key)
    return scores, prm_state, metrics


def _sharder(mesh: jax.sharding.Mesh | None, data_axis: str) -> Callable[[Any], Any]:
    """Lays the leading (episode) axis of every leaf along `data_axis` (identity without mesh)."""

    def shard(tree):
        if mesh is None:
            return tree
        spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(data_axis))
        return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, spec), tree)

    return shard


def _optimise(
    params: nnx.State,
    opt_state: Any,
    batch: _Batch,
    key: jax.Array,
    kl_coef: jax.Array,
    *,
    loss: Callable[[nnx.State, _Batch, jax.Array], tuple[jax.Array, Metrics]],
    optimizer: optax.GradientTransformation,
    config: TrainConfig,
) -> tuple[tuple[nnx.State, Any], Metrics]:
    """`config.num_epochs` passes over shuffled minibatches; per-step stats stacked."""
    batch_size = config.batch_size
    minibatch_size = batch_size // config.num_minibatches

    def epoch(carry, epoch_key):
        params, opt_state = carry
        order = jax.random.permutation(epoch_key, batch_size)
        minibatches = jax.tree.map(
            lambda x: x[order].reshape(config.num_minibatches, minibatch_size, *x.shape[1:]),
            batch,
        )
        (params, opt_state), stats = jax.lax.scan(minibatch_step, (params, opt_state), minibatches)
        return (params, opt_state), stats

    def minibatch_step(carry, minibatch):
        params, opt_state = carry
        params, opt_state, stats = guarded_step(
            loss, params, opt_state, optimizer, minibatch, kl_coef
        )
        return (params, opt_state), stats

    return jax.lax.scan(epoch, (params, opt_state), jax.random.split(key, config.num_epochs))


def guarded_step(
    loss: Callable[..., tuple[jax.Array, Metrics]],
    params: Any,
    opt_state: Any,
    optimizer: optax.GradientTransformation,
    *args: Any,
) -> tuple[Any, Any, Metrics]:
    """One optimiser step on `loss(params, *args) -> (value, stats)`: `(params, opt_state,
    stats + grad_norm + NONFINITE_METRICS)`.

    A non-finite loss or gradient leaves parameters and optimiser state as they were
    (selected, not branched: no host sync); its flags let the host loop stop the run.
    """
    value_and_grads = jax.value_and_grad(loss, has_aux=True)(params, *args)
    return guarded_apply(value_and_grads, params, opt_state, optimizer)


def guarded_apply(
    value_and_grads: tuple[tuple[jax.Array, Metrics], Any],
    params: Any,
    opt_state: Any,
    optimizer: optax.GradientTransformation,
) -> tuple[Any, Any, Metrics]:
    """`guarded_step` from `((value, stats), grads)` computed by the caller (the output of
    `jax.value_and_grad(loss, has_aux=True)`, or a gradient accumulated otherwise)."""
    (value, stats), grads = value_and_grads
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    grad_norm = optax.tree_utils.tree_norm(grads)
    finite_loss, finite_grads = jnp.isfinite(value), jnp.isfinite(grad_norm)
    keep = finite_loss & finite_grads
    params, opt_state = jax.tree.map(
        lambda new, old: jnp.where(keep, new, old),
        (optax.apply_updates(params, updates), new_opt_state),
        (params, opt_state),
    )
    stats = {
        **stats,
        "grad_norm": grad_norm,
        "nonfinite_loss": 1.0 - finite_loss.astype(jnp.float32),
        "nonfinite_grads": 1.0 - finite_grads.astype(jnp.float32),
    }
    return params, opt_state, stats


class _TokenTargets(NamedTuple):
    """What the PPO loss reads beside the scores, per token `[B, S, L]` (`[B, S]` for kl_coef)."""

    old_logp: jax.Array  # behaviour log-probs.
    advantages: jax.Array
    old_values: jax.Array  # values at sampling time (value clipping).
    value_targets: jax.Array
    ref_logp: jax.Array  # the frozen reference's log-probs.
    mask: jax.Array  # bool loss mask.
    weight: jax.Array  # the token's weight in `config.agg`: a loss is sum(weight * x).
    mean_weight: jax.Array  # its weight in a token mean (the diagnostics' reduction).
    kl_coef: jax.Array  # [B, S] the KL loss coefficient.


def _ppo_loss(
    params: nnx.State,
    minibatch: _Batch,
    kl_coef: jax.Array,
    *,
    score_sum: Callable[[nnx.State, Trajectory, _TokenTargets], tuple[jax.Array, Metrics]],
    config: TrainConfig,
) -> tuple[jax.Array, Metrics]:
    """Clipped policy loss - entropy bonus (+ value loss, + KL loss) of one minibatch.

    Every aggregation (`losses.aggregate`) is linear in the per-token values with weights
    set by the mask alone, so the loss is a sum over turns of weighted token terms
    (`_token_loss`), which `score_sum` computes turn by turn on played turns only.
    """
    trajectory = minibatch.trajectory
    mask = trajectory.loss_mask
    targets = _TokenTargets(
        old_logp=trajectory.logp,
        advantages=minibatch.advantages,
        old_values=trajectory.values,
        value_targets=minibatch.value_targets,
        ref_logp=minibatch.ref_logp,
        mask=mask,
        weight=_token_weights(mask, config.agg),
        mean_weight=_token_weights(mask, "token-mean"),
        kl_coef=jnp.broadcast_to(kl_coef, mask.shape[:2]),
    )
    return score_sum(params, trajectory, targets)


def _token_weights(mask: jax.Array, agg: str) -> jax.Array:
    """[B, S, L] weights w with `losses.aggregate(x, mask, agg) = sum(w x)` (over action rows)."""
    return jax.grad(lambda x: losses.aggregate(action_rows(x), action_rows(mask), agg))(
        jnp.zeros(mask.shape, jnp.float32)
    )


def _token_loss(config: TrainConfig) -> Callable[[TokenScores, _TokenTargets], tuple]:
    """`token_loss(scores [n, L], targets [n, ...]) -> (loss [n], stats [n])` per turn.

    Each token's terms come from the loss kernels applied to that token alone (a one-token
    batch, so their reductions are the identity), weighted by `targets.weight` (the loss
    and the `config.agg` reductions) or `targets.mean_weight` (clip fraction, approx KL).
    """
    with_kl = _needs_reference(config) and config.kl_placement == "loss"

    def one_token(kernel):
        def apply(*args):
            return kernel(*(jnp.reshape(a, (1, 1)) for a in args))

        return jax.vmap(jax.vmap(apply))

    @one_token
    def policy_terms(logp, old_logp, advantages):
        loss, stats = losses.ppo_policy_loss(
            logp, old_logp, advantages, jnp.ones((1, 1), bool),
            clip_low=config.clip_low, clip_high=config.clip_high, dual_clip=config.dual_clip,
        )  # fmt: skip
        return loss, stats.clip_fraction, stats.approx_kl

    @one_token
    def value_term(values, old_values, value_targets):
        return losses.value_loss(
            values, old_values, value_targets, jnp.ones((1, 1), bool), clip=config.value_clip
        )

    def token_loss(scores: TokenScores, targets: _TokenTargets):
        def total(weight, x):
            return jnp.sum(jnp.where(targets.mask, weight * x, 0.0), axis=-1)

        policy, clipped, approx_kl = policy_terms(scores.logp, targets.old_logp, targets.advantages)
        stats = {
            "policy_loss": total(targets.weight, policy),
            "entropy": total(targets.weight, scores.entropy),
            "clip_fraction": total(targets.mean_weight, clipped),
            "approx_kl": total(targets.mean_weight, approx_kl),
        }
        loss = stats["policy_loss"] - config.entropy_coef * stats["entropy"]
        if config.uses_critic:
            value = value_term(scores.values, targets.old_values, targets.value_targets)
            stats["value_loss"] = total(targets.weight, value)
            loss = loss + config.value_coef * stats["value_loss"]
        if with_kl:
            kl = losses.kl_penalty(scores.logp, targets.ref_logp, kind=config.kl_kind)
            stats["kl_loss"] = total(targets.weight, kl)
            loss = loss + targets.kl_coef * stats["kl_loss"]
        return loss, jax.tree.map(jax.lax.stop_gradient, stats)

    return token_loss


def _needs_reference(config: TrainConfig) -> bool:
    """Whether a KL term reads the frozen reference policy's log-probs."""
    return config.kl_placement != "none" and (config.kl_coef != 0 or config.kl_target is not None)


def episode_metrics(env: Any, trajectory: Trajectory) -> Metrics:
    """Per-iteration means over the batch of episodes, all float32 scalars: success (the
    environment's), turns, tokens, experience (`env_turns`) and the environment's own
    metrics of the batch's signals (`env.episode_metrics`)."""
    valid = trajectory.turn_mask.astype(jnp.float32)
    turns = jnp.sum(valid, axis=1)
    tokens = jnp.sum(trajectory.loss_mask, axis=(1, 2))
    own = env.episode_metrics(trajectory.signals, trajectory.turn_mask, trajectory.action_tokens)
    return {
        **own,
        "success": jnp.mean(trajectory.episode_success),
        "turns": jnp.mean(turns),
        "tokens": jnp.mean(tokens.astype(jnp.float32)),
        "env_turns": jnp.sum(turns),
    }


def make_optimizer(
    config: TrainConfig, learning_rate: float | None = None
) -> optax.GradientTransformation:
    """clip_by_global_norm(max_grad_norm), then AdamW at `config.lr_schedule` from
    `learning_rate` (default `config.learning_rate`) after `warmup_updates` of linear
    warm-up, one schedule step per minibatch step (num_updates x num_epochs x
    num_minibatches in all). Both engines' updates use it."""
    learning_rate = config.learning_rate if learning_rate is None else learning_rate
    steps = config.num_updates * config.num_epochs * config.num_minibatches
    warmup = config.warmup_updates * config.num_epochs * config.num_minibatches
    if config.lr_schedule == "constant":
        schedule = optax.constant_schedule(learning_rate)
    elif config.lr_schedule == "linear":
        schedule = optax.linear_schedule(learning_rate, 0.0, max(steps - warmup, 1))
    else:
        schedule = optax.cosine_decay_schedule(learning_rate, max(steps - warmup, 1))
    if warmup:
        schedule = optax.join_schedules(
            [optax.linear_schedule(0.0, learning_rate, warmup), schedule], [warmup]
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
