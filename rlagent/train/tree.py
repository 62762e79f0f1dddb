"""Tree rollouts from forks: episodes branched at a turn, siblings continued from its state.

Tree-GRPO (Ji et al., 2025) and TreeRL (Hou et al., 2025) sample a tree per prompt: a
shared prefix, then several continuations of the same state, so that the continuations
are each other's baseline (a within-tree comparison that an independent group of
episodes cannot make) and the prefix is played once for all of them. Here any
environment of the protocol can be forked at a turn (its state and the policy's memory
are the rollout's carry, `make_rollout(with_carries=True)`), so a tree is one program:

1. play R root episodes (`R = batch / K`, roots of a group share its task);
2. pick one branch turn per root among its played turns: uniformly ('uniform'), or the
   turn whose sampled tokens were most surprising to the policy ('surprisal': the largest
   sum of `-log pi` over the turn's tokens, an unbiased estimate of the turn's entropy;
   TreeRL forks where the entropy is highest);
3. continue K - 1 siblings from the root's carry at that turn with fresh policy keys
   (`rollout.make_continue`), each to the end of its episode;
4. splice (`rollout.make_branch`): a sibling is the root's turns before the branch turn
   and its own from it on, so every leaf is a full `[S]` trajectory and the batch keeps
   the trainer's shape.

Rows are `tree * K + k` with `k = 0` the root, so a group of `group_size` rows holds
`group_size / K` trees of its task. A sibling's prefix turns are the root's: the same
tokens, log-probs and values (the policy that played them is the one that would have),
and the environment turns it costs are only its own (`TreeBatch.env_turns`), the
saving tree rollouts buy. The `tree_grpo` estimator (`rlagent.train.estimators`) reads
`branch_turn`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rlagent.envs.base import Environment
from rlagent.rollout import RolloutCarry
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_branch
from rlagent.rollout import make_rollout
from rlagent.types import Trajectory

# How a tree picks its branch turn (TrainConfig.tree_branch_at).
BRANCH_AT = ("uniform", "surprisal")


class TreeBatch(NamedTuple):
    """A batch of trees: `B = R * K` leaves, row `tree * K + k` (`k = 0` the root)."""

    trajectory: Trajectory  # [B, S, ...] every leaf as a full trajectory.
    branch_turn: jax.Array  # [B] int32: the turn the leaf's tree branches at (same for its K).
    env_turns: jax.Array  # [B] float32: turns the leaf played itself (a sibling: from the branch).
    root_carries: RolloutCarry  # turn-major [S, R, ...] carries of the roots (the credit probe).


def branch_turns(trajectory: Trajectory, key: jax.Array, branch_at: str) -> jax.Array:
    """`[R]` int32: one played turn per episode of `trajectory` (`BRANCH_AT`)."""
    if branch_at not in BRANCH_AT:
        raise ValueError(f"branch_at must be one of {BRANCH_AT}, got {branch_at!r}.")
    played = trajectory.turn_mask
    length = jnp.maximum(jnp.sum(played, axis=1), 1)
    if branch_at == "uniform":
        u = jax.random.uniform(key, length.shape)
        return jnp.minimum(jnp.floor(u * length).astype(jnp.int32), length - 1)
    surprisal = -jnp.sum(jnp.where(trajectory.loss_mask, trajectory.logp, 0.0), axis=-1)
    return jnp.argmax(jnp.where(played, surprisal, -jnp.inf), axis=1).astype(jnp.int32)


def make_tree_rollout(
    env: Environment,
    graphdef: nnx.GraphDef,
    rollout_config: RolloutConfig,
    *,
    branches: int,
    branch_at: str = "uniform",
) -> Callable[..., TreeBatch]:
    """Builds `tree_rollout(params, env_keys [R], policy_keys [R], key) -> TreeBatch`.

    Args:
      env: the environment (forkable: its state is a pytree, as the protocol asks).
      graphdef: the policy's graph definition.
      rollout_config: the rollout's sampling settings (the siblings sample alike).
      branches: K >= 2 leaves per tree (the root and K - 1 siblings).
      branch_at: 'uniform' or 'surprisal' (`branch_turns`).
    Returns:
      tree_rollout: pure, jit / vmap-safe; `key` draws the branch turns and the siblings'
      policy keys. `B = R * K` leaves; pure in (params, keys).
    """
    if int(branches) < 2:
        raise ValueError(f"branches must be >= 2 (a root and a sibling), got {branches}.")
    if branch_at not in BRANCH_AT:
        raise ValueError(f"branch_at must be one of {BRANCH_AT}, got {branch_at!r}.")
    k = int(branches)
    num_turns = env.max_turns
    rollout = make_rollout(env, graphdef, rollout_config, with_carries=True)
    branch = make_branch(env, graphdef, rollout_config)

    def tree_rollout(params, env_keys, policy_keys, key) -> TreeBatch:
        roots, carries = rollout(params, env_keys, policy_keys)
        num_roots = roots.turn_mask.shape[0]
        branch_key, sibling_key = jax.random.split(key)
        turn = branch_turns(roots, branch_key, branch_at)  # [R]
        rows = jnp.repeat(jnp.arange(num_roots), k - 1)  # [R * (K - 1)] siblings' roots
        keys = jax.random.split(sibling_key, num_roots * (k - 1))
        siblings = branch(params, roots, carries, rows, turn[rows], keys)
        # A sibling from turn t > 0 never plays column S - 1: no truncation bootstrap.
        siblings = siblings._replace(bootstrap_value=jnp.zeros_like(siblings.bootstrap_value))
        leaves = _interleave(roots, siblings, k)
        branch_turn = jnp.repeat(turn, k)
        # A root plays all its turns, a sibling those from the branch turn on.
        is_root = jnp.arange(num_roots * k) % k == 0
        own = is_root[:, None] | (jnp.arange(num_turns)[None] >= branch_turn[:, None])
        env_turns = jnp.sum(leaves.turn_mask & own, axis=1).astype(jnp.float32)
        return TreeBatch(leaves, branch_turn, env_turns, carries)

    return tree_rollout


def roots_of(tree: jax.Array | Trajectory, branches: int):
    """The root rows (`k = 0`) of every leaf-major array or pytree `[B, ...]` -> `[R, ...]`."""
    return jax.tree.map(lambda x: x[:: int(branches)], tree)


def _interleave(roots: Trajectory, siblings: Trajectory, k: int) -> Trajectory:
    """`[R]` roots and `[R * (K - 1)]` siblings -> `[R * K]` leaves, row `tree * K + k`."""

    def field(r, s):
        s = s.reshape(r.shape[0], k - 1, *s.shape[1:])
        return jnp.concatenate([r[:, None], s], axis=1).reshape(-1, *r.shape[1:])

    return jax.tree.map(field, roots, siblings)
