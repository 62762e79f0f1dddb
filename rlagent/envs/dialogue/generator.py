"""Sampling a dialogue at reset: the catalogue, the user's hidden goal, the feedback draws.

The catalogue has N entities of A attributes with values uniform in [0, V). The goal's C
constraint attributes and R requested attributes are distinct, uniformly chosen; the
constraint values are those of a *target* entity at an index in [C, N). One near miss per
constraint i (it meets every constraint but i) sits at an index below the target, and
every other entity that would meet the whole goal is changed on the first constraint, so:

* the target is the only entity that meets the goal, and
* a query on any strict subset of the constraints returns (as its first match) an entity
  that does not: the agent must learn every constraint before it can recommend well.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlagent.envs.dialogue import messages
from rlagent.envs.dialogue.config import DialogueConfig
from rlagent.envs.dialogue.types import Marker
from rlagent.envs.dialogue.types import State


def generate(config: DialogueConfig, key: jax.Array) -> State:
    """A fresh dialogue `State` from `key` (jit/vmap-safe)."""
    n, a, v = config.num_entities, config.num_attributes, config.num_values
    c, r = config.num_constraints, config.num_requests
    keys = jax.random.split(key, 7)
    kb = jax.random.randint(keys[0], (n, a), 0, v, jnp.int32)
    attrs = jax.random.permutation(keys[1], a)
    rank = jnp.zeros((a,), jnp.int32).at[attrs].set(jnp.arange(a, dtype=jnp.int32))
    goal_rank = jnp.where(rank < c, rank, a)
    request_rank = jnp.where((rank >= c) & (rank < c + r), rank - c, a)
    constraint = goal_rank < a
    target = jax.random.randint(keys[2], (), c, n, jnp.int32)
    goal_value = jnp.where(constraint, kb[target], -1)
    # Near misses: the C entities with the smallest scores among the indices below target.
    scores = jnp.where(jnp.arange(n) < target, jax.random.uniform(keys[3], (n,)), 2.0)
    near = jnp.argsort(scores)[:c]  # near[i] misses constraint of rank i
    shift = jax.random.randint(keys[4], (c,), 1, v, jnp.int32)
    rows = jnp.where(constraint[None, :], goal_value[None, :], kb[near])
    missed = attrs[:c]  # the attribute of rank i
    rows = rows.at[jnp.arange(c), missed].set((goal_value[missed] + shift) % v)
    kb = kb.at[near].set(rows)
    # Any other entity meeting the goal is moved off the first constraint.
    meets = jnp.all(~constraint[None, :] | (kb == goal_value[None, :]), axis=1)
    others = meets & (jnp.arange(n) != target)
    first = attrs[0]
    kb = kb.at[:, first].set(jnp.where(others, (goal_value[first] + 1) % v, kb[:, first]))
    marker = jnp.where(constraint, Marker.WANTED, Marker.NONE).astype(jnp.int32)
    marker = marker.at[first].set(Marker.TOLD)
    return State(
        kb=kb,
        goal_value=goal_value.astype(jnp.int32),
        goal_rank=goal_rank.astype(jnp.int32),
        request_rank=request_rank.astype(jnp.int32),
        target=target,
        marker=marker,
        answered_right=jnp.zeros((a,), bool),
        informed=jnp.full((n, a), -1, jnp.int32),
        shown=jnp.zeros((n,), bool),
        accepted=jnp.int32(-1),
        queried=jnp.bool_(False),
        pending_chat=jnp.bool_(False),
        patience_left=jnp.int32(config.persona.patience),
        turn=jnp.int32(0),
        coherence_errors=jnp.int32(0),
        over=jnp.bool_(False),
        feedback_draws=jax.random.uniform(keys[5], (config.max_turns, 2), jnp.float32),
        obs=messages.opening(config, first, goal_value[first]),
    )
