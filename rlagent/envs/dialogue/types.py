"""Types of the dialogue environment: the attribute markers and the pytrees of reset / step.

Sizes: N entities, A attributes, S = max_turns, O observation tokens. Every module of
`rlagent.envs.dialogue` imports from here; this module imports only the protocol's
`StepType`.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import jax

from rlagent.envs.base import StepType  # noqa: F401  (re-exported)


class Marker(enum.IntEnum):
    """What the dialogue has established about an attribute (`Observation.progress [A]`).

    The user's opening names the attributes it cares about (WANTED) and tells the first
    constraint; the markers are the dialogue-state tracker a system would keep.
    """

    NONE = 0  # not mentioned.
    WANTED = 1  # a constraint of the user's whose value is not told yet.
    TOLD = 2  # a constraint the user has told.
    DONTCARE = 3  # asked about; the user has no constraint on it.
    REQUESTED = 4  # the user asked for it (of the accepted entity); not answered yet.
    ANSWERED = 5  # the agent informed it (the user cannot tell whether rightly).


class Observation(NamedTuple):
    tokens: jax.Array  # [O] int32: the user's message, the KB return, the thumb.
    progress: jax.Array  # [A] int32: a Marker per attribute.


class Signals(NamedTuple):
    """Per-turn signals (0 on reset and on steps from an ended dialogue).

    The scalar signals are reward-ready: errors are negative counts, so a reward
    component is `weight * signal`.
    """

    outcome: jax.Array  # [] float32: 1 on the last turn of a successful dialogue.
    success: jax.Array  # [] bool: bye with the goal met (the accepted entity meets every
    # constraint and every requested attribute was informed rightly) before this turn.
    verdict: jax.Array  # [] float32: +1 a step of the shortest dialogue, -1 a turn with an
    # error or a bye before the goal is met, 0 otherwise.
    efficiency: jax.Array  # [] float32: -1 on a turn past the shortest dialogue.
    factuality: jax.Array  # [] float32: -(wrong informs + recommendations the KB never
    # returned) in the turn.
    coherence: jax.Array  # [] float32: -(coherence errors) in the turn.
    fluency: jax.Array  # [] float32: -(1 if malformed + acts beyond the persona's wish).
    feedback: jax.Array  # [] float32: the user's thumb, +1 / -1, 0 when none is given.
    rating: jax.Array  # [] float32: on the turn that ends the dialogue, (stars - 3) / 2
    # in [-1, 1] for the user's 1-5 rating; 0 otherwise.
    opinion: jax.Array  # [] float32: the thumb before noise (+1 / -1 every played turn).
    stars: jax.Array  # [] int32: the 1-5 rating on the last turn, 0 otherwise.


class TimeStep(NamedTuple):
    step_type: jax.Array  # [] int8 StepType.
    reward: jax.Array  # [] float32: the outcome.
    discount: jax.Array  # [] float32: 0 once the dialogue has ended, else 1.
    observation: Observation
    signals: Signals


class State(NamedTuple):
    """Full environment state of one dialogue."""

    kb: jax.Array  # [N, A] int32: the catalogue, a value index per entity and attribute.
    goal_value: jax.Array  # [A] int32: the user's constraint per attribute, -1 none.
    goal_rank: jax.Array  # [A] int32: agenda order of the constraints (A for others).
    request_rank: jax.Array  # [A] int32: order of the requested attributes (A for others).
    target: jax.Array  # [] int32: the one entity that meets every constraint.
    marker: jax.Array  # [A] int32 Marker.
    answered_right: jax.Array  # [A] bool: the last inform of a request was true.
    informed: jax.Array  # [N, A] int32: the value last informed per entity, -1 none.
    shown: jax.Array  # [N] bool: returned by a query (a grounded recommendation).
    accepted: jax.Array  # [] int32: the entity the user accepted, -1 none.
    queried: jax.Array  # [] bool: a query ran on every constraint.
    pending_chat: jax.Array  # [] bool: the user's off-topic remark awaits an answer.
    patience_left: jax.Array  # [] int32: patience minus turns minus coherence errors.
    turn: jax.Array  # [] int32: turns played.
    coherence_errors: jax.Array  # [] int32: so far (the rating reads it).
    over: jax.Array  # [] bool: bye or the user left (the dialogue has ended).
    feedback_draws: jax.Array  # [S, 2] float32 uniforms: thumb given? flipped? per turn.
    obs: jax.Array  # [O] int32: the last observation tokens.
