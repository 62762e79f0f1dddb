"""Sampling a dialogue at reset: the catalogue, the user's hidden goal, the feedback draws.

The catalogue has N entities of A attributes with values uniform in [0, V). The goal's C
constraint attributes and R requested attributes are distinct, uniformly chosen; the
constraint values are those of a *target* entity at an index in [C, N). One near miss per
constraint i (it meets every constraint but i) sits at an index below the target, and
every other entity that would meet the whole goal is changed on the first constraint, so:

* the target is the only entity that meets the goal, and
* a query on any strict subset of the constraints returns (as its first match) an entity
  that does not: the agent must learn every constraint before it can recommend well.

Held-out goals (`DialogueConfig.task_split`): a dialogue's *cell* is its goal, the
constraint attributes by agenda rank with their values and the requested attributes by
rank; `config.heldout_goals` holds out a fixed pseudo-random quarter of the goals (a hash
of the cell index). With `task_split='train'` a dialogue is redrawn (from
`fold_in(key, attempt)`) until its goal is not held out, with `'heldout'` until it is,
so no held-out goal is ever trained on; `'all'` draws once, as before.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rlagent.envs.dialogue import messages
from rlagent.envs.dialogue.config import DialogueConfig
from rlagent.envs.dialogue.config import heldout_goals
from rlagent.envs.dialogue.types import Marker
from rlagent.envs.dialogue.types import State
from rlagent.envs.splits import draw_split

# Redraws of a split dialogue before giving up (then the last draw is kept, unfit):
# splits.MAX_SPLIT_ATTEMPTS = 256. Goals are drawn uniformly, so one draw fits with
# p = 1 - f ('train') or f ('heldout'), f the held-out fraction of the config's goals, and
# P(no fit) = (1 - p)^256. At the levels f is 1/6 (level 1: 2 of 12 goals) to 1/4
# (docs/dialogue.md): P(no fit) < 1e-20 for 'heldout', < 1e-150 for 'train'.


def generate(config: DialogueConfig, key: jax.Array) -> State:
    """A fresh dialogue `State` from `key` (jit/vmap-safe).

    With `config.task_split` other than 'all', redrawn until the goal is of the split
    (module docstring); 'all' is one draw, `_generate(config, key)`.
    """
    draw, heldout = functools.partial(_generate, config), functools.partial(heldout_goal, config)
    return draw_split(config.task_split, draw, heldout, key)


def heldout_goal(config: DialogueConfig, state: State) -> jax.Array:
    """[] bool (or batched): the dialogue's goal is held out (`config.heldout_goals`)."""
    return heldout_goals(config, state.goal_rank, state.goal_value, state.request_rank)


def _generate(config: DialogueConfig, key: jax.Array) -> State:
    """One draw of a dialogue from `key` (`generate` without the split)."""
    n, a, v = config.num_entities, config.num_attributes, config.num_values
    c, r = config.num_constraints, config.num_requests
    draws = _uniforms(key, kb=(n, a), order=(a,), target=(), near=(n,), shift=(c,),
                      feedback=(config.max_turns, 2))  # fmt: skip
    kb = _below(draws["kb"], v)
    attrs = jnp.argsort(draws["order"])  # attrs[i]: the attribute of agenda rank i
    rank = jnp.zeros((a,), jnp.int32).at[attrs].set(jnp.arange(a, dtype=jnp.int32))
    goal_rank = jnp.where(rank < c, rank, a)
    request_rank = jnp.where((rank >= c) & (rank < c + r), rank - c, a)
    constraint = goal_rank < a
    target = c + _below(draws["target"], n - c)
    goal_value = jnp.where(constraint, kb[target], -1)
    # Near misses: the C entities with the smallest draws among the indices below target.
    near = jnp.argsort(jnp.where(jnp.arange(n) < target, draws["near"], 2.0))[:c]
    rows = jnp.where(constraint[None, :], goal_value[None, :], kb[near])
    missed = attrs[:c]  # near[i] misses the constraint of rank i
    shift = 1 + _below(draws["shift"], v - 1)
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
        feedback_draws=draws["feedback"],
        obs=messages.opening(config, first, goal_value[first]),
    )


def _uniforms(key: jax.Array, **shapes) -> dict[str, jax.Array]:
    """Float32 uniforms in [0, 1) of the given shapes, from one draw.

    One `uniform` call: on the CPU, XLA compiles every threefry call of a reset anew, and
    seven of them took 20x longer to compile than one.
    """
    sizes = [int(np.prod(shape)) for shape in shapes.values()]
    flat = jax.random.uniform(key, (sum(sizes),), jnp.float32)
    parts = jnp.split(flat, np.cumsum(sizes)[:-1])
    return {
        name: part.reshape(shape) for (name, shape), part in zip(shapes.items(), parts, strict=True)
    }


def _below(uniform: jax.Array, bound: int) -> jax.Array:
    """int32 uniform in [0, bound) from uniforms in [0, 1)."""
    return jnp.minimum((uniform * bound).astype(jnp.int32), bound - 1)
