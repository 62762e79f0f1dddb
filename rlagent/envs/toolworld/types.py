"""Types of ToolWorld: enums of task kinds and progress, and the pytrees of `reset` / `step`.

Sizes: N orders, I items, K tasks (intents + distractors), O observation tokens, R guardrail
rules (`rlagent.envs.toolworld.guardrail.Rule`). Every module of `rlagent.envs.toolworld`
imports from here, and this module imports from none of them (only the protocol's
`StepType`).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import jax

from rlagent.envs.base import StepType  # noqa: F401  (re-exported: ToolWorld's step types)


class TaskKind(enum.IntEnum):
    """What the user asks for (stored as int32 in `State.task_kind`)."""

    CHANGE_ADDRESS = 0
    CANCEL = 1
    STATUS = 2
    REFUND = 3
    EXCHANGE = 4
    OFF_TOPIC = 5  # a distractor: the agent declines it.

    @property
    def label(self) -> str:
        """The kind's name in `ToolWorldConfig.kinds`, e.g. 'change_address'."""
        return self.name.lower()


class Progress(enum.IntEnum):
    """Per-task progress marker (`Observation.progress`, `State.progress`)."""

    ABSENT = 0  # not asked yet.
    PENDING = 1  # the current task.
    DONE = 2  # settled correctly.
    FAILED = 3  # settled wrongly (wrong answer or action, or ungrounded).


class Observation(NamedTuple):
    tokens: jax.Array  # [O] int32: user message or tool return to read before the next turn.
    progress: jax.Array  # [K] int32: a Progress marker per task.


class Signals(NamedTuple):
    """Per-turn signals of one step, beyond the reward (all zero where they do not apply).

    The reset timestep carries zeros except `shortest_plan`; a step from a terminal
    (absorbing) state carries zeros only.
    """

    outcome: jax.Array  # [] float32: 1 on the last step iff BYE, every task done, no rule broken.
    success: jax.Array  # [] bool: outcome == 1 (the episode is solved).
    verdict: jax.Array  # [] float32: process verdict, +1 useful / 0 redundant / -1 slip and
    # the config's values for irreversible mistakes, BYE after a failure, an unneeded lookup.
    efficiency: jax.Array  # [] float32: -1 on a turn past the shortest plan, else 0.
    violations: jax.Array  # [] int32: number of guardrail rules broken by this turn.
    violation_flags: jax.Array  # [R] bool: which rules this turn broke (Rule order).
    shortest_plan: jax.Array  # [] int32: turns of the episode's shortest correct plan.
    accuracy: jax.Array  # [] float32: dialogue, last step: share of questions answered right.
    user_feedback: jax.Array  # [] float32: dialogue, last step: +1 all right and in time, -1.


class TimeStep(NamedTuple):
    step_type: jax.Array  # [] int8 StepType.
    reward: jax.Array  # [] float32: outcome (0/1) on the last step, -penalty if blocked.
    discount: jax.Array  # [] float32: 0 after termination, else 1.
    observation: Observation
    signals: Signals


class State(NamedTuple):
    """Full environment state."""

    key: jax.Array  # PRNG key the episode was reset with.
    item: jax.Array  # [N] int32: item index of each order.
    status: jax.Array  # [N] int32: PROCESSING 0 / SHIPPED 1 / DELIVERED 2.
    address: jax.Array  # [N] int32: delivery address index.
    amount: jax.Array  # [N] int32: amount bucket 0..3.
    cancelled: jax.Array  # [N] bool.
    refunded: jax.Array  # [N] bool.
    exchanged: jax.Array  # [N] bool.
    in_stock: jax.Array  # [I] bool: inventory.
    looked_up: jax.Array  # [N] bool: the agent looked the order up this episode.
    stock_checked: jax.Array  # [I] bool: the agent checked the item's stock this episode.
    task_kind: jax.Array  # [K] int32: TaskKind of each task.
    task_order: jax.Array  # [K] int32: order the task is about (distinct across tasks).
    task_address: jax.Array  # [K] int32: requested new address (change_address tasks).
    progress: jax.Array  # [K] int32: Progress of each task.
    current: jax.Array  # [] int32: index of the current task; K once all are settled.
    turn: jax.Array  # [] int32: turns played.
    violated: jax.Array  # [] bool: some guardrail rule was broken this episode.
    correct_answers: jax.Array  # [] int32: factually correct status answers (dialogue).
    shortest_plan: jax.Array  # [] int32: turns of the shortest correct plan.
    terminated: jax.Array  # [] bool: BYE or a penalised violation ended the episode.
    truncated: jax.Array  # [] bool: max_turns reached without termination.
    obs: jax.Array  # [O] int32: the last observation tokens (repeated when absorbing).


class TaskView(NamedTuple):
    """The current task seen with ground truth; shared by `step` and the oracle policy."""

    active: jax.Array  # [] bool: a task is open (else the agent should say BYE).
    index: jax.Array  # [] int32: current task, clipped to K - 1.
    kind: jax.Array  # [] int32 TaskKind.
    order: jax.Array  # [] int32.
    address: jax.Array  # [] int32: requested new address.
    item: jax.Array  # [] int32: item of the task's order.
    looked_up: jax.Array  # [] bool.
    stock_checked: jax.Array  # [] bool: stock of `item` checked.
    final_command: jax.Array  # [] int32 Command that settles the task correctly.
    final_arg1: jax.Array  # [] int32.
    final_arg2: jax.Array  # [] int32.
    grounded: jax.Array  # [] bool: the facts behind the final command were observed.
