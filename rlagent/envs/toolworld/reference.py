"""Plain-Python reference implementation of ToolWorld (no JAX, no NumPy in `step`).

Written from the rules in `rlagent.envs.toolworld.env`'s docstring with ordinary `if`
statements, as an independent check of the vectorised JAX dynamics (differential tests
replay the same action sequences on both) and as the speed baseline of
`experiments/bench_env.py`. `load` copies a JAX state (so both start from the same
world); `reset` samples a world from the same distribution with Python's `random`.
"""

from __future__ import annotations

import dataclasses
import functools
import random

import numpy as np

from rlagent.envs.splits import draw_split_python
from rlagent.envs.splits import heldout_index_int
from rlagent.envs.toolworld import dsl
from rlagent.envs.toolworld.config import KIND_COST
from rlagent.envs.toolworld.config import ToolWorldConfig
from rlagent.envs.toolworld.dsl import Command
from rlagent.envs.toolworld.guardrail import NUM_RULES
from rlagent.envs.toolworld.guardrail import Rule
from rlagent.envs.toolworld.types import Progress
from rlagent.envs.toolworld.types import Signals
from rlagent.envs.toolworld.types import StepType
from rlagent.envs.toolworld.types import TaskKind

_THANKS = [dsl.USER, dsl.token("thanks")]
_GOODBYE = [dsl.USER, dsl.token("goodbye")]


@dataclasses.dataclass
class RefState:
    item: list
    status: list
    address: list
    amount: list
    cancelled: list
    refunded: list
    exchanged: list
    in_stock: list
    looked_up: list
    stock_checked: list
    task_kind: list
    task_order: list
    task_address: list
    progress: list
    current: int
    turn: int
    violated: bool
    correct_answers: int
    shortest_plan: int
    terminated: bool
    truncated: bool
    obs: list


@dataclasses.dataclass
class RefTimeStep:
    step_type: int
    reward: float
    discount: float
    obs: list
    progress: list
    signals: Signals  # with Python scalars, and a list of R bools for violation_flags.


class ReferenceToolWorld:
    """Same dynamics as `ToolWorld`, one episode at a time, in plain Python."""

    def __init__(self, config: ToolWorldConfig):
        self.config = config
        cfg = config
        sizes = {
            "ORDER": cfg.num_orders,
            "ITEM": cfg.num_items,
            "ADDR": cfg.num_addresses,
            "STATUS": dsl.NUM_STATUSES,
        }
        bases = {"ORDER": dsl.ORDER_0, "ITEM": dsl.ITEM_0, "ADDR": dsl.ADDR_0}
        bases["STATUS"] = dsl.STATUS_0
        # Per command: the token pattern as (literal or None, class base, class size).
        self._patterns = {}
        for command, pattern in dsl.COMMAND_PATTERNS.items():
            slots = []
            for slot in pattern:
                if isinstance(slot, str):
                    slots.append((None, bases[slot], sizes[slot]))
                else:
                    slots.append((slot, 0, 0))
            self._patterns[command] = slots

    # Episode start ---------------------------------------------------------------------
    def load(self, state) -> RefState:
        """A reference state equal to one (unbatched) JAX `State`."""
        leaves = {f: np.asarray(getattr(state, f)) for f in RefState.__dataclass_fields__}
        values = {}
        for name, value in leaves.items():
            values[name] = value.tolist() if value.ndim else value.item()
        return RefState(**values)

    def reset(self, rng: random.Random) -> RefState:
        """Samples a world and a task queue (same distribution as `ToolWorld.reset`); with
        a `task_split`, redraws until the episode is of its split."""
        draw = functools.partial(self._draw, rng)
        return draw_split_python(self.config.task_split, draw, self.episode_heldout)

    def heldout_cell(self, kind: int, order: int, item: int, address: int) -> bool:
        """Whether a task cell is held out (`generator.heldout_cells`, in plain integers)."""
        cfg = self.config
        cell = ((int(kind) * cfg.num_orders + order) * cfg.num_items + item) * cfg.num_addresses
        cell += address
        return heldout_index_int(cell)

    def episode_heldout(self, state: RefState) -> bool:
        """Some intent task (not a distractor) of the episode has a held-out cell."""
        return any(
            kind != TaskKind.OFF_TOPIC
            and self.heldout_cell(kind, order, state.item[order], address)
            for kind, order, address in zip(
                state.task_kind, state.task_order, state.task_address, strict=True
            )
        )

    def _draw(self, rng: random.Random) -> RefState:
        """One draw of an episode (`reset` without the split)."""
        cfg = self.config
        n, i, a = cfg.num_orders, cfg.num_items, cfg.num_addresses
        item = [rng.randrange(i) for _ in range(n)]
        status = [rng.randrange(dsl.NUM_STATUSES) for _ in range(n)]
        address = [rng.randrange(a) for _ in range(n)]
        amount = [rng.randrange(dsl.NUM_AMOUNTS) for _ in range(n)]
        in_stock = [rng.random() < 0.5 for _ in range(i)]
        kinds = [rng.choice(cfg.kind_ids) for _ in range(cfg.num_intents)]
        kinds += [TaskKind.OFF_TOPIC] * cfg.num_distractors
        rng.shuffle(kinds)
        orders = rng.sample(range(n), cfg.num_tasks)
        free_items = rng.sample(range(i), i)
        task_address = []
        for kind, order in zip(kinds, orders, strict=True):
            if kind in (TaskKind.CHANGE_ADDRESS, TaskKind.CANCEL):
                status[order] = dsl.PROCESSING
            elif kind == TaskKind.REFUND:
                if rng.random() < 0.5:
                    status[order] = dsl.DELIVERED
                    amount[order] = rng.randrange(cfg.refund_limit + 1)
                elif rng.random() < 0.5:
                    status[order] = rng.choice((dsl.PROCESSING, dsl.SHIPPED))
                else:
                    status[order] = dsl.DELIVERED
                    amount[order] = rng.randrange(cfg.refund_limit + 1, dsl.NUM_AMOUNTS)
            elif kind == TaskKind.EXCHANGE:
                status[order] = dsl.DELIVERED
                item[order] = free_items.pop()
                in_stock[item[order]] = rng.random() < 0.5
            task_address.append((address[order] + rng.randrange(1, a)) % a)
        progress = [Progress.PENDING] + [Progress.ABSENT] * (cfg.num_tasks - 1)
        return RefState(
            item=item,
            status=status,
            address=address,
            amount=amount,
            cancelled=[False] * n,
            refunded=[False] * n,
            exchanged=[False] * n,
            in_stock=in_stock,
            looked_up=[False] * n,
            stock_checked=[False] * i,
            task_kind=kinds,
            task_order=orders,
            task_address=task_address,
            progress=progress,
            current=0,
            turn=0,
            violated=False,
            correct_answers=0,
            shortest_plan=1 + sum(KIND_COST[k] for k in kinds),
            terminated=False,
            truncated=False,
            obs=self._user_message(kinds[0], orders[0], task_address[0]),
        )

    # Dynamics --------------------------------------------------------------------------
    def parse(self, action) -> tuple[int, int, int]:
        """`(command, arg1, arg2)`, or `(MALFORMED, 0, 0)`."""
        for command, slots in self._patterns.items():
            args = []
            ok = True
            for j, token in enumerate(action):
                if j >= len(slots):
                    ok = token == dsl.PAD
                else:
                    literal, base, size = slots[j]
                    if literal is not None:
                        ok = token == literal
                    else:
                        ok = base <= token < base + size
                        args.append(token - base)
                if not ok:
                    break
            if ok:
                args += [0, 0]
                return command, args[0], args[1]
        return Command.MALFORMED, 0, 0

    def step(self, state: RefState, action) -> tuple[RefState, RefTimeStep]:
        """Plays one turn in place; returns the (same, updated) state and its timestep.

        Kept as one readable sequence mirroring the JAX step's stages (parse, rules, world,
        settle, verdict, terminate, observe), each stage a helper call, so the two
        implementations can be compared line by line.
        """
        cfg = self.config
        if state.terminated or state.truncated:
            return state, _ended_timestep(state)
        command, arg1, arg2 = self.parse([int(t) for t in action])
        active = state.current < cfg.num_tasks
        task = min(state.current, cfg.num_tasks - 1)
        final, grounded = self._final_step(state, task)
        flags = self._broken_rules(state, command, arg1)
        violation = any(flags)
        blocked = violation and cfg.guardrail == "penalise"
        call_ok = _call_succeeds(state, command, arg1, arg2)
        tool_return = _tool_return(state, command, arg1, call_ok)

        # Settling and the process verdict, before the state changes.
        nargs = dsl.num_args(command)
        matches = command == final[0] and (nargs < 1 or arg1 == final[1])
        matches = matches and (nargs < 2 or arg2 == final[2])
        settles = active and not blocked and (command in dsl.SAY_COMMANDS or call_ok)
        done = settles and matches and grounded
        verdict = self._verdict(
            state,
            task,
            active=active,
            settles=settles,
            done=done,
            command=command,
            arg1=arg1,
            violation=violation,
        )
        kind, task_order = state.task_kind[task], state.task_order[task]
        if (
            active
            and not blocked
            and kind == TaskKind.STATUS
            and command == Command.SAY_STATUS
            and arg1 == task_order
            and arg2 == state.status[task_order]
        ):
            state.correct_answers += 1

        if call_ok and not blocked:
            _run_call(state, command, arg1, arg2)
        if command == Command.LOOKUP_ORDER:
            state.looked_up[arg1] = True
        if command == Command.CHECK_STOCK:
            state.stock_checked[arg1] = True
        obs = self._settle(
            state, task, settles=settles, done=done, blocked=blocked, tool_return=tool_return
        )

        efficiency, last, outcome = self._terminate(state, command, violation, blocked)
        state.obs = obs
        signals = self._signals(state, last, outcome, verdict, efficiency, flags)
        if blocked:
            reward = -cfg.penalty
        else:
            reward = 1.0 if outcome else 0.0
        return state, RefTimeStep(
            step_type=StepType.LAST if last else StepType.MID,
            reward=reward,
            discount=0.0 if state.terminated else 1.0,
            obs=list(obs),
            progress=list(state.progress),
            signals=signals,
        )

    def _settle(self, state: RefState, task: int, *, settles, done, blocked, tool_return) -> list:
        """Settle and observe: marks task `task` done or failed (moving on to the next task)
        if the turn settles it, and returns the padded observation of the turn."""
        obs = self._pad(tool_return)
        if settles:
            state.progress[task] = Progress.DONE if done else Progress.FAILED
            state.current += 1
            obs = self._pad(_THANKS)
            if state.current < self.config.num_tasks:
                state.progress[state.current] = Progress.PENDING
                nxt = state.current
                obs = self._user_message(
                    state.task_kind[nxt], state.task_order[nxt], state.task_address[nxt]
                )
        if blocked:
            obs = self._pad([dsl.TOOL, dsl.token("blocked")])
        return obs

    def _terminate(
        self, state: RefState, command: int, violation: bool, blocked: bool
    ) -> tuple[float, bool, bool]:
        """Terminate: counts the turn and ends the episode on BYE, a block or the last turn.

        Returns `(efficiency, last, outcome)` of the turn.
        """
        state.violated = state.violated or violation
        efficiency = -1.0 if state.turn >= state.shortest_plan else 0.0
        state.turn += 1
        state.terminated = command == Command.BYE or blocked
        state.truncated = not state.terminated and state.turn >= self.config.max_turns
        last = state.terminated or state.truncated
        outcome = (
            command == Command.BYE
            and all(p == Progress.DONE for p in state.progress)
            and not state.violated
        )
        return efficiency, last, outcome

    def _final_step(self, state: RefState, task: int) -> tuple[tuple[int, int, int], bool]:
        """The correct final step of task `task`, and whether its facts were observed."""
        kind, order = state.task_kind[task], state.task_order[task]
        item = state.item[order]
        if kind == TaskKind.CHANGE_ADDRESS:
            return (Command.CHANGE_ADDRESS, order, state.task_address[task]), True
        if kind == TaskKind.CANCEL:
            return (Command.CANCEL_ORDER, order, 0), True
        if kind == TaskKind.STATUS:
            return (Command.SAY_STATUS, order, state.status[order]), state.looked_up[order]
        if kind == TaskKind.REFUND:
            refund = Command.REFUND if self._refundable(state, order) else Command.SAY_CANNOT
            return (refund, order, 0), state.looked_up[order]
        if kind == TaskKind.EXCHANGE:
            if state.in_stock[item]:
                final = (Command.EXCHANGE, order, item)
            else:
                final = (Command.SAY_NO_STOCK, item, 0)
            return final, state.looked_up[order] and state.stock_checked[item]
        return (Command.SAY_DECLINE, 0, 0), True

    def _broken_rules(self, state: RefState, command: int, order: int) -> list:
        """Guardrail flags (`[R]` bools) of calling `command` on `order`, before the call."""
        flags = [False] * NUM_RULES
        if command == Command.REFUND:
            flags[Rule.REFUND_UNVERIFIED] = not state.looked_up[order]
            flags[Rule.REFUND_INELIGIBLE] = (
                state.status[order] != dsl.DELIVERED or state.refunded[order]
            )
            flags[Rule.AMOUNT_OVER_LIMIT] = state.amount[order] > self.config.refund_limit
        if command in (Command.CANCEL_ORDER, Command.CHANGE_ADDRESS):
            flags[Rule.CHANGE_AFTER_SHIPPING] = state.status[order] != dsl.PROCESSING
        return flags

    def _signals(self, state, last, outcome, verdict, efficiency, flags) -> Signals:
        """Signals of a played turn (`state` is the state after it)."""
        signals = _zero_signals()._replace(
            outcome=1.0 if (last and outcome) else 0.0,
            success=bool(last and outcome),
            verdict=verdict,
            efficiency=efficiency,
            violations=sum(flags),
            violation_flags=flags,
            shortest_plan=state.shortest_plan,
        )
        if self.config.scenario == "dialogue" and last:
            questions = max(sum(k == TaskKind.STATUS for k in state.task_kind), 1)
            pleased = state.correct_answers == questions and state.turn <= state.shortest_plan
            signals = signals._replace(
                accuracy=state.correct_answers / questions,
                user_feedback=1.0 if pleased else -1.0,
            )
        return signals

    def _verdict(self, state, task, *, active, settles, done, command, arg1, violation) -> float:
        """Process verdict of a turn, before the state changes (values: `toolworld`)."""
        cfg = self.config
        if (settles and not done) or (active and command == Command.BYE):
            return cfg.verdict_wrong_final
        if violation:
            return -1.0
        if not active:
            if command != Command.BYE:
                return -1.0
            if all(p == Progress.DONE for p in state.progress):
                return 1.0
            return cfg.verdict_bye_failed
        if done:
            return 1.0
        kind, order = state.task_kind[task], state.task_order[task]
        item = state.item[order]
        if command == Command.LOOKUP_ORDER and arg1 == order and kind != TaskKind.OFF_TOPIC:
            if state.looked_up[order]:
                return 0.0
            if kind in (TaskKind.CHANGE_ADDRESS, TaskKind.CANCEL):
                return cfg.verdict_unneeded_lookup
            return 1.0
        if (
            kind == TaskKind.EXCHANGE
            and state.looked_up[order]
            and command == Command.CHECK_STOCK
            and arg1 == item
        ):
            return 0.0 if state.stock_checked[item] else 1.0
        return -1.0

    def oracle(self, state: RefState) -> list:
        """Next turn of the shortest correct plan (same plan as `policies.oracle_policy`)."""
        cfg = self.config
        if state.current >= cfg.num_tasks:
            return self.encode(Command.BYE)
        task = state.current
        kind, order = state.task_kind[task], state.task_order[task]
        item = state.item[order]
        if kind == TaskKind.CHANGE_ADDRESS:
            command = (Command.CHANGE_ADDRESS, order, state.task_address[task])
        elif kind == TaskKind.CANCEL:
            command = (Command.CANCEL_ORDER, order, 0)
        elif kind == TaskKind.OFF_TOPIC:
            command = (Command.SAY_DECLINE, 0, 0)
        elif not state.looked_up[order]:
            command = (Command.LOOKUP_ORDER, order, 0)
        elif kind == TaskKind.STATUS:
            command = (Command.SAY_STATUS, order, state.status[order])
        elif kind == TaskKind.REFUND:
            command = (
                Command.REFUND if self._refundable(state, order) else Command.SAY_CANNOT,
                order,
                0,
            )
        elif not state.stock_checked[item]:
            command = (Command.CHECK_STOCK, item, 0)
        elif state.in_stock[item]:
            command = (Command.EXCHANGE, order, item)
        else:
            command = (Command.SAY_NO_STOCK, item, 0)
        return self.encode(*command)

    def _refundable(self, state: RefState, order: int) -> bool:
        """A refund is the right final step: delivered, not refunded, amount within limit."""
        return (
            state.status[order] == dsl.DELIVERED
            and not state.refunded[order]
            and state.amount[order] <= self.config.refund_limit
        )

    def encode(self, command: int, arg1: int = 0, arg2: int = 0) -> list:
        """Tokens of one command padded to turn_len (pure Python)."""
        tokens = []
        for j, (literal, base, _) in enumerate(self._patterns[command]):
            tokens.append(literal if literal is not None else base + (arg1 if j == 2 else arg2))
        return tokens + [dsl.PAD] * (self.config.turn_len - len(tokens))

    def _user_message(self, kind, order, address) -> list:
        tokens = [dsl.USER, dsl.token(dsl.INTENT_WORDS[kind])]
        if kind != TaskKind.OFF_TOPIC:
            tokens.append(dsl.ORDER_0 + order)
        if kind == TaskKind.CHANGE_ADDRESS:
            tokens.append(dsl.ADDR_0 + address)
        return self._pad(tokens)

    def _pad(self, tokens) -> list:
        return list(tokens) + [dsl.PAD] * (self.config.obs_len - len(tokens))


def _call_succeeds(state: RefState, command: int, arg1: int, arg2: int) -> bool:
    """A world-changing call succeeds (decided on the state before the turn)."""
    if command in (Command.CANCEL_ORDER, Command.CHANGE_ADDRESS):
        return state.status[arg1] == dsl.PROCESSING and not state.cancelled[arg1]
    if command == Command.REFUND:
        return state.status[arg1] == dsl.DELIVERED and not state.refunded[arg1]
    if command == Command.EXCHANGE:
        return (
            state.status[arg1] == dsl.DELIVERED
            and not state.exchanged[arg1]
            and state.in_stock[arg2]
            and state.item[arg1] == arg2
        )
    return False


def _run_call(state: RefState, command: int, arg1: int, arg2: int) -> None:
    """The effect of a successful, unblocked world call."""
    if command == Command.CANCEL_ORDER:
        state.cancelled[arg1] = True
    elif command == Command.CHANGE_ADDRESS:
        state.address[arg1] = arg2
    elif command == Command.REFUND:
        state.refunded[arg1] = True
    elif command == Command.EXCHANGE:
        state.exchanged[arg1] = True


def _tool_return(state: RefState, command: int, arg1: int, call_ok: bool) -> list:
    """Tokens (unpadded) the agent reads after a turn that settles no task."""
    if command == Command.LOOKUP_ORDER:
        return [
            dsl.TOOL,
            dsl.token("order"),
            dsl.ORDER_0 + arg1,
            dsl.ITEM_0 + state.item[arg1],
            dsl.STATUS_0 + state.status[arg1],
            dsl.ADDR_0 + state.address[arg1],
            dsl.AMT_0 + state.amount[arg1],
        ]
    if command in dsl.WORLD_COMMANDS:
        return [dsl.TOOL, dsl.token("ok" if call_ok else "error"), dsl.ORDER_0 + arg1]
    if command == Command.CHECK_STOCK:
        word = "in_stock" if state.in_stock[arg1] else "out_of_stock"
        return [dsl.TOOL, dsl.token("stock"), dsl.ITEM_0 + arg1, dsl.token(word)]
    if command in dsl.SAY_COMMANDS:
        return list(_THANKS)
    if command == Command.BYE:
        return list(_GOODBYE)
    return [dsl.TOOL, dsl.token("error")]


def _ended_timestep(state: RefState) -> RefTimeStep:
    """The timestep of a step taken after the episode ended: LAST, no reward, no signals."""
    return RefTimeStep(
        step_type=StepType.LAST,
        reward=0.0,
        discount=0.0 if state.terminated else 1.0,
        obs=list(state.obs),
        progress=list(state.progress),
        signals=_zero_signals(),
    )


def _zero_signals() -> Signals:
    return Signals(
        outcome=0.0,
        success=False,
        verdict=0.0,
        efficiency=0.0,
        violations=0,
        violation_flags=[False] * NUM_RULES,
        shortest_plan=0,
        accuracy=0.0,
        user_feedback=0.0,
    )
