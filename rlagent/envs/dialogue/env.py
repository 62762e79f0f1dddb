"""DialogueEnv: a task-oriented dialogue with an agenda-based simulated user (JAX-native).

The user (Schatzmann et al., 2007) wants the one entity of a catalogue that meets its
hidden constraints, and wants some of its attributes told. Its opening names the
attributes it cares about (markers WANTED) and tells the first constraint. One step is
one agent turn of 1..max_acts dialogue acts (`rlagent.envs.dialogue.dsl`); the acts are
played in order against the user, who answers each (`messages`), then makes its own
move (the agenda item) and, in its replies to the first `persona.chats` turns, an
off-topic remark.

The user's reactions, act by act (a constraint is *told* once the user has said it):

    ask a          its constraint on a (u_inform a v), or `any` if it has none
    confirm a v    affirm, or negate with the right value (or `any`)
    query          nothing; the KB return shows the matches of the constraints told
                   before this turn: their number and the first (lowest index)
    inform e a v   if e is the accepted entity and a requested: a is answered (the user
                   cannot tell a wrong value)
    recommend e    accept if e meets every constraint (the user then requests all its
                   requested attributes), else negate the first constraint e breaks
                   (telling it); once an entity is accepted the user keeps it
    chat           answers the pending off-topic remark
    bye            ends the dialogue: success iff the goal was met before this turn
                   (an entity accepted, every request answered rightly)

Its own move: a volunteering user states its next untold constraint while no entity is
accepted; after acceptance it asks the first unanswered request (`repeat` if the turn
ignored it) or thanks. Its patience drops by one per turn and one more per coherence
error; at 0 it leaves (a failed dialogue).

Errors of a turn (the signals are their negated counts, see `types.Signals`):

    factuality  an inform whose value the KB contradicts; a recommendation of an entity no
                query returned (ungrounded)
    coherence   asking or confirming what the user already said (ask on a told or
                don't-care attribute, confirm against a told value); recommending an
                entity that breaks a told constraint, or another after one was accepted;
                informing (e, a) differently than before; ignoring the user's last
                question (a pending remark not answered by chat, pending requests of which
                the turn informs none)
    fluency     a malformed turn; each act beyond the persona's preferred number (1 for
                short answers, max_acts for detailed)

The process verdict judges a turn against the shortest dialogue: -1 if it has an error
or says bye before the goal is met; +1 if it takes a step of the shortest dialogue (a
constraint told because asked or confirmed, the first query on every constraint, an
accepted recommendation, a request answered rightly, the remark answered, bye once the
goal is met); 0 otherwise. The oracle (`oracle_action`) plays only such turns.

User feedback: after each turn the user has an opinion, +1 unless the turn was
incoherent, badly formed, a rejected recommendation, a bye before the goal, or made it
leave (the user cannot check facts, so factual errors do not sway it); with probability
`feedback_rate` it shows it as a thumb, flipped with probability `feedback_noise`. When
the dialogue ends it rates it: stars = clip(2 + 2 success + quick - min(coherence
errors, 2), 1, 5), quick = success within (shortest + patience) // 2 turns.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from rlagent.envs.base import TokenSpec
from rlagent.envs.dialogue import dsl
from rlagent.envs.dialogue import generator
from rlagent.envs.dialogue import messages
from rlagent.envs.dialogue.config import DialogueConfig
from rlagent.envs.dialogue.dsl import Act
from rlagent.envs.dialogue.dsl import ArgClass
from rlagent.envs.dialogue.messages import T
from rlagent.envs.dialogue.messages import item
from rlagent.envs.dialogue.types import Marker
from rlagent.envs.dialogue.types import Observation
from rlagent.envs.dialogue.types import Signals
from rlagent.envs.dialogue.types import State
from rlagent.envs.dialogue.types import StepType
from rlagent.envs.dialogue.types import TimeStep
from rlagent.envs.splits import heldout_config


class DialogueEnv:
    """Jumanji-style environment; see the module docstring for the rules."""

    def __init__(self, config: DialogueConfig | None = None):
        self.config = config if config is not None else DialogueConfig()
        cfg = self.config
        self._fsm = dsl.fsm_tables(cfg.num_entities, cfg.num_attributes, cfg.num_values)
        self._shortest = cfg.shortest

    def __repr__(self) -> str:
        return f"DialogueEnv({self.config})"

    # Sizes and the environment protocol (rlagent.envs.base) ------------------------------
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
        return self.config.num_attributes

    token_spec = TokenSpec(vocab_size=dsl.VOCAB_SIZE, pad=dsl.PAD, end=dsl.END)
    # Per-turn scalar signals the rollout records (Signals fields; `success` is its own).
    signal_names = (
        "outcome", "verdict", "efficiency", "factuality", "coherence", "fluency", "feedback",
        "rating",
    )  # fmt: skip
    # Training-reward components of rlagent.train.rewards these signals support.
    reward_components = (
        "outcome",  # `outcome`: 1 on the last turn of a successful dialogue.
        "process",  # `verdict`.
        "efficiency",  # `efficiency`: -1 on a turn past the shortest dialogue.
        "potential",  # shaping by the verdict's useful turns.
        "prm_min",  # min-form credit of the verdict.
        "learned_sum",  # a PRM's scores (any environment).
        "learned_min",
        "learned_potential",
        "learned_centred",
        "fluency",  # `fluency`: -(malformed turns + acts beyond the persona's wish).
        "factuality",  # `factuality`: -(wrong facts + ungrounded recommendations).
        "feedback",  # `feedback`: the user's noisy, sparse thumbs up / down.
        "rating",  # `rating`: (stars - 3) / 2 on the last turn.
        "coherence",  # `coherence`: -(coherence errors).
    )

    def reset(self, key: jax.Array) -> tuple[State, TimeStep]:
        """Samples a catalogue and a goal (`generator`; of `config.task_split`'s side of
        the held-out goals); returns the user's opening."""
        state = generator.generate(self.config, key)
        timestep = TimeStep(
            step_type=jnp.int8(StepType.FIRST),
            reward=jnp.float32(0.0),
            discount=jnp.float32(1.0),
            observation=self.observe(state),
            signals=_zero_signals(),
        )
        return state, timestep

    def step(self, state: State, action: jax.Array) -> tuple[State, TimeStep]:
        """Plays one agent turn `[L]` int32 (an ended dialogue is absorbing)."""
        chex.assert_shape(action, (self.turn_len,))
        chex.assert_type(action, int)
        return jax.lax.cond(state.over, self._absorb, self._transition, state, action)

    def allowed_tokens(self, state: State, prefix: jax.Array, position) -> jax.Array:
        """`[V]` bool: the tokens the grammar allows at `position` after `prefix [L]`.

        At an act boundary: an act head (while fewer than max_acts acts and no bye) or
        END (after at least one act); inside an act, its argument class (the config's
        sizes). After END, or after a prefix that is already malformed, PAD only.
        """
        del state
        chex.assert_shape(prefix, (self.turn_len,))
        fsm = self._run_fsm(prefix, position)
        return self._next_tokens(fsm)

    def parse(self, action: jax.Array) -> _Parsed:
        """The acts of a turn (`Act.NONE` in empty slots, and everywhere if malformed)."""
        fsm = self._run_fsm(action, self.turn_len)
        valid = fsm.ended & ~fsm.broken
        kinds = jnp.where(valid, fsm.kinds, Act.NONE)
        return _Parsed(kinds=kinds, args=fsm.args, valid=valid)

    def heldout_env(self) -> DialogueEnv:
        """This environment drawing only held-out goals (`task_split='heldout'`); the
        training env must draw none of them (`task_split='train'`)."""
        return DialogueEnv(heldout_config(self.config, "goals"))

    def observe(self, state: State) -> Observation:
        return Observation(tokens=state.obs, progress=state.marker)

    def episode_over(self, state: State) -> jax.Array:
        return state.over

    def episode_turn(self, state: State) -> jax.Array:
        return state.turn

    def episode_metrics(
        self, signals: dict[str, jax.Array], turn_mask: jax.Array, action_tokens: jax.Array
    ) -> dict[str, jax.Array]:
        """Batch means (float32 scalars) of `[B, S]` signals (0 off `turn_mask`).

        Per dialogue: goal success, satisfaction (stars, 3 + 2 rating, of dialogues that
        ended), factuality / coherence / format errors, turns and turns past the shortest
        dialogue; per played turn: the verdict, the rate of thumbs and of thumbs up.
        `collapse_rate` is the fraction of dialogues (`action_tokens [B, S, L]`) that never
        query the catalogue: a policy that gives up (bye at once) makes no factual or
        coherence error, so read the error counts next to it.
        """
        valid = turn_mask.astype(jnp.float32)
        queries = (action_tokens == dsl.token("query")) & turn_mask[..., None]

        def per_dialogue(name):
            return jnp.mean(jnp.sum(signals[name] * valid, axis=1))

        turns = jnp.maximum(jnp.sum(valid), 1.0)
        thumbs = (signals["feedback"] != 0) & turn_mask
        return {
            "goal_success": per_dialogue("outcome"),
            "satisfaction": 3.0 + 2.0 * per_dialogue("rating"),
            "factuality_errors": -per_dialogue("factuality"),
            "coherence_errors": -per_dialogue("coherence"),
            "format_errors": -per_dialogue("fluency"),
            "dialogue_turns": jnp.mean(jnp.sum(valid, axis=1)),
            "turns_over_shortest": -per_dialogue("efficiency"),
            "process_score": jnp.sum(signals["verdict"] * valid) / turns,
            "feedback_rate": jnp.sum(thumbs) / turns,
            "thumbs_up_rate": jnp.sum(thumbs & (signals["feedback"] > 0))
            / jnp.maximum(jnp.sum(thumbs), 1),
            "collapse_rate": jnp.mean(~jnp.any(queries, axis=(1, 2))),
        }

    def oracle_action(self, state: State) -> jax.Array:
        """`[L]` the next turn of the shortest dialogue from `state` (module docstring).

        A pending remark is answered first; then, in the persona's remaining act slots:
        bye once the goal is met; informs of the requests not yet answered rightly once an
        entity is accepted; the target's recommendation once a query on every constraint
        ran; that query once every constraint is told; else asks for the untold
        constraints in the user's agenda order.
        """
        cfg, a = self.config, self.config.num_attributes
        start = _turn_start(state)
        order = jnp.arange(a)
        wanted = state.marker == Marker.WANTED
        untold = jnp.argsort(jnp.where(wanted, state.goal_rank, a + order))
        accepted = jnp.maximum(state.accepted, 0)
        open_requests = (state.request_rank < a) & ~state.answered_right & (state.accepted >= 0)
        requests = jnp.argsort(jnp.where(open_requests, state.request_rank, a + order))
        phase = jnp.select(
            [start.goal_met, state.accepted >= 0, start.all_told & state.queried, start.all_told],
            [Act.BYE, Act.INFORM, Act.RECOMMEND, Act.QUERY],
            Act.ASK,
        )
        many = jnp.where(phase == Act.INFORM, open_requests.sum(), wanted.sum())
        chat = state.pending_chat.astype(jnp.int32)
        acts = []
        for k in range(cfg.preferred_acts):
            j = k - chat
            index = jnp.clip(j, 0, a - 1)
            single = (phase == Act.BYE) | (phase == Act.RECOMMEND) | (phase == Act.QUERY)
            present = (j >= 0) & jnp.where(single, j == 0, j < many)
            attr = jnp.where(phase == Act.INFORM, requests[index], untold[index])
            kind = jnp.where(j < 0, Act.CHAT, jnp.where(present, phase, Act.NONE))
            ent = jnp.where(phase == Act.RECOMMEND, state.target, accepted)
            acts.append((kind, ent, attr, state.kb[accepted, attr]))
        return self._encode(acts)

    # Grammar: the finite-state machine of dsl.fsm_tables --------------------------------
    def _run_fsm(self, tokens: jax.Array, position) -> _Fsm:
        """The grammar's state after reading `tokens[:position]`."""
        m = self.config.max_acts
        init = _Fsm(
            n_acts=jnp.int32(0),
            act=jnp.int32(-1),
            offset=jnp.int32(0),
            last_bye=jnp.bool_(False),
            ended=jnp.bool_(False),
            broken=jnp.bool_(False),
            kinds=jnp.full((m,), Act.NONE, jnp.int32),
            args=jnp.zeros((m, len(ArgClass)), jnp.int32),
        )

        def read(fsm, inputs):
            j, tok = inputs
            new = self._fsm_step(fsm, tok)
            return jax.tree.map(lambda n, o: jnp.where(j < position, n, o), new, fsm), None

        steps = jnp.arange(self.turn_len)
        fsm, _ = jax.lax.scan(read, init, (steps, tokens.astype(jnp.int32)))
        return fsm

    def _fsm_step(self, fsm: _Fsm, tok: jax.Array) -> _Fsm:
        t = self._fsm
        m = self.config.max_acts
        in_vocab = (tok >= 0) & (tok < dsl.VOCAB_SIZE)
        head = jnp.where(
            in_vocab, jnp.asarray(t.head_act)[jnp.clip(tok, 0, dsl.VOCAB_SIZE - 1)], -1
        )
        live = ~fsm.broken & ~fsm.ended
        boundary = fsm.act < 0
        start = live & boundary & (head >= 0) & (fsm.n_acts < m) & ~fsm.last_bye
        end = live & boundary & (tok == dsl.END) & (fsm.n_acts > 0)
        act = jnp.clip(fsm.act, 0, dsl.NUM_ACTS - 1)
        cls = jnp.asarray(t.slot_class)[act, jnp.clip(fsm.offset, 0, dsl.MAX_ACT_LEN - 1)]
        cls_index = jnp.clip(cls, 0, len(ArgClass) - 1)
        low = jnp.asarray(t.class_low)[cls_index]
        in_class = (cls >= 0) & (tok >= low) & (tok < jnp.asarray(t.class_high)[cls_index])
        arg = live & ~boundary & in_class
        pad_after = fsm.ended & ~fsm.broken & (tok == dsl.PAD)
        head_index = jnp.clip(head, 0, dsl.NUM_ACTS - 1)
        length = jnp.asarray(t.act_len)
        slot = jnp.clip(fsm.n_acts - 1, 0, m - 1)  # the act whose argument this is
        finished = arg & (fsm.offset + 1 >= length[act])
        return _Fsm(
            n_acts=fsm.n_acts + start.astype(jnp.int32),
            act=jnp.where(
                start,
                jnp.where(length[head_index] > 1, head_index, -1),
                jnp.where(finished, -1, fsm.act),
            ),
            offset=jnp.where(start, 1, jnp.where(arg, fsm.offset + 1, fsm.offset)),
            last_bye=jnp.where(start, head_index == Act.BYE, fsm.last_bye),
            ended=fsm.ended | end,
            broken=fsm.broken | ~(start | end | arg | pad_after),
            kinds=jnp.where(
                start, fsm.kinds.at[jnp.clip(fsm.n_acts, 0, m - 1)].set(head_index), fsm.kinds
            ),
            args=jnp.where(arg, fsm.args.at[slot, cls_index].set(tok - low), fsm.args),
        )

    def _next_tokens(self, fsm: _Fsm) -> jax.Array:
        t = self._fsm
        vocab = jnp.arange(dsl.VOCAB_SIZE)
        live = ~fsm.broken & ~fsm.ended
        boundary = fsm.act < 0
        heads = live & boundary & (fsm.n_acts < self.config.max_acts) & ~fsm.last_bye
        end = live & boundary & (fsm.n_acts > 0)
        act = jnp.clip(fsm.act, 0, dsl.NUM_ACTS - 1)
        cls = jnp.asarray(t.slot_class)[act, jnp.clip(fsm.offset, 0, dsl.MAX_ACT_LEN - 1)]
        cls_index = jnp.clip(cls, 0, len(ArgClass) - 1)
        in_class = (vocab >= jnp.asarray(t.class_low)[cls_index]) & (
            vocab < jnp.asarray(t.class_high)[cls_index]
        )
        allowed = (
            (heads & (jnp.asarray(t.head_act) >= 0))
            | (end & (vocab == dsl.END))
            | (live & ~boundary & (cls >= 0) & in_class)
        )
        return jnp.where(allowed.any(), allowed, vocab == dsl.PAD)

    def _encode(self, acts) -> jax.Array:
        """`[L]` tokens of up to max_acts acts `(kind, ent, attr, val)` (NONE: no act)."""
        t = self._fsm
        tokens = jnp.zeros((self.turn_len,), jnp.int32)
        position = jnp.int32(0)
        for kind, ent, attr, val in acts:
            present = kind != Act.NONE
            index = jnp.clip(kind, 0, dsl.NUM_ACTS - 1)
            length = jnp.asarray(t.act_len)[index]
            args = jnp.stack([ent, attr, val]).astype(jnp.int32)
            for j in range(dsl.MAX_ACT_LEN):
                cls = jnp.asarray(t.slot_class)[index, j]
                arg_token = (
                    jnp.asarray(t.class_low)[jnp.clip(cls, 0, 2)] + args[jnp.clip(cls, 0, 2)]
                )
                tok = jnp.asarray(dsl.HEADS)[index] if j == 0 else arg_token
                where = jnp.clip(position + j, 0, self.turn_len - 1)
                write = present & (j < length)
                tokens = tokens.at[where].set(jnp.where(write, tok, tokens[where]))
            position = position + jnp.where(present, length, 0)
        return tokens.at[position].set(dsl.END)

    # Dynamics ---------------------------------------------------------------------------
    def _transition(self, state: State, action: jax.Array) -> tuple[State, TimeStep]:
        parsed = self.parse(action)
        start = _turn_start(state)
        user = _User(
            marker=state.marker,
            answered_right=state.answered_right,
            informed=state.informed,
            shown=state.shown,
            accepted=state.accepted,
            queried=state.queried,
            pending_chat=state.pending_chat,
        )
        # The acts in order, each against the user as the earlier ones left it; a scan
        # compiles the act rules once, not once per act slot.
        acts = _Act(parsed.kinds, *(parsed.args[:, c] for c in ArgClass))
        user, effects = jax.lax.scan(functools.partial(_play_act, state, start), user, acts)
        judged = self._judge(start, parsed, effects)
        user, agenda, chat = self._user_move(state, user, judged)
        return self._finish(state, start, user, judged, (effects.item, agenda, chat))

    def _judge(self, start: _TurnStart, parsed: _Parsed, effects: _Effect) -> _Judged:
        """The turn's errors, its verdict inputs and whether it said bye."""
        present = parsed.kinds != Act.NONE
        ignored_chat = start.pending_chat & ~(parsed.kinds == Act.CHAT).any()
        ignored_requests = start.pending_requests.any() & ~effects.answers_pending.any()
        incoherent = effects.incoherent.sum() + ignored_chat + ignored_requests
        excess = jnp.maximum(present.sum() - self.config.preferred_acts, 0)
        said_bye = effects.bye.any()
        return _Judged(
            malformed=~parsed.valid,
            factual=effects.factual.sum().astype(jnp.int32),
            incoherent=incoherent.astype(jnp.int32),
            format_errors=((~parsed.valid).astype(jnp.int32) + excess).astype(jnp.int32),
            useful=effects.useful.any(),
            rejected=effects.rejected.any(),
            queried=effects.query.any(),
            said_bye=said_bye,
            success=said_bye & start.goal_met,
            ignored_chat=ignored_chat,
            ignored_requests=ignored_requests,
        )

    def _user_move(self, state: State, user: _User, judged: _Judged):
        """The user's own move: `(user, agenda item [3], chat item [3])`."""
        a = self.config.num_attributes
        persona = self.config.persona
        pending_chat = user.pending_chat | (state.turn < persona.chats)
        chat_item = jnp.where(
            judged.ignored_chat, item(T["repeat"], T["u_chat"]), item(T["u_chat"])
        )
        chat_item = jnp.where(pending_chat, chat_item, messages.empty_item())
        search = user.accepted < 0
        wanted = user.marker == Marker.WANTED
        volunteer = persona.volunteers & search & wanted.any()
        told = jnp.argmin(jnp.where(wanted, state.goal_rank, a + 1))
        marker = jnp.where(volunteer & (jnp.arange(a) == told), Marker.TOLD, user.marker)
        volunteered = item(T["u_inform"], dsl.ATTR_0 + told, dsl.VAL_0 + state.goal_value[told])
        pending = marker == Marker.REQUESTED
        asked = jnp.argmin(jnp.where(pending, state.request_rank, a + 1))
        word = jnp.where(judged.ignored_requests, T["repeat"], T["request"])
        request = jnp.where(pending.any(), item(word, dsl.ATTR_0 + asked), item(T["thanks"]))
        agenda = jnp.where(
            search, jnp.where(volunteer, volunteered, messages.empty_item()), request
        )
        return user._replace(marker=marker, pending_chat=pending_chat), agenda, chat_item

    def _finish(self, state, start, user, judged, items) -> tuple[State, TimeStep]:
        """Patience, the end, feedback and rating, the observation and the signals."""
        cfg, persona = self.config, self.config.persona
        patience_left = state.patience_left - 1 - judged.incoherent
        leave = ~judged.said_bye & (patience_left <= 0)
        over = judged.said_bye | leave
        turn = state.turn + 1
        coherence_errors = state.coherence_errors + judged.incoherent
        failed_bye = judged.said_bye & ~judged.success
        bad = (judged.incoherent > 0) | (judged.format_errors > 0) | judged.rejected
        opinion = jnp.where(bad | failed_bye | leave, -1.0, 1.0)
        draws = state.feedback_draws[jnp.clip(state.turn, 0, cfg.max_turns - 1)]
        given = draws[0] < jnp.float32(persona.feedback_rate)
        flipped = draws[1] < jnp.float32(persona.feedback_noise)
        feedback = jnp.where(given, jnp.where(flipped, -opinion, opinion), 0.0)
        quick = judged.success & (turn <= (self._shortest + persona.patience) // 2)
        stars = 2 + 2 * judged.success + quick - jnp.minimum(coherence_errors, 2)
        stars = jnp.where(over, jnp.clip(stars, 1, 5), 0).astype(jnp.int32)
        error = (judged.factual + judged.incoherent + judged.format_errors > 0) | failed_bye
        thumb = jnp.select([feedback > 0, feedback < 0], [T["up"], T["down"]], dsl.PAD)
        obs = self._observation(state, start, judged, items, thumb=thumb, leave=leave)
        new_state = state._replace(
            marker=user.marker,
            answered_right=user.answered_right,
            informed=user.informed,
            shown=user.shown,
            accepted=user.accepted,
            queried=user.queried,
            pending_chat=user.pending_chat,
            patience_left=patience_left,
            turn=turn,
            coherence_errors=coherence_errors,
            over=over,
            obs=obs,
        )
        signals = Signals(
            outcome=judged.success.astype(jnp.float32),
            success=judged.success,
            verdict=jnp.where(error, -1.0, jnp.where(judged.useful, 1.0, 0.0)).astype(jnp.float32),
            efficiency=jnp.where(state.turn >= self._shortest, -1.0, 0.0).astype(jnp.float32),
            factuality=-judged.factual.astype(jnp.float32),
            coherence=-judged.incoherent.astype(jnp.float32),
            fluency=-judged.format_errors.astype(jnp.float32),
            feedback=feedback.astype(jnp.float32),
            rating=jnp.where(over, (stars - 3) / 2.0, 0.0).astype(jnp.float32),
            opinion=opinion.astype(jnp.float32),
            stars=stars,
        )
        timestep = TimeStep(
            step_type=jnp.where(over, StepType.LAST, StepType.MID).astype(jnp.int8),
            reward=signals.outcome,
            discount=jnp.where(over, 0.0, 1.0).astype(jnp.float32),
            observation=Observation(tokens=obs, progress=user.marker),
            signals=signals,
        )
        return new_state, timestep

    def _observation(self, state, start, judged, items, *, thumb, leave) -> jax.Array:
        cfg = self.config
        replies, agenda, chat = items
        replies = replies.at[0].set(jnp.where(judged.malformed, item(T["huh"]), replies[0]))
        kb = jnp.where(
            judged.queried,
            messages.kb_return(state.kb, start.top, start.count),
            jnp.zeros((3 + cfg.num_attributes,), jnp.int32),
        )
        middle = messages.compose(cfg, list(replies), agenda, chat, kb_return=kb, thumb=thumb)
        closing = messages.closing(cfg, jnp.where(leave, T["leave"], T["goodbye"]), thumb)
        over = judged.said_bye | leave
        return jnp.where(over, closing, middle)

    def _absorb(self, state: State, action: jax.Array) -> tuple[State, TimeStep]:
        del action
        timestep = TimeStep(
            step_type=jnp.int8(StepType.LAST),
            reward=jnp.float32(0.0),
            discount=jnp.float32(0.0),
            observation=self.observe(state),
            signals=_zero_signals(),
        )
        return state, timestep


class _Fsm(NamedTuple):
    """The grammar's state while reading a turn."""

    n_acts: jax.Array  # [] int32: acts started.
    act: jax.Array  # [] int32: the act being read, -1 at an act boundary.
    offset: jax.Array  # [] int32: tokens of that act read so far.
    last_bye: jax.Array  # [] bool: the last act was bye (only END may follow).
    ended: jax.Array  # [] bool: END read.
    broken: jax.Array  # [] bool: a token the grammar does not allow was read.
    kinds: jax.Array  # [M] int32 Act (NONE in unused slots).
    args: jax.Array  # [M, 3] int32: per act, its entity, attribute and value index.


class _Parsed(NamedTuple):
    kinds: jax.Array  # [M] int32 Act, all NONE if malformed.
    args: jax.Array  # [M, 3] int32 (ArgClass order).
    valid: jax.Array  # [] bool: the turn parses.


class _Act(NamedTuple):
    kind: jax.Array  # [] int32 Act.
    ent: jax.Array  # [] int32.
    attr: jax.Array  # [] int32.
    val: jax.Array  # [] int32.


class _TurnStart(NamedTuple):
    """What the agent knew when it wrote the turn (the state before the turn)."""

    told: jax.Array  # [A] bool.
    all_told: jax.Array  # [] bool: every constraint told.
    goal_met: jax.Array  # [] bool: an entity accepted, every request answered rightly.
    pending_requests: jax.Array  # [A] bool: asked by the user, not answered.
    pending_chat: jax.Array  # [] bool.
    shown: jax.Array  # [N] bool.
    top: jax.Array  # [] int32: the first entity meeting the told constraints.
    count: jax.Array  # [] int32: how many do.


class _User(NamedTuple):
    """The part of the state the acts of a turn change, one after another."""

    marker: jax.Array  # [A] int32.
    answered_right: jax.Array  # [A] bool.
    informed: jax.Array  # [N, A] int32.
    shown: jax.Array  # [N] bool.
    accepted: jax.Array  # [] int32.
    queried: jax.Array  # [] bool.
    pending_chat: jax.Array  # [] bool.


class _Effect(NamedTuple):
    """What one act did."""

    item: jax.Array  # [3] int32: the user's reply to it.
    factual: jax.Array  # [] int32: 1 if a factual error.
    incoherent: jax.Array  # [] int32: 1 if a coherence error.
    useful: jax.Array  # [] bool: a step of the shortest dialogue.
    rejected: jax.Array  # [] bool: a recommendation the user turned down.
    bye: jax.Array  # [] bool.
    query: jax.Array  # [] bool.
    answers_pending: jax.Array  # [] bool: answered a request pending before the turn.


class _Judged(NamedTuple):
    malformed: jax.Array  # [] bool.
    factual: jax.Array  # [] int32: factual errors.
    incoherent: jax.Array  # [] int32: coherence errors.
    format_errors: jax.Array  # [] int32.
    useful: jax.Array  # [] bool.
    rejected: jax.Array  # [] bool.
    queried: jax.Array  # [] bool.
    said_bye: jax.Array  # [] bool.
    success: jax.Array  # [] bool.
    ignored_chat: jax.Array  # [] bool.
    ignored_requests: jax.Array  # [] bool.


def _turn_start(state: State) -> _TurnStart:
    a = state.marker.shape[0]
    told = state.marker == Marker.TOLD
    constraint = state.goal_value >= 0
    matches = jnp.all(~told[None, :] | (state.kb == state.goal_value[None, :]), axis=1)
    requests_right = jnp.all(state.answered_right | (state.request_rank >= a))
    return _TurnStart(
        told=told,
        all_told=jnp.all(told | ~constraint),
        goal_met=(state.accepted >= 0) & requests_right,
        pending_requests=state.marker == Marker.REQUESTED,
        pending_chat=state.pending_chat,
        shown=state.shown,
        top=jnp.argmax(matches).astype(jnp.int32),
        count=matches.sum().astype(jnp.int32),
    )


def _play_act(state: State, start: _TurnStart, user: _User, act: _Act) -> tuple[_User, _Effect]:
    """One act against the user (`lax.switch` over the act kinds, NONE a no-op)."""
    bound = [functools.partial(_ACT_RULES[kind], state, start, act) for kind in Act]
    return jax.lax.switch(act.kind, bound, user)


def _effect(**fields) -> _Effect:
    """An `_Effect` with every field not given at its no-op value (fixed dtypes)."""
    counts = ("factual", "incoherent")
    values = {name: fields.get(name, False) for name in _Effect._fields if name != "item"}
    values = {k: jnp.asarray(v, jnp.int32 if k in counts else bool) for k, v in values.items()}
    return _Effect(item=fields.get("item", messages.empty_item()), **values)


def _tell(state: State, user: _User, attr: jax.Array) -> jax.Array:
    """Markers after the user says its preference on `attr` (told, or don't care)."""
    m = user.marker[attr]
    constraint = state.goal_value[attr] >= 0
    new = jnp.where(m == Marker.WANTED, Marker.TOLD, m)
    new = jnp.where(m == Marker.NONE, jnp.where(constraint, Marker.TOLD, Marker.DONTCARE), new)
    return user.marker.at[attr].set(new)


def _ask(state, start, act, user):
    del start
    m = user.marker[act.attr]
    goal = state.goal_value[act.attr]
    value = jnp.where(goal >= 0, dsl.VAL_0 + goal, T["any"])
    said = (m != Marker.NONE) & (m != Marker.WANTED)
    reply = item(T["u_inform"], dsl.ATTR_0 + act.attr, value)
    effect = _effect(item=reply, incoherent=said, useful=m == Marker.WANTED)
    return user._replace(marker=_tell(state, user, act.attr)), effect


def _confirm(state, start, act, user):
    del start
    m = user.marker[act.attr]
    goal = state.goal_value[act.attr]
    right = (goal >= 0) & (act.val == goal)
    contradicts = jnp.where(goal >= 0, (m == Marker.TOLD) & ~right, m == Marker.DONTCARE)
    attr = dsl.ATTR_0 + act.attr
    reply = jnp.where(
        right,
        item(T["affirm"], attr, dsl.VAL_0 + act.val),
        item(T["negate"], attr, jnp.where(goal >= 0, dsl.VAL_0 + goal, T["any"])),
    )
    effect = _effect(item=reply, incoherent=contradicts, useful=m == Marker.WANTED)
    return user._replace(marker=_tell(state, user, act.attr)), effect


def _query(state, start, act, user):
    del state, act
    useful = start.all_told & ~user.queried
    shown = user.shown.at[start.top].set(True)
    effect = _effect(useful=useful, query=True)
    return user._replace(shown=shown, queried=user.queried | start.all_told), effect


def _inform(state, start, act, user):
    e, a = act.ent, act.attr
    true = state.kb[e, a] == act.val
    prior = user.informed[e, a]
    m = user.marker[a]
    is_request = state.request_rank[a] < state.marker.shape[0]
    answers = (e == user.accepted) & is_request
    answers = answers & ((m == Marker.REQUESTED) | (m == Marker.ANSWERED))
    effect = _effect(
        factual=~true,
        incoherent=(prior >= 0) & (prior != act.val),
        useful=answers & (m == Marker.REQUESTED) & true,
        answers_pending=answers & start.pending_requests[a],
    )
    return user._replace(
        marker=user.marker.at[a].set(jnp.where(answers, Marker.ANSWERED, m)),
        answered_right=user.answered_right.at[a].set(
            jnp.where(answers, true, user.answered_right[a])
        ),
        informed=user.informed.at[e, a].set(act.val),
    ), effect


def _recommend(state, start, act, user):
    a = state.marker.shape[0]
    e = act.ent
    constraint = state.goal_value >= 0
    breaks = constraint & (state.kb[e] != state.goal_value)
    fits = ~breaks.any()
    first = jnp.argmin(jnp.where(breaks, state.goal_rank, a + 1))
    fresh = user.accepted < 0
    accept = fresh & fits
    kept = jnp.maximum(user.accepted, 0)
    reply = jnp.where(
        fresh & ~fits,
        item(T["negate"], dsl.ATTR_0 + first, dsl.VAL_0 + state.goal_value[first]),
        item(T["accept"], dsl.ENT_0 + jnp.where(fresh, e, kept)),
    )
    breaks_told = (breaks & start.told).any()
    effect = _effect(
        item=reply,
        factual=~start.shown[e],
        incoherent=breaks_told | (~fresh & (e != user.accepted)),
        useful=accept,
        rejected=fresh & ~fits,
    )
    corrected = jnp.where(user.marker[first] == Marker.WANTED, Marker.TOLD, user.marker[first])
    marker = jnp.where(fresh & ~fits, user.marker.at[first].set(corrected), user.marker)
    marker = jnp.where(accept & (state.request_rank < a), Marker.REQUESTED, marker)
    return user._replace(marker=marker, accepted=jnp.where(accept, e, user.accepted)), effect


def _chat(state, start, act, user):
    del state, start, act
    return user._replace(pending_chat=jnp.bool_(False)), _effect(useful=user.pending_chat)


def _bye(state, start, act, user):
    del state, act
    return user, _effect(useful=start.goal_met, bye=True)


def _none(state, start, act, user):
    del state, start, act
    return user, _effect()


def _zero_signals() -> Signals:
    zero = jnp.float32(0.0)
    return Signals(
        outcome=zero,
        success=jnp.bool_(False),
        verdict=zero,
        efficiency=zero,
        factuality=zero,
        coherence=zero,
        fluency=zero,
        feedback=zero,
        rating=zero,
        opinion=zero,
        stars=jnp.int32(0),
    )


_ACT_RULES = {
    Act.ASK: _ask,
    Act.QUERY: _query,
    Act.INFORM: _inform,
    Act.RECOMMEND: _recommend,
    Act.CONFIRM: _confirm,
    Act.CHAT: _chat,
    Act.BYE: _bye,
    Act.NONE: _none,
}
