"""The token DSL of the dialogue environment: vocabulary, dialogue acts and the turn grammar.

An agent turn is a sequence of 1..max_acts *dialogue acts* followed by `END` and padded
with `PAD` to the turn length L = 4 * max_acts + 1 (the longest act is 4 tokens):

    ask       ATTR_a                  ask the user for their constraint on attribute a
    query                             search the catalogue with the constraints the user
                                      has told before this turn (KB returns the matches)
    inform    ENT_e ATTR_a VAL_v      tell the user that entity e has value v for a
    recommend ENT_e                   recommend entity e
    confirm   ATTR_a VAL_v            check an assumed constraint ("you want a = v?")
    chat                              answer the user's off-topic remark
    bye                               end the dialogue (only as the turn's last act)

e.g. `ask ATTR_2 ask ATTR_0 END PAD ...`. A parsed act is `(act, ent, attr, val)`: an act
has at most one argument of each class (entity, attribute, value), so the arguments are
stored by class, 0 where unused. A turn that fits no sequence of acts (or has none) is
malformed. The vocabulary is fixed (MAX_* sizes), so one policy vocabulary serves every
config; a config uses a prefix of the ENT / ATTR / VAL tokens.

The grammar is a small finite-state machine over tokens (`fsm_tables`), which both the
parser and the constrained-decoding mask of `DialogueEnv` run, so the two cannot drift.
"""

from __future__ import annotations

import enum
import functools
from typing import NamedTuple

import numpy as np

MAX_ENTITIES = 16
MAX_ATTRIBUTES = 12
MAX_VALUES = 4
MAX_ACTS = 3
MAX_ACT_LEN = 4  # inform ENT ATTR VAL

_SPECIAL = ("PAD", "END")
_ACT_WORDS = ("ask", "query", "inform", "recommend", "confirm", "chat", "bye")
# What the user and the knowledge base say (`messages`).
_USER_WORDS = (
    "USER", "u_inform", "affirm", "negate", "accept", "request", "repeat", "u_chat",
    "thanks", "goodbye", "leave", "huh", "any", "KB", "num_1", "num_2", "num_3",
    "num_many", "up", "down",
)  # fmt: skip

TOKEN_NAMES: tuple[str, ...] = (
    _SPECIAL
    + _ACT_WORDS
    + _USER_WORDS
    + tuple(f"ENT_{i}" for i in range(MAX_ENTITIES))
    + tuple(f"ATTR_{i}" for i in range(MAX_ATTRIBUTES))
    + tuple(f"VAL_{i}" for i in range(MAX_VALUES))
)
VOCAB_SIZE: int = len(TOKEN_NAMES)
TOKEN_IDS: dict[str, int] = {name: i for i, name in enumerate(TOKEN_NAMES)}


def token(name: str) -> int:
    """Id of the token called `name` (KeyError names the unknown token)."""
    return TOKEN_IDS[name]


PAD = token("PAD")
END = token("END")
ENT_0 = token("ENT_0")
ATTR_0 = token("ATTR_0")
VAL_0 = token("VAL_0")


class Act(enum.IntEnum):
    """A dialogue act of the agent (values index the `[NUM_ACTS, ...]` tables)."""

    ASK = 0
    QUERY = 1
    INFORM = 2
    RECOMMEND = 3
    CONFIRM = 4
    CHAT = 5
    BYE = 6
    NONE = 7  # an empty act slot (the turn has fewer acts).


NUM_ACTS = 7
HEADS = np.array([token(word) for word in _ACT_WORDS], np.int32)  # [NUM_ACTS]


class ArgClass(enum.IntEnum):
    """Argument classes; a parsed act stores one argument per class."""

    ENT = 0
    ATTR = 1
    VAL = 2


ACT_ARGS: dict[Act, tuple[ArgClass, ...]] = {
    Act.ASK: (ArgClass.ATTR,),
    Act.QUERY: (),
    Act.INFORM: (ArgClass.ENT, ArgClass.ATTR, ArgClass.VAL),
    Act.RECOMMEND: (ArgClass.ENT,),
    Act.CONFIRM: (ArgClass.ATTR, ArgClass.VAL),
    Act.CHAT: (),
    Act.BYE: (),
}
_CLASS_BASE = {ArgClass.ENT: ENT_0, ArgClass.ATTR: ATTR_0, ArgClass.VAL: VAL_0}


def turn_len(max_acts: int) -> int:
    """L: tokens of a turn of up to `max_acts` acts and its END."""
    return MAX_ACT_LEN * max_acts + 1


class FsmTables(NamedTuple):
    """The grammar as tables (numpy, read-only): see `fsm_tables`."""

    head_act: np.ndarray  # [V] int32: the act a head token starts, -1 for other tokens.
    act_len: np.ndarray  # [NUM_ACTS] int32: tokens of the act, head included.
    slot_class: np.ndarray  # [NUM_ACTS, MAX_ACT_LEN] int32: ArgClass at offset j, -1 none.
    class_low: np.ndarray  # [3] int32: first token of each argument class.
    class_high: np.ndarray  # [3] int32: one past the last token the config uses.


@functools.lru_cache(maxsize=32)
def fsm_tables(num_entities: int, num_attributes: int, num_values: int) -> FsmTables:
    """Grammar tables for a config's sizes (a class accepts its first `size` tokens)."""
    head_act = np.full(VOCAB_SIZE, -1, np.int32)
    head_act[HEADS] = np.arange(NUM_ACTS)
    act_len = np.array([1 + len(ACT_ARGS[Act(a)]) for a in range(NUM_ACTS)], np.int32)
    slot_class = np.full((NUM_ACTS, MAX_ACT_LEN), -1, np.int32)
    for act, classes in ACT_ARGS.items():
        slot_class[act, 1 : 1 + len(classes)] = classes
    sizes = {ArgClass.ENT: num_entities, ArgClass.ATTR: num_attributes, ArgClass.VAL: num_values}
    class_low = np.array([_CLASS_BASE[c] for c in ArgClass], np.int32)
    class_high = class_low + np.array([sizes[c] for c in ArgClass], np.int32)
    tables = FsmTables(head_act, act_len, slot_class, class_low, class_high)
    for table in tables:
        table.setflags(write=False)
    return tables


def encode(acts, max_acts: int) -> list[int]:
    """Token ids of a turn of `acts` [(Act, ent, attr, val), ...], END, PAD to L (plain Python)."""
    tokens = []
    for act, ent, attr, val in acts:
        args = {ArgClass.ENT: ent, ArgClass.ATTR: attr, ArgClass.VAL: val}
        tokens.append(int(HEADS[act]))
        tokens += [_CLASS_BASE[c] + int(args[c]) for c in ACT_ARGS[Act(act)]]
    tokens.append(END)
    return tokens + [PAD] * (turn_len(max_acts) - len(tokens))


def render(tokens) -> str:
    """Readable text of a token array of any shape (rows joined by newlines); PAD skipped."""
    array = np.asarray(tokens)
    if array.ndim == 0:
        array = array.reshape(1)
    if array.ndim > 1:
        return "\n".join(render(row) for row in array.reshape(-1, array.shape[-1]))
    words = [TOKEN_NAMES[t] if 0 <= t < VOCAB_SIZE else f"<unk:{t}>" for t in array.tolist()]
    return " ".join(word for word in words if word != "PAD")
