"""Row-wise functions evaluated only on live rows, in static chunks, differentiably.

Teacher-forced scoring runs one row per (episode, turn), and most turn slots belong to
episodes that already ended (about 60% in the main experiment): their rows are read by
nobody. `live_rows(fn, num_chunks)` sorts the live rows first, cuts the rows into
`num_chunks` chunks of static size and runs `fn` with a `lax.while_loop` over the chunks
that hold a live row only, in the forward and in the backward pass (a custom VJP, as
`while_loop` has no reverse-mode rule). Shapes stay static, so the trainer remains one
compiled program.

Under `vmap` (runs trained side by side) a `while_loop` runs until the member that needs
most chunks is done, the others idling through `select`: the work follows the largest
number of live rows in the batch of runs, not B x S. A data-dependent `lax.cond` would
save nothing there (it becomes a `select` of both branches).

`live_row_sum(fn, num_chunks)` is the same for a loss that is a sum over rows: each
chunk's value and gradients come from one `value_and_grad` in the forward loop, so the
backward pass only scales them (no second loop, no recomputation). Its loop also has a
vmap rule (`jax.custom_batching.custom_vmap`) that packs chunks across the members: the
(member, chunk) pairs holding live rows are dealt R at a time, each chunk run with its
own member's parameters, so the R members of a vmap take ceil(sum of chunks / R) steps
instead of the largest member's count (runs with live fractions 0.2-0.7 train side by
side in the main experiment); the sums are each member's own, up to float reassociation.

`live_map(fn, num_chunks)` is the forward-only map of the rollout (a turn's policy
calls on the episodes still playing): the same chunks and the same packing of
(member, chunk) pairs under `vmap`, each live row's result written back to its place,
and one pass over every row when nearly all are live (a rollout's first turn).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp


def live_rows(
    fn: Callable[[Any, Any, Any], jax.Array], num_chunks: int
) -> Callable[[Any, Any, Any, jax.Array], jax.Array]:
    """Wraps `fn(params, x, aux) -> [n, ...]` (rows independent) to skip dead rows.

    Returns `apply(params, x, aux, live) -> [N, ...]`: `fn`'s rows where `live [N]`,
    zeros elsewhere; differentiable in `params` and in `x` (a pytree of [N, ...] arrays),
    with the gradients of a plain `jnp.where(live, fn(params, x, aux), 0)`. `aux` is a
    pytree of [N, ...] arrays that are not differentiated (tokens, masks).
    """

    def forward(params, x, aux, live):
        chex.assert_rank(live, 1)
        order, count, chunk = _plan(live, num_chunks)
        packed_x, packed_aux = _pack((x, aux), order, chunk * num_chunks)
        first = _rows((packed_x, packed_aux), 0, chunk)
        shape = jax.eval_shape(fn, params, *first)
        out = jnp.zeros((chunk * num_chunks, *shape.shape[1:]), shape.dtype)

        def body(carry):
            i, out = carry
            start = i * chunk
            rows = fn(params, *_rows((packed_x, packed_aux), start, chunk))
            return i + 1, jax.lax.dynamic_update_slice_in_dim(out, rows, start, 0)

        _, out = jax.lax.while_loop(lambda c: c[0] < count, body, (jnp.int32(0), out))
        result = _unpack(out, order, live)
        return result, (params, packed_x, packed_aux, live, order, count)

    def backward(residuals, grad):
        params, packed_x, packed_aux, live, order, count = residuals
        chunk = _chunk_size(live.shape[0], num_chunks)
        packed_grad = _pack(_mask(grad, live), order, chunk * num_chunks)

        def body(carry):
            i, grad_params, grad_x = carry
            start = i * chunk
            x, aux = _rows((packed_x, packed_aux), start, chunk)
            _, vjp = jax.vjp(lambda p, x: fn(p, x, aux), params, x)
            chunk_params, chunk_x = vjp(_rows(packed_grad, start, chunk))
            grad_params = jax.tree.map(jnp.add, grad_params, chunk_params)
            grad_x = jax.tree.map(
                lambda g, c: jax.lax.dynamic_update_slice_in_dim(g, c, start, 0), grad_x, chunk_x
            )
            return i + 1, grad_params, grad_x

        zeros = jax.tree.map(jnp.zeros_like, (params, packed_x))
        _, grad_params, grad_x = jax.lax.while_loop(
            lambda c: c[0] < count, body, (jnp.int32(0), *zeros)
        )
        return grad_params, _unsort(grad_x, order), None, None

    @jax.custom_vjp
    def apply(params, x, aux, live):
        return forward(params, x, aux, live)[0]

    apply.defvjp(forward, backward)
    return apply


def live_row_sum(
    fn: Callable[[Any, Any, Any], tuple[jax.Array, Any]], num_chunks: int
) -> Callable[[Any, Any, Any, jax.Array], tuple[jax.Array, Any]]:
    """Wraps `fn(params, x, aux) -> (value [n], stats)` (rows independent) to sum live rows.

    Returns `apply(params, x, aux, live) -> (value [], stats)`: the sums over the rows
    where `live [N]` of `value` and of `stats` (a pytree of [n, ...] arrays). `value` is
    differentiable in `params` and in `x` (a pytree of [N, ...] arrays), with the
    gradients of a plain `jnp.sum(jnp.where(live, value, 0))`; `stats` carry no gradient
    (diagnostics). `aux` is a pytree of [N, ...] arrays not differentiated. The gradients
    are computed with the value, in the forward pass: meant for `jax.grad` /
    `jax.value_and_grad` of a loss (a call without differentiation pays for them too).
    """

    def chunk_sum(params, x, aux, live):
        value, stats = fn(params, x, aux)
        stats = jax.tree.map(lambda s: jnp.sum(_mask(s, live), axis=0), stats)
        return jnp.sum(jnp.where(live, value, 0.0)), stats

    value_and_grad = jax.value_and_grad(chunk_sum, argnums=(0, 1), has_aux=True)

    def zero_sums(params, packed, chunk):
        """Zeros of (value, stats, grad_params, grad_x) for `packed` (x, aux, live) rows."""
        value, stats = jax.eval_shape(chunk_sum, params, *_rows(packed, 0, chunk))
        return jax.tree.map(
            lambda a: jnp.zeros(a.shape, a.dtype), (value, stats, params, packed[0])
        )

    @jax.custom_batching.custom_vmap
    def sums(params, x, aux, live):
        """(value, stats, grad_params, grad_x) of one member: its chunks of live rows."""
        chex.assert_rank(live, 1)
        order, count, chunk = _plan(live, num_chunks)
        packed = _pack((x, aux, live), order, chunk * num_chunks)
        zeros = zero_sums(params, packed, chunk)

        def body(carry):
            i, value, stats, grad_params, grad_x = carry
            start = i * chunk
            (chunk_value, chunk_stats), (chunk_params, chunk_x) = value_and_grad(
                params, *_rows(packed, start, chunk)
            )
            grad_x = jax.tree.map(
                lambda g, c: jax.lax.dynamic_update_slice_in_dim(g, c, start, 0), grad_x, chunk_x
            )
            value, stats, grad_params = jax.tree.map(
                jnp.add, (value, stats, grad_params), (chunk_value, chunk_stats, chunk_params)
            )
            return i + 1, value, stats, grad_params, grad_x

        _, value, stats, grad_params, grad_x = jax.lax.while_loop(
            lambda c: c[0] < count, body, (jnp.int32(0), *zeros)
        )
        return value, stats, grad_params, _unsort(grad_x, order)

    @sums.def_vmap
    def sums_batched(axis_size, in_batched, params, x, aux, live):
        """R members at once, their chunks packed: every step runs R chunks of any members.

        Member r's live rows fill `count_r` chunks; the (member, chunk) pairs, listed member
        by member, are dealt R per step, each chunk with its own member's parameters, so
        the loop runs ceil(sum_r count_r / R) steps instead of max_r count_r.
        """
        params, x, aux, live = jax.tree.map(
            lambda a, batched: a if batched else jnp.broadcast_to(a, (axis_size, *a.shape)),
            (params, x, aux, live),
            tuple(in_batched),
        )
        chex.assert_rank(live, 2)
        order, counts = jax.vmap(lambda live: _plan(live, num_chunks)[:2])(live)
        chunk = _chunk_size(live.shape[1], num_chunks)
        packed = jax.vmap(lambda tree, order: _pack(tree, order, chunk * num_chunks))(
            (x, aux, live), order
        )
        zeros = jax.vmap(lambda params, packed: zero_sums(params, packed, chunk))(params, packed)
        ends = jnp.cumsum(counts)

        def body(carry):
            i, value, stats, grad_params, grad_x = carry
            member, start, valid = _deal(i, counts, ends, chunk)
            index = (member[:, None], start[:, None] + jnp.arange(chunk))
            rows, aux, live = jax.tree.map(lambda a: a[index], packed)
            member_params = jax.tree.map(lambda p: p[member], params)
            (chunk_value, chunk_stats), (chunk_params, chunk_x) = jax.vmap(value_and_grad)(
                member_params, rows, aux, live & valid[:, None]
            )
            value, stats, grad_params = jax.tree.map(
                lambda total, new: total.at[member].add(new),
                (value, stats, grad_params),
                (chunk_value, chunk_stats, chunk_params),
            )
            grad_x = jax.tree.map(lambda total, new: total.at[index].add(new), grad_x, chunk_x)
            return i + 1, value, stats, grad_params, grad_x

        steps = (ends[-1] + axis_size - 1) // axis_size
        _, value, stats, grad_params, grad_x = jax.lax.while_loop(
            lambda c: c[0] < steps, body, (jnp.int32(0), *zeros)
        )
        out = (value, stats, grad_params, jax.vmap(_unsort)(grad_x, order))
        return out, jax.tree.map(lambda _: True, out)

    def forward(params, x, aux, live):
        value, stats, grad_params, grad_x = sums(params, x, aux, live)
        return (value, stats), (grad_params, grad_x)

    def backward(residuals, grad):
        grad_value = grad[0]
        grad_params, grad_x = jax.tree.map(lambda g: grad_value * g, residuals)
        return grad_params, grad_x, None, None

    @jax.custom_vjp
    def apply(params, x, aux, live):
        return forward(params, x, aux, live)[0]

    apply.defvjp(forward, backward)
    return apply


def live_map(
    fn: Callable[[Any, Any], Any], num_chunks: int
) -> Callable[[Any, Any, jax.Array], Any]:
    """Wraps `fn(params, x) -> y` (rows independent) to run it on live rows only.

    `x` and `y` are pytrees of `[n, ...]` arrays (`x` may hold typed PRNG keys). Returns
    `apply(params, x, live) -> y`: `fn`'s rows where `live [N]`, zeros elsewhere, from a
    `lax.while_loop` over the chunks of live rows (sorted first). Not differentiable (the
    rollout's sampling). Under `vmap` (runs side by side) its rule deals the (member,
    chunk) pairs holding live rows R per step, each chunk run with its own member's
    `params`: ceil(sum of chunks / R) steps. When more than 3/4 of the rows are live
    (all members together) a `lax.cond` runs every row in one pass instead (as `fn`
    alone would; its numbers then equal `fn`'s bit for bit), so `fn` is compiled twice.
    A row's result does not depend on the rows it shares a chunk with when `fn`'s rows
    are independent, up to float rounding (XLA CPU picks its matmul kernel by the
    number of rows).
    """

    @jax.custom_batching.custom_vmap
    def apply(params, x, live):
        chex.assert_rank(live, 1)
        order, count, chunk = _plan(live, num_chunks)
        index, target = _map_plan(live, order, chunk * num_chunks)
        shape = jax.eval_shape(fn, params, jax.tree.map(lambda a: a[:chunk], x))
        out = _zeros(shape, live.shape[0])

        def body(carry):
            i, out = carry
            rows = jax.lax.dynamic_slice_in_dim(index, i * chunk, chunk)
            result = fn(params, jax.tree.map(lambda a: a[rows], x))
            to = jax.lax.dynamic_slice_in_dim(target, i * chunk, chunk)
            out = jax.tree.map(lambda o, r: o.at[to].set(r, mode="drop"), out, result)
            return i + 1, out

        def chunks(out):
            return jax.lax.while_loop(lambda c: c[0] < count, body, (jnp.int32(0), out))[1]

        def every_row(out):
            return jax.tree.map(lambda r: _mask(r, live), fn(params, x))

        return jax.lax.cond(_mostly_live(live), every_row, chunks, out)

    @apply.def_vmap
    def apply_batched(axis_size, in_batched, params, x, live):
        params, x, live = jax.tree.map(
            lambda a, batched: a if batched else jnp.broadcast_to(a, (axis_size, *a.shape)),
            (params, x, live),
            tuple(in_batched),
        )
        out = _live_map_batched(fn, num_chunks, params, x, live)
        return out, jax.tree.map(lambda _: True, out)

    return apply


def _live_map_batched(fn: Callable, num_chunks: int, params: Any, x: Any, live: jax.Array):
    """`live_map` of R members at once (leading axis R): every step runs R chunks of any
    members, listed member by member, each with its own member's `params` (as in
    `live_row_sum`'s rule)."""
    chex.assert_rank(live, 2)
    axis_size = live.shape[0]
    order, counts = jax.vmap(lambda live: _plan(live, num_chunks)[:2])(live)
    chunk = _chunk_size(live.shape[1], num_chunks)
    index, target = jax.vmap(lambda *a: _map_plan(*a, chunk * num_chunks))(live, order)
    first = jax.tree.map(lambda a: a[0], params), jax.tree.map(lambda a: a[0, :chunk], x)
    out = _zeros(jax.eval_shape(fn, *first), live.shape[1])
    out = jax.tree.map(lambda a: jnp.zeros((axis_size, *a.shape), a.dtype), out)
    ends = jnp.cumsum(counts)

    def body(carry):
        i, out = carry
        member, start, valid = _deal(i, counts, ends, chunk)
        slots = (member[:, None], start[:, None] + jnp.arange(chunk))
        rows = (member[:, None], index[slots])
        result = jax.vmap(fn)(
            jax.tree.map(lambda p: p[member], params), jax.tree.map(lambda a: a[rows], x)
        )
        # Lanes past the last pair, like dead rows, write nowhere (out of range).
        to = (member[:, None], jnp.where(valid[:, None], target[slots], live.shape[1]))
        out = jax.tree.map(lambda o, r: o.at[to].set(r, mode="drop"), out, result)
        return i + 1, out

    def chunks(out):
        steps = (ends[-1] + axis_size - 1) // axis_size
        return jax.lax.while_loop(lambda c: c[0] < steps, body, (jnp.int32(0), out))[1]

    def every_row(out):
        return jax.tree.map(lambda r: jax.vmap(_mask)(r, live), jax.vmap(fn)(params, x))

    return jax.lax.cond(_mostly_live(live), every_row, chunks, out)


def _deal(step, counts: jax.Array, ends: jax.Array, chunk: int):
    """Step `step` of dealing the (member, chunk) pairs that hold live rows, R at a time
    (R members; listed member by member, `counts [R]` chunks each, `ends` their cumsum):
    each lane's `member`, the first packed row of its chunk (`start`), and `valid` (False
    past the last pair; such lanes read member R - 1's row 0)."""
    axis_size = counts.shape[0]
    pair = step * axis_size + jnp.arange(axis_size)
    valid = pair < ends[-1]
    member = jnp.minimum(jnp.searchsorted(ends, pair, side="right"), axis_size - 1)
    start = jnp.where(valid, pair - ends[member] + counts[member], 0) * chunk
    return member, start, valid


def _mostly_live(live: jax.Array) -> jax.Array:
    """Whether `live_map` runs every row in one pass: its chunks would run nearly all
    rows anyway, in more steps (the first turn of a rollout, where all rows are live)."""
    return jnp.sum(live, dtype=jnp.int32) * 4 > live.size * 3


def _map_plan(live: jax.Array, order: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
    """`live_map`'s slots: the row each of `size` slots reads (live rows first, then the
    others, then row 0 again) and the row it writes (out of range unless live)."""
    rows = live.shape[0]
    index = jnp.pad(order, (0, size - rows))
    keep = jnp.pad(live[order], (0, size - rows))
    return index, jnp.where(keep, index, rows)


def _plan(live: jax.Array, num_chunks: int) -> tuple[jax.Array, jax.Array, int]:
    """(row order with live rows first, number of chunks to run, static chunk size)."""
    chunk = _chunk_size(live.shape[0], num_chunks)
    order = jnp.argsort(~live, stable=True)
    count = (jnp.sum(live, dtype=jnp.int32) + chunk - 1) // chunk
    return order, count, chunk


def _chunk_size(rows: int, num_chunks: int) -> int:
    return -(-rows // num_chunks)


def _pack(tree: Any, order: jax.Array, size: int) -> Any:
    """Rows in `order`, zero-padded to `size` rows."""

    def pack(x):
        pad = [(0, size - x.shape[0])] + [(0, 0)] * (x.ndim - 1)
        return jnp.pad(x[order], pad)

    return jax.tree.map(pack, tree)


def _zeros(shapes: Any, size: int) -> Any:
    """Zeros of `size` rows for a pytree of `jax.ShapeDtypeStruct` of chunk rows."""
    return jax.tree.map(lambda a: jnp.zeros((size, *a.shape[1:]), a.dtype), shapes)


def _unsort(tree: Any, order: jax.Array) -> Any:
    """`_pack`'s inverse: the first rows of every leaf, back in their original places."""
    inverse = jnp.argsort(order)
    return jax.tree.map(lambda x: x[: order.shape[0]][inverse], tree)


def _unpack(packed: jax.Array, order: jax.Array, live: jax.Array) -> jax.Array:
    return _mask(_unsort(packed, order), live)


def _mask(x: jax.Array, live: jax.Array) -> jax.Array:
    return jnp.where(live.reshape(-1, *([1] * (x.ndim - 1))), x, jnp.zeros((), x.dtype))


def _rows(tree: Any, start: jax.Array | int, size: int) -> Any:
    return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, size, 0), tree)
