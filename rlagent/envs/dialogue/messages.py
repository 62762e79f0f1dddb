"""What the agent reads: the user's message, the knowledge base's return and the thumb.

An observation `[O]` is, in order:

    USER                          1 token (or `USER goodbye` / `USER leave` at the end)
    act replies   max_acts x 3    one item per act of the agent's turn, in order
    agenda item   3               the user's own move
    chat item     3               an off-topic remark awaiting an answer
    KB return     3 + A           `KB <count> ENT_e VAL..` after a query, else PAD
    thumb         1               `up` / `down` / PAD

Items (3 tokens, PAD where unused):

    u_inform ATTR_a VAL_v|any     the user's constraint on a (any: it does not care)
    affirm   ATTR_a VAL_v         yes, a = v (to confirm)
    negate   ATTR_a VAL_v|any     no: a is v (to confirm, or to a recommendation)
    accept   ENT_e                the user takes the recommended entity
    request  ATTR_a               what is a (of the accepted entity)?
    repeat   ATTR_a | u_chat      the same question again: the last turn ignored it
    u_chat                        an off-topic remark
    thanks                        every request is answered
    huh                           the turn was malformed

The KB return shows the number of matches (num_1, num_2, num_3, num_many) and the first
match (lowest index) with its A values.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from rlagent.envs.dialogue import dsl
from rlagent.envs.dialogue.config import DialogueConfig

T = dsl.TOKEN_IDS
COUNT_TOKENS = (T["num_1"], T["num_2"], T["num_3"], T["num_many"])
ITEM_LEN = 3


def item(word: int, first=dsl.PAD, second=dsl.PAD) -> jax.Array:
    """`[3]` int32 item (int32 scalars or ints)."""
    return jnp.stack([jnp.asarray(t, jnp.int32) for t in (word, first, second)])


def empty_item() -> jax.Array:
    return jnp.zeros((ITEM_LEN,), jnp.int32)


def pad(tokens: Sequence, length: int) -> jax.Array:
    tokens = jnp.stack([jnp.asarray(t, jnp.int32) for t in tokens])
    return jnp.pad(tokens, (0, length - tokens.shape[0]))


def opening(config: DialogueConfig, attr: jax.Array, value: jax.Array) -> jax.Array:
    """`[O]`: USER, empty act replies, the first constraint as the agenda item."""
    empty = [empty_item()] * config.max_acts
    agenda = item(T["u_inform"], dsl.ATTR_0 + attr, dsl.VAL_0 + value)
    return compose(config, empty, agenda, empty_item(), kb_return=None, thumb=dsl.PAD)


def kb_return(kb: jax.Array, top: jax.Array, count: jax.Array) -> jax.Array:
    """`[3 + A]`: `KB <count> ENT_top VAL..` (count >= 1: the target always matches)."""
    count_token = jnp.asarray(COUNT_TOKENS, jnp.int32)[jnp.clip(count, 1, 4) - 1]
    head = jnp.stack([jnp.int32(T["KB"]), count_token, dsl.ENT_0 + top]).astype(jnp.int32)
    return jnp.concatenate([head, dsl.VAL_0 + kb[top]]).astype(jnp.int32)


def compose(
    config: DialogueConfig,
    replies: Sequence[jax.Array],
    agenda: jax.Array,
    chat: jax.Array,
    *,
    kb_return: jax.Array | None,
    thumb: jax.Array | int,
) -> jax.Array:
    """`[O]` int32 of a mid-dialogue message (`kb_return` None: no query this turn)."""
    kb_len = 3 + config.num_attributes
    kb_part = jnp.zeros((kb_len,), jnp.int32) if kb_return is None else kb_return
    parts = [jnp.full((1,), T["USER"], jnp.int32), *replies, agenda, chat, kb_part]
    return jnp.concatenate(parts + [jnp.reshape(jnp.asarray(thumb, jnp.int32), (1,))])


def closing(config: DialogueConfig, word: jax.Array, thumb: jax.Array) -> jax.Array:
    """`[O]`: `USER goodbye|leave`, PAD, the thumb last."""
    body = pad([T["USER"], word], config.obs_len - 1)
    return jnp.concatenate([body, jnp.reshape(jnp.asarray(thumb, jnp.int32), (1,))])
