"""Scripted policies of the dialogue environment (pure JAX, jit/vmap-safe): the oracle (the
shortest dialogue), the uniform random policy over the grammar, and `unroll`."""

from __future__ import annotations

import jax

from rlagent.envs.base import Unroll  # noqa: F401  (re-exported with unroll)
from rlagent.envs.base import random_action
from rlagent.envs.base import unroll  # noqa: F401  (the protocol's, any env)
from rlagent.envs.dialogue.env import DialogueEnv
from rlagent.envs.dialogue.types import State


def oracle_policy(env: DialogueEnv, state: State, key: jax.Array | None = None) -> jax.Array:
    """Next turn `[L]` of the shortest dialogue from `state` (`DialogueEnv.oracle_action`)."""
    del key
    return env.oracle_action(state)


def random_policy(env: DialogueEnv, state: State, key: jax.Array) -> jax.Array:
    """A grammatical turn `[L]`, sampled token by token uniformly over `allowed_tokens`."""
    return random_action(env, state, key)
