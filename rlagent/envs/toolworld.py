"""ToolWorld: a JAX-native multi-turn customer-service environment with tools.

The world is a small order database (item, status, address, amount bucket, per order), an
inventory (in stock or not, per item) and a user with a queue of *tasks* (intents and
off-topic distractors) revealed one after another. One environment step is one agent
turn: a DSL command (see `rlagent.envs.dsl`). The environment parses it, runs the tool in
pure JAX and answers with the tool's return or, when the turn settles the current task,
the user's next message (`USER thanks` once every task is settled; the agent then ends
the conversation with `BYE END`).

Tasks (intent kinds) and their correct handling, given the ground truth of the world:

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

`shortest_plan = 1 + sum_t cost(kind_t)` with cost change_address 1, cancel 1, status 2,
refund 2, exchange 3, off_topic 1; `kinds=('exchange',)` with `num_intents=n` and
`num_distractors=d` gives exactly `3n + d + 1` turns, e.g. 16 for n=5, d=0.
The dialogue scenario (`scenario='dialogue'`) asks only order-status questions
(plus distractors) and reports answer accuracy and simulated user feedback.

Per-turn signals (`TimeStep.extras`): outcome (1 iff the agent said BYE with every task
done and no rule broken), process verdict (+1 valid next step of a correct plan, 0
redundant repeat of a valid lookup / stock check, -1 anything else: wrong tool or
argument, malformed turn, rule violation, ungrounded or wrong final), efficiency (-1 on
every turn past the shortest plan), guardrail violations (see `guardrail`).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rlagent.envs import dsl
from rlagent.envs import guardrail

KIND_NAMES = ("change_address", "cancel", "status", "refund", "exchange", "off_topic")
ADDRESS_KIND, CANCEL_KIND, STATUS_KIND, REFUND_KIND, EXCHANGE_KIND, OFF_TOPIC_KIND = range(6)
# Turns of the shortest correct handling of each task kind.
KIND_COST = (1, 1, 2, 2, 3, 1)
KIND_USER_WORD = tuple(dsl.token(w) for w in dsl.INTENT_WORDS)
LEVEL_KINDS = {
    1: ("change_address", "cancel"),
    2: ("status", "refund"),
    3: ("exchange",),
    4: ("change_address", "cancel", "status", "refund", "exchange"),
}
SCENARIOS = ("agent", "dialogue")
# Progress markers of Observation.progress.
ABSENT, PENDING, DONE, FAILED = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True)
class ToolWorldConfig:
    """Static configuration of ToolWorld (hashable: safe as a static jit argument).

    Fields left at None are filled from the level in `__post_init__`.
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
    guardrail: str = "off"  # 'off' | 'penalise' | 'mask' (see rlagent.envs.guardrail).
    penalty: float = 1.0  # reward of a penalised violation is -penalty.
    refund_limit: int = 2  # largest amount bucket (AMT_0..AMT_3) refundable, 0..2.

    def __post_init__(self):
        def fail(name, message):
            raise ValueError(f"ToolWorldConfig.{name}: {message}, got {getattr(self, name)!r}")

        if self.level not in LEVEL_KINDS:
            fail("level", "must be 1, 2, 3 or 4")
        if self.scenario not in SCENARIOS:
            fail("scenario", f"must be one of {SCENARIOS}")
        if self.guardrail not in guardrail.GUARDRAIL_MODES:
            fail("guardrail", f"must be one of {guardrail.GUARDRAIL_MODES}")
        if not 8 <= self.num_orders <= dsl.MAX_ORDERS:
            fail("num_orders", f"must be in [8, {dsl.MAX_ORDERS}]")
        if not 2 <= self.num_items <= dsl.MAX_ITEMS:
            fail("num_items", f"must be in [2, {dsl.MAX_ITEMS}]")
        if not 2 <= self.num_addresses <= dsl.MAX_ADDRESSES:
            fail("num_addresses", f"must be in [2, {dsl.MAX_ADDRESSES}]")
        if self.turn_len < dsl.MAX_COMMAND_LEN:
            fail("turn_len", f"must be >= {dsl.MAX_COMMAND_LEN} (longest command)")
        if self.obs_len < 7:
            fail("obs_len", "must be >= 7 (length of a lookup return)")
        if not 0 <= self.refund_limit < dsl.NUM_AMOUNTS - 1:
            fail("refund_limit", f"must be in [0, {dsl.NUM_AMOUNTS - 2}]")
        if self.penalty < 0:
            fail("penalty", "must be >= 0")
        if self.kinds is None:
            kinds = ("status",) if self.scenario == "dialogue" else LEVEL_KINDS[self.level]
            object.__setattr__(self, "kinds", kinds)
        else:
            object.__setattr__(self, "kinds", tuple(self.kinds))
            bad = [k for k in self.kinds if k not in KIND_NAMES[:OFF_TOPIC_KIND]]
            if bad or not self.kinds:
                fail("kinds", f"must be a non-empty subset of {KIND_NAMES[:OFF_TOPIC_KIND]}")
        if self.num_intents is None:
            object.__setattr__(self, "num_intents", 3 if self.level == 4 else 1)
        if self.num_distractors is None:
            object.__setattr__(self, "num_distractors", 1 if self.level == 4 else 0)
        if not 1 <= self.num_intents <= self.num_items:
            fail("num_intents", f"must be in [1, num_items={self.num_items}]")
        if self.num_distractors < 0:
            fail("num_distractors", "must be >= 0")
        if self.num_tasks > self.num_orders:
            fail("num_distractors", "num_intents + num_distractors must be <= num_orders")
        longest = 1 + self.num_intents * max(KIND_COST[i] for i in self.kind_ids)
        longest += self.num_distractors
        if self.max_turns is None:
            object.__setattr__(self, "max_turns", longest + 2)
        elif self.max_turns < 1:
            fail("max_turns", "must be >= 1")

    @property
    def num_tasks(self) -> int:
        """K: tasks (intents + distractors) per episode, one progress marker each."""
        return self.num_intents + self.num_distractors

    @property
    def kind_ids(self) -> tuple[int, ...]:
        """Intent pool as kind ids (indices into KIND_NAMES)."""
        return tuple(KIND_NAMES.index(k) for k in self.kinds)


class StepType(enum.IntEnum):
    """Jumanji step types (stored as int8)."""

    FIRST = 0
    MID = 1
    LAST = 2


class Observation(NamedTuple):
    tokens: jax.Array  # [O] int32: user message or tool return to read before the next turn.
    progress: jax.Array  # [K] int32: per task ABSENT 0 / PENDING 1 / DONE 2 / FAILED 3.


class TimeStep(NamedTuple):
    step_type: jax.Array  # [] int8 StepType.
    reward: jax.Array  # [] float32: outcome (0/1) on the last step, -penalty if blocked.
    discount: jax.Array  # [] float32: 0 after termination, else 1.
    observation: Observation
    extras: dict  # see module docstring and rlagent_interfaces: scalars and [R] flags.


class State(NamedTuple):
    """Full environment state (N orders, I items, K tasks, O observation tokens)."""

    key: jax.Array  # PRNG key of the episode (split by auto-reset wrappers).
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
    task_kind: jax.Array  # [K] int32: kind id of each task (KIND_NAMES).
    task_order: jax.Array  # [K] int32: order the task is about (distinct across tasks).
    task_address: jax.Array  # [K] int32: requested new address (change_address tasks).
    progress: jax.Array  # [K] int32: ABSENT / PENDING / DONE / FAILED.
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
    kind: jax.Array  # [] int32.
    order: jax.Array  # [] int32.
    address: jax.Array  # [] int32: requested new address.
    item: jax.Array  # [] int32: item of the task's order.
    looked_up: jax.Array  # [] bool.
    stock_checked: jax.Array  # [] bool: stock of `item` checked.
    final_command: jax.Array  # [] int32: the command that settles the task correctly.
    final_arg1: jax.Array  # [] int32.
    final_arg2: jax.Array  # [] int32.
    grounded: jax.Array  # [] bool: the facts behind the final command were observed.


class ToolWorld:
    """Jumanji-style environment; see the module docstring for the task rules."""

    def __init__(self, config: ToolWorldConfig | None = None):
        self.config = config if config is not None else ToolWorldConfig()
        cfg = self.config
        self._slot_masks = dsl.slot_masks(
            cfg.turn_len, cfg.num_orders, cfg.num_items, cfg.num_addresses
        )
        self._literal, self._arg_slot, self._class_base = dsl.encode_tables(cfg.turn_len)
        self._base1, self._base2 = dsl.arg_bases()
        self._num_args = np.array(
            [dsl.num_args(c) for c in range(dsl.NUM_COMMANDS)] + [0], np.int32
        )
        self._slot_ranges = dsl.slot_ranges(
            cfg.turn_len, cfg.num_orders, cfg.num_items, cfg.num_addresses
        )
        self._is_say = np.isin(np.arange(dsl.NUM_COMMANDS + 1), dsl.SAY_COMMANDS)

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
        """Samples a world and a task queue; returns the first user message.

        Args:
          key: a PRNG key (raw `[2]` uint32 or typed), kept in the state.
        """
        cfg = self.config
        n, i, a, k = cfg.num_orders, cfg.num_items, cfg.num_addresses, cfg.num_tasks
        draws = _Draws(key, 5 * n + 3 * i + 9 * k + cfg.num_intents)
        item = draws.integers(n, 0, i)
        status = draws.integers(n, 0, dsl.NUM_STATUSES)
        address = draws.integers(n, 0, a)
        amount = draws.integers(n, 0, dsl.NUM_AMOUNTS)
        in_stock = draws.bernoulli(i)

        pool = jnp.asarray(cfg.kind_ids, jnp.int32)
        intent_kinds = pool[draws.integers(cfg.num_intents, 0, len(pool))]
        kinds = jnp.concatenate(
            [intent_kinds, jnp.full((cfg.num_distractors,), OFF_TOPIC_KIND, jnp.int32)]
        )
        kinds = kinds[draws.permutation(k)]  # distractors anywhere in the queue
        orders = draws.permutation(n)[:k]
        item_perm = draws.permutation(i)

        # Make every task's order fit its kind (e.g. a cancel needs a processing order).
        t_status, t_amount, t_item = status[orders], amount[orders], item[orders]
        refund_ok = draws.bernoulli(k)
        not_delivered = draws.bernoulli(k)  # why a refund is denied
        pending = draws.integers(k, 0, 2)  # processing or shipped
        small = draws.integers(k, 0, cfg.refund_limit + 1)
        large = draws.integers(k, cfg.refund_limit + 1, dsl.NUM_AMOUNTS)
        exchange_stock = draws.bernoulli(k)
        offset = draws.integers(k, 1, a)  # new address != old one

        is_change = (kinds == ADDRESS_KIND) | (kinds == CANCEL_KIND)
        is_refund = kinds == REFUND_KIND
        is_exchange = kinds == EXCHANGE_KIND
        refund_status = jnp.where(refund_ok | ~not_delivered, dsl.DELIVERED, pending)
        refund_amount = jnp.where(refund_ok, small, jnp.where(not_delivered, t_amount, large))
        new_status = jnp.where(is_change, dsl.PROCESSING, t_status)
        new_status = jnp.where(is_refund, refund_status, new_status)
        new_status = jnp.where(is_exchange, dsl.DELIVERED, new_status)
        new_amount = jnp.where(is_refund, refund_amount, t_amount)
        exchange_rank = jnp.cumsum(is_exchange) - 1  # distinct items for exchange tasks
        new_item = jnp.where(is_exchange, item_perm[jnp.clip(exchange_rank, 0, i - 1)], t_item)

        order_hot = orders[:, None] == jnp.arange(n)[None, :]  # [K, N], rows distinct
        touched = order_hot.any(0)
        status = jnp.where(touched, (order_hot * new_status[:, None]).sum(0), status)
        amount = jnp.where(touched, (order_hot * new_amount[:, None]).sum(0), amount)
        item = jnp.where(touched, (order_hot * new_item[:, None]).sum(0), item)
        item_hot = is_exchange[:, None] & (new_item[:, None] == jnp.arange(i)[None, :])
        in_stock = jnp.where(item_hot.any(0), (item_hot & exchange_stock[:, None]).any(0), in_stock)
        task_address = (address[orders] + offset) % a

        progress = jnp.zeros((k,), jnp.int32).at[0].set(PENDING)
        obs = self._user_message(kinds[0], orders[0], task_address[0])
        shortest = 1 + jnp.asarray(KIND_COST, jnp.int32)[kinds].sum()
        state = State(
            key=key,
            item=item.astype(jnp.int32),
            status=status.astype(jnp.int32),
            address=address.astype(jnp.int32),
            amount=amount.astype(jnp.int32),
            cancelled=jnp.zeros((n,), bool),
            refunded=jnp.zeros((n,), bool),
            exchanged=jnp.zeros((n,), bool),
            in_stock=in_stock,
            looked_up=jnp.zeros((n,), bool),
            stock_checked=jnp.zeros((i,), bool),
            task_kind=kinds,
            task_order=orders,
            task_address=task_address.astype(jnp.int32),
            progress=progress,
            current=jnp.int32(0),
            turn=jnp.int32(0),
            violated=jnp.bool_(False),
            correct_answers=jnp.int32(0),
            shortest_plan=shortest.astype(jnp.int32),
            terminated=jnp.bool_(False),
            truncated=jnp.bool_(False),
            obs=obs,
        )
        extras = self._zero_extras()
        extras["shortest_plan"] = state.shortest_plan
        timestep = TimeStep(
            step_type=jnp.int8(StepType.FIRST),
            reward=jnp.float32(0.0),
            discount=jnp.float32(1.0),
            observation=Observation(tokens=obs, progress=progress),
            extras=extras,
        )
        return state, timestep

    def step(self, state: State, action: jax.Array) -> tuple[State, TimeStep]:
        """Plays one agent turn.

        Args:
          state: the current state (a terminal state is absorbing: same observation,
            reward 0, all extras 0, step type LAST).
          action: `[L]` int32 tokens of the turn (PAD after END).
        """
        chex.assert_shape(action, (self.turn_len,))
        chex.assert_type(action, int)
        done = state.terminated | state.truncated
        return jax.lax.cond(done, self._absorb, self._transition, state, action)

    def allowed_tokens(
        self, state: State, prefix: jax.Array, position, rules: bool = False
    ) -> jax.Array:
        """Tokens allowed at `position` of the current turn: `[VOCAB_SIZE]` bool.

        Args:
          state: current state (used only with `rules=True`).
          prefix: `[L]` int32 tokens of this turn; entries at `position` and later ignored.
          position: int or int32 scalar in [0, L).
          rules: also exclude tokens that would break a guardrail rule (mask mode); a
            command is offered only if some rule-abiding completion of it exists.

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
        if rules:
            forbidden = guardrail.forbidden_orders(state, self.config.refund_limit)  # [C, N]
            n = self.config.num_orders
            forbidden_tokens = (
                jnp.zeros((dsl.NUM_COMMANDS, dsl.VOCAB_SIZE), bool)
                .at[:, dsl.ORDER_0 : dsl.ORDER_0 + n]
                .set(forbidden)
            )
            viable = (masks[:, 2, :] & ~forbidden_tokens).any(axis=1)
            consistent = consistent & viable
            slot = jnp.where(position == 2, slot & ~forbidden_tokens, slot)
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
        command = jnp.where(fits.any(), jnp.argmax(fits), dsl.MALFORMED).astype(jnp.int32)
        nargs = jnp.asarray(self._num_args)[command]
        arg1 = jnp.where(nargs >= 1, tokens[2] - jnp.asarray(self._base1)[command], 0)
        arg2 = jnp.where(nargs >= 2, tokens[3] - jnp.asarray(self._base2)[command], 0)
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
        active = state.current < cfg.num_tasks
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

        def by_kind(*values):
            return jnp.stack([jnp.asarray(v, jnp.int32) for v in values])[kind]

        final_command = by_kind(
            dsl.CHANGE_ADDRESS,
            dsl.CANCEL,
            dsl.SAY_STATUS,
            jnp.where(refundable, dsl.REFUND, dsl.SAY_CANNOT),
            jnp.where(in_stock, dsl.EXCHANGE, dsl.SAY_NO_STOCK),
            dsl.SAY_DECLINE,
        )
        final_arg1 = by_kind(order, order, order, order, jnp.where(in_stock, order, item), 0)
        final_arg2 = by_kind(address, 0, state.status[order], 0, jnp.where(in_stock, item, 0), 0)
        grounded = by_kind(True, True, looked_up, looked_up, looked_up & stock_checked, True)
        return TaskView(
            active=active,
            index=index,
            kind=kind,
            order=order,
            address=address,
            item=item,
            looked_up=looked_up,
            stock_checked=stock_checked,
            final_command=final_command,
            final_arg1=final_arg1,
            final_arg2=final_arg2,
            grounded=grounded.astype(bool),
        )

    # Dynamics --------------------------------------------------------------------------
    def _transition(self, state: State, action: jax.Array) -> tuple[State, TimeStep]:
        cfg = self.config
        n, i, k = cfg.num_orders, cfg.num_items, cfg.num_tasks
        command, arg1, arg2 = self.parse(action)
        order = jnp.clip(arg1, 0, n - 1)
        item = jnp.clip(jnp.where(command == dsl.EXCHANGE, arg2, arg1), 0, i - 1)
        task = self.task_view(state)

        flags = guardrail.violation_flags(state, command, order, cfg.refund_limit)
        any_violation = flags.any()
        blocked = any_violation & (cfg.guardrail == "penalise")

        # World calls: does the call succeed on the state before the turn?
        processing = (state.status[order] == dsl.PROCESSING) & ~state.cancelled[order]
        delivered = state.status[order] == dsl.DELIVERED
        exchange_ok = (
            delivered & ~state.exchanged[order] & state.in_stock[item] & (state.item[order] == item)
        )
        call_ok = jnp.stack(
            [
                command == dsl.CANCEL,
                command == dsl.CHANGE_ADDRESS,
                command == dsl.REFUND,
                command == dsl.EXCHANGE,
            ]
        ) & jnp.stack([processing, processing, delivered & ~state.refunded[order], exchange_ok])
        world_ok = call_ok.any()
        runs = call_ok & ~blocked  # [4] which world call takes effect
        order_hot = jnp.arange(n) == order
        item_hot = jnp.arange(i) == item
        new_state = state._replace(
            cancelled=state.cancelled | (order_hot & runs[0]),
            address=jnp.where(order_hot & runs[1], arg2, state.address),
            refunded=state.refunded | (order_hot & runs[2]),
            exchanged=state.exchanged | (order_hot & runs[3]),
            looked_up=state.looked_up | (order_hot & (command == dsl.LOOKUP)),
            stock_checked=state.stock_checked | (item_hot & (command == dsl.CHECK_STOCK)),
        )

        # Task bookkeeping: any SAY or successful world call settles the open task.
        nargs = jnp.asarray(self._num_args)[command]
        matches = (
            (command == task.final_command)
            & ((nargs < 1) | (arg1 == task.final_arg1))
            & ((nargs < 2) | (arg2 == task.final_arg2))
        )
        is_say = jnp.asarray(self._is_say)[command]
        settles = task.active & ~blocked & (is_say | (world_ok & ~blocked))
        task_done = settles & matches & task.grounded
        marker = jnp.where(task_done, DONE, FAILED)
        progress = jnp.where(settles & (jnp.arange(k) == task.index), marker, state.progress)
        current = state.current + settles.astype(jnp.int32)
        progress = jnp.where(settles & (jnp.arange(k) == current), PENDING, progress)
        factual = (
            task.active
            & ~blocked
            & (task.kind == STATUS_KIND)
            & (command == dsl.SAY_STATUS)
            & (arg1 == task.order)
            & (arg2 == state.status[task.order])
        )

        # Process verdict: +1 useful, 0 redundant repeat, -1 otherwise.
        needs_order = task.active & (task.kind != OFF_TOPIC_KIND)
        task_lookup = needs_order & (command == dsl.LOOKUP) & (arg1 == task.order)
        task_stock = (
            task.active
            & (task.kind == EXCHANGE_KIND)
            & task.looked_up
            & (command == dsl.CHECK_STOCK)
            & (arg1 == task.item)
        )
        useful = (
            (task_lookup & ~task.looked_up)
            | (task_stock & ~task.stock_checked)
            | task_done
            | (~task.active & (command == dsl.BYE_CMD))
        )
        redundant = (task_lookup & task.looked_up) | (task_stock & task.stock_checked)
        verdict = jnp.where(useful, 1.0, jnp.where(redundant, 0.0, -1.0))
        verdict = jnp.where(any_violation, -1.0, verdict).astype(jnp.float32)

        said_bye = command == dsl.BYE_CMD
        terminated = said_bye | blocked
        violated = state.violated | any_violation
        outcome = said_bye & (progress == DONE).all() & ~violated
        turn = state.turn + 1
        truncated = ~terminated & (turn >= cfg.max_turns)
        last = terminated | truncated
        reward = jnp.where(blocked, -cfg.penalty, outcome.astype(jnp.float32))

        tool_return = self._tool_return(state, command, order, item, world_ok)
        next_index = jnp.minimum(current, k - 1)
        next_message = jnp.where(
            current < k,
            self._user_message(
                state.task_kind[next_index],
                state.task_order[next_index],
                state.task_address[next_index],
            ),
            self._pad([dsl.USER, dsl.token("thanks")]),
        )
        obs = jnp.where(settles, next_message, tool_return)
        obs = jnp.where(blocked, self._pad([dsl.TOOL, dsl.token("blocked")]), obs)

        correct_answers = state.correct_answers + factual.astype(jnp.int32)
        new_state = new_state._replace(
            progress=progress,
            current=current,
            turn=turn,
            violated=violated,
            correct_answers=correct_answers,
            terminated=terminated,
            truncated=truncated,
            obs=obs,
        )
        extras = self._zero_extras()
        extras.update(
            outcome=jnp.where(last, outcome, False).astype(jnp.float32),
            success=last & outcome,
            verdict=verdict,
            efficiency=jnp.where(state.turn >= state.shortest_plan, -1.0, 0.0).astype(jnp.float32),
            violations=flags.sum().astype(jnp.int32),
            violation_flags=flags,
            shortest_plan=state.shortest_plan,
        )
        if cfg.scenario == "dialogue":
            questions = jnp.maximum((state.task_kind == STATUS_KIND).sum(), 1)
            accuracy = correct_answers / questions
            pleased = (correct_answers == questions) & (turn <= state.shortest_plan)
            extras["accuracy"] = jnp.where(last, accuracy, 0.0).astype(jnp.float32)
            extras["user_feedback"] = jnp.where(last, jnp.where(pleased, 1.0, -1.0), 0.0).astype(
                jnp.float32
            )
        timestep = TimeStep(
            step_type=jnp.where(last, StepType.LAST, StepType.MID).astype(jnp.int8),
            reward=reward.astype(jnp.float32),
            discount=jnp.where(terminated, 0.0, 1.0).astype(jnp.float32),
            observation=Observation(tokens=obs, progress=progress),
            extras=extras,
        )
        return new_state, timestep

    def _absorb(self, state: State, action: jax.Array) -> tuple[State, TimeStep]:
        del action
        timestep = TimeStep(
            step_type=jnp.int8(StepType.LAST),
            reward=jnp.float32(0.0),
            discount=jnp.where(state.terminated, 0.0, 1.0).astype(jnp.float32),
            observation=Observation(tokens=state.obs, progress=state.progress),
            extras=self._zero_extras(),
        )
        return state, timestep

    def _tool_return(self, state, command, order, item, world_ok) -> jax.Array:
        """Observation `[O]` of a turn that does not settle a task (one branch per command)."""
        status_token = dsl.STATUS_0 + state.status[order]
        stock_word = jnp.where(
            state.in_stock[item], dsl.token("in_stock"), dsl.token("out_of_stock")
        )
        call_word = jnp.where(world_ok, dsl.token("ok"), dsl.token("error"))

        def lookup():
            return self._pad(
                [
                    dsl.TOOL,
                    dsl.token("order"),
                    dsl.ORDER_0 + order,
                    dsl.ITEM_0 + state.item[order],
                    status_token,
                    dsl.ADDR_0 + state.address[order],
                    dsl.AMT_0 + state.amount[order],
                ]
            )

        def world_call():
            return self._pad([dsl.TOOL, call_word, dsl.ORDER_0 + order])

        def check_stock():
            return self._pad([dsl.TOOL, dsl.token("stock"), dsl.ITEM_0 + item, stock_word])

        def say():  # only reached when no task is open: the user is still saying thanks
            return self._pad([dsl.USER, dsl.token("thanks")])

        def bye():
            return self._pad([dsl.USER, dsl.token("goodbye")])

        def malformed():
            return self._pad([dsl.TOOL, dsl.token("error")])

        # One branch per kind of return, selected through a static command -> branch table.
        branches = (lookup, world_call, check_stock, say, bye, malformed)
        branch_of_command = np.zeros(dsl.NUM_COMMANDS + 1, np.int32)
        branch_of_command[list(dsl.WORLD_COMMANDS)] = 1
        branch_of_command[dsl.CHECK_STOCK] = 2
        branch_of_command[list(dsl.SAY_COMMANDS)] = 3
        branch_of_command[dsl.BYE_CMD] = 4
        branch_of_command[dsl.MALFORMED] = 5
        return jax.lax.switch(jnp.asarray(branch_of_command)[command], branches)

    def _user_message(self, kind, order, address) -> jax.Array:
        """`USER <intent word> ORDER_k [ADDR_a]` as `[O]` int32."""
        word = jnp.asarray(KIND_USER_WORD, jnp.int32)[kind]
        order_token = jnp.where(kind == OFF_TOPIC_KIND, dsl.PAD, dsl.ORDER_0 + order)
        address_token = jnp.where(kind == ADDRESS_KIND, dsl.ADDR_0 + address, dsl.PAD)
        return self._pad([dsl.USER, word, order_token, address_token])

    def _pad(self, tokens) -> jax.Array:
        tokens = jnp.stack([jnp.asarray(t, jnp.int32) for t in tokens])
        return jnp.pad(tokens, (0, self.obs_len - tokens.shape[0]))

    def _zero_extras(self) -> dict:
        zero = jnp.float32(0.0)
        return {
            "outcome": zero,
            "success": jnp.bool_(False),
            "verdict": zero,
            "efficiency": zero,
            "violations": jnp.int32(0),
            "violation_flags": jnp.zeros((guardrail.NUM_RULES,), bool),
            "shortest_plan": jnp.int32(0),
            "accuracy": zero,
            "user_feedback": zero,
        }


class _Draws:
    """Random samples for `reset`, cut slice by slice from one vector of uniforms.

    Why not `jax.random` for each sample: hashing is the main cost of a reset, and a
    dozen threefry samplers also compile slowly. One threefry draw of two words seeds a
    counter-based integer hash (the murmur3 finaliser, applied twice), which gives the
    ~100 uniforms of a reset at a fifth of the cost of threefry, with ample quality for
    sampling a world. Uniforms have 24 bits.
    """

    def __init__(self, key: jax.Array, size: int):
        seed = jax.random.bits(key, (2,), jnp.uint32)
        counter = jnp.arange(size, dtype=jnp.uint32)
        words = _fmix32(seed[0] ^ _fmix32(counter * jnp.uint32(0x9E3779B9) + seed[1]))
        self._uniforms = (words >> 8).astype(jnp.float32) * (1.0 / (1 << 24))
        self._used = 0

    def _take(self, size: int) -> jax.Array:
        if self._used + size > self._uniforms.shape[0]:
            raise ValueError("internal: reset drew more random numbers than it allocated")
        out = self._uniforms[self._used : self._used + size]
        self._used += size
        return out

    def integers(self, size: int, low: int, high: int) -> jax.Array:
        """`[size]` int32 uniform on [low, high)."""
        u = self._take(size)
        return jnp.clip(low + jnp.floor(u * (high - low)), low, high - 1).astype(jnp.int32)

    def bernoulli(self, size: int) -> jax.Array:
        """`[size]` bool, each True with probability 1/2."""
        return self._take(size) < 0.5

    def permutation(self, size: int) -> jax.Array:
        """`[size]` int32 uniformly random permutation of range(size).

        The ranks of iid uniforms (rare ties broken by position), by `size^2` comparisons:
        several times faster than `argsort` for these small sizes under vmap on CPU.
        """
        u = self._take(size)
        index = jnp.arange(size)
        before = (u[None, :] < u[:, None]) | (
            (u[None, :] == u[:, None]) & (index[None, :] < index[:, None])
        )
        return before.sum(axis=1).astype(jnp.int32)


def _fmix32(x: jax.Array) -> jax.Array:
    """murmur3 32-bit finaliser: a bijective avalanche mix of uint32 words."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)
