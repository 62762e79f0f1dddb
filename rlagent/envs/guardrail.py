"""Guardrail rules of ToolWorld: which tool calls break a business rule.

Rules (index r of `violation_flags`):

    0 refund_unverified      CALL refund ORDER_k before ORDER_k was looked up this episode
    1 refund_ineligible      CALL refund ORDER_k when k is not delivered or already refunded
    2 change_after_shipping  CALL cancel_order / change_address ORDER_k when k has left
                             the warehouse (status shipped or delivered)
    3 amount_over_limit      CALL refund ORDER_k when the amount bucket of k exceeds the
                             automatic-refund limit (config.refund_limit)

All rules are about the order argument of a world-changing call, so one table
`forbidden_orders [NUM_COMMANDS, N]` (does calling command c on order k break a rule?)
drives both the per-turn flags and the token mask of `ToolWorld.allowed_tokens(...,
rules=True)`. Modes (`ToolWorldConfig.guardrail`):

    'off'       violations are counted in extras and spoil the outcome; the call runs.
    'penalise'  a violating call is blocked and ends the episode: outcome 0, reward -penalty.
    'mask'      as 'off' in `step`; the rollout samples from `allowed_tokens(rules=True)`,
                which excludes every rule-breaking token, so no violation can be sampled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from rlagent.envs import dsl

if TYPE_CHECKING:
    from rlagent.envs.toolworld import State

RULE_NAMES = (
    "refund_unverified",
    "refund_ineligible",
    "change_after_shipping",
    "amount_over_limit",
)
NUM_RULES = len(RULE_NAMES)
GUARDRAIL_MODES = ("off", "penalise", "mask")


def rule_table(state: State, refund_limit: int) -> jax.Array:
    """Per order, which rule each world call would break: `[NUM_RULES, N]` bool.

    Row r is the set of orders k for which the call that rule r is about breaks it
    (rows 0, 1, 3 are about refunds, row 2 about cancel / change_address).
    """
    not_delivered = state.status != dsl.DELIVERED
    return jnp.stack(
        [
            ~state.looked_up,
            not_delivered | state.refunded,
            state.status != dsl.PROCESSING,
            state.amount > refund_limit,
        ]
    )


def violation_flags(state: State, command: jax.Array, order: jax.Array, refund_limit: int):
    """Rules broken by calling `command` on order index `order`: `[NUM_RULES]` bool.

    Args:
      state: the state before the call.
      command: int32 scalar command id (dsl.MALFORMED for unparsable turns).
      order: int32 scalar order index in [0, N) (ignored by non-order commands).
      refund_limit: largest amount bucket that may be refunded.
    """
    table = rule_table(state, refund_limit)[:, order]  # [R]
    is_refund = command == dsl.REFUND
    is_change = (command == dsl.CANCEL) | (command == dsl.CHANGE_ADDRESS)
    applies = jnp.stack([is_refund, is_refund, is_change, is_refund])
    return table & applies


def forbidden_orders(state: State, refund_limit: int) -> jax.Array:
    """`[NUM_COMMANDS, N]` bool: calling command c on order k breaks at least one rule."""
    table = rule_table(state, refund_limit)
    refund_bad = table[0] | table[1] | table[3]
    change_bad = table[2]
    num_orders = state.status.shape[0]
    rows = []
    for command in range(dsl.NUM_COMMANDS):
        if command == dsl.REFUND:
            rows.append(refund_bad)
        elif command in (dsl.CANCEL, dsl.CHANGE_ADDRESS):
            rows.append(change_bad)
        else:
            rows.append(jnp.zeros((num_orders,), bool))
    return jnp.stack(rows)
