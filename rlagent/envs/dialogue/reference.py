"""Plain-Python reference of the dialogue environment (no JAX, no NumPy in `step`).

Written from the rules in `rlagent.envs.dialogue.env`'s docstring with ordinary `if`
statements, as an independent check of the vectorised JAX dynamics: differential tests
load a JAX reset state (`load`, so both play the same catalogue, goal and feedback
draws) and replay the same turns on both. `reset` samples a dialogue from the
generator's rules (`rlagent.envs.dialogue.generator`) with Python's `random`, redrawn
until its goal is on the config's side of the held-out goals (`heldout_goal`).
"""

from __future__ import annotations

import dataclasses
import functools
import random

import numpy as np

from rlagent.envs.dialogue import dsl
from rlagent.envs.dialogue.config import DialogueConfig
from rlagent.envs.dialogue.dsl import Act
from rlagent.envs.dialogue.dsl import ArgClass
from rlagent.envs.dialogue.types import Marker
from rlagent.envs.dialogue.types import Signals
from rlagent.envs.dialogue.types import StepType
from rlagent.envs.splits import draw_split_python
from rlagent.envs.splits import heldout_index_int

T = dsl.TOKEN_IDS
_EMPTY = [dsl.PAD] * 3


@dataclasses.dataclass
class RefState:
    kb: list  # [N][A]
    goal_value: list
    goal_rank: list
    request_rank: list
    target: int
    marker: list
    answered_right: list
    informed: list  # [N][A]
    shown: list
    accepted: int
    queried: bool
    pending_chat: bool
    patience_left: int
    turn: int
    coherence_errors: int
    over: bool
    feedback_draws: list  # [S][2] float32 (numpy scalars, compared in float32)
    obs: list


@dataclasses.dataclass
class RefTimeStep:
    step_type: int
    reward: float
    discount: float
    obs: list
    progress: list
    signals: Signals  # of Python scalars.


@dataclasses.dataclass
class _Turn:
    """What the acts of a turn did, summed."""

    replies: list
    factual: int = 0
    incoherent: int = 0
    useful: bool = False
    rejected: bool = False
    queried: bool = False
    said_bye: bool = False
    answered_pending: bool = False
    chatted: bool = False


class ReferenceDialogue:
    """Same dynamics as `DialogueEnv`, one dialogue at a time, in plain Python."""

    def __init__(self, config: DialogueConfig):
        self.config = config
        cfg = config
        self.sizes = {
            ArgClass.ENT: cfg.num_entities,
            ArgClass.ATTR: cfg.num_attributes,
            ArgClass.VAL: cfg.num_values,
        }
        self.bases = {ArgClass.ENT: dsl.ENT_0, ArgClass.ATTR: dsl.ATTR_0, ArgClass.VAL: dsl.VAL_0}
        self.heads = {int(t): Act(i) for i, t in enumerate(dsl.HEADS)}
        self.shortest = cfg.shortest

    def load(self, state) -> RefState:
        """A reference state equal to one (unbatched) JAX `State`."""
        values = {}
        for name in RefState.__dataclass_fields__:
            value = np.asarray(getattr(state, name))
            if name == "feedback_draws":
                values[name] = [[np.float32(x) for x in row] for row in value]
            else:
                values[name] = value.tolist() if value.ndim else value.item()
        return RefState(**values)

    def reset(self, rng: random.Random) -> RefState:
        """A dialogue sampled by the generator's rules (not the same draws as JAX's); with a
        `task_split`, redrawn until its goal is of the split."""
        draw = functools.partial(self._draw, rng)
        return draw_split_python(self.config.task_split, draw, self.heldout_goal)

    def heldout_goal(self, state: RefState) -> bool:
        """Whether the goal is held out (`config.heldout_goals`, in plain integers): the
        constraints by rank as digits attribute * V + value, then the requested
        attributes by rank, in mixed radix; the hash of the index modulo 2**32."""
        cfg = self.config
        a, v = cfg.num_attributes, cfg.num_values
        constraints = sorted((x for x in range(a) if state.goal_rank[x] < a),
                             key=lambda x: state.goal_rank[x])  # fmt: skip
        requests = sorted((x for x in range(a) if state.request_rank[x] < a),
                          key=lambda x: state.request_rank[x])  # fmt: skip
        index = 0
        for x in constraints:
            index = index * a * v + x * v + state.goal_value[x]
        for x in requests:
            index = index * a + x
        return heldout_index_int(index)

    def _draw(self, rng: random.Random) -> RefState:
        """One draw of a dialogue (`reset` without the split)."""
        cfg = self.config
        n, a, v, c, r = (cfg.num_entities, cfg.num_attributes, cfg.num_values,
                         cfg.num_constraints, cfg.num_requests)  # fmt: skip
        kb = [[rng.randrange(v) for _ in range(a)] for _ in range(n)]
        attrs = rng.sample(range(a), a)  # attrs[i]: the attribute of agenda rank i
        goal_rank, request_rank = [a] * a, [a] * a
        for i, x in enumerate(attrs):
            if i < c:
                goal_rank[x] = i
            elif i < c + r:
                request_rank[x] = i - c
        target = rng.randrange(c, n)
        goal_value = [kb[target][x] if goal_rank[x] < a else -1 for x in range(a)]
        for i, e in enumerate(rng.sample(range(target), c)):  # near misses below the target
            for x in attrs[:c]:
                kb[e][x] = goal_value[x]
            kb[e][attrs[i]] = (goal_value[attrs[i]] + rng.randrange(1, v)) % v
        first = attrs[0]
        for e in range(n):
            meets = all(goal_value[x] < 0 or kb[e][x] == goal_value[x] for x in range(a))
            if meets and e != target:
                kb[e][first] = (goal_value[first] + 1) % v
        marker = [Marker.WANTED if goal_rank[x] < a else Marker.NONE for x in range(a)]
        marker[first] = Marker.TOLD
        obs = [T["USER"]] + _EMPTY * cfg.max_acts
        obs += [T["u_inform"], dsl.ATTR_0 + first, dsl.VAL_0 + goal_value[first]]
        obs += _EMPTY + [dsl.PAD] * (3 + a) + [dsl.PAD]
        draws = [[np.float32(rng.random()) for _ in range(2)] for _ in range(cfg.max_turns)]
        return RefState(
            kb=kb, goal_value=goal_value, goal_rank=goal_rank, request_rank=request_rank,
            target=target, marker=marker, answered_right=[False] * a,
            informed=[[-1] * a for _ in range(n)], shown=[False] * n, accepted=-1,
            queried=False, pending_chat=False, patience_left=cfg.persona.patience, turn=0,
            coherence_errors=0, over=False, feedback_draws=draws, obs=obs,
        )  # fmt: skip

    # The grammar -----------------------------------------------------------------------
    def parse(self, tokens) -> list | None:
        """`[(Act, ent, attr, val), ...]`, or None if the turn is malformed."""
        tokens = [int(t) for t in tokens]
        acts, j = [], 0
        while j < len(tokens) and tokens[j] != dsl.END:
            act = self.heads.get(tokens[j])
            if act is None or len(acts) == self.config.max_acts:
                return None
            if acts and acts[-1][0] == Act.BYE:
                return None
            args = {ArgClass.ENT: 0, ArgClass.ATTR: 0, ArgClass.VAL: 0}
            for cls in dsl.ACT_ARGS[act]:
                j += 1
                if j >= len(tokens):
                    return None
                index = tokens[j] - self.bases[cls]
                if not 0 <= index < self.sizes[cls]:
                    return None
                args[cls] = index
            acts.append((act, args[ArgClass.ENT], args[ArgClass.ATTR], args[ArgClass.VAL]))
            j += 1
        if j >= len(tokens) or not acts:
            return None
        if any(t != dsl.PAD for t in tokens[j + 1 :]):
            return None
        return acts

    def encode(self, acts) -> list:
        return dsl.encode(acts, self.config.max_acts)

    # A turn ----------------------------------------------------------------------------
    def step(self, state: RefState, action) -> tuple[RefState, RefTimeStep]:
        """Plays one turn in place; returns the (same, updated) state and its timestep."""
        if state.over:
            return state, RefTimeStep(
                StepType.LAST, 0.0, 0.0, list(state.obs), list(state.marker), _zeros()
            )
        acts = self.parse(action)
        before = self._snapshot(state)
        turn = _Turn(replies=[list(_EMPTY) for _ in range(self.config.max_acts)])
        for k, act in enumerate(acts or []):
            turn.replies[k] = self._play(state, before, act, turn)
        if acts is None:
            turn.replies[0] = [T["huh"], dsl.PAD, dsl.PAD]
        ignored_chat = before["pending_chat"] and not turn.chatted
        ignored_requests = bool(before["pending_requests"]) and not turn.answered_pending
        turn.incoherent += int(ignored_chat) + int(ignored_requests)
        n_acts = len(acts) if acts is not None else 0
        format_errors = int(acts is None) + max(n_acts - self.config.preferred_acts, 0)
        agenda, chat = self._user_move(state, ignored_chat, ignored_requests)
        return state, self._finish(state, before, turn, format_errors, (agenda, chat))

    def _snapshot(self, state: RefState) -> dict:
        a = self.config.num_attributes
        told = [m == Marker.TOLD for m in state.marker]
        matches = [
            e
            for e in range(self.config.num_entities)
            if all(not told[x] or state.kb[e][x] == state.goal_value[x] for x in range(a))
        ]
        requests = [x for x in range(a) if state.request_rank[x] < a]
        return {
            "told": told,
            "all_told": all(told[x] for x in range(a) if state.goal_value[x] >= 0),
            "goal_met": state.accepted >= 0 and all(state.answered_right[x] for x in requests),
            "pending_requests": [x for x in range(a) if state.marker[x] == Marker.REQUESTED],
            "pending_chat": state.pending_chat,
            "shown": list(state.shown),
            "top": matches[0],
            "count": len(matches),
        }

    def _play(self, state: RefState, before: dict, act, turn: _Turn) -> list:
        """Plays one act; returns the user's reply item."""
        kind, e, a, v = act
        if kind == Act.ASK:
            return self._ask(state, a, turn)
        if kind == Act.CONFIRM:
            return self._confirm(state, a, v, turn)
        if kind == Act.QUERY:
            turn.queried = True
            if before["all_told"] and not state.queried:
                turn.useful = True
            state.queried = state.queried or before["all_told"]
            state.shown[before["top"]] = True
            return list(_EMPTY)
        if kind == Act.INFORM:
            self._inform(state, before, act, turn)
            return list(_EMPTY)
        if kind == Act.RECOMMEND:
            return self._recommend(state, before, e, turn)
        if kind == Act.CHAT:
            turn.chatted = True
            if state.pending_chat:
                turn.useful = True
            state.pending_chat = False
            return list(_EMPTY)
        turn.said_bye = True  # Act.BYE
        if before["goal_met"]:
            turn.useful = True
        return list(_EMPTY)

    def _tell(self, state: RefState, a: int) -> None:
        if state.marker[a] == Marker.WANTED:
            state.marker[a] = Marker.TOLD
        elif state.marker[a] == Marker.NONE:
            state.marker[a] = Marker.TOLD if state.goal_value[a] >= 0 else Marker.DONTCARE

    def _ask(self, state: RefState, a: int, turn: _Turn) -> list:
        m = state.marker[a]
        goal = state.goal_value[a]
        if m not in (Marker.NONE, Marker.WANTED):
            turn.incoherent += 1
        if m == Marker.WANTED:
            turn.useful = True
        self._tell(state, a)
        value = dsl.VAL_0 + goal if goal >= 0 else T["any"]
        return [T["u_inform"], dsl.ATTR_0 + a, value]

    def _confirm(self, state: RefState, a: int, v: int, turn: _Turn) -> list:
        m = state.marker[a]
        goal = state.goal_value[a]
        right = goal >= 0 and v == goal
        if goal >= 0 and m == Marker.TOLD and not right:
            turn.incoherent += 1
        if goal < 0 and m == Marker.DONTCARE:
            turn.incoherent += 1
        if m == Marker.WANTED:
            turn.useful = True
        self._tell(state, a)
        if right:
            return [T["affirm"], dsl.ATTR_0 + a, dsl.VAL_0 + v]
        return [T["negate"], dsl.ATTR_0 + a, dsl.VAL_0 + goal if goal >= 0 else T["any"]]

    def _inform(self, state: RefState, before: dict, act, turn: _Turn) -> None:
        _, e, a, v = act
        true = state.kb[e][a] == v
        if not true:
            turn.factual += 1
        prior = state.informed[e][a]
        if prior >= 0 and prior != v:
            turn.incoherent += 1
        state.informed[e][a] = v
        requested = state.request_rank[a] < self.config.num_attributes
        m = state.marker[a]
        if e == state.accepted and requested and m in (Marker.REQUESTED, Marker.ANSWERED):
            if m == Marker.REQUESTED and true:
                turn.useful = True
            if a in before["pending_requests"]:
                turn.answered_pending = True
            state.marker[a] = Marker.ANSWERED
            state.answered_right[a] = true

    def _recommend(self, state: RefState, before: dict, e: int, turn: _Turn) -> list:
        a = self.config.num_attributes
        broken = [
            x
            for x in range(a)
            if state.goal_value[x] >= 0 and state.kb[e][x] != state.goal_value[x]
        ]
        if not before["shown"][e]:
            turn.factual += 1
        incoherent = any(before["told"][x] for x in broken)
        if state.accepted >= 0:
            if e != state.accepted:
                incoherent = True
            turn.incoherent += int(incoherent)
            return [T["accept"], dsl.ENT_0 + state.accepted, dsl.PAD]
        turn.incoherent += int(incoherent)
        if not broken:
            state.accepted = e
            turn.useful = True
            for x in range(a):
                if state.request_rank[x] < a:
                    state.marker[x] = Marker.REQUESTED
            return [T["accept"], dsl.ENT_0 + e, dsl.PAD]
        turn.rejected = True
        first = min(broken, key=lambda x: state.goal_rank[x])
        if state.marker[first] == Marker.WANTED:
            state.marker[first] = Marker.TOLD
        return [T["negate"], dsl.ATTR_0 + first, dsl.VAL_0 + state.goal_value[first]]

    def _user_move(self, state: RefState, ignored_chat: bool, ignored_requests: bool):
        """The user's own move after the acts: `(agenda item, chat item)`."""
        a = self.config.num_attributes
        persona = self.config.persona
        if state.turn < persona.chats:
            state.pending_chat = True
        chat = list(_EMPTY)
        if state.pending_chat:
            chat = (
                [T["repeat"], T["u_chat"], dsl.PAD]
                if ignored_chat
                else [T["u_chat"], dsl.PAD, dsl.PAD]
            )
        if state.accepted < 0:
            wanted = [x for x in range(a) if state.marker[x] == Marker.WANTED]
            if persona.volunteers and wanted:
                x = min(wanted, key=lambda x: state.goal_rank[x])
                state.marker[x] = Marker.TOLD
                return [T["u_inform"], dsl.ATTR_0 + x, dsl.VAL_0 + state.goal_value[x]], chat
            return list(_EMPTY), chat
        pending = [x for x in range(a) if state.marker[x] == Marker.REQUESTED]
        if pending:
            x = min(pending, key=lambda x: state.request_rank[x])
            word = T["repeat"] if ignored_requests else T["request"]
            return [word, dsl.ATTR_0 + x, dsl.PAD], chat
        return [T["thanks"], dsl.PAD, dsl.PAD], chat

    def _finish(self, state, before, turn: _Turn, format_errors: int, items) -> RefTimeStep:
        persona = self.config.persona
        success = turn.said_bye and before["goal_met"]
        failed_bye = turn.said_bye and not before["goal_met"]
        state.patience_left -= 1 + turn.incoherent
        leave = not turn.said_bye and state.patience_left <= 0
        over = turn.said_bye or leave
        played = state.turn
        state.turn += 1
        state.coherence_errors += turn.incoherent
        bad = turn.incoherent > 0 or format_errors > 0 or turn.rejected or failed_bye or leave
        opinion = -1.0 if bad else 1.0
        give, flip = state.feedback_draws[played]
        feedback = 0.0
        if give < np.float32(persona.feedback_rate):
            feedback = -opinion if flip < np.float32(persona.feedback_noise) else opinion
        stars = 0
        if over:
            quick = success and state.turn <= (self.shortest + persona.patience) // 2
            stars = 2 + 2 * int(success) + int(quick) - min(state.coherence_errors, 2)
            stars = min(max(stars, 1), 5)
        if turn.factual or turn.incoherent or format_errors or failed_bye:
            verdict = -1.0
        else:
            verdict = 1.0 if turn.useful else 0.0
        thumb = T["up"] if feedback > 0 else T["down"] if feedback < 0 else dsl.PAD
        state.obs = self._observation(state, before, turn, items, (thumb, leave))
        state.over = over
        signals = Signals(
            outcome=float(success),
            success=success,
            verdict=verdict,
            efficiency=-1.0 if played >= self.shortest else 0.0,
            factuality=-float(turn.factual),
            coherence=-float(turn.incoherent),
            fluency=-float(format_errors),
            feedback=feedback,
            rating=(stars - 3) / 2.0 if over else 0.0,
            opinion=opinion,
            stars=stars,
        )
        step_type = StepType.LAST if over else StepType.MID
        discount = 0.0 if over else 1.0
        return RefTimeStep(
            step_type, float(success), discount, list(state.obs), list(state.marker), signals
        )

    def _observation(self, state, before, turn: _Turn, items, ending) -> list:
        thumb, leave = ending
        cfg = self.config
        if turn.said_bye or leave:
            word = T["leave"] if leave else T["goodbye"]
            return [T["USER"], word] + [dsl.PAD] * (cfg.obs_len - 3) + [thumb]
        agenda, chat = items
        kb = [dsl.PAD] * (3 + cfg.num_attributes)
        if turn.queried:
            top, count = before["top"], before["count"]
            counts = ["num_1", "num_2", "num_3", "num_many"]
            kb = [T["KB"], T[counts[min(count, 4) - 1]], dsl.ENT_0 + top]
            kb += [dsl.VAL_0 + value for value in state.kb[top]]
        replies = [token for reply in turn.replies for token in reply]
        return [T["USER"]] + replies + agenda + chat + kb + [thumb]

    # The oracle ------------------------------------------------------------------------
    def oracle(self, state: RefState) -> list:
        """The next turn of the shortest dialogue (same rule as `DialogueEnv.oracle_action`)."""
        a = self.config.num_attributes
        before = self._snapshot(state)
        acts = []
        if state.pending_chat:
            acts.append((Act.CHAT, 0, 0, 0))
        slots = self.config.preferred_acts - len(acts)
        accepted = max(state.accepted, 0)
        if before["goal_met"]:
            main = [(Act.BYE, 0, 0, 0)]
        elif state.accepted >= 0:
            open_requests = [
                x for x in range(a) if state.request_rank[x] < a and not state.answered_right[x]
            ]
            open_requests.sort(key=lambda x: state.request_rank[x])
            main = [(Act.INFORM, accepted, x, state.kb[accepted][x]) for x in open_requests]
        elif before["all_told"] and state.queried:
            main = [(Act.RECOMMEND, state.target, 0, 0)]
        elif before["all_told"]:
            main = [(Act.QUERY, 0, 0, 0)]
        else:
            wanted = [x for x in range(a) if state.marker[x] == Marker.WANTED]
            wanted.sort(key=lambda x: state.goal_rank[x])
            main = [(Act.ASK, 0, x, 0) for x in wanted]
        return self.encode(acts + main[:slots])


def _zeros() -> Signals:
    return Signals(
        outcome=0.0,
        success=False,
        verdict=0.0,
        efficiency=0.0,
        factuality=0.0,
        coherence=0.0,
        fluency=0.0,
        feedback=0.0,
        rating=0.0,
        opinion=0.0,
        stars=0,
    )
