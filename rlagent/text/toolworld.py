"""ToolWorld in text mode: ToolWorld's dynamics, messages in natural language, tool calls
parsed from the model's text (a `rlagent.text.loop.TextEnvironment`; docs/text_envs.md).

The world is ToolWorld's (`rlagent.envs.toolworld`): `reset(seed)` samples the world of
`ToolWorld.reset(jax.random.key(seed))` (the JAX generator, so a seed is the same episode
in token and in text mode) and loads it into the plain-Python twin
(`ReferenceToolWorld`), which plays every turn. Each DSL command is a tool:

    lookup_order(order_id)  cancel_order(order_id)  change_address(order_id, address_id)
    refund(order_id)  check_stock(item_id)  exchange(order_id, item_id)
    tell_status(order_id, status)  tell_cannot(order_id)  tell_out_of_stock(item_id)
    decline_off_topic()  end_conversation()

(`tool_schemas`: JSON schemas, the chat template's `tools`). A turn is one tool call in
the Hermes / Qwen format, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
with any text around it; a turn without the tags whose whole text is one JSON object
`{"name": ..., "arguments": {...}}` is read as that call (small models often drop the
tags; the parser is `rlagent.text.toolcalls`'s, shared with the other text
environments). The call becomes its DSL command (`parse_turn`) and the twin steps on its
tokens.

A turn that is not exactly one well-formed call of a known tool with its arguments
(ids inside the world's ranges, `status` one of the statuses, no missing or extra
argument) is *malformed*: never an exception, it is played as ToolWorld plays a token turn
that fits no command (the twin steps on PAD tokens, which parse as `MALFORMED`): it costs
the turn, the verdict is -1 (a recoverable slip) and the tool answers with an error, here
naming the fault. `malformed == 1` exactly on the turns the twin parses as `MALFORMED`.

Replies: the twin's observation in words. A tool result is a `tool` message holding a
JSON object; a user message (the next request, "thank you" once every request is
settled) is a `user` message, after a `tool` message with the result of a world call that
settled the request.

Signals: ToolWorld's (`ToolWorld.signal_names`: outcome, verdict, efficiency,
violations), `malformed`, and `success`; `done` is termination (end_conversation, or a
call the guardrail blocks in 'penalise' mode). The 'mask' guardrail is refused: it relies
on constrained decoding over the DSL's tokens, which text mode has no equivalent of.
"""

from __future__ import annotations

import functools
import json
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlagent.envs.toolworld import dsl
from rlagent.envs.toolworld import generator
from rlagent.envs.toolworld.config import ToolWorldConfig
from rlagent.envs.toolworld.dsl import Command
from rlagent.envs.toolworld.env import ToolWorld
from rlagent.envs.toolworld.reference import ReferenceToolWorld
from rlagent.envs.toolworld.reference import RefState
from rlagent.text import toolcalls
from rlagent.text.chat import Message
from rlagent.text.toolcalls import parse_tool_calls

MALFORMED_SIGNAL = "malformed"
STATUSES: tuple[str, ...] = tuple(
    dsl.TOKEN_NAMES[dsl.STATUS_0 + s] for s in range(dsl.NUM_STATUSES)
)
# The tool of each DSL command: its name and description (arguments: from the pattern).
TOOL_SPECS: dict[Command, tuple[str, str]] = {
    Command.LOOKUP_ORDER: (
        "lookup_order", "Look an order up: its item, status, address and amount level.",
    ),
    Command.CANCEL_ORDER: ("cancel_order", "Cancel an order that is still processing."),
    Command.CHANGE_ADDRESS: (
        "change_address", "Change the delivery address of an order that is still processing.",
    ),
    Command.REFUND: ("refund", "Refund a delivered order."),
    Command.CHECK_STOCK: ("check_stock", "Check whether an item is in stock."),
    Command.EXCHANGE: (
        "exchange", "Exchange the item of a delivered order for a new one of the same item.",
    ),
    Command.SAY_STATUS: ("tell_status", "Tell the user the status of their order."),
    Command.SAY_CANNOT: (
        "tell_cannot", "Tell the user that their request about an order cannot be granted.",
    ),
    Command.SAY_NO_STOCK: ("tell_out_of_stock", "Tell the user that an item is out of stock."),
    Command.SAY_DECLINE: ("decline_off_topic", "Decline a request that is not about an order."),
    Command.BYE: ("end_conversation", "End the conversation once every request is handled."),
}  # fmt: skip
TOOL_COMMANDS: dict[str, Command] = {name: command for command, (name, _) in TOOL_SPECS.items()}
# The argument name of each DSL argument class.
_ARGUMENT_NAMES = {"ORDER": "order_id", "ITEM": "item_id", "ADDR": "address_id", "STATUS": "status"}
_USER_TEXT = {
    "want_address": "Please send my order {order} to address {address} instead.",
    "want_cancel": "Please cancel my order {order}.",
    "ask_status": "What is the status of my order {order}?",
    "want_refund": "I would like a refund for my order {order}.",
    "want_exchange": "I would like to exchange the item of my order {order}.",
    "off_topic": "Can you recommend a good film for tonight?",
    "thanks": "Thank you, that is all I needed.",
    "goodbye": "Goodbye!",
}
_SYSTEM = (
    "You are the customer-service agent of an online shop. Handle the user's requests one "
    "after another with the tools. Every turn, call exactly one tool, written as "
    '<tool_call>{{"name": <tool name>, "arguments": {{<argument>: <value>, ...}}}}</tool_call>'
    "; orders, items and addresses are integer ids. Shop policies: look an order up before "
    "you answer about it, refund it or exchange it. Refund only a delivered order that was not "
    "refunded yet and whose amount level is at most {refund_limit}; otherwise tell the user "
    "that the refund cannot be granted. Cancel or change the address of an order only while "
    "it is processing. For an exchange, look the order up, check the stock of its item, then "
    "exchange it if it is in stock or tell the user that it is out of stock. Decline requests "
    "that are not about an order. Once the user has nothing more to ask, end the "
    "conversation. You have {max_turns} turns."
)


class ParsedTurn(NamedTuple):
    """The DSL command of an assistant turn (`parse_turn`)."""

    command: Command  # MALFORMED when the text is no valid call.
    arg1: int  # argument 1 as an index in its class (0 if none).
    arg2: int  # argument 2 (0 if none).
    error: str | None  # why the turn is malformed (None if it is not).


class ToolWorldText:
    """ToolWorld as a text environment (module docstring); `copy.deepcopy` forks it."""

    signal_names = (*ToolWorld.signal_names, MALFORMED_SIGNAL)
    reward_components = (*ToolWorld.reward_components, MALFORMED_SIGNAL)

    def __init__(self, config: ToolWorldConfig):
        if config.guardrail == "mask":
            raise ValueError(
                "ToolWorldText: guardrail='mask' masks the DSL's tokens in constrained "
                "decoding, which text mode has no equivalent of; use 'off' or 'penalise'"
            )
        self.config = config
        self.world = ReferenceToolWorld(config)  # the twin that plays the turns.
        self.tools = tool_schemas(config)
        self.state: RefState | None = None

    @property
    def max_turns(self) -> int:
        return self.config.max_turns

    def reset(self, seed: int) -> list[Message]:
        """System and user messages of the world of `ToolWorld.reset(jax.random.key(seed))`."""
        self.state = self.world.load(_jax_reset(self.config)(jax.random.key(seed)))
        system = _SYSTEM.format(
            refund_limit=self.config.refund_limit, max_turns=self.config.max_turns
        )
        return [{"role": "system", "content": system}, *self._reply(self.state.obs, None)]

    def step(self, text: str) -> tuple[list[Message], dict[str, float], bool]:
        """Plays the assistant's turn `text`; a malformed turn is played, never raised."""
        if self.state is None:
            raise RuntimeError("ToolWorldText.step before reset")
        if self.state.terminated or self.state.truncated:
            raise RuntimeError("ToolWorldText.step after the episode ended")
        turn = parse_turn(text, self.config)
        if turn.command == Command.MALFORMED:
            action = [dsl.PAD] * self.config.turn_len  # fits no command: the twin's MALFORMED.
        else:
            action = self.world.encode(turn.command, turn.arg1, turn.arg2)
        self.state, timestep = self.world.step(self.state, action)
        signals = {name: float(getattr(timestep.signals, name)) for name in ToolWorld.signal_names}
        signals[MALFORMED_SIGNAL] = float(turn.command == Command.MALFORMED)
        signals["success"] = float(timestep.signals.success)
        return self._reply(timestep.obs, turn), signals, bool(self.state.terminated)

    def oracle_text(self) -> str:
        """The text of the oracle's next turn: the call of the shortest correct plan
        (`ReferenceToolWorld.oracle`)."""
        command, arg1, arg2 = self.world.parse(self.world.oracle(self.state))
        return tool_call_text(Command(command), arg1, arg2)

    def slip_text(self, rng: np.random.Generator) -> str:
        """A well-formed call of a random tool with random in-range arguments: a scripted
        mistake (`rlagent.text.pretrain`'s noisy players)."""
        command = list(TOOL_SPECS)[int(rng.integers(len(TOOL_SPECS)))]
        sizes = {**_class_sizes(self.config), "STATUS": len(STATUSES)}
        args = [int(rng.integers(sizes[slot])) for slot in _argument_classes(command)]
        return tool_call_text(command, *args)

    def episode_metrics(
        self, signals: dict[str, jax.Array], turn_mask: jax.Array, action_tokens: jax.Array
    ) -> dict[str, jax.Array]:
        """Batch metrics (float32 scalars) of `[B, S]` signals (0 off `turn_mask`), as
        ToolWorld's (its `collapse_rate` reads DSL tokens: not here) and `malformed_rate`,
        the share of played turns that were malformed."""
        del action_tokens
        valid = turn_mask.astype(jnp.float32)
        played = jnp.maximum(jnp.sum(valid), 1.0)
        violations = jnp.sum(signals["violations"] * valid, axis=1)
        return {
            "outcome": jnp.mean(jnp.sum(signals["outcome"] * valid, axis=1)),
            "process_score": jnp.sum(signals["verdict"] * valid) / played,
            "turns_over_plan": jnp.mean(-jnp.sum(signals["efficiency"] * valid, axis=1)),
            "violations": jnp.mean(violations),
            "violation_rate": jnp.mean(violations > 0),
            "malformed_rate": jnp.sum(signals[MALFORMED_SIGNAL] * valid) / played,
        }

    def _reply(self, obs: list[int], turn: ParsedTurn | None) -> list[Message]:
        """The twin's observation tokens as messages (module docstring)."""
        words = [dsl.TOKEN_NAMES[t] for t in obs if t != dsl.PAD]
        numbers = {word.rsplit("_", 1)[0]: _index(word) for word in words if word[-1].isdigit()}
        if words[0] == "USER":
            user = _USER_TEXT[words[1]].format(
                order=numbers.get("ORDER"), address=numbers.get("ADDR")
            )
            messages = [{"role": "user", "content": user}]
            if turn is not None and turn.command in dsl.WORLD_COMMANDS:  # it succeeded.
                messages.insert(0, _tool_message({"order_id": turn.arg1, "result": "ok"}))
            return messages
        kind = words[1]
        if kind == "order":
            result = {
                "order_id": numbers["ORDER"], "item_id": numbers["ITEM"], "status": words[4],
                "address_id": numbers["ADDR"], "amount_level": numbers["AMT"],
            }  # fmt: skip
        elif kind == "stock":
            result = {"item_id": numbers["ITEM"], "in_stock": words[3] == "in_stock"}
        elif kind == "blocked":
            result = {"error": "blocked: the call breaks a shop policy; the conversation ends"}
        elif "ORDER" in numbers:  # a world call that failed or settled nothing.
            result = {"order_id": numbers["ORDER"], "result": kind}
        else:  # `TOOL error` of a malformed turn.
            result = {"error": f"malformed turn: {turn.error}"}
        return [_tool_message(result)]


def make_toolworld_text(level: int = 1, **config: Any) -> ToolWorldText:
    """ToolWorld in text mode at a curriculum level; `config`: other `ToolWorldConfig`
    fields (scenario, guardrail 'off' or 'penalise', sizes, verdict, ...)."""
    return ToolWorldText(ToolWorldConfig(level=level, **config))


def tool_schemas(config: ToolWorldConfig) -> tuple[dict, ...]:
    """The tools' JSON schemas (OpenAI function format, as `apply_chat_template` takes
    them), with the id ranges of the config's world."""
    sizes = _class_sizes(config)
    tools = []
    for command, (name, description) in TOOL_SPECS.items():
        properties = {}
        for slot in _argument_classes(command):
            if slot == "STATUS":
                properties["status"] = {"type": "string", "enum": list(STATUSES)}
            else:
                properties[_ARGUMENT_NAMES[slot]] = {
                    "type": "integer", "minimum": 0, "maximum": sizes[slot] - 1,
                }  # fmt: skip
        parameters = {"type": "object", "properties": properties, "required": list(properties)}
        tools.append(
            {"type": "function", "function": {"name": name, "description": description,
                                              "parameters": parameters}}
        )  # fmt: skip
    return tuple(tools)


def tool_call_text(command: Command, arg1: int = 0, arg2: int = 0) -> str:
    """The text of one call of `command`'s tool (the inverse of `parse_turn`)."""
    name, _ = TOOL_SPECS[command]
    values = (arg1, arg2)
    arguments = {
        _ARGUMENT_NAMES[slot]: STATUSES[values[j]] if slot == "STATUS" else values[j]
        for j, slot in enumerate(_argument_classes(command))
    }
    return toolcalls.tool_call_text(name, arguments)


def parse_turn(text: str, config: ToolWorldConfig) -> ParsedTurn:
    """The DSL command of an assistant turn's text, or MALFORMED and why (never raises).

    One `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` with any text around it,
    or (without the tags) a text that is one such JSON object (`toolcalls.parse_tool_calls`).
    """
    parsed = parse_tool_calls(text)
    if parsed.error is not None:
        return _malformed(parsed.error)
    if len(parsed.calls) > 1:
        return _malformed(f"{len(parsed.calls)} tool calls; call exactly one tool per turn")
    if not parsed.calls:
        return _malformed(
            'no tool call; write one <tool_call>{"name": ..., "arguments": {...}}</tool_call>'
        )
    (call,) = parsed.calls
    if call.name not in TOOL_COMMANDS:
        return _malformed(f"unknown tool {call.name[:40]!r}; the tools are {list(TOOL_COMMANDS)}")
    return _command(TOOL_COMMANDS[call.name], call.arguments, config)


def _command(command: Command, arguments: dict, config: ToolWorldConfig) -> ParsedTurn:
    """The command with its arguments checked against the tool's schema."""
    sizes = _class_sizes(config)
    classes = _argument_classes(command)
    names = [_ARGUMENT_NAMES[slot] for slot in classes]
    name = TOOL_SPECS[command][0]
    if set(arguments) != set(names):
        missing, extra = sorted(set(names) - set(arguments)), sorted(set(arguments) - set(names))
        return _malformed(
            f"{name} takes the arguments {names}: missing {missing}, unexpected {extra}"
        )
    values = []
    for slot, argument in zip(classes, names, strict=True):
        value = arguments[argument]
        if slot == "STATUS":
            if value not in STATUSES:
                return _malformed(f"status must be one of {list(STATUSES)}, got {value!r:.40}")
            values.append(STATUSES.index(value))
        elif not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < sizes[slot]:
            return _malformed(
                f"{argument} must be an integer in [0, {sizes[slot] - 1}], got {value!r:.40}"
            )
        else:
            values.append(value)
    values += [0, 0]
    return ParsedTurn(command, values[0], values[1], None)


def _class_sizes(config: ToolWorldConfig) -> dict[str, int]:
    """The ids of each id class in the config's world."""
    return {"ORDER": config.num_orders, "ITEM": config.num_items, "ADDR": config.num_addresses}


def _argument_classes(command: Command) -> list[str]:
    """The DSL argument classes of `command` in order ('ORDER', 'ITEM', 'ADDR', 'STATUS')."""
    return [slot for slot in dsl.COMMAND_PATTERNS[command] if isinstance(slot, str)]


def _malformed(error: str) -> ParsedTurn:
    return ParsedTurn(Command.MALFORMED, 0, 0, error)


def _tool_message(result: dict) -> Message:
    return {"role": "tool", "content": json.dumps(result)}


def _index(word: str) -> int:
    """`ORDER_3` -> 3."""
    return int(word.rsplit("_", 1)[1])


@functools.cache
def _jax_reset(config: ToolWorldConfig):
    """ToolWorld's episode generator, jitted once per config."""
    return jax.jit(functools.partial(generator.generate, config))
