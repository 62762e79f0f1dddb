"""Guardrail rules of ToolWorld: which tool calls break a business rule.

Rules (`Rule`, the index r of `Signals.violation_flags`):

    0 refund_unverified      CALL refund ORDER_k before ORDER_k was looked up this episode
    1 refund_ineligible      CALL refund ORDER_k when k is not delivered or already refunded
    2 change_after_shipping  CALL cancel_order / change_address ORDER_k when k has left
                             the warehouse (status shipped or delivered)
    3 amount_over_limit      CALL refund ORDER_k when the amount bucket of k exceeds the
                             automatic-refund limit (config.refund_limit)

All rules are about the order argument of a world-changing call: `broken_by_order` says,
per rule, which orders break it, and `RULE_COMMANDS` (the one table of which command each
rule is about) turns that into the per-turn flags (`violation_flags`) and into the token
mask (`forbidden_tokens`). Modes (`ToolWorldConfig.guardrail`, the one setting):

    'off'       violations are counted in the signals and spoil the outcome; the call runs.
    'penalise'  a violating call is blocked and ends the episode: outcome 0, reward -penalty.
    'mask'      as 'off' in `step`; `ToolWorld.allowed_tokens` also excludes every token
                that would break a rule (`forbidden_tokens`), so a sampler that draws from
                it (constrained decoding) cannot break one.
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp
import numpy as np

from rlagent.envs.toolworld import dsl
from rlagent.envs.toolworld.dsl import Command
from rlagent.envs.toolworld.types import State

GUARDRAIL_MODES = ("off", "penalise", "mask")


class Rule(enum.IntEnum):
    REFUND_UNVERIFIED = 0
    REFUND_INELIGIBLE = 1
    CHANGE_AFTER_SHIPPING = 2
    AMOUNT_OVER_LIMIT = 3


RULE_NAMES = tuple(rule.name.lower() for rule in Rule)
NUM_RULES = len(Rule)
# The commands each rule is about.
RULE_COMMANDS: dict[Rule, tuple[Command, ...]] = {
    Rule.REFUND_UNVERIFIED: (Command.REFUND,),
    Rule.REFUND_INELIGIBLE: (Command.REFUND,),
    Rule.CHANGE_AFTER_SHIPPING: (Command.CANCEL_ORDER, Command.CHANGE_ADDRESS),
    Rule.AMOUNT_OVER_LIMIT: (Command.REFUND,),
}


def _applies_table() -> np.ndarray:
    """`[R, C + 1]` bool: rule r is about command c (the MALFORMED column is all False)."""
    table = np.zeros((NUM_RULES, len(Command)), bool)
    for rule, commands in RULE_COMMANDS.items():
        table[rule, list(commands)] = True
    table.setflags(write=False)
    return table


_APPLIES = _applies_table()


def broken_by_order(state: State, refund_limit: int) -> jax.Array:
    """`[R, N]` bool: calling rule r's commands on order k would break rule r."""
    broken = {
        Rule.REFUND_UNVERIFIED: ~state.looked_up,
        Rule.REFUND_INELIGIBLE: (state.status != dsl.DELIVERED) | state.refunded,
        Rule.CHANGE_AFTER_SHIPPING: state.status != dsl.PROCESSING,
        Rule.AMOUNT_OVER_LIMIT: state.amount > refund_limit,
    }
    return jnp.stack([broken[rule] for rule in Rule])


def violation_flags(
    state: State, command: jax.Array, order: jax.Array, refund_limit: int
) -> jax.Array:
    """Rules broken by calling `command` on order index `order`: `[R]` bool.

    Args:
      state: the state before the call.
      command: int32 scalar Command (MALFORMED for unparsable turns).
      order: int32 scalar order index in [0, N) (ignored by non-order commands).
      refund_limit: largest amount bucket that may be refunded.
    """
    return broken_by_order(state, refund_limit)[:, order] & jnp.asarray(_APPLIES)[:, command]


def forbidden_tokens(state: State, refund_limit: int) -> jax.Array:
    """`[C, VOCAB_SIZE]` bool: argument-1 tokens (`ORDER_k`) that make command c break a rule.

    Argument 1 sits at position 2 of every pattern; only order tokens are ever forbidden.
    """
    broken = broken_by_order(state, refund_limit)  # [R, N]
    applies = jnp.asarray(_APPLIES[:, : dsl.NUM_COMMANDS])  # [R, C]
    forbidden_orders = (applies[:, :, None] & broken[:, None, :]).any(axis=0)  # [C, N]
    num_orders = state.status.shape[0]
    return (
        jnp.zeros((dsl.NUM_COMMANDS, dsl.VOCAB_SIZE), bool)
        .at[:, dsl.ORDER_0 : dsl.ORDER_0 + num_orders]
        .set(forbidden_orders)
    )
