"""ToolWorld: a JAX-native multi-turn customer-service environment with tools.

The world is a small order database (item, status, address, amount bucket, per order), an
inventory (in stock or not, per item) and a user with a queue of *tasks* (intents and
off-topic distractors) revealed one after another. One environment step is one agent
turn: a DSL command (see `rlagent.envs.toolworld.dsl`). The environment parses it, runs the tool in
pure JAX and answers with the tool's return or, when the turn settles the current task,
the user's next message (`USER thanks` once every task is settled; the agent then ends
the conversation with `BYE END`).

Tasks (`TaskKind`) and their correct handling, given the ground truth of the world:

    change_address  USER want_address ORDER_k ADDR_a  ->  CALL change_address ORDER_k ADDR_a
    cancel          USER want_cancel ORDER_k          ->  CALL cancel_order ORDER_k
    status          USER ask_status ORDER_k           ->  CALL lookup_order ORDER_k;
                                                          SAY status ORDER_k <status>
    refund          USER want_refund ORDER_k          ->  CALL lookup_order ORDER_k; then
                    CALL refund ORDER_k if delivered, not refunded and amount <= limit,
                    else SAY cannot ORDER_k
    exchange        USER want_exchange ORDER_k        ->  CALL lookup_order ORDER_k (gives
                    ITEM_i); CALL check_stock ITEM_i; CALL exchange ORDER_k ITEM_i if in
                    stock, else SAY no_stock ITEM_i
    off_topic       USER off_topic                    ->  SAY decline

An answer (`SAY`) or a final call must be *grounded*: the facts it relies on must have been
observed (the order looked up, the stock checked); an ungrounded final fails the task.
Any SAY, and any world call that succeeds, settles the current task: done if it is the
correct final step and grounded, failed otherwise (the agent told or did something wrong).

Curriculum levels (shortest plan in turns, BYE included, with the default one intent):

    level 1  single tool       change_address | cancel (order still processing)   2 turns
    level 2  several tools     status | refund (lookup, then act or answer)        3 turns
    level 3  nested calls      exchange (item from the lookup feeds check_stock)   4 turns
    level 4  long dialogue     num_intents (default 3) intents of levels 1-3 plus
                               num_distractors (default 1) off-topic requests:
                               1 + sum of the task costs (1, 1, 2, 2, 3; distractor 1)

`shortest_plan = 1 + sum_t KIND_COST[kind_t]`; `kinds=('exchange',)` with `num_intents=n`
and `num_distractors=d` gives exactly `3n + d + 1` turns, e.g. 16 for n=5, d=0.
The dialogue scenario (`scenario='dialogue'`) asks only order-status questions
(plus distractors) and reports answer accuracy and simulated user feedback.

Per-turn signals: `TimeStep.signals`, a `Signals` (see `rlagent.envs.toolworld.types`): outcome,
process verdict, efficiency, guardrail violations, and the dialogue scores. The verdict
judges a turn against the shortest correct plan:

    +1  useful: the first lookup of the task's order (status, refund, exchange), the
        first stock check of its looked-up item (exchange), the correct grounded final
        step, BYE once every task is done
     0  redundant: a repeat of such a lookup or stock check
    -1  a recoverable slip: wrong tool or argument, malformed turn, failed call, broken rule
    config.verdict_wrong_final (clean -2, legacy -1): an irreversible mistake, a turn that
        settles the task wrongly (wrong or ungrounded answer or final call) or says BYE
        with a task still open
    config.verdict_bye_failed (clean 0, legacy +1): BYE once every task is settled, some
        of them failed
    config.verdict_unneeded_lookup (clean 0, legacy +1): the first lookup of the order of
        a change_address / cancel task, which needs no fact (the 'lookup detour')

`ToolWorldConfig(verdict='legacy')` restores the first verdict (the give-up and detour
reward-hacking study); see `rlagent.envs.toolworld.config`. The guardrail mode
(`ToolWorldConfig.guardrail`) decides what a violation does in `step` and whether
`allowed_tokens` masks it (see `rlagent.envs.toolworld.guardrail`).

`step` is a sequence of stages, one small function each: read the turn (parse), check
the rules, change the world, settle the current task, judge the turn (verdict), end the
episode or not (termination), and build what the agent reads next (observation).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rlagent.envs.base import TokenSpec
from rlagent.envs.splits import heldout_config
from rlagent.envs.toolworld import dsl
from rlagent.envs.toolworld import generator
from rlagent.envs.toolworld import guardrail
from rlagent.envs.toolworld import messages
from rlagent.envs.toolworld.config import ToolWorldConfig
from rlagent.envs.toolworld.dsl import Command
from rlagent.envs.toolworld.types import Observation
from rlagent.envs.toolworld.types import Progress
from rlagent.envs.toolworld.types import Signals
from rlagent.envs.toolworld.types import State
from rlagent.envs.toolworld.types import StepType
from rlagent.envs.toolworld.types import TaskKind
from rlagent.envs.toolworld.types import TaskView
from rlagent.envs.toolworld.types import TimeStep


class ToolWorld:
    """Jumanji-style environment; see the module docstring for the task rules."""

    def __init__(self, config: ToolWorldConfig | None = None):
        self.config = config if config is not None else ToolWorldConfig()
        cfg = self.config
        self._slot_masks = dsl.slot_masks(
            cfg.turn_len, cfg.num_orders, cfg.num_items, cfg.num_addresses
        )
        self._slot_ranges = dsl.slot_ranges(
            cfg.turn_len, cfg.num_orders, cfg.num_items, cfg.num_addresses
        )
        self._literal, self._arg_slot, self._class_base = dsl.encode_tables(cfg.turn_len)
        self._base1, self._base2 = dsl.arg_bases()
        # Per Command (MALFORMED included): number of arguments, and whether it is a SAY.
        self._num_args = np.array([dsl.num_args(c) for c in Command], np.int32)
        self._is_say = np.isin(np.arange(len(Command)), dsl.SAY_COMMANDS)

    def __repr__(self) -> str:
        return f"ToolWorld({self.config})"

    # Sizes -----------------------------------------------------------------------------
    @property
    def turn_len(self) -> int:
        return self.config.turn_len

    @property
    def obs_len(self) -> int:
        return self.config.obs_len

    @property
    def max_turns(self) -> int:
        return self.config.max_turns

    @property
    def num_markers(self) -> int:
        return self.config.num_tasks

    @property
    def num_rules(self) -> int:
        return guardrail.NUM_RULES

    # The environment protocol (rlagent.envs.base) ---------------------------------------
    token_spec = TokenSpec(vocab_size=dsl.VOCAB_SIZE, pad=dsl.PAD, end=dsl.END)
    # Per-turn scalar signals the rollout records (Signals fields; `success` is its own).
    signal_names = ("outcome", "verdict", "efficiency", "violations")
    # Training-reward components built from those signals (rlagent.train.rewards).
    reward_components = (
        "outcome",  # `outcome`: 1 on the final turn of a solved episode.
        "process",  # `verdict`: the oracle process verdict of the turn.
        "efficiency",  # `efficiency`: -1 on a turn past the shortest plan.
        "potential",  # shaping by the verdict's valid steps.
        "prm_min",  # min-form credit of the verdict.
        "violations",  # 1 on a turn that breaks a guardrail rule.
        "learned_sum",  # a PRM's scores (any environment).
        "learned_min",
        "learned_potential",
        "learned_centred",
    )

    @property
    def requires_constrained(self) -> bool:
        """The guardrail acts through `allowed_tokens` ('mask'): sampling must be constrained."""
        return self.config.guardrail == "mask"

    def episode_metrics(
        self, signals: dict[str, jax.Array], turn_mask: jax.Array, action_tokens: jax.Array
    ) -> dict[str, jax.Array]:
        """Batch metrics (float32 scalars) of `[B, S]` signals (0 off `turn_mask`).

        `collapse_rate` is the fraction of episodes without a single tool call (no turn
        starting with CALL): a policy that gives up makes no calls, so it breaks no rule
        and is never "inefficient"; read violation and efficiency numbers next to it.
        """
        valid = turn_mask.astype(jnp.float32)
        violations = jnp.sum(signals["violations"] * valid, axis=1)
        calls = jnp.sum((action_tokens[..., 0] == dsl.CALL) & turn_mask, axis=1)
        return {
            "collapse_rate": jnp.mean(calls == 0),
            "outcome": jnp.mean(jnp.sum(signals["outcome"] * valid, axis=1)),
            "process_score": jnp.sum(signals["verdict"] * valid) / jnp.maximum(jnp.sum(valid), 1.0),
            "turns_over_plan": jnp.mean(-jnp.sum(signals["efficiency"] * valid, axis=1)),
            "violations": jnp.mean(violations),
            "violation_rate": jnp.mean(violations > 0),
        }

    def heldout_env(self) -> ToolWorld:
        """This ToolWorld drawing only held-out tasks (`task_split='heldout'`); the training
        env must draw none of them (`task_split='train'`)."""
        return ToolWorld(heldout_config(self.config, "tasks"))

    def observe(self, state: State) -> Observation:
        """What the agent reads before the next turn from `state` (as the last timestep's)."""
        return Observation(tokens=state.obs, progress=state.progress)

    def episode_over(self, state: State) -> jax.Array:
        """`[]` bool: the episode has ended (terminated or truncated)."""
        return state.terminated | state.truncated

    def episode_turn(self, state: State) -> jax.Array:
        """`[]` int32: turns played so far."""
        return state.turn

    def oracle_action(self, state: State) -> jax.Array:
        """Next turn `[L]` of the shortest correct plan from `state`.

        Per task: look the order up if the task needs a fact about it (status, refund,
        exchange), check the stock of the looked-up item (exchange), then the task's
        correct final command; `BYE` once every task is settled. Following it from `reset`
        solves every episode in exactly `shortest_plan` turns with verdict +1 on every
        turn.
        """
        task = self.task_view(state)
        is_exchange = task.kind == TaskKind.EXCHANGE
        asks_fact = (task.kind == TaskKind.STATUS) | (task.kind == TaskKind.REFUND) | is_exchange
        needs_lookup = asks_fact & ~task.looked_up
        needs_stock = is_exchange & task.looked_up & ~task.stock_checked
        command = jnp.where(needs_stock, Command.CHECK_STOCK, task.final_command)
        arg1 = jnp.where(needs_stock, task.item, task.final_arg1)
        arg2 = task.final_arg2
        command = jnp.where(needs_lookup, Command.LOOKUP_ORDER, command)
        arg1 = jnp.where(needs_lookup, task.order, arg1)
        command = jnp.where(task.active, command, Command.BYE)
        return self.encode(command, arg1, arg2)

    @functools.cached_property
    def observation_spec(self) -> Observation:
        """Shapes and dtypes of one observation."""
        return Observation(
            tokens=jax.ShapeDtypeStruct((self.obs_len,), jnp.int32),
            progress=jax.ShapeDtypeStruct((self.num_markers,), jnp.int32),
        )

    @functools.cached_property
    def action_spec(self) -> jax.ShapeDtypeStruct:
        """One turn: `[L]` int32 tokens in [0, VOCAB_SIZE)."""
        return jax.ShapeDtypeStruct((self.turn_len,), jnp.int32)

    # Public API ------------------------------------------------------------------------
    def reset(self, key: jax.Array) -> tuple[State, TimeStep]:
        """Samples a world and a task queue (`generator`); returns the first user message.

        Args:
          key: a PRNG key (raw `[2]` uint32 or typed), kept in the state.
        """
        state = generator.generate(self.config, key)
        timestep = TimeStep(
            step_type=jnp.int8(StepType.FIRST),
            reward=jnp.float32(0.0),
            discount=jnp.float32(1.0),
            observation=Observation(tokens=state.obs, progress=state.progress),
            signals=_zero_signals()._replace(shortest_plan=state.shortest_plan),
        )
        return state, timestep

    def step(self, state: State, action: jax.Array) -> tuple[State, TimeStep]:
        """Plays one agent turn.

        Args:
          state: the current state (a terminal state is absorbing: same observation,
            reward 0, all signals 0, step type LAST).
          action: `[L]` int32 tokens of the turn (PAD after END).
        """
        chex.assert_shape(action, (self.turn_len,))
        chex.assert_type(action, int)
        done = state.terminated | state.truncated
        return jax.lax.cond(done, self._absorb, self._transition, state, action)

    def allowed_tokens(self, state: State, prefix: jax.Array, position) -> jax.Array:
        """Tokens allowed at `position` of the current turn: `[VOCAB_SIZE]` bool.

        The DSL grammar, and with `config.guardrail == 'mask'` also the guardrail rules
        (`guardrail.forbidden_tokens`): a rule-breaking argument is excluded, and a command
        is offered only if some rule-abiding completion of it exists.

        Args:
          state: current state (read only in mask mode).
          prefix: `[L]` int32 tokens of this turn; entries at `position` and later ignored.
          position: int or int32 scalar in [0, L).

        The grammar is the union over commands consistent with the prefix: after END only
        PAD; at position L-1 only END (or PAD after END). An inconsistent prefix (the turn
        is already malformed) allows PAD only, so a sampler never sees an empty set.
        """
        chex.assert_shape(prefix, (self.turn_len,))
        chex.assert_type(prefix, int)
        masks = jnp.asarray(self._slot_masks)  # [C, L, V]
        steps = jnp.arange(self.turn_len)
        in_vocab = (prefix >= 0) & (prefix < dsl.VOCAB_SIZE)
        fits = masks[:, steps, jnp.clip(prefix, 0, dsl.VOCAB_SIZE - 1)] & in_vocab  # [C, L]
        consistent = jnp.where(steps[None, :] < position, fits, True).all(axis=1)  # [C]
        slot = jnp.take(masks, position, axis=1)  # [C, V]
        if self.config.guardrail == "mask":
            forbidden = guardrail.forbidden_tokens(state, self.config.refund_limit)  # [C, V]
            viable = (masks[:, dsl.ARG1_POSITION, :] & ~forbidden).any(axis=1)
            consistent = consistent & viable
            slot = jnp.where(position == dsl.ARG1_POSITION, slot & ~forbidden, slot)
        allowed = (consistent[:, None] & slot).any(axis=0)
        pad_only = jnp.arange(dsl.VOCAB_SIZE) == dsl.PAD
        return jnp.where(allowed.any(), allowed, pad_only)

    def parse(self, action: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """`(command, arg1, arg2)` int32 scalars of one turn; command MALFORMED if invalid."""
        # Range tests against [C, L] bounds: fewer ops than a gather from the [C, L, V]
        # mask, and an out-of-vocabulary token simply fits no range.
        low, high = self._slot_ranges  # [C, L]
        fits = ((action >= low) & (action < high)).all(axis=1)
        tokens = jnp.clip(action, 0, dsl.VOCAB_SIZE - 1)
        command = jnp.where(fits.any(), jnp.argmax(fits), Command.MALFORMED).astype(jnp.int32)
        nargs = jnp.asarray(self._num_args)[command]
        arg1 = jnp.where(
            nargs >= 1, tokens[dsl.ARG1_POSITION] - jnp.asarray(self._base1)[command], 0
        )
        arg2 = jnp.where(
            nargs >= 2, tokens[dsl.ARG2_POSITION] - jnp.asarray(self._base2)[command], 0
        )
        return command, arg1.astype(jnp.int32), arg2.astype(jnp.int32)

    def encode(self, command: jax.Array, arg1: jax.Array, arg2: jax.Array) -> jax.Array:
        """Tokens `[L]` int32 of a command with its arguments (inverse of `parse`)."""
        literal = jnp.asarray(self._literal)[command]
        arg_slot = jnp.asarray(self._arg_slot)[command]
        base = jnp.asarray(self._class_base)[command]
        value = jnp.where(arg_slot == 1, arg1, arg2)
        return jnp.where(arg_slot == 0, literal, base + value).astype(jnp.int32)

    def task_view(self, state: State) -> TaskView:
        """The current task and its correct final command under the ground truth."""
        cfg = self.config
        index = jnp.minimum(state.current, cfg.num_tasks - 1)
        kind = state.task_kind[index]
        order = state.task_order[index]
        address = state.task_address[index]
        item = state.item[order]
        looked_up = state.looked_up[order]
        stock_checked = state.stock_checked[item]
        in_stock = state.in_stock[item]
        refundable = (
            (state.status[order] == dsl.DELIVERED)
            & ~state.refunded[order]
            & (state.amount[order] <= cfg.refund_limit)
        )
        # Per kind: (final command, arg1, arg2, grounded).
        finals = {
            TaskKind.CHANGE_ADDRESS: (Command.CHANGE_ADDRESS, order, address, True),
            TaskKind.CANCEL: (Command.CANCEL_ORDER, order, 0, True),
            TaskKind.STATUS: (Command.SAY_STATUS, order, state.status[order], looked_up),
            TaskKind.REFUND: (
                jnp.where(refundable, Command.REFUND, Command.SAY_CANNOT),
                order,
                0,
                looked_up,
            ),
            TaskKind.EXCHANGE: (
                jnp.where(in_stock, Command.EXCHANGE, Command.SAY_NO_STOCK),
                jnp.where(in_stock, order, item),
                jnp.where(in_stock, item, 0),
                looked_up & stock_checked,
            ),
            TaskKind.OFF_TOPIC: (Command.SAY_DECLINE, 0, 0, True),
        }

        def of_kind(field: int) -> jax.Array:
            return jnp.stack([jnp.asarray(finals[k][field], jnp.int32) for k in TaskKind])[kind]

        return TaskView(
            active=state.current < cfg.num_tasks,
            index=index,
            kind=kind,
            order=order,
            address=address,
            item=item,
            looked_up=looked_up,
            stock_checked=stock_checked,
            final_command=of_kind(0),
            final_arg1=of_kind(1),
            final_arg2=of_kind(2),
            grounded=of_kind(3).astype(bool),
        )

    # Dynamics: the stages of a step ----------------------------------------------------
    def _transition(self, state: State, action: jax.Array) -> tuple[State, TimeStep]:
        cfg = self.config
        turn = self._read_turn(action)
        task = self.task_view(state)
        flags = guardrail.violation_flags(state, turn.command, turn.order, cfg.refund_limit)
        broke_rule = flags.any()
        blocked = broke_rule & (cfg.guardrail == "penalise")
        changed, world_ok = _change_world(state, turn, blocked)
        settled = self._settle_task(state, task, turn, world_ok, blocked)
        verdict = _verdict(cfg, state, task, turn, settled, broke_rule)
        end = self._terminate(state, turn, settled, broke_rule, blocked)
        obs = self._observe(state, turn, world_ok, settled, blocked)
        new_state = changed._replace(
            progress=settled.progress,
            current=settled.current,
            turn=end.turn,
            violated=end.violated,
            correct_answers=settled.correct_answers,
            terminated=end.terminated,
            truncated=end.truncated,
            obs=obs,
        )
        signals = self._signals(state, settled, end, verdict, flags)
        timestep = TimeStep(
            step_type=jnp.where(end.last, StepType.LAST, StepType.MID).astype(jnp.int8),
            reward=end.reward.astype(jnp.float32),
            discount=jnp.where(end.terminated, 0.0, 1.0).astype(jnp.float32),
            observation=Observation(tokens=obs, progress=settled.progress),
            signals=signals,
        )
        return new_state, timestep

    def _absorb(self, state: State, action: jax.Array) -> tuple[State, TimeStep]:
        del action
        timestep = TimeStep(
            step_type=jnp.int8(StepType.LAST),
            reward=jnp.float32(0.0),
            discount=jnp.where(state.terminated, 0.0, 1.0).astype(jnp.float32),
            observation=Observation(tokens=state.obs, progress=state.progress),
            signals=_zero_signals(),
        )
        return state, timestep

    def _read_turn(self, action: jax.Array) -> _Turn:
        """Parse: the command, its arguments, and the order / item it is about (clipped)."""
        command, arg1, arg2 = self.parse(action)
        item = jnp.where(command == Command.EXCHANGE, arg2, arg1)
        return _Turn(
            command=command,
            arg1=arg1,
            arg2=arg2,
            order=jnp.clip(arg1, 0, self.config.num_orders - 1),
            item=jnp.clip(item, 0, self.config.num_items - 1),
        )

    def _settle_task(
        self, state: State, task: TaskView, turn: _Turn, world_ok: jax.Array, blocked: jax.Array
    ) -> _Settlement:
        """Any SAY or successful (unblocked) world call settles the open task."""
        k = self.config.num_tasks
        nargs = jnp.asarray(self._num_args)[turn.command]
        matches = (
            (turn.command == task.final_command)
            & ((nargs < 1) | (turn.arg1 == task.final_arg1))
            & ((nargs < 2) | (turn.arg2 == task.final_arg2))
        )
        is_say = jnp.asarray(self._is_say)[turn.command]
        settles = task.active & ~blocked & (is_say | (world_ok & ~blocked))
        done = settles & matches & task.grounded
        marker = jnp.where(done, Progress.DONE, Progress.FAILED)
        progress = jnp.where(settles & (jnp.arange(k) == task.index), marker, state.progress)
        current = state.current + settles.astype(jnp.int32)
        progress = jnp.where(settles & (jnp.arange(k) == current), Progress.PENDING, progress)
        factual = (
            task.active
            & ~blocked
            & (task.kind == TaskKind.STATUS)
            & (turn.command == Command.SAY_STATUS)
            & (turn.arg1 == task.order)
            & (turn.arg2 == state.status[task.order])
        )
        return _Settlement(
            settles=settles,
            done=done,
            progress=progress,
            current=current,
            correct_answers=state.correct_answers + factual.astype(jnp.int32),
        )

    def _terminate(
        self,
        state: State,
        turn: _Turn,
        settled: _Settlement,
        broke_rule: jax.Array,
        blocked: jax.Array,
    ) -> _Ending:
        """BYE or a blocked call terminates; max_turns truncates; the outcome and reward."""
        said_bye = turn.command == Command.BYE
        terminated = said_bye | blocked
        violated = state.violated | broke_rule
        outcome = said_bye & (settled.progress == Progress.DONE).all() & ~violated
        turns = state.turn + 1
        truncated = ~terminated & (turns >= self.config.max_turns)
        return _Ending(
            turn=turns,
            terminated=terminated,
            truncated=truncated,
            last=terminated | truncated,
            violated=violated,
            outcome=outcome,
            reward=jnp.where(blocked, -self.config.penalty, outcome.astype(jnp.float32)),
        )

    def _observe(
        self,
        state: State,
        turn: _Turn,
        world_ok: jax.Array,
        settled: _Settlement,
        blocked: jax.Array,
    ) -> jax.Array:
        """`[O]`: the next user message if the task was settled, else the tool's return."""
        k, obs_len = self.config.num_tasks, self.obs_len
        tool_return = messages.tool_return(
            state, turn.command, turn.order, turn.item, world_ok, obs_len
        )
        next_index = jnp.minimum(settled.current, k - 1)
        next_message = jnp.where(
            settled.current < k,
            messages.user_message(
                state.task_kind[next_index],
                state.task_order[next_index],
                state.task_address[next_index],
                obs_len,
            ),
            messages.thanks(obs_len),
        )
        obs = jnp.where(settled.settles, next_message, tool_return)
        return jnp.where(blocked, messages.blocked(obs_len), obs)

    def _signals(
        self,
        state: State,
        settled: _Settlement,
        end: _Ending,
        verdict: jax.Array,
        flags: jax.Array,
    ) -> Signals:
        """Signals of a played turn (`state` is the state before it)."""
        signals = Signals(
            outcome=jnp.where(end.last, end.outcome, False).astype(jnp.float32),
            success=end.last & end.outcome,
            verdict=verdict,
            efficiency=jnp.where(state.turn >= state.shortest_plan, -1.0, 0.0).astype(jnp.float32),
            violations=flags.sum().astype(jnp.int32),
            violation_flags=flags,
            shortest_plan=state.shortest_plan,
            accuracy=jnp.float32(0.0),
            user_feedback=jnp.float32(0.0),
        )
        if self.config.scenario != "dialogue":
            return signals
        correct = settled.correct_answers
        questions = jnp.maximum((state.task_kind == TaskKind.STATUS).sum(), 1)
        pleased = (correct == questions) & (end.turn <= state.shortest_plan)
        feedback = jnp.where(pleased, 1.0, -1.0)
        return signals._replace(
            accuracy=jnp.where(end.last, correct / questions, 0.0).astype(jnp.float32),
            user_feedback=jnp.where(end.last, feedback, 0.0).astype(jnp.float32),
        )


class _Turn(NamedTuple):
    """The parsed agent turn."""

    command: jax.Array  # [] int32 Command.
    arg1: jax.Array  # [] int32: argument 1 as an index in its class (0 if none).
    arg2: jax.Array  # [] int32: argument 2 (0 if none).
    order: jax.Array  # [] int32: arg1 clipped to an order index.
    item: jax.Array  # [] int32: the item argument (arg2 of exchange, else arg1), clipped.


class _Settlement(NamedTuple):
    """The task bookkeeping of a turn."""

    settles: jax.Array  # [] bool: the turn settled the open task.
    done: jax.Array  # [] bool: ... correctly (right final step, grounded).
    progress: jax.Array  # [K] int32 Progress after the turn.
    current: jax.Array  # [] int32: the current task after the turn.
    correct_answers: jax.Array  # [] int32: factually correct status answers so far.


class _Ending(NamedTuple):
    """Termination of a turn and its reward."""

    turn: jax.Array  # [] int32: turns played, this one included.
    terminated: jax.Array  # [] bool.
    truncated: jax.Array  # [] bool.
    last: jax.Array  # [] bool: terminated or truncated.
    violated: jax.Array  # [] bool: some rule broken this episode.
    outcome: jax.Array  # [] bool: BYE with every task done and no rule broken.
    reward: jax.Array  # [] float32 (weakly typed): outcome, or -penalty if blocked.


def _change_world(state: State, turn: _Turn, blocked: jax.Array) -> tuple[State, jax.Array]:
    """Runs the turn's tool: `(state with the world changed, world call succeeded [] bool)`.

    Whether a world call succeeds is decided on the state before the turn; a blocked
    call (penalise mode) does not run. Lookups and stock checks are recorded.
    """
    order, item, command = turn.order, turn.item, turn.command
    processing = (state.status[order] == dsl.PROCESSING) & ~state.cancelled[order]
    delivered = state.status[order] == dsl.DELIVERED
    succeeds = {
        Command.CANCEL_ORDER: processing,
        Command.CHANGE_ADDRESS: processing,
        Command.REFUND: delivered & ~state.refunded[order],
        Command.EXCHANGE: (
            delivered & ~state.exchanged[order] & state.in_stock[item] & (state.item[order] == item)
        ),
    }
    world_ok = jnp.stack([jnp.asarray(succeeds.get(c, False)) for c in Command])[command]
    runs = world_ok & ~blocked
    order_hot = jnp.arange(state.status.shape[0]) == order
    item_hot = jnp.arange(state.in_stock.shape[0]) == item

    def ran(c: Command) -> jax.Array:
        return order_hot & runs & (command == c)

    changed = state._replace(
        cancelled=state.cancelled | ran(Command.CANCEL_ORDER),
        address=jnp.where(ran(Command.CHANGE_ADDRESS), turn.arg2, state.address),
        refunded=state.refunded | ran(Command.REFUND),
        exchanged=state.exchanged | ran(Command.EXCHANGE),
        looked_up=state.looked_up | (order_hot & (command == Command.LOOKUP_ORDER)),
        stock_checked=state.stock_checked | (item_hot & (command == Command.CHECK_STOCK)),
    )
    return changed, world_ok


def _verdict(
    cfg: ToolWorldConfig,
    state: State,
    task: TaskView,
    turn: _Turn,
    settled: _Settlement,
    broke_rule: jax.Array,
) -> jax.Array:
    """Process verdict `[]` float32 of a turn (values: the module docstring).

    `state` is the state before the turn; a broken rule is -1 unless the turn is also an
    irreversible mistake (then `cfg.verdict_wrong_final`).
    """
    command = turn.command
    said_bye = command == Command.BYE
    needs_order = task.active & (task.kind != TaskKind.OFF_TOPIC)
    task_lookup = needs_order & (command == Command.LOOKUP_ORDER) & (turn.arg1 == task.order)
    direct = (task.kind == TaskKind.CHANGE_ADDRESS) | (task.kind == TaskKind.CANCEL)
    task_stock = (
        task.active
        & (task.kind == TaskKind.EXCHANGE)
        & task.looked_up
        & (command == Command.CHECK_STOCK)
        & (turn.arg1 == task.item)
    )
    first_lookup = task_lookup & ~task.looked_up
    all_done = (state.progress == Progress.DONE).all()
    useful = (
        (first_lookup & ~direct)
        | (task_stock & ~task.stock_checked)
        | settled.done
        | (~task.active & said_bye & all_done)
    )
    redundant = (task_lookup & task.looked_up) | (task_stock & task.stock_checked)
    verdict = jnp.where(useful, 1.0, jnp.where(redundant, 0.0, -1.0))
    verdict = jnp.where(first_lookup & direct, cfg.verdict_unneeded_lookup, verdict)
    verdict = jnp.where(~task.active & said_bye & ~all_done, cfg.verdict_bye_failed, verdict)
    verdict = jnp.where(broke_rule, -1.0, verdict)
    irreversible = (settled.settles & ~settled.done) | (task.active & said_bye)
    return jnp.where(irreversible, cfg.verdict_wrong_final, verdict).astype(jnp.float32)


def _zero_signals() -> Signals:
    """Signals of a step that plays no turn (reset, absorbing state)."""
    zero = jnp.float32(0.0)
    return Signals(
        outcome=zero,
        success=jnp.bool_(False),
        verdict=zero,
        efficiency=zero,
        violations=jnp.int32(0),
        violation_flags=jnp.zeros((guardrail.NUM_RULES,), bool),
        shortest_plan=jnp.int32(0),
        accuracy=zero,
        user_feedback=zero,
    )
