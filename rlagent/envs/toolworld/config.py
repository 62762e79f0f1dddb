"""Configuration of ToolWorld: sizes, curriculum level, scenario, guardrail mode, verdict.

Tables indexed by `TaskKind`: `KIND_COST` (turns of the shortest correct handling of a
task) and `LEVEL_KINDS` (the intent pool of each curriculum level; see `toolworld`).

The oracle process verdict (`Signals.verdict`) has three design choices, each a field
filled from the preset `verdict` unless given (`VERDICT_PRESETS`):

    field                     clean (default)  legacy  the turn it judges
    verdict_bye_failed         0.0             +1.0    BYE once every task is settled but
                                                       some task failed
    verdict_wrong_final       -2.0             -1.0    settles a task wrongly (wrong or
                                                       ungrounded answer / final call) or
                                                       says BYE with a task still open
    verdict_unneeded_lookup    0.0             +1.0    first lookup of a change_address /
                                                       cancel task's order (not needed)

'clean' is what a process-reward designer would defend: closing a failed conversation is
no progress, an irreversible mistake costs more than a recoverable slip (-1: wrong tool
or argument, malformed turn, failed call, broken rule), and a detour is redundant, not
useful. 'legacy' is the first verdict (every valid step +1, every mistake -1), kept as a
reward-hacking study: it pays the give-up policy (wrong answer -1, BYE +1) and the
lookup detour before change_address / cancel.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from rlagent.envs.splits import check_split
from rlagent.envs.toolworld import dsl
from rlagent.envs.toolworld.guardrail import GUARDRAIL_MODES
from rlagent.envs.toolworld.types import TaskKind

KIND_NAMES = tuple(kind.label for kind in TaskKind)
INTENT_KINDS = tuple(kind for kind in TaskKind if kind != TaskKind.OFF_TOPIC)
# Turns of the shortest correct handling of each task kind.
KIND_COST: dict[TaskKind, int] = {
    TaskKind.CHANGE_ADDRESS: 1,  # change_address
    TaskKind.CANCEL: 1,  # cancel_order
    TaskKind.STATUS: 2,  # lookup_order, SAY status
    TaskKind.REFUND: 2,  # lookup_order, refund or SAY cannot
    TaskKind.EXCHANGE: 3,  # lookup_order, check_stock, exchange or SAY no_stock
    TaskKind.OFF_TOPIC: 1,  # SAY decline
}
LEVEL_KINDS: dict[int, tuple[TaskKind, ...]] = {
    1: (TaskKind.CHANGE_ADDRESS, TaskKind.CANCEL),
    2: (TaskKind.STATUS, TaskKind.REFUND),
    3: (TaskKind.EXCHANGE,),
    4: INTENT_KINDS,
}
SCENARIOS = ("agent", "dialogue")
# Verdict presets: (verdict_bye_failed, verdict_wrong_final, verdict_unneeded_lookup).
VERDICT_PRESETS: dict[str, tuple[float, float, float]] = {
    "clean": (0.0, -2.0, 0.0),
    "legacy": (1.0, -1.0, 1.0),
}
VERDICT_FIELDS = ("verdict_bye_failed", "verdict_wrong_final", "verdict_unneeded_lookup")
_INTEGER_FIELDS = (
    "level",
    "num_orders",
    "num_items",
    "num_addresses",
    "num_intents",
    "num_distractors",
    "max_turns",
    "turn_len",
    "obs_len",
    "refund_limit",
)


@dataclasses.dataclass(frozen=True)
class ToolWorldConfig:
    """Static configuration of ToolWorld (hashable: safe as a static jit argument).

    Fields left at None are filled from the level in `__post_init__`; a bad field raises
    a ValueError that names it.
    """

    level: int = 1  # curriculum level 1..4 (chooses the pool of intent kinds).
    scenario: str = "agent"  # 'agent' (tool use) or 'dialogue' (status questions only).
    num_orders: int = 8  # orders in the database, 8..16 (ORDER_0..ORDER_{N-1}).
    num_items: int = 8  # catalogue items, 2..8; also bounds num_intents.
    num_addresses: int = 4  # addresses ADDR_0..ADDR_{A-1}, 2..8.
    num_intents: int | None = None  # user intents per episode (1 at levels 1-3, 3 at 4).
    num_distractors: int | None = None  # off-topic requests mixed in (0; 1 at level 4).
    kinds: tuple[str, ...] | None = None  # override the level's intent pool (KIND_NAMES).
    max_turns: int | None = None  # S; default: longest possible shortest plan + 2.
    turn_len: int = 6  # L action tokens per turn (>= 5, the longest command).
    obs_len: int = 8  # O observation tokens (>= 7, the lookup return).
    guardrail: str = "off"  # 'off' | 'penalise' | 'mask' (see rlagent.envs.toolworld.guardrail).
    penalty: float = 1.0  # reward of a blocked call, however many rules it breaks: -penalty.
    refund_limit: int = 2  # largest amount bucket (AMT_0..AMT_3) refundable, 0..2.
    # Process verdict (module docstring): a preset, and its three values (None: preset's).
    verdict: str = "clean"  # 'clean' | 'legacy' (VERDICT_PRESETS).
    verdict_bye_failed: float | None = None  # BYE after a failed task (clean 0, legacy +1).
    verdict_wrong_final: float | None = None  # task settled wrongly / BYE too early (-2, -1).
    verdict_unneeded_lookup: float | None = None  # lookup before change_address (0, +1).
    # Held-out tasks: a fixed quarter of the (intent kind, order, item, address) cells is
    # held out; 'train' episodes hold none of them, 'heldout' episodes at least one, 'all'
    # samples as before (`rlagent.envs.splits`, `generator.heldout_cells`).
    task_split: str = "all"

    def __post_init__(self):
        self._check_types()
        self._check_ranges()
        self._fill_level_defaults()
        self._fill_verdict()

    @property
    def num_tasks(self) -> int:
        """K: tasks (intents + distractors) per episode, one progress marker each."""
        return self.num_intents + self.num_distractors

    @property
    def kind_ids(self) -> tuple[TaskKind, ...]:
        """Intent pool as TaskKinds."""
        return tuple(TaskKind[name.upper()] for name in self.kinds)

    def _fail(self, name: str, message: str):
        raise ValueError(f"ToolWorldConfig.{name}: {message}, got {getattr(self, name)!r}")

    def _check_types(self):
        """Integers are integers (2.5 turns would truncate silently), penalty is finite."""
        for name in _INTEGER_FIELDS:
            value = getattr(self, name)
            if value is None and name in ("num_intents", "num_distractors", "max_turns"):
                continue
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                self._fail(name, "must be an integer")
        penalty = self.penalty
        if not isinstance(penalty, numbers.Real) or isinstance(penalty, bool):
            self._fail("penalty", "must be a number")
        if not math.isfinite(penalty):
            self._fail("penalty", "must be finite")
        for name in VERDICT_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                self._fail(name, "must be a number")
            if not math.isfinite(value):
                self._fail(name, "must be finite")

    def _check_ranges(self):
        """Fields that do not depend on the level defaults."""
        if self.level not in LEVEL_KINDS:
            self._fail("level", "must be 1, 2, 3 or 4")
        if self.scenario not in SCENARIOS:
            self._fail("scenario", f"must be one of {SCENARIOS}")
        if self.guardrail not in GUARDRAIL_MODES:
            self._fail("guardrail", f"must be one of {GUARDRAIL_MODES}")
        if not 8 <= self.num_orders <= dsl.MAX_ORDERS:
            self._fail("num_orders", f"must be in [8, {dsl.MAX_ORDERS}]")
        if not 2 <= self.num_items <= dsl.MAX_ITEMS:
            self._fail("num_items", f"must be in [2, {dsl.MAX_ITEMS}]")
        if not 2 <= self.num_addresses <= dsl.MAX_ADDRESSES:
            self._fail("num_addresses", f"must be in [2, {dsl.MAX_ADDRESSES}]")
        if self.turn_len < dsl.MAX_COMMAND_LEN:
            self._fail("turn_len", f"must be >= {dsl.MAX_COMMAND_LEN} (longest command)")
        if self.obs_len < 7:
            self._fail("obs_len", "must be >= 7 (length of a lookup return)")
        if not 0 <= self.refund_limit < dsl.NUM_AMOUNTS - 1:
            self._fail("refund_limit", f"must be in [0, {dsl.NUM_AMOUNTS - 2}]")
        if self.penalty < 0:
            self._fail("penalty", "must be >= 0")
        if self.verdict not in VERDICT_PRESETS:
            self._fail("verdict", f"must be one of {tuple(VERDICT_PRESETS)}")
        check_split(self.task_split, self._fail)

    def _fill_level_defaults(self):
        """kinds, num_intents, num_distractors and max_turns from the level, then checked."""
        if self.kinds is None:
            pool = (TaskKind.STATUS,) if self.scenario == "dialogue" else LEVEL_KINDS[self.level]
            object.__setattr__(self, "kinds", tuple(kind.label for kind in pool))
        else:
            object.__setattr__(self, "kinds", tuple(self.kinds))
            names = tuple(kind.label for kind in INTENT_KINDS)
            if not self.kinds or any(k not in names for k in self.kinds):
                self._fail("kinds", f"must be a non-empty subset of {names}")
        if self.num_intents is None:
            object.__setattr__(self, "num_intents", 3 if self.level == 4 else 1)
        if self.num_distractors is None:
            object.__setattr__(self, "num_distractors", 1 if self.level == 4 else 0)
        if not 1 <= self.num_intents <= self.num_items:
            self._fail("num_intents", f"must be in [1, num_items={self.num_items}]")
        if self.num_distractors < 0:
            self._fail("num_distractors", "must be >= 0")
        if self.num_tasks > self.num_orders:
            self._fail("num_distractors", "num_intents + num_distractors must be <= num_orders")
        longest = 1 + self.num_intents * max(KIND_COST[k] for k in self.kind_ids)
        longest += self.num_distractors * KIND_COST[TaskKind.OFF_TOPIC]
        # The shortest plan of the easiest task (BYE included): fewer turns solve nothing.
        easiest = 1 + self.num_intents * min(KIND_COST[k] for k in self.kind_ids)
        easiest += self.num_distractors * KIND_COST[TaskKind.OFF_TOPIC]
        if self.max_turns is None:
            object.__setattr__(self, "max_turns", longest + 2)
        elif self.max_turns < easiest:
            self._fail(
                "max_turns", f"must be >= {easiest}, the shortest plan of the easiest task here "
                "(no episode could succeed in fewer turns)",
            )  # fmt: skip

    def _fill_verdict(self):
        """Verdict values left at None from the `verdict` preset, as floats."""
        for name, preset in zip(VERDICT_FIELDS, VERDICT_PRESETS[self.verdict], strict=True):
            value = getattr(self, name)
            object.__setattr__(self, name, float(preset if value is None else value))
