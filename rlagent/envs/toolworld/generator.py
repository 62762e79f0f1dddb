"""Episode sampling of ToolWorld: a world (orders, inventory) and a queue of tasks.

`generate(config, key) -> State` draws, from one key:
  * the world: per order an item, a status, an address and an amount bucket; per item
    whether it is in stock;
  * the task queue: `num_intents` kinds from the config's pool and `num_distractors`
    off-topic requests, in random order, each about a distinct order;
  * fits the world to the tasks, so that every task is answerable and every final step
    occurs: a cancel / change_address order is still processing; a refund order is
    refundable half the time, else not delivered or over the refund limit (1/4 each); an
    exchange order is delivered, with its own item, in stock half the time; a requested
    address differs from the current one.

Random numbers come from `_Draws`, a counter-based hash seeded by one threefry draw.

Held-out tasks (`ToolWorldConfig.task_split`): a task's *cell* is its intent kind, its
order, that order's item and the requested address; `heldout_cells` holds out a fixed
pseudo-random quarter of the cells (a hash of the cell index). With `task_split='train'`
an episode is redrawn (from `fold_in(key, attempt)`) until none of its intent tasks has
a held-out cell, with `'heldout'` until at least one has, so no held-out combination is
ever trained on; `'all'` draws once, as before.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlagent.envs.splits import draw_split
from rlagent.envs.splits import fmix32
from rlagent.envs.splits import heldout_index
from rlagent.envs.toolworld import dsl
from rlagent.envs.toolworld import messages
from rlagent.envs.toolworld.config import KIND_COST
from rlagent.envs.toolworld.config import ToolWorldConfig
from rlagent.envs.toolworld.types import Progress
from rlagent.envs.toolworld.types import State
from rlagent.envs.toolworld.types import TaskKind

# Turns of each kind's shortest handling, indexed by TaskKind.
_KIND_COST = np.array([KIND_COST[kind] for kind in TaskKind], np.int32)


class _World(NamedTuple):
    item: jax.Array  # [N] int32.
    status: jax.Array  # [N] int32.
    address: jax.Array  # [N] int32.
    amount: jax.Array  # [N] int32.
    in_stock: jax.Array  # [I] bool.


class _Tasks(NamedTuple):
    kind: jax.Array  # [K] int32 TaskKind.
    order: jax.Array  # [K] int32: distinct orders.
    exchange_items: jax.Array  # [I] int32: a permutation, the items of exchange tasks.


# A split episode is redrawn at most splits.MAX_SPLIT_ATTEMPTS = 256 times. One draw fits
# with p = (3/4)^k ('train', k intents) or 1 - (3/4)^k ('heldout'), so P(no fit) =
# (1 - p)^256: about 1e-32 at k = 1 for 'heldout', 2e-12 at k = 8 for 'train'.


def generate(config: ToolWorldConfig, key: jax.Array) -> State:
    """A fresh episode's state: sampled world and tasks, the first task pending.

    Args:
      config: the environment config (`task_split` other than 'all': redrawn until the
        episode is of its split, module docstring).
      key: a PRNG key (raw `[2]` uint32 or typed), kept in the state (with a split, the
        key of the draw that fit).
    """
    draw, heldout = functools.partial(_generate, config), functools.partial(episode_heldout, config)
    return draw_split(config.task_split, draw, heldout, key)


def heldout_cells(
    config: ToolWorldConfig, kind: jax.Array, order: jax.Array, item: jax.Array, address
) -> jax.Array:
    """Whether each task cell (kind, order, item of the order, requested address) is held
    out (`splits.heldout_index` of the cell index; same shapes as the args)."""
    n, i, a = config.num_orders, config.num_items, config.num_addresses
    cell = ((jnp.asarray(kind) * n + order) * i + item) * a + address
    return heldout_index(cell)


def episode_heldout(config: ToolWorldConfig, state: State) -> jax.Array:
    """[] bool: some intent task of the episode (distractors excluded) has a held-out cell."""
    item = state.item[state.task_order]
    held = heldout_cells(config, state.task_kind, state.task_order, item, state.task_address)
    return jnp.any(held & (state.task_kind != TaskKind.OFF_TOPIC))


def _generate(config: ToolWorldConfig, key: jax.Array) -> State:
    """One draw of an episode from `key` (`generate` without the split)."""
    n, i, k = config.num_orders, config.num_items, config.num_tasks
    draws = _Draws(key, 5 * n + 3 * i + 9 * k + config.num_intents)
    # The order of the draws below fixes the episode of a key: keep it.
    world = _sample_world(config, draws)
    tasks = _sample_tasks(config, draws)
    world, task_address = _fit_world_to_tasks(config, draws, world, tasks)
    obs = messages.user_message(tasks.kind[0], tasks.order[0], task_address[0], config.obs_len)
    shortest = 1 + jnp.asarray(_KIND_COST)[tasks.kind].sum()
    return State(
        key=key,
        item=world.item.astype(jnp.int32),
        status=world.status.astype(jnp.int32),
        address=world.address.astype(jnp.int32),
        amount=world.amount.astype(jnp.int32),
        cancelled=jnp.zeros((n,), bool),
        refunded=jnp.zeros((n,), bool),
        exchanged=jnp.zeros((n,), bool),
        in_stock=world.in_stock,
        looked_up=jnp.zeros((n,), bool),
        stock_checked=jnp.zeros((i,), bool),
        task_kind=tasks.kind,
        task_order=tasks.order,
        task_address=task_address.astype(jnp.int32),
        progress=jnp.zeros((k,), jnp.int32).at[0].set(Progress.PENDING),
        current=jnp.int32(0),
        turn=jnp.int32(0),
        violated=jnp.bool_(False),
        correct_answers=jnp.int32(0),
        shortest_plan=shortest.astype(jnp.int32),
        terminated=jnp.bool_(False),
        truncated=jnp.bool_(False),
        obs=obs,
    )


def _sample_world(config: ToolWorldConfig, draws: _Draws) -> _World:
    """Orders and inventory, independent of the tasks."""
    n = config.num_orders
    return _World(
        item=draws.integers(n, 0, config.num_items),
        status=draws.integers(n, 0, dsl.NUM_STATUSES),
        address=draws.integers(n, 0, config.num_addresses),
        amount=draws.integers(n, 0, dsl.NUM_AMOUNTS),
        in_stock=draws.bernoulli(config.num_items),
    )


def _sample_tasks(config: ToolWorldConfig, draws: _Draws) -> _Tasks:
    """Task kinds (intents from the pool, distractors anywhere) and their distinct orders."""
    pool = jnp.asarray(config.kind_ids, jnp.int32)
    intent_kinds = pool[draws.integers(config.num_intents, 0, len(pool))]
    distractors = jnp.full((config.num_distractors,), TaskKind.OFF_TOPIC, jnp.int32)
    kinds = jnp.concatenate([intent_kinds, distractors])
    kinds = kinds[draws.permutation(config.num_tasks)]
    orders = draws.permutation(config.num_orders)[: config.num_tasks]
    return _Tasks(kind=kinds, order=orders, exchange_items=draws.permutation(config.num_items))


def _fit_world_to_tasks(
    config: ToolWorldConfig, draws: _Draws, world: _World, tasks: _Tasks
) -> tuple[_World, jax.Array]:
    """Rewrites the tasks' orders so that each fits its kind; returns the requested addresses.

    A cancel / change_address needs a processing order; a refund is granted (delivered,
    small amount), or denied because the order is not delivered or the amount is too
    large; an exchange needs a delivered order with its own item (distinct across the
    exchange tasks) whose stock is redrawn.
    """
    k, n, i, a = config.num_tasks, config.num_orders, config.num_items, config.num_addresses
    orders, kinds = tasks.order, tasks.kind
    t_status, t_amount, t_item = world.status[orders], world.amount[orders], world.item[orders]
    refund_ok = draws.bernoulli(k)
    not_delivered = draws.bernoulli(k)  # why a refund is denied
    pending = draws.integers(k, 0, 2)  # processing or shipped
    small = draws.integers(k, 0, config.refund_limit + 1)
    large = draws.integers(k, config.refund_limit + 1, dsl.NUM_AMOUNTS)
    exchange_stock = draws.bernoulli(k)
    offset = draws.integers(k, 1, a)  # new address != old one

    is_change = (kinds == TaskKind.CHANGE_ADDRESS) | (kinds == TaskKind.CANCEL)
    is_refund = kinds == TaskKind.REFUND
    is_exchange = kinds == TaskKind.EXCHANGE
    refund_status = jnp.where(refund_ok | ~not_delivered, dsl.DELIVERED, pending)
    refund_amount = jnp.where(refund_ok, small, jnp.where(not_delivered, t_amount, large))
    new_status = jnp.where(is_change, dsl.PROCESSING, t_status)
    new_status = jnp.where(is_refund, refund_status, new_status)
    new_status = jnp.where(is_exchange, dsl.DELIVERED, new_status)
    new_amount = jnp.where(is_refund, refund_amount, t_amount)
    exchange_rank = jnp.cumsum(is_exchange) - 1  # distinct items for exchange tasks
    new_item = jnp.where(
        is_exchange, tasks.exchange_items[jnp.clip(exchange_rank, 0, i - 1)], t_item
    )

    order_hot = orders[:, None] == jnp.arange(n)[None, :]  # [K, N], rows distinct
    touched = order_hot.any(0)
    item_hot = is_exchange[:, None] & (new_item[:, None] == jnp.arange(i)[None, :])  # [K, I]
    world = _World(
        item=jnp.where(touched, (order_hot * new_item[:, None]).sum(0), world.item),
        status=jnp.where(touched, (order_hot * new_status[:, None]).sum(0), world.status),
        address=world.address,
        amount=jnp.where(touched, (order_hot * new_amount[:, None]).sum(0), world.amount),
        in_stock=jnp.where(
            item_hot.any(0), (item_hot & exchange_stock[:, None]).any(0), world.in_stock
        ),
    )
    return world, (world.address[orders] + offset) % a


class _Draws:
    """Random samples for `reset`, cut slice by slice from one vector of uniforms.

    Why not `jax.random` for each sample: hashing is the main cost of a reset, and a
    dozen threefry samplers also compile slowly. One threefry draw of two words seeds a
    counter-based integer hash (the murmur3 finaliser, applied twice), which gives the
    ~100 uniforms of a reset at a fifth of the cost of threefry, with ample quality for
    sampling a world. Uniforms have 24 bits.
    """

    def __init__(self, key: jax.Array, size: int):
        seed = jax.random.bits(key, (2,), jnp.uint32)
        counter = jnp.arange(size, dtype=jnp.uint32)
        words = fmix32(seed[0] ^ fmix32(counter * jnp.uint32(0x9E3779B9) + seed[1]))
        self._uniforms = (words >> 8).astype(jnp.float32) * (1.0 / (1 << 24))
        self._used = 0

    def _take(self, size: int) -> jax.Array:
        if self._used + size > self._uniforms.shape[0]:
            raise ValueError("internal: reset drew more random numbers than it allocated")
        out = self._uniforms[self._used : self._used + size]
        self._used += size
        return out

    def integers(self, size: int, low: int, high: int) -> jax.Array:
        """`[size]` int32 uniform on [low, high)."""
        u = self._take(size)
        return jnp.clip(low + jnp.floor(u * (high - low)), low, high - 1).astype(jnp.int32)

    def bernoulli(self, size: int) -> jax.Array:
        """`[size]` bool, each True with probability 1/2."""
        return self._take(size) < 0.5

    def permutation(self, size: int) -> jax.Array:
        """`[size]` int32 uniformly random permutation of range(size).

        The ranks of iid uniforms (rare ties broken by position), by `size^2` comparisons:
        several times faster than `argsort` for these small sizes under vmap on CPU.
        """
        u = self._take(size)
        index = jnp.arange(size)
        before = (u[None, :] < u[:, None]) | (
            (u[None, :] == u[:, None]) & (index[None, :] < index[:, None])
        )
        return before.sum(axis=1).astype(jnp.int32)
