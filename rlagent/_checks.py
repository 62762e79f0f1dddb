"""Trace-time argument checks shared by the kernels (`returns`, `advantages`, `losses`).

Each check raises with the argument's name, so a wrong rank, dtype or shape fails when the
kernel is traced, naming what to fix, and costs nothing at run time.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def _check_float(name: str, x: jax.Array, rank: int | None) -> None:
    """Trace-time check that `x` is a floating array of the given rank."""
    if rank is not None:
        chex.assert_rank(x, rank, custom_message=f"`{name}` must have rank {rank}")
    chex.assert_type(
        x,
        float,
        custom_message=f"`{name}` must be floating point (an integer buffer truncates rewards)",
    )


def _check_mask(name: str, mask: jax.Array, like: jax.Array) -> None:
    """Trace-time check that `mask` is bool and shaped like `like`."""
    chex.assert_type(mask, bool, custom_message=f"`{name}` must be bool")
    chex.assert_equal_shape([mask, like], custom_message=f"`{name}` must match {like.shape}")


def _check_like(name: str, x: jax.Array, like: jax.Array) -> jax.Array:
    """Checks a float array shaped like `like` and returns it as float32."""
    _check_float(name, x, like.ndim)
    chex.assert_equal_shape([x, like], custom_message=f"`{name}` must have shape {like.shape}")
    return x.astype(jnp.float32)


def _check_rows(
    name: str, x: jax.Array, mask: jax.Array, bootstrap_value: jax.Array | None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Validates `[B, T]` float rows, their bool mask and an optional `[B]` bootstrap."""
    _check_float(name, x, 2)
    _check_mask("mask", mask, x)
    if bootstrap_value is None:
        bootstrap_value = jnp.zeros(x.shape[:1], jnp.float32)
    else:
        _check_float("bootstrap_value", bootstrap_value, 1)
        chex.assert_equal_shape_prefix(
            [bootstrap_value, x], 1, custom_message="`bootstrap_value` must be [B]"
        )
    return x.astype(jnp.float32), mask, bootstrap_value.astype(jnp.float32)
