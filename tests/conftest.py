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
