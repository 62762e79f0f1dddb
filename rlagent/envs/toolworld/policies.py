"""Scripted ToolWorld policies: the oracle (shortest correct plan) and a random baseline.

All are pure JAX functions of the state, jit/vmap-safe, returning one turn `[L]` int32.
"""

from __future__ import annotations

import jax

from rlagent.envs.base import Unroll  # noqa: F401  (re-exported with unroll)
from rlagent.envs.base import random_action
from rlagent.envs.base import unroll  # noqa: F401  (the protocol's, any env)
from rlagent.envs.toolworld.env import ToolWorld
from rlagent.envs.toolworld.types import State


def oracle_policy(env: ToolWorld, state: State) -> jax.Array:
    """Next turn `[L]` of the shortest correct plan from `state` (`ToolWorld.oracle_action`)."""
    return env.oracle_action(state)


def random_policy(env: ToolWorld, state: State, key: jax.Array) -> jax.Array:
    """A turn `[L]` sampled token by token, uniformly over `env.allowed_tokens`.

    Grammatical; with `guardrail='mask'` it never breaks a rule either
    (`rlagent.envs.base.random_action`).
    """
    return random_action(env, state, key)
