"""Held-out task splits: one design for every environment that has tasks to hold out.

An environment names a task's *cell* (ToolWorld: intent kind, order, item and address of
each task; the dialogue: the user's goal; Mastermind: the secret code) by an integer
index. A cell is held out iff `fmix32(index + HELDOUT_SALT) % HELDOUT_MOD == 0`
(`heldout_index`): a fixed pseudo-random quarter of the cells, the same for every key
and run. A config's `task_split` (TASK_SPLITS) says which episodes reset draws: 'all'
(one draw, as without a split), 'train' (redrawn until the episode holds no held-out
cell) or 'heldout' (redrawn until it does), by `draw_split`; `heldout_config` is the
config of an environment's `heldout_env()`, the evaluation side of a training split;
`check_sides` refuses a config whose split leaves one side without a cell.

The plain-Python references use `fmix32_int` / `heldout_index_int`, the same hash on
Python ints (tests check the two agree), and `draw_split_python`, the same redraw.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Iterable
from typing import Any
from typing import TypeVar

import jax
import jax.numpy as jnp
import numpy as np

# Every episode, only episodes without a held-out cell, only episodes with at least one.
TASK_SPLITS = ("all", "train", "heldout")
# One cell in HELDOUT_MOD is held out; the salt fixes which (part of the split's definition).
HELDOUT_MOD = 4
HELDOUT_SALT = 0x5EED_7A5C
# Redraws of a split episode before giving up (then the last draw is kept, unfit). A draw
# fits with some p, so P(no fit) = (1 - p)^256; each environment states its p.
MAX_SPLIT_ATTEMPTS = 256

_MASK32 = 0xFFFFFFFF
T = TypeVar("T")


def fmix32(x: jax.Array) -> jax.Array:
    """murmur3 32-bit finaliser: a bijective avalanche mix of uint32 words."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def fmix32_int(x: int) -> int:
    """`fmix32` on a Python int in [0, 2**32) (the references' twin)."""
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & _MASK32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)


def heldout_index(index: jax.Array) -> jax.Array:
    """Whether each cell index (any int dtype, taken modulo 2**32) is held out."""
    word = jnp.asarray(index).astype(jnp.uint32) + jnp.uint32(HELDOUT_SALT)
    return fmix32(word) % HELDOUT_MOD == 0


def heldout_index_int(index: int) -> bool:
    """`heldout_index` on a Python int."""
    return fmix32_int((int(index) + HELDOUT_SALT) & _MASK32) % HELDOUT_MOD == 0


def check_split(split: Any, fail: Callable[[str, str], Any]) -> None:
    """Calls `fail('task_split', message)` unless `split` is one of TASK_SPLITS."""
    if split not in TASK_SPLITS:
        fail("task_split", f"must be one of {TASK_SPLITS}")


def check_sides(held: Iterable[Any], what: str, fail: Callable[[str, str], Any]) -> None:
    """Calls `fail('task_split', message)` unless the cells have both sides: `held` yields
    bool arrays (whether each cell is held out), read only until both sides are seen, so
    a space is enumerated to its end only when one side is empty (the message counts
    both sides of the `what`)."""
    count = seen = 0
    for chunk in held:
        chunk = np.asarray(chunk)
        count, seen = count + int(np.sum(chunk)), seen + chunk.size
        if 0 < count < seen:
            return
    fail(
        "task_split",
        f"needs {what} on both sides, but the {seen} {what} hold out {count} and leave "
        f"{seen - count} for training",
    )


def draw_split(
    split: str, draw: Callable[[jax.Array], T], heldout: Callable[[T], jax.Array], key
) -> T:
    """One episode of `split` (jit/vmap-safe): `draw(key)` for 'all'; otherwise `draw(key)`
    redrawn as `draw(fold_in(key, attempt))`, attempt = 1, 2, ..., while `heldout(episode)`
    is not the split's side, at most MAX_SPLIT_ATTEMPTS times (then the last is kept)."""
    first = draw(key)
    if split == "all":
        return first
    want = split == "heldout"

    def unfit(carry):
        attempt, episode = carry
        return (heldout(episode) != want) & (attempt < MAX_SPLIT_ATTEMPTS)

    def redraw(carry):
        attempt, _ = carry
        return attempt + 1, draw(jax.random.fold_in(key, attempt + 1))

    return jax.lax.while_loop(unfit, redraw, (jnp.int32(0), first))[1]


def draw_split_python(split: str, draw: Callable[[], T], heldout: Callable[[T], bool]) -> T:
    """`draw_split` for the plain-Python references: `draw()` again (from the reference's
    own random stream) until `heldout(episode)` is the split's side; 'all' draws once."""
    episode = draw()
    if split != "all":
        while heldout(episode) != (split == "heldout"):
            episode = draw()
    return episode


def heldout_config(config: T, what: str) -> T:
    """`config` drawing only held-out `what` (task_split='heldout'), for `heldout_env()`;
    refused unless `config` is a training split (its episodes never draw them)."""
    if config.task_split != "train":
        raise ValueError(
            f"held-out {what} need a training environment that never draws them: set "
            f"{type(config).__name__}.task_split='train' (got {config.task_split!r})."
        )
    return dataclasses.replace(config, task_split="heldout")
