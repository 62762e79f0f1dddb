"""Advantage estimators of the trainer: a table from name to one small function.

Every estimator has the signature `estimate(inputs, settings) -> Estimate`: it reads the
batch's rewards in the form it needs from `EstimatorInputs` (built once per update by
`estimator_inputs`) and returns token advantages and value targets `[B, S, L]`, zero off
`trajectory.loss_mask`. `estimate_advantages` looks the name up in `ESTIMATORS`, whitens
critic-based advantages when asked and stops gradients. Adding an estimator is adding an
entry to `ESTIMATORS`; `TrainConfig` validates names against it.

Kernels see a batch as `action_rows` (`[B, S * L]`, generated-token positions only); see
its docstring for why that equals the token view with observation tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple
from typing import Protocol

import jax
import jax.numpy as jnp

from rlagent import advantages as adv_lib
from rlagent import returns as returns_lib
from rlagent.types import Trajectory
from rlagent.types import action_rows


class EstimatorSettings(Protocol):
    """The hyperparameters estimators read (`TrainConfig` has them)."""

    gamma: float
    lam: float
    num_groups: int
    group_size: int
    gigpo_omega: float
    tree_branches: int
    tree_omega: float
    estimator: str
    normalize_advantages: bool
    check_inputs: bool  # the kernels' traced-id checks (needs `checkify.checkify`).


class EstimatorInputs(NamedTuple):
    """One update's batch in the reward forms the estimators read."""

    trajectory: Trajectory
    # [B, S, L] float32: a turn's reward on its last generated token (token-level
    # estimators, docs/architecture.md) plus the per-token KL reward.
    token_rewards: jax.Array
    # [B, S] float32: a turn's reward plus the turn's summed KL reward.
    turn_rewards: jax.Array
    group_ids: jax.Array  # [B] int32: episodes of a group share a task.
    # [B] int32: the turn each leaf's tree branches at (tree rollouts, rlagent.train.tree;
    # rows `tree * tree_branches + k`), None for a batch of independent episodes.
    branch_turn: jax.Array | None = None


class Estimate(NamedTuple):
    advantages: jax.Array  # [B, S, L] float32, 0 off `loss_mask`.
    value_targets: jax.Array  # [B, S, L] float32 (zeros for critic-free estimators).


class Estimator(NamedTuple):
    """An entry of `ESTIMATORS`."""

    estimate: Callable[[EstimatorInputs, EstimatorSettings], Estimate]
    uses_critic: bool  # reads `trajectory.values` (and trains the value head).
    grouped: bool  # compares episodes of a group: needs group_size >= 2.
    # trains on tree rollouts (rlagent.train.tree): reads `EstimatorInputs.branch_turn`.
    tree: bool = False


def estimate_advantages(
    trajectory: Trajectory,
    rewards: jax.Array,
    kl_reward: jax.Array,
    settings: EstimatorSettings,
    branch_turn: jax.Array | None = None,
) -> Estimate:
    """Token advantages and value targets `[B, S, L]` of `settings.estimator`.

    Args:
      trajectory: the batch (`[B, S, ...]`).
      rewards: `[B, S]` float32 per-turn rewards.
      kl_reward: `[B, S, L]` float32 per-token reward (the KL penalty when it is placed in
        the reward, else zeros).
      settings: a `TrainConfig` (or anything with `EstimatorSettings`' fields).
      branch_turn: `[B]` int32 branch turns of a tree batch (`rlagent.train.tree`); a tree
        estimator needs them, the others ignore them.
    Returns:
      `Estimate` with gradients stopped; critic-based advantages whitened over
      `loss_mask` when `settings.normalize_advantages`.
    """
    if settings.estimator not in ESTIMATORS:
        raise ValueError(
            f"Unknown estimator {settings.estimator!r}; expected one of {tuple(ESTIMATORS)}."
        )
    entry = ESTIMATORS[settings.estimator]
    if entry.tree and branch_turn is None:
        raise ValueError(
            f"estimator {settings.estimator!r} reads a tree batch: pass branch_turn "
            "(rlagent.train.tree.make_tree_rollout; make_train does when the estimator asks)."
        )
    inputs = estimator_inputs(trajectory, rewards, kl_reward, settings.group_size)
    advantages, targets = entry.estimate(inputs._replace(branch_turn=branch_turn), settings)
    if settings.normalize_advantages and entry.uses_critic:
        mask = trajectory.loss_mask
        advantages = adv_lib.whiten(action_rows(advantages), action_rows(mask))
        advantages = advantages.reshape(mask.shape)
    return Estimate(jax.lax.stop_gradient(advantages), jax.lax.stop_gradient(targets))


def estimator_inputs(
    trajectory: Trajectory, rewards: jax.Array, kl_reward: jax.Array, group_size: int
) -> EstimatorInputs:
    """Places turn rewards `[B, S]` and token KL rewards `[B, S, L]` for the estimators."""
    loss_mask = trajectory.loss_mask
    batch, _, turn_len = loss_mask.shape
    last_token = jnp.clip(jnp.sum(trajectory.action_mask, axis=-1) - 1, 0, turn_len - 1)
    on_last = jax.nn.one_hot(last_token, turn_len, dtype=jnp.float32) * loss_mask
    return EstimatorInputs(
        trajectory=trajectory,
        token_rewards=rewards[..., None] * on_last + kl_reward,
        turn_rewards=rewards + jnp.sum(kl_reward, axis=-1),
        group_ids=jnp.arange(batch, dtype=jnp.int32) // group_size,
    )


def gae_token(inputs: EstimatorInputs, settings: EstimatorSettings) -> Estimate:
    """Token-level GAE over generated tokens (observation tokens bridged)."""
    traj = inputs.trajectory
    out = adv_lib.gae(
        action_rows(inputs.token_rewards),
        action_rows(traj.values),
        action_rows(traj.loss_mask),
        gamma=settings.gamma,
        lam=settings.lam,
        bootstrap_value=traj.bootstrap_value,
    )
    shape = traj.values.shape
    return Estimate(out.advantages.reshape(shape), out.returns.reshape(shape))


def gae_turn(inputs: EstimatorInputs, settings: EstimatorSettings) -> Estimate:
    """Turn-level GAE (V before each turn's first token), broadcast to the turn's tokens."""
    traj = inputs.trajectory
    out = adv_lib.gae(
        inputs.turn_rewards,
        traj.values[:, :, 0],
        traj.turn_mask,
        gamma=settings.gamma,
        lam=settings.lam,
        bootstrap_value=traj.bootstrap_value,
    )
    return Estimate(_to_tokens(out.advantages, traj), _to_tokens(out.returns, traj))


def hierarchical(inputs: EstimatorInputs, settings: EstimatorSettings) -> Estimate:
    """Turn-level critic drives every token of the turn (ArCHer style)."""
    traj = inputs.trajectory
    out = adv_lib.hierarchical_advantages(
        inputs.turn_rewards,
        traj.values[:, :, 0],
        traj.turn_mask,
        _turn_ids(traj.loss_mask),
        gamma=settings.gamma,
        lam=settings.lam,
        token_values=action_rows(traj.values),
        bootstrap_value=traj.bootstrap_value,
    )
    advantages = out.token_advantages.reshape(traj.values.shape)
    return Estimate(advantages, _to_tokens(out.turn_returns, traj))


def grpo(inputs: EstimatorInputs, settings: EstimatorSettings) -> Estimate:
    """Group-relative episode score, scaled by the group's std."""
    scores = jnp.sum(inputs.turn_rewards, axis=1)
    episode = adv_lib.grpo_advantages(
        scores,
        inputs.group_ids,
        num_groups=settings.num_groups,
        scale="std",
        check_inputs=settings.check_inputs,
    )
    return _episode_estimate(episode, inputs.trajectory)


def drgrpo(inputs: EstimatorInputs, settings: EstimatorSettings) -> Estimate:
    """Dr.GRPO: group-relative episode score without std scaling."""
    scores = jnp.sum(inputs.turn_rewards, axis=1)
    episode = adv_lib.grpo_advantages(
        scores,
        inputs.group_ids,
        num_groups=settings.num_groups,
        scale="none",
        check_inputs=settings.check_inputs,
    )
    return _episode_estimate(episode, inputs.trajectory)


def rloo(inputs: EstimatorInputs, settings: EstimatorSettings) -> Estimate:
    """Leave-one-out baseline within the group."""
    scores = jnp.sum(inputs.turn_rewards, axis=1)
    episode = adv_lib.rloo_advantages(
        scores,
        inputs.group_ids,
        num_groups=settings.num_groups,
        check_inputs=settings.check_inputs,
    )
    return _episode_estimate(episode, inputs.trajectory)


def rloo_turn(inputs: EstimatorInputs, settings: EstimatorSettings) -> Estimate:
    """Return from each turn minus the other group members' return from the same turn
    index (0 for members that had ended): a turn-level baseline that stays unbiased when
    the agent chooses how many turns to take (`advantages.turn_rloo_advantages`)."""
    traj = inputs.trajectory
    step_returns = returns_lib.discounted_returns(
        inputs.turn_rewards, traj.turn_mask, gamma=settings.gamma
    )
    per_turn = adv_lib.turn_rloo_advantages(
        step_returns,
        traj.turn_mask,
        inputs.group_ids,
        num_groups=settings.num_groups,
        check_inputs=settings.check_inputs,
    )
    return Estimate(_to_tokens(per_turn, traj), jnp.zeros_like(traj.values))


def reinforce_pp(inputs: EstimatorInputs, settings: EstimatorSettings) -> Estimate:
    """REINFORCE++: discounted token returns, whitened over the batch."""
    traj = inputs.trajectory
    out = adv_lib.reinforce_pp_returns(
        action_rows(inputs.token_rewards), action_rows(traj.loss_mask), gamma=settings.gamma
    )
    advantages = out.advantages.reshape(traj.values.shape)
    return Estimate(advantages, jnp.zeros_like(traj.values))


def gigpo(inputs: EstimatorInputs, settings: EstimatorSettings) -> Estimate:
    """GiGPO: episode-relative plus step-relative advantages within anchor-state groups."""
    traj = inputs.trajectory
    step_returns = returns_lib.discounted_returns(
        inputs.turn_rewards, traj.turn_mask, gamma=settings.gamma
    )
    out = adv_lib.gigpo_advantages(
        jnp.sum(inputs.turn_rewards, axis=1),
        step_returns,
        anchor_ids(traj),
        traj.turn_mask,
        inputs.group_ids,
        num_groups=settings.num_groups,
        omega=settings.gigpo_omega,
        check_inputs=settings.check_inputs,
    )
    return Estimate(_to_tokens(out.advantages, traj), jnp.zeros_like(traj.values))


def tree_grpo(inputs: EstimatorInputs, settings: EstimatorSettings) -> Estimate:
    """Tree-GRPO (Ji et al., 2025): the episode's group-relative score (all leaves of the
    task, GRPO) plus `tree_omega` times its within-tree score on the turns from the
    branch turn on: the return from the branch turn, relative to the tree's K leaves (each
    continued from the same state) and scaled by their std. Before the branch turn the
    leaves of a tree share their turns, so the within-tree term (which sums to 0 over the
    tree) is left off them."""
    traj = inputs.trajectory
    batch, turns = traj.turn_mask.shape
    episode = adv_lib.grpo_advantages(
        jnp.sum(inputs.turn_rewards, axis=1),
        inputs.group_ids,
        num_groups=settings.num_groups,
        scale="std",
        check_inputs=settings.check_inputs,
    )
    step_returns = returns_lib.discounted_returns(
        inputs.turn_rewards, traj.turn_mask, gamma=settings.gamma
    )
    branch = inputs.branch_turn
    from_branch = step_returns[jnp.arange(batch), branch]
    within = adv_lib.grpo_advantages(
        from_branch,
        jnp.arange(batch, dtype=jnp.int32) // settings.tree_branches,
        num_groups=batch // settings.tree_branches,
        scale="std",
        check_inputs=settings.check_inputs,
    )
    after = jnp.arange(turns)[None] >= branch[:, None]
    per_turn = episode[:, None] + settings.tree_omega * within[:, None] * after
    return Estimate(_to_tokens(per_turn, traj), jnp.zeros_like(traj.values))


ESTIMATORS: dict[str, Estimator] = {
    "gae_token": Estimator(gae_token, uses_critic=True, grouped=False),
    "gae_turn": Estimator(gae_turn, uses_critic=True, grouped=False),
    "hierarchical": Estimator(hierarchical, uses_critic=True, grouped=False),
    "grpo": Estimator(grpo, uses_critic=False, grouped=True),
    "drgrpo": Estimator(drgrpo, uses_critic=False, grouped=True),
    "rloo": Estimator(rloo, uses_critic=False, grouped=True),
    "rloo_turn": Estimator(rloo_turn, uses_critic=False, grouped=True),
    "reinforce_pp": Estimator(reinforce_pp, uses_critic=False, grouped=False),
    "gigpo": Estimator(gigpo, uses_critic=False, grouped=True),
    "tree_grpo": Estimator(tree_grpo, uses_critic=False, grouped=True, tree=True),
}


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


# Helpers -----------------------------------------------------------------------------------


def _to_tokens(per_turn: jax.Array, trajectory: Trajectory) -> jax.Array:
    """`[B, S]` -> `[B, S, L]`: every generated token of a turn gets the turn's value."""
    return per_turn[..., None] * trajectory.loss_mask


def _episode_estimate(episode: jax.Array, trajectory: Trajectory) -> Estimate:
    """`[B]` episode advantages on every generated token; no value targets."""
    advantages = episode[:, None, None] * trajectory.loss_mask
    return Estimate(advantages, jnp.zeros_like(trajectory.values))


def _turn_ids(loss_mask: jax.Array) -> jax.Array:
    """`[B, S, L]` mask -> `[B, S * L]` int32 turn of each generated token, -1 elsewhere."""
    batch, turns, turn_len = loss_mask.shape
    ids = jnp.broadcast_to(jnp.arange(turns, dtype=jnp.int32)[None, :, None], loss_mask.shape)
    return jnp.where(loss_mask, ids, -1).reshape(batch, turns * turn_len)
