"""What the agent reads: the user's messages and the tool returns, as `[O]` int32 tokens.

user message       USER <intent word> ORDER_k [ADDR_a]    (USER off_topic for a distractor)
after every task   USER thanks
lookup_order       TOOL order ORDER_k ITEM_i <status> ADDR_a AMT_b
world call         TOOL ok|error ORDER_k
check_stock        TOOL stock ITEM_i in_stock|out_of_stock
BYE                USER goodbye
malformed turn     TOOL error
penalised call     TOOL blocked
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlagent.envs.toolworld import dsl
from rlagent.envs.toolworld.dsl import Command
from rlagent.envs.toolworld.types import State
from rlagent.envs.toolworld.types import TaskKind

# Token of the user's word for each task kind, indexed by TaskKind.
_INTENT_TOKENS = np.array([dsl.token(dsl.INTENT_WORDS[kind]) for kind in TaskKind], np.int32)


def pad(tokens: Sequence, obs_len: int) -> jax.Array:
    """`[O]` int32: `tokens` (ints or int32 scalars) followed by PAD."""
    tokens = jnp.stack([jnp.asarray(t, jnp.int32) for t in tokens])
    return jnp.pad(tokens, (0, obs_len - tokens.shape[0]))


def thanks(obs_len: int) -> jax.Array:
    """`USER thanks`: the user once every task is settled."""
    return pad([dsl.USER, dsl.token("thanks")], obs_len)


def blocked(obs_len: int) -> jax.Array:
    """`TOOL blocked`: a call stopped by the guardrail in penalise mode."""
    return pad([dsl.TOOL, dsl.token("blocked")], obs_len)


def user_message(kind: jax.Array, order: jax.Array, address: jax.Array, obs_len: int):
    """`USER <intent word> ORDER_k [ADDR_a]` as `[O]` int32 (int32 scalar arguments)."""
    word = jnp.asarray(_INTENT_TOKENS)[kind]
    order_token = jnp.where(kind == TaskKind.OFF_TOPIC, dsl.PAD, dsl.ORDER_0 + order)
    address_token = jnp.where(kind == TaskKind.CHANGE_ADDRESS, dsl.ADDR_0 + address, dsl.PAD)
    return pad([dsl.USER, word, order_token, address_token], obs_len)


def tool_return(
    state: State,
    command: jax.Array,
    order: jax.Array,
    item: jax.Array,
    world_ok: jax.Array,
    obs_len: int,
) -> jax.Array:
    """Observation `[O]` of a turn that does not settle a task (one branch per command).

    Args:
      state: the state before the turn (the lookup shows the order as it was).
      command: int32 scalar Command.
      order: int32 scalar order index (clipped to [0, N)).
      item: int32 scalar item index (clipped to [0, I)).
      world_ok: [] bool: a world-changing call succeeded.
      obs_len: O.
    """
    status_token = dsl.STATUS_0 + state.status[order]
    stock_word = jnp.where(state.in_stock[item], dsl.token("in_stock"), dsl.token("out_of_stock"))
    call_word = jnp.where(world_ok, dsl.token("ok"), dsl.token("error"))

    def lookup():
        return pad(
            [
                dsl.TOOL,
                dsl.token("order"),
                dsl.ORDER_0 + order,
                dsl.ITEM_0 + state.item[order],
                status_token,
                dsl.ADDR_0 + state.address[order],
                dsl.AMT_0 + state.amount[order],
            ],
            obs_len,
        )

    def world_call():
        return pad([dsl.TOOL, call_word, dsl.ORDER_0 + order], obs_len)

    def check_stock():
        return pad([dsl.TOOL, dsl.token("stock"), dsl.ITEM_0 + item, stock_word], obs_len)

    def say():  # only reached when no task is open: the user is still saying thanks
        return thanks(obs_len)

    def bye():
        return pad([dsl.USER, dsl.token("goodbye")], obs_len)

    def malformed():
        return pad([dsl.TOOL, dsl.token("error")], obs_len)

    # One branch per kind of return; the Command -> branch table is built from this dict.
    returns = {
        Command.LOOKUP_ORDER: lookup,
        Command.CHECK_STOCK: check_stock,
        Command.BYE: bye,
        Command.MALFORMED: malformed,
    }
    returns.update({c: world_call for c in dsl.WORLD_COMMANDS})
    returns.update({c: say for c in dsl.SAY_COMMANDS})
    branches = list(dict.fromkeys(returns.values()))
    branch_of_command = np.array([branches.index(returns[c]) for c in Command], np.int32)
    return jax.lax.switch(jnp.asarray(branch_of_command)[command], branches)
