"""Configuration of the dialogue environment: the catalogue, the user's goal and persona.

The horizon knob is the goal's size: `num_constraints` C (hidden constraints the agent
must learn), `num_requests` R (attributes the user wants told) and the persona's `chats`
D (off-topic remarks the agent must answer). For a short-answer persona without
volunteering the shortest dialogue is exactly `C + R + D + 2` turns (C - 1 asks, one
query, one recommendation, R informs, D chat answers, bye); `shortest_dialogue` computes
it for every persona. The catalogue size does not change the shortest dialogue (the
generator puts one near miss per constraint before the target, so a query on fewer than
C constraints never returns an entity that meets the whole goal); it bounds C from above
(`num_entities >= C + 1`).

Held-out goals (`task_split`): a dialogue's *cell* is its goal, the constraint attributes
in agenda-rank order with their values and the requested attributes in rank order
(`heldout_goals`); a fixed pseudo-random quarter of the goals is held out
(`rlagent.envs.splits`, as in ToolWorld and Mastermind). 'train' never draws a held-out
goal, 'heldout' draws only held-out ones (`DialogueEnv.heldout_env`), 'all' draws as
before.
"""

from __future__ import annotations

import dataclasses
import itertools
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from rlagent.envs.dialogue import dsl
from rlagent.envs.splits import check_sides
from rlagent.envs.splits import check_split
from rlagent.envs.splits import heldout_index

# Level -> (num_constraints, num_requests, chats), short answers, no volunteering:
# shortest dialogues of 3, 5, 8, 11 and 16 turns.
LEVELS: dict[int, tuple[int, int, int]] = {
    1: (1, 0, 0),
    2: (2, 1, 0),
    3: (3, 2, 1),
    4: (4, 3, 2),
    5: (6, 4, 4),
}
ANSWER_STYLES = ("short", "detailed")
MAX_CHATS = 6
# Attributes beyond the goal's (asked about, the user does not care), when left at None.
SPARE_ATTRIBUTES = 2
# Goals classified per batch by the config's split check (`_check_split`).
_SPLIT_CHECK_CHUNK = 256


@dataclasses.dataclass(frozen=True)
class Persona:
    """How the simulated user behaves (hashable)."""

    patience: int | None = None  # turns it tolerates (None: shortest + max(2, shortest // 2)).
    answers: str = "short"  # 'short': one act per turn; 'detailed': up to max_acts.
    volunteers: bool = False  # states its next untold constraint unasked, every reply.
    # Off-topic remarks, one in each reply to the first `chats` turns (None: the level's).
    chats: int | None = None
    feedback_rate: float = 0.3  # probability of a thumbs up / down after a turn.
    feedback_noise: float = 0.1  # probability that a given thumb is flipped.

    def __post_init__(self):
        if self.patience is not None:
            _check_integer(self, "patience", "Persona")
        if self.answers not in ANSWER_STYLES:
            _fail(self, "answers", "Persona", f"must be one of {ANSWER_STYLES}")
        if not isinstance(self.volunteers, bool):
            _fail(self, "volunteers", "Persona", "must be a bool")
        if self.chats is not None:
            _check_integer(self, "chats", "Persona")
            if not 0 <= self.chats <= MAX_CHATS:
                _fail(self, "chats", "Persona", f"must be in [0, {MAX_CHATS}]")
        for name in ("feedback_rate", "feedback_noise"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                _fail(self, name, "Persona", "must be a number")
            if not 0.0 <= value <= 1.0:  # NaN fails too
                _fail(self, name, "Persona", "must be in [0, 1]")


@dataclasses.dataclass(frozen=True)
class DialogueConfig:
    """Static configuration (hashable: safe as a static jit argument).

    Fields left at None are filled from the level; a bad field raises a ValueError that
    names it.
    """

    level: int = 1  # curriculum level 1..5 (LEVELS): C, R and chats.
    num_constraints: int | None = None  # C hidden constraints (distinct attributes).
    num_requests: int | None = None  # R attributes of the entity the user wants told.
    num_attributes: int | None = None  # A catalogue attributes (default C + R + 2, <= 12).
    num_values: int = 4  # values per attribute, 2..4.
    num_entities: int | None = None  # N catalogue entities, C + 1..16 (default max(8, C + 2)).
    max_acts: int = 2  # acts a turn may hold, 1..3 (L = 4 * max_acts + 1).
    persona: Persona | None = None  # None: Persona(); its chats None: the level's.
    # Held-out goals: a fixed quarter of the goals (`heldout_goals`); 'train' dialogues
    # have none of them, 'heldout' dialogues only them, 'all' draws as before (splits.TASK_SPLITS).
    task_split: str = "all"

    def __post_init__(self):
        _check_integer(self, "level")
        if self.level not in LEVELS:
            _fail(self, "level", "DialogueConfig", f"must be one of {tuple(LEVELS)}")
        self._fill_level_defaults()
        self._check_sizes()
        self._fill_patience()
        self._check_split()

    @property
    def preferred_acts(self) -> int:
        """W: acts per turn the persona wants (more is a fluency error)."""
        return 1 if self.persona.answers == "short" else self.max_acts

    @property
    def shortest(self) -> int:
        """Turns of the shortest error-free dialogue that meets the goal (the oracle's)."""
        return shortest_dialogue(self)

    @property
    def max_turns(self) -> int:
        """S: the user leaves once out of patience, so no dialogue runs past it."""
        return self.persona.patience

    @property
    def turn_len(self) -> int:
        return dsl.turn_len(self.max_acts)

    @property
    def obs_len(self) -> int:
        """O: USER, max_acts + 2 items of 3 tokens, the KB return (3 + A), the thumb."""
        return 1 + 3 * (self.max_acts + 2) + 3 + self.num_attributes + 1

    def _fill_level_defaults(self):
        constraints, requests, chats = LEVELS[self.level]
        for name, value in (("num_constraints", constraints), ("num_requests", requests)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if self.persona is None:
            object.__setattr__(self, "persona", Persona(chats=chats))
        elif not isinstance(self.persona, Persona):
            _fail(self, "persona", "DialogueConfig", "must be a Persona")
        elif self.persona.chats is None:
            object.__setattr__(self, "persona", dataclasses.replace(self.persona, chats=chats))
        goal = self.num_constraints + self.num_requests
        if self.num_attributes is None:
            spare = min(dsl.MAX_ATTRIBUTES, goal + SPARE_ATTRIBUTES)
            object.__setattr__(self, "num_attributes", max(spare, 2))
        if self.num_entities is None:
            object.__setattr__(
                self, "num_entities", min(dsl.MAX_ENTITIES, max(8, self.num_constraints + 2))
            )

    def _check_sizes(self):
        for name in ("num_constraints", "num_requests", "num_attributes", "num_values"):
            _check_integer(self, name)
        _check_integer(self, "num_entities")
        _check_integer(self, "max_acts")
        if not 2 <= self.num_attributes <= dsl.MAX_ATTRIBUTES:
            _fail(self, "num_attributes", "DialogueConfig", f"must be in [2, {dsl.MAX_ATTRIBUTES}]")
        if not 2 <= self.num_values <= dsl.MAX_VALUES:
            _fail(self, "num_values", "DialogueConfig", f"must be in [2, {dsl.MAX_VALUES}]")
        if not 1 <= self.max_acts <= dsl.MAX_ACTS:
            _fail(self, "max_acts", "DialogueConfig", f"must be in [1, {dsl.MAX_ACTS}]")
        if not 1 <= self.num_constraints <= self.num_attributes:
            _fail(
                self,
                "num_constraints",
                "DialogueConfig",
                f"must be in [1, num_attributes={self.num_attributes}]",
            )
        if not 0 <= self.num_requests <= self.num_attributes - self.num_constraints:
            _fail(
                self,
                "num_requests",
                "DialogueConfig",
                f"must be in [0, num_attributes - num_constraints = "
                f"{self.num_attributes - self.num_constraints}] (distinct attributes)",
            )
        if not self.num_constraints + 1 <= self.num_entities <= dsl.MAX_ENTITIES:
            _fail(
                self,
                "num_entities",
                "DialogueConfig",
                f"a catalogue of {self.num_entities} entities is too small for "
                f"{self.num_constraints} constraints (or above {dsl.MAX_ENTITIES}): it holds the "
                f"target and one near miss per constraint, so it must be in "
                f"[num_constraints + 1 = {self.num_constraints + 1}, {dsl.MAX_ENTITIES}]",
            )

    def _fill_patience(self):
        shortest = self.shortest
        persona = self.persona
        if persona.patience is None:
            patience = shortest + max(2, shortest // 2)
            object.__setattr__(self, "persona", dataclasses.replace(persona, patience=patience))
        elif persona.patience < shortest:
            raise ValueError(
                f"DialogueConfig.persona.patience: must be >= the shortest dialogue that meets "
                f"the goal ({shortest} turns), got {persona.patience}"
            )

    def _check_split(self):
        """A split needs goals on both sides. Goals are classified in enumeration order
        until both sides are seen (a few goals: a quarter is held out), so only a goal space
        that has one side empty is enumerated to its end, and then refused with its counts."""

        def fail(name, why):
            _fail(self, name, "DialogueConfig", why)

        check_split(self.task_split, fail)
        if self.task_split == "all":
            return
        with jax.ensure_compile_time_eval():  # concrete even if built under a trace.
            held = (_heldout_goals_jit(self, *chunk) for chunk in _goal_chunks(self))
            check_sides(held, "goals", fail)


def heldout_goals(config: DialogueConfig, goal_rank, goal_value, request_rank) -> jax.Array:
    """`[...]` bool: whether each goal (`State` fields `[..., A]`) is held out.

    A goal's cell index is in mixed radix: per constraint, by agenda rank, the digit
    attribute * V + value (radix A * V), then per requested attribute, by rank, the
    attribute (radix A), the first constraint most significant; modulo 2**32 (the index
    is below 2**32 up to level 4; level 5's wrap, and goals that share the 32-bit index
    share their side). It is held out iff `splits.heldout_index(index)`: a fixed
    pseudo-random quarter.
    """
    a, v = config.num_attributes, config.num_values
    c, r = config.num_constraints, config.num_requests
    # The weight of each rank (0 at rank A: not in the goal), modulo 2**32.
    lower = pow(a, r, 1 << 32)
    constraint_weight = np.zeros((a + 1,), np.uint32)
    constraint_weight[:c] = [pow(a * v, c - 1 - i, 1 << 32) * lower % (1 << 32) for i in range(c)]
    request_weight = np.zeros((a + 1,), np.uint32)
    request_weight[:r] = [pow(a, r - 1 - j, 1 << 32) for j in range(r)]
    attribute = jnp.arange(a, dtype=jnp.uint32)
    digit = attribute * jnp.uint32(v) + jnp.maximum(jnp.asarray(goal_value), 0).astype(jnp.uint32)
    terms = digit * jnp.asarray(constraint_weight)[jnp.asarray(goal_rank)]
    terms = terms + attribute * jnp.asarray(request_weight)[jnp.asarray(request_rank)]
    index = jnp.sum(terms, axis=-1, dtype=jnp.uint32)
    return heldout_index(index)


# The split check's classifier, jitted: one compile per config (run eagerly, each op was
# compiled on its own and a check took about 5x longer).
_heldout_goals_jit = jax.jit(heldout_goals, static_argnums=0)


def _goal_chunks(config: DialogueConfig):
    """Every goal of the config as `(goal_rank, goal_value, request_rank)` `[G, A]` int32
    arrays, in chunks of `_SPLIT_CHECK_CHUNK` goals (lexicographic order)."""
    a, c, r = config.num_attributes, config.num_constraints, config.num_requests
    goals = (  # lazily: itertools.product would first list every permutation.
        (attrs, values)
        for attrs in itertools.permutations(range(a), c + r)
        for values in itertools.product(range(config.num_values), repeat=c)
    )
    while chunk := list(itertools.islice(goals, _SPLIT_CHECK_CHUNK)):
        order = np.asarray([attrs for attrs, _ in chunk], np.int32).reshape(len(chunk), c + r)
        values = np.asarray([value for _, value in chunk], np.int32).reshape(len(chunk), c)
        rows = np.arange(len(chunk))[:, None]
        goal_rank = np.full((len(chunk), a), a, np.int32)
        goal_rank[rows, order[:, :c]] = np.arange(c)
        goal_value = np.full((len(chunk), a), -1, np.int32)
        goal_value[rows, order[:, :c]] = values
        request_rank = np.full((len(chunk), a), a, np.int32)
        request_rank[rows, order[:, c:]] = np.arange(r)
        yield goal_rank, goal_value, request_rank


def shortest_dialogue(config: DialogueConfig) -> int:
    """Turns of the oracle's dialogue, counted without playing it (plain Python).

    Per turn the oracle answers a pending chat first, then, in the persona's remaining
    act slots: bye once the goal is met; informs of the requested attributes once an
    entity is accepted; the recommendation once a query on every constraint ran; that
    query once every constraint is told; otherwise asks for the untold constraints. The
    user then volunteers a constraint (if it does) and chats (the first `chats` replies).
    """
    persona = config.persona
    slots_per_turn = config.preferred_acts
    told, answered, turn = 1, 0, 0  # the opening message tells the first constraint.
    pending_chat = accepted = queried = False
    while True:
        slots = slots_per_turn - int(pending_chat)
        pending_chat = False
        if slots > 0:
            if accepted and answered == config.num_requests:
                return turn + 1
            if accepted:
                answered += min(slots, config.num_requests - answered)
            elif told == config.num_constraints:
                accepted, queried = queried, True
            else:
                told += min(slots, config.num_constraints - told)
        if not accepted and persona.volunteers and told < config.num_constraints:
            told += 1
        pending_chat = turn < persona.chats
        turn += 1


def _check_integer(obj, name: str, owner: str = "DialogueConfig"):
    value = getattr(obj, name)
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        _fail(obj, name, owner, "must be an integer")


def _fail(obj, name: str, owner: str, message: str):
    raise ValueError(f"{owner}.{name}: {message}, got {getattr(obj, name)!r}")
