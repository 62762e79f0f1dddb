"""The token DSL of ToolWorld: vocabulary, command grammar and rendering.

One agent turn is one *command*, written as a short token sequence that ends with `END`
and is padded with `PAD` to the turn length L:

    CALL lookup_order   ORDER_k        END      -> TOOL order ORDER_k ITEM_i <status> ADDR_a AMT_b
    CALL cancel_order   ORDER_k        END
    CALL change_address ORDER_k ADDR_a END
    CALL refund         ORDER_k        END
    CALL check_stock    ITEM_i         END      -> TOOL stock ITEM_i in_stock|out_of_stock
    CALL exchange       ORDER_k ITEM_i END
    SAY  status         ORDER_k <status> END   (answer an order-status question)
    SAY  cannot         ORDER_k        END      (decline: the request is not allowed)
    SAY  no_stock       ITEM_i         END      (tell the user the item is out of stock)
    SAY  decline                       END      (decline an off-topic request)
    BYE                                END      (end the conversation)

User messages read `USER <intent word> ORDER_k [ADDR_a]`, e.g. `USER want_refund ORDER_3`.
The vocabulary is fixed (it does not depend on the environment config), so one policy
vocabulary serves every level; a config only uses a prefix of the ORDER/ITEM/ADDR tokens.

Every command pattern is a tuple of *slots*: a literal token or an argument class
(`ORDER`, `ITEM`, `ADDR`, `STATUS`). Argument 1 always sits at position 2 and argument 2
at position 3, so a parsed command is `(command, arg1, arg2)`, `command` a `Command` and the
arguments indices inside their class (`ORDER_3` -> 3). Tables over commands are indexed
by `Command` (`[C, ...]`, C = NUM_COMMANDS; `[C + 1]` when MALFORMED has an entry).
"""

from __future__ import annotations

import enum
import functools

import numpy as np

from rlagent.envs.toolworld.types import TaskKind

MAX_ORDERS = 16
MAX_ITEMS = 8
MAX_ADDRESSES = 8
NUM_AMOUNTS = 4
NUM_STATUSES = 3

_SPECIAL = ("PAD", "END", "CALL", "SAY", "BYE", "USER", "TOOL")
_TOOLS = ("lookup_order", "cancel_order", "change_address", "refund", "check_stock", "exchange")
_TEMPLATES = ("status", "cannot", "no_stock", "decline")
# The user's word for each task kind (`USER want_refund ORDER_3`).
INTENT_WORDS: dict[TaskKind, str] = {
    TaskKind.CHANGE_ADDRESS: "want_address",
    TaskKind.CANCEL: "want_cancel",
    TaskKind.STATUS: "ask_status",
    TaskKind.REFUND: "want_refund",
    TaskKind.EXCHANGE: "want_exchange",
    TaskKind.OFF_TOPIC: "off_topic",
}
_USER_WORDS = tuple(INTENT_WORDS[kind] for kind in TaskKind) + ("thanks", "goodbye")
_TOOL_WORDS = ("order", "ok", "error", "blocked", "stock", "in_stock", "out_of_stock")
_STATUSES = ("processing", "shipped", "delivered")

TOKEN_NAMES: tuple[str, ...] = (
    _SPECIAL
    + _TOOLS
    + _TEMPLATES
    + _USER_WORDS
    + _TOOL_WORDS
    + _STATUSES
    + tuple(f"AMT_{i}" for i in range(NUM_AMOUNTS))
    + tuple(f"ORDER_{i}" for i in range(MAX_ORDERS))
    + tuple(f"ITEM_{i}" for i in range(MAX_ITEMS))
    + tuple(f"ADDR_{i}" for i in range(MAX_ADDRESSES))
)
VOCAB_SIZE: int = len(TOKEN_NAMES)
TOKEN_IDS: dict[str, int] = {name: i for i, name in enumerate(TOKEN_NAMES)}


def token(name: str) -> int:
    """Id of the token called `name` (KeyError names the unknown token)."""
    return TOKEN_IDS[name]


PAD = token("PAD")
END = token("END")
CALL = token("CALL")
SAY = token("SAY")
BYE = token("BYE")
USER = token("USER")
TOOL = token("TOOL")
# First token of each class; a class member is base + index.
ORDER_0 = token("ORDER_0")
ITEM_0 = token("ITEM_0")
ADDR_0 = token("ADDR_0")
AMT_0 = token("AMT_0")
STATUS_0 = token("processing")

# Token positions of argument 1 and argument 2 in every command pattern.
ARG1_POSITION, ARG2_POSITION = 2, 3

# Order statuses (index into _STATUSES).
PROCESSING, SHIPPED, DELIVERED = 0, 1, 2


class Command(enum.IntEnum):
    """A parsed agent turn (values index `COMMAND_PATTERNS` and the `[C, ...]` tables)."""

    LOOKUP_ORDER = 0
    CANCEL_ORDER = 1
    CHANGE_ADDRESS = 2
    REFUND = 3
    CHECK_STOCK = 4
    EXCHANGE = 5
    SAY_STATUS = 6
    SAY_CANNOT = 7
    SAY_NO_STOCK = 8
    SAY_DECLINE = 9
    BYE = 10
    MALFORMED = 11  # the parse of a turn that fits no pattern.


COMMAND_PATTERNS: dict[Command, tuple[int | str, ...]] = {
    Command.LOOKUP_ORDER: (CALL, token("lookup_order"), "ORDER", END),
    Command.CANCEL_ORDER: (CALL, token("cancel_order"), "ORDER", END),
    Command.CHANGE_ADDRESS: (CALL, token("change_address"), "ORDER", "ADDR", END),
    Command.REFUND: (CALL, token("refund"), "ORDER", END),
    Command.CHECK_STOCK: (CALL, token("check_stock"), "ITEM", END),
    Command.EXCHANGE: (CALL, token("exchange"), "ORDER", "ITEM", END),
    Command.SAY_STATUS: (SAY, token("status"), "ORDER", "STATUS", END),
    Command.SAY_CANNOT: (SAY, token("cannot"), "ORDER", END),
    Command.SAY_NO_STOCK: (SAY, token("no_stock"), "ITEM", END),
    Command.SAY_DECLINE: (SAY, token("decline"), END),
    Command.BYE: (BYE, END),
}
# C: commands with a pattern (every Command but MALFORMED, which is C).
NUM_COMMANDS = len(COMMAND_PATTERNS)
assert tuple(COMMAND_PATTERNS) == tuple(Command)[:NUM_COMMANDS]
MAX_COMMAND_LEN = max(len(p) for p in COMMAND_PATTERNS.values())  # 5: the smallest turn_len.
# Commands that change the world (they may succeed, fail with an error, or break a rule).
WORLD_COMMANDS = (
    Command.CANCEL_ORDER,
    Command.CHANGE_ADDRESS,
    Command.REFUND,
    Command.EXCHANGE,
)
SAY_COMMANDS = (
    Command.SAY_STATUS,
    Command.SAY_CANNOT,
    Command.SAY_NO_STOCK,
    Command.SAY_DECLINE,
)

_CLASS_BASE = {"ORDER": ORDER_0, "ITEM": ITEM_0, "ADDR": ADDR_0, "STATUS": STATUS_0}


def _class_sizes(num_orders: int, num_items: int, num_addresses: int) -> dict[str, int]:
    return {
        "ORDER": num_orders,
        "ITEM": num_items,
        "ADDR": num_addresses,
        "STATUS": NUM_STATUSES,
    }


@functools.lru_cache(maxsize=32)
def slot_masks(turn_len: int, num_orders: int, num_items: int, num_addresses: int) -> np.ndarray:
    """Allowed tokens of every command at every position: `[NUM_COMMANDS, L, VOCAB_SIZE]` bool.

    Position j of command c accepts the literal token of the pattern, any member of the
    argument class (restricted to the config's sizes) or, after the pattern's END, PAD.
    A token sequence parses as command c iff every position is allowed by this table.
    """
    if turn_len < MAX_COMMAND_LEN:
        raise ValueError(f"turn_len must be >= {MAX_COMMAND_LEN}, got {turn_len}")
    sizes = _class_sizes(num_orders, num_items, num_addresses)
    masks = np.zeros((NUM_COMMANDS, turn_len, VOCAB_SIZE), dtype=bool)
    for c, pattern in COMMAND_PATTERNS.items():
        for j in range(turn_len):
            if j >= len(pattern):
                masks[c, j, PAD] = True
            elif isinstance(pattern[j], str):
                base = _CLASS_BASE[pattern[j]]
                masks[c, j, base : base + sizes[pattern[j]]] = True
            else:
                masks[c, j, pattern[j]] = True
    masks.setflags(write=False)
    return masks


@functools.lru_cache(maxsize=32)
def slot_ranges(
    turn_len: int, num_orders: int, num_items: int, num_addresses: int
) -> tuple[np.ndarray, np.ndarray]:
    """The same grammar as `slot_masks` as token ranges: `(low, high)`, each `[C, L]` int32.

    Position j of command c accepts exactly the tokens t with `low <= t < high` (a
    literal t is the range [t, t + 1); PAD after the pattern's END).
    """
    masks = slot_masks(turn_len, num_orders, num_items, num_addresses)
    low = masks.argmax(axis=-1).astype(np.int32)
    high = (low + masks.sum(axis=-1)).astype(np.int32)
    # Every slot is one contiguous range of token ids (classes are contiguous blocks).
    for c in COMMAND_PATTERNS:
        for j in range(turn_len):
            assert masks[c, j, low[c, j] : high[c, j]].all()
    low.setflags(write=False)
    high.setflags(write=False)
    return low, high


@functools.lru_cache(maxsize=32)
def encode_tables(turn_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tables that write a command: `(literal [C, L], arg_slot [C, L], class_base [C, L])`.

    The tokens of `(c, arg1, arg2)` are `literal[c]` where `arg_slot == 0`, else
    `class_base[c] + arg{arg_slot}`; positions after the pattern hold PAD (literal 0).
    """
    literal = np.zeros((NUM_COMMANDS, turn_len), np.int32)
    arg_slot = np.zeros((NUM_COMMANDS, turn_len), np.int32)
    class_base = np.zeros((NUM_COMMANDS, turn_len), np.int32)
    for c, pattern in COMMAND_PATTERNS.items():
        for j, slot in enumerate(pattern):
            if isinstance(slot, str):
                arg_slot[c, j] = j - 1  # position 2 -> arg 1, position 3 -> arg 2
                class_base[c, j] = _CLASS_BASE[slot]
            else:
                literal[c, j] = slot
    for table in (literal, arg_slot, class_base):
        table.setflags(write=False)
    return literal, arg_slot, class_base


def arg_bases() -> tuple[np.ndarray, np.ndarray]:
    """Class base token of argument 1 and 2 per command (0 where the argument is unused)."""
    base1 = np.zeros(NUM_COMMANDS + 1, np.int32)
    base2 = np.zeros(NUM_COMMANDS + 1, np.int32)
    for c, pattern in COMMAND_PATTERNS.items():
        if len(pattern) > 2 and isinstance(pattern[2], str):
            base1[c] = _CLASS_BASE[pattern[2]]
        if len(pattern) > 3 and isinstance(pattern[3], str):
            base2[c] = _CLASS_BASE[pattern[3]]
    return base1, base2


def num_args(command: int) -> int:
    """Number of arguments of `command` (0, 1 or 2; 0 for MALFORMED)."""
    return sum(isinstance(slot, str) for slot in COMMAND_PATTERNS.get(command, ()))


def encode(command: int, arg1: int = 0, arg2: int = 0, turn_len: int = MAX_COMMAND_LEN) -> list:
    """Token ids of one command, padded to `turn_len` (plain Python, for tests and tools)."""
    literal, arg_slot, class_base = encode_tables(turn_len)
    args = (0, arg1, arg2)
    return [
        int(literal[command, j])
        if arg_slot[command, j] == 0
        else int(class_base[command, j] + args[arg_slot[command, j]])
        for j in range(turn_len)
    ]


def parse(tokens, num_orders: int, num_items: int, num_addresses: int) -> tuple[int, int, int]:
    """Plain-Python parse of one turn: `(command, arg1, arg2)`; MALFORMED if no pattern fits."""
    tokens = [int(t) for t in np.asarray(tokens).reshape(-1)]
    masks = slot_masks(len(tokens), num_orders, num_items, num_addresses)
    base1, base2 = arg_bases()
    for c in COMMAND_PATTERNS:
        if all(masks[c, j, t] for j, t in enumerate(tokens)):
            return (
                c,
                tokens[2] - base1[c] if base1[c] else 0,
                tokens[3] - base2[c] if base2[c] else 0,
            )
    return Command.MALFORMED, 0, 0


def render(tokens) -> str:
    """Readable text of a token array of any shape (rows joined by newlines); PAD skipped."""
    array = np.asarray(tokens)
    if array.ndim == 0:
        array = array.reshape(1)
    if array.ndim > 1:
        return "\n".join(render(row) for row in array.reshape(-1, array.shape[-1]))
    words = []
    for t in array.tolist():
        if t == PAD:
            continue
        words.append(TOKEN_NAMES[t] if 0 <= t < VOCAB_SIZE else f"<unk:{t}>")
    return " ".join(words)
