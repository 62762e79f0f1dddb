"""Shared pytest fixtures."""

import functools

import jax
import pytest


@pytest.fixture(params=[True, False], ids=["jit", "nojit"])
def variant(request):
    """Wraps a kernel with its keyword arguments bound, jitted or run eagerly."""

    def wrap(fn, **static_kwargs):
        bound = functools.partial(fn, **static_kwargs)
        return jax.jit(bound) if request.param else bound

    return wrap


@pytest.fixture(scope="session")
def tiny_policy_config():
    """`make(**overrides) -> PolicyConfig`: the tiny policy the model and rollout tests share.

    One layer, d = 32, ToolWorld's vocabulary, a 2-slot summary: small enough to compile in
    seconds, with every part (GQA, summary recurrence, value head) present.
    """
    from rlagent.envs.toolworld import dsl
    from rlagent.models import PolicyConfig

    def make(**overrides):
        base = dict(
            vocab_size=dsl.VOCAB_SIZE,
            d_model=32,
            num_layers=1,
            num_heads=2,
            num_kv_heads=1,
            mlp_dim=32,
            num_summary_slots=2,
            summary_dim=16,
        )
        return PolicyConfig(**{**base, **overrides})

    return make
