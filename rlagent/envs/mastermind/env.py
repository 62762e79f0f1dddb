"""Mastermind on the environment protocol: TextArena's `MastermindEnv`, one move a turn.

The secret is L numbers in 1..N (distinct unless `duplicate_numbers`), uniform over the
codes; `task_split` restricts it to the training or the held-out codes
(`config.heldout_codes`; redrawn at reset until it fits, `MAX_SPLIT_ATTEMPTS`), and
`heldout_env` is the held-out game. A move is one guess, L digit tokens then END.
TextArena's rules (textarena 0.7.4, `envs/Mastermind/env.py` with `SinglePlayerState`),
ported as they are:

* A move is invalid, checked in this order, when it is not a bracketed list of numbers
  (here: a non-digit token before END, or nothing before END), has another length than L,
  has a number outside 1..N, repeats a digit without `duplicate_numbers`, or repeats an
  earlier guess. An invalid move is no guess: the first `error_allowance` in a row are
  warned, the next ends the game paying the percentage completion of the latest guess
  ((black + white / 2) / L, 0 before any guess).
* A valid guess is answered with black and white pegs. All L black wins (reward 1).
  Otherwise, when at least `max_turns` valid guesses came before it, the turn limit ends
  the game paying the guess's percentage completion (so max_turns + 1 guesses in all).

Every ending pays TextArena's reward once, as the `outcome` signal of the last move, and
terminates (discount 0). S = (error_allowance + 1) * (max_turns + 1) moves bound a game, so
the protocol's truncation never cuts one short.

Observation `tokens [L + 3]`: [status, the latest valid guess (L digits, PAD before any),
B_black, W_white (PAD before any)], status = START, FEEDBACK (a valid guess), WON, LIMIT
(the turn limit ended the game) or the reason of an invalid move (FORMAT .. REPEAT). It
shows the last feedback only: the policy's window and summary keep earlier turns, and its
own guesses are in its action tokens. `progress [2]`: [1 playing / 2 won / 3 lost,
1 / 3 an invalid move is pending a warning (the next one within the allowance)].

Signals: `outcome` (TextArena's reward, on the last move); `verdict` (information gain:
+1 a guess that wins or shrinks the set of codes consistent with all feedback, 0 a valid
guess that shrinks nothing, `verdict_invalid` an invalid move; `MastermindConfig.verdict`
for code spaces too big to enumerate); `efficiency` (-1 / (max_turns + 1) on a move that
does not win); `violations` (1 on an invalid move); `success` (the winning move).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlagent.envs.base import StepType
from rlagent.envs.base import TokenSpec
from rlagent.envs.mastermind import rules
from rlagent.envs.mastermind.config import MastermindConfig
from rlagent.envs.mastermind.config import all_codes
from rlagent.envs.mastermind.config import heldout_codes
from rlagent.envs.mastermind.rules import END
from rlagent.envs.mastermind.rules import PAD
from rlagent.envs.splits import draw_split
from rlagent.envs.splits import heldout_config

PLAYING, WON, LOST = 1, 2, 3  # progress[0]
CLEAR, WARNED = 1, 3  # progress[1]


class State(NamedTuple):
    secret: jax.Array  # [L] int32 numbers in 1..N.
    guesses: jax.Array  # [G] x [L] int32 valid guesses in order (G = max_turns + 1), 0 unused.
    black: jax.Array  # [G] int32 black pegs of each guess.
    white: jax.Array  # [G] int32 white pegs of each guess.
    num_guesses: jax.Array  # [] int32 valid guesses so far (TextArena's state.turn).
    errors: jax.Array  # [] int32 consecutive invalid moves (TextArena's error_count).
    turn: jax.Array  # [] int32 moves played (valid or not).
    over: jax.Array  # [] bool
    won: jax.Array  # [] bool
    consistent: jax.Array  # [C] bool codes consistent with all feedback ([1] unenumerated).
    obs: jax.Array  # [O] int32 what the next move reads.
    key: jax.Array  # [2] uint32 raw key of the oracle's candidates (unenumerated spaces).


class Observation(NamedTuple):
    tokens: jax.Array  # [O] int32
    progress: jax.Array  # [2] int32


class Signals(NamedTuple):
    outcome: jax.Array  # [] float32 TextArena's reward, on the move that ends the game.
    verdict: jax.Array  # [] float32 +1 informative, 0 uninformative, <= 0 invalid.
    efficiency: jax.Array  # [] float32 -1 / (max_turns + 1) on a move that does not win.
    violations: jax.Array  # [] float32 1 on an invalid move.
    success: jax.Array  # [] bool the move that cracks the code.
    reason: jax.Array  # [] int32 rules.VALID or the invalid-move reason.
    black: jax.Array  # [] int32 pegs of a valid guess (0 otherwise).
    white: jax.Array  # [] int32
    num_consistent: jax.Array  # [] int32 consistent codes after the move (-1 unenumerated).


class TimeStep(NamedTuple):
    step_type: jax.Array  # [] int8
    reward: jax.Array  # [] float32 (the outcome)
    discount: jax.Array  # [] float32
    observation: Observation
    signals: Signals


class Mastermind:
    """TextArena's Mastermind as a JAX environment (module docstring)."""

    signal_names = ("outcome", "verdict", "efficiency", "violations")
    reward_components = (
        "outcome", "process", "efficiency", "potential", "prm_min", "violations",
        "learned_sum", "learned_min", "learned_potential", "learned_centred",
    )  # fmt: skip
    num_markers = 2

    def __init__(self, config: MastermindConfig | None = None):
        self.config = MastermindConfig() if config is None else config
        self.vocab = rules.Vocabulary.of(self.config)
        # The enumerated code space: a jit constant (a few hundred KiB at most).
        self._codes = all_codes(self.config) if self.config.enumerated else None
        # Orders of the L positions, for the counting oracle of large duplicate spaces.
        self._arrangements = None
        if self._codes is None and self.config.duplicate_numbers:
            if math.factorial(self.config.code_length) <= self.config.max_enumerated_codes:
                positions = range(self.config.code_length)
                self._arrangements = np.asarray(list(itertools.permutations(positions)), np.int32)

    @property
    def max_turns(self) -> int:
        return self.config.episode_turns

    @property
    def obs_len(self) -> int:
        return self.config.code_length + 3

    @property
    def turn_len(self) -> int:
        return self.config.code_length + 1

    @property
    def token_spec(self) -> TokenSpec:
        return TokenSpec(vocab_size=self.vocab.size, pad=PAD, end=END)

    def reset(self, key: jax.Array) -> tuple[State, TimeStep]:
        config = self.config
        secret_key, oracle_key = jax.random.split(key)
        secret = self._draw_secret(secret_key)
        guesses = config.guess_limit
        num_codes = config.num_codes if config.enumerated else 1
        zero = jnp.int32(0)
        state = State(
            secret=secret.astype(jnp.int32),
            guesses=jnp.zeros((guesses, config.code_length), jnp.int32),
            black=jnp.zeros((guesses,), jnp.int32),
            white=jnp.zeros((guesses,), jnp.int32),
            num_guesses=zero,
            errors=zero,
            turn=zero,
            over=jnp.bool_(False),
            won=jnp.bool_(False),
            consistent=jnp.ones((num_codes,), bool),
            obs=self._obs(jnp.int32(self.vocab.status("START")), None),
            key=jax.random.key_data(oracle_key),
        )
        return state, self._timestep(state, self._zero_signals(), StepType.FIRST)

    def heldout_env(self) -> Mastermind:
        """This Mastermind drawing only held-out secrets (`task_split='heldout'`); the
        training env must draw none of them (`task_split='train'`)."""
        return Mastermind(heldout_config(self.config, "codes"))

    def step(self, state: State, action: jax.Array) -> tuple[State, TimeStep]:
        """One move `action [L + 1]`; an ended game is absorbing (zero signals, LAST)."""
        new, signals = self._move(state, action)
        new = jax.tree.map(lambda old, moved: jnp.where(state.over, old, moved), state, new)
        signals = jax.tree.map(
            lambda zero, s: jnp.where(state.over, zero, s), self._zero_signals(), signals
        )
        step_type = jnp.where(new.over, StepType.LAST, StepType.MID)
        return new, self._timestep(new, signals, step_type)

    def allowed_tokens(self, state: State, prefix: jax.Array, position: jax.Array) -> jax.Array:
        """`[V]` bool tokens a constrained sampler may draw (`MastermindConfig.grammar`)."""
        config, vocab = self.config, self.vocab
        tokens = jnp.arange(vocab.size)
        if config.grammar == "free":
            return tokens != PAD
        in_range = (tokens >= vocab.first_digit) & (tokens < vocab.first_digit + config.num_numbers)
        if not config.duplicate_numbers:
            earlier = jnp.arange(self.turn_len) < position
            used = jnp.any((prefix[None, :] == tokens[:, None]) & earlier[None, :], axis=1)
            in_range = in_range & ~used
        if config.grammar == "novel":
            in_range = self._ban_repeats(state, prefix, position, in_range)
        return jnp.where(position < config.code_length, in_range, tokens == END)

    def oracle_action(self, state: State) -> jax.Array:
        """`[L + 1]` the first code consistent with all feedback, then END.

        Enumerated spaces: the lexicographically first consistent code (exact). Larger
        spaces with duplicates (Mastermind-v0-extreme): one-number guesses [d d .. d] for
        d = 1, 2, .. count each number (black pegs) until the counts reach L (or one number
        is left), then the first arrangement of the counted numbers consistent with all
        feedback (exact: the secret is one of them). Larger spaces without duplicates: the
        first of `oracle_candidates` random codes (drawn from the episode's key and the
        turn) consistent with all feedback, else the closest (fewest peg differences over
        the history, a repeat excluded); a heuristic.
        """
        if self._codes is not None:
            guess = jnp.asarray(self._codes)[jnp.argmax(state.consistent)]
        elif self._arrangements is not None:
            guess = self._counting_guess(state)
        else:
            guess = self._sampled_guess(state)
        return jnp.append(guess + self.vocab.first_digit - 1, END).astype(jnp.int32)

    def episode_over(self, state: State) -> jax.Array:
        return state.over

    def episode_turn(self, state: State) -> jax.Array:
        return state.turn

    def observe(self, state: State) -> Observation:
        progress = jnp.stack([
            jnp.where(state.over, jnp.where(state.won, WON, LOST), PLAYING),
            jnp.where(state.errors > 0, WARNED, CLEAR),
        ]).astype(jnp.int32)  # fmt: skip
        return Observation(tokens=state.obs, progress=progress)

    def episode_metrics(
        self, signals: dict[str, jax.Array], turn_mask: jax.Array, action_tokens: jax.Array
    ) -> dict[str, jax.Array]:
        """Batch metrics (float32 scalars) of `[B, S]` signals (0 off `turn_mask`).

        `guesses`: valid guesses per game; `invalid_rate`: invalid moves per move played;
        `solve_guesses`: guesses of the solved games (0 if none); `outcome`: TextArena's
        mean reward; `process_score`: mean verdict per move.
        """
        played = turn_mask.astype(jnp.float32)
        invalid = signals["violations"] * played
        guesses = jnp.sum(played - invalid, axis=1)
        solved = jnp.any((signals["outcome"] == 1.0) & turn_mask, axis=1)
        moves = jnp.maximum(jnp.sum(played), 1.0)
        return {
            "guesses": jnp.mean(guesses),
            "invalid_rate": jnp.sum(invalid) / moves,
            "solve_guesses": jnp.sum(guesses * solved) / jnp.maximum(jnp.sum(solved), 1.0),
            "outcome": jnp.mean(jnp.sum(signals["outcome"] * played, axis=1)),
            "process_score": jnp.sum(signals["verdict"] * played) / moves,
        }

    # -- helpers -------------------------------------------------------------------------

    def _draw_secret(self, key: jax.Array) -> jax.Array:
        """`[L]` int32 the secret of a reset: one uniform draw, or with a `task_split` other
        than 'all' redrawn from `fold_in(key, attempt)` until it is of the split.

        At most splits.MAX_SPLIT_ATTEMPTS = 256 draws (then the last is kept, unfit).
        One draw fits with p, the fraction of the split's side of the codes (0.23 to 0.26
        held out at every level), so P(no fit) = (1 - p)^256: below 1e-29 for 'heldout',
        1e-148 for 'train'; 2e-10 for a side of 1 code in 12. The oracle's key is split
        off before, so redraws leave it as it is.
        """
        config = self.config
        draw = functools.partial(_uniform_code, config)
        return draw_split(config.task_split, draw, functools.partial(heldout_codes, config), key)

    def _move(self, state: State, action: jax.Array) -> tuple[State, Signals]:
        config, vocab = self.config, self.vocab
        guess = action[: config.code_length] - vocab.first_digit + 1
        reason = self._invalid_reason(state, action, guess)
        valid = reason == rules.VALID
        black, white = rules.pegs(state.secret, guess, config.digit_tokens)
        black, white = jnp.where(valid, black, 0), jnp.where(valid, white, 0)
        won = valid & (black == config.code_length)
        limit = valid & ~won & (state.num_guesses >= config.max_turns)
        given_up = ~valid & (state.errors >= config.error_allowance)
        slot = jnp.minimum(state.num_guesses, config.guess_limit - 1)
        recorded = state._replace(
            guesses=state.guesses.at[slot].set(jnp.where(valid, guess, state.guesses[slot])),
            black=state.black.at[slot].set(jnp.where(valid, black, state.black[slot])),
            white=state.white.at[slot].set(jnp.where(valid, white, state.white[slot])),
            num_guesses=state.num_guesses + valid,
        )
        consistent, verdict = self._information(state, guess, black, white, won, valid)
        over = won | limit | given_up
        outcome = jnp.where(won, 1.0, jnp.where(over, _completion(recorded, config), 0.0))
        status = jnp.where(
            valid,
            jnp.select([won, limit], [vocab.status("WON"), vocab.status("LIMIT")],
                       vocab.status("FEEDBACK")),
            vocab.reason_token(reason),
        )  # fmt: skip
        new = recorded._replace(
            errors=jnp.where(valid, 0, state.errors + 1),
            turn=state.turn + 1,
            over=over,
            won=won,
            consistent=consistent,
            obs=self._obs(status, recorded),
        )
        signals = Signals(
            outcome=outcome.astype(jnp.float32),
            verdict=verdict,
            efficiency=jnp.where(won, 0.0, -1.0 / config.guess_limit).astype(jnp.float32),
            violations=(~valid).astype(jnp.float32),
            success=won,
            reason=reason.astype(jnp.int32),
            black=black,
            white=white,
            num_consistent=(
                jnp.sum(consistent, dtype=jnp.int32) if self._codes is not None else jnp.int32(-1)
            ),
        )
        return new, signals

    def _invalid_reason(self, state: State, action: jax.Array, guess: jax.Array) -> jax.Array:
        """`[]` int32 TextArena's first broken rule (rules.FORMAT..REPEAT), or VALID."""
        config, vocab = self.config, self.vocab
        is_end = action == END
        length = jnp.where(jnp.any(is_end), jnp.argmax(is_end), self.turn_len)
        before_end = jnp.arange(self.turn_len) < length
        is_digit = (action >= vocab.first_digit) & (action < vocab.first_black)
        bad_format = (length == 0) | jnp.any(before_end & ~is_digit)
        bad_length = length != config.code_length
        out_of_range = jnp.any(guess > config.num_numbers)
        same = guess[:, None] == guess[None, :]
        duplicate = jnp.any(same & ~jnp.eye(config.code_length, dtype=bool))
        duplicate = duplicate & (not config.duplicate_numbers)
        made = jnp.arange(config.guess_limit) < state.num_guesses
        repeat = jnp.any(made & jnp.all(state.guesses == guess, axis=1))
        broken = [bad_format, bad_length, out_of_range, duplicate, repeat]
        codes = [rules.FORMAT, rules.LENGTH, rules.RANGE, rules.DUPLICATE, rules.REPEAT]
        return jnp.select(broken, codes, rules.VALID).astype(jnp.int32)

    def _information(self, state, guess, black, white, won, valid):
        """(consistent codes after the move [C], verdict []) of a move (module docstring)."""
        config = self.config
        if self._codes is not None:
            codes = jnp.asarray(self._codes)
            code_black, code_white = rules.pegs(codes, guess, config.num_numbers)
            agrees = (code_black == black) & (code_white == white)
            after = state.consistent & (agrees | ~valid)
            shrinks = jnp.sum(after) < jnp.sum(state.consistent)
        else:
            after = state.consistent
            # A consistent guess that does not win strikes at least itself from the set.
            shrinks = jnp.all(self._agreement(state, guess[None])[0] == 0)
        verdict = jnp.where(valid, jnp.where(won | shrinks, 1.0, 0.0), config.verdict_invalid)
        return after, verdict.astype(jnp.float32)

    def _agreement(self, state: State, candidates: jax.Array) -> jax.Array:
        """`[M]` int32 peg differences of candidate secrets `[M, L]` with all feedback."""
        hist_black, hist_white = rules.pegs(
            candidates[:, None, :], state.guesses[None, :, :], self.config.digit_tokens
        )  # [M, G]
        made = jnp.arange(self.config.guess_limit) < state.num_guesses
        miss = jnp.abs(hist_black - state.black) + jnp.abs(hist_white - state.white)
        return jnp.sum(jnp.where(made, miss, 0), axis=1)

    def _counting_guess(self, state: State) -> jax.Array:
        config = self.config
        length, numbers = config.code_length, config.num_numbers
        made = jnp.arange(config.guess_limit) < state.num_guesses
        single = made & jnp.all(state.guesses == state.guesses[:, :1], axis=1)  # [G]
        digits = jnp.arange(1, numbers + 1)
        rows = single[None, :] & (state.guesses[None, :, 0] == digits[:, None])  # [N, G]
        counted = jnp.any(rows, axis=1)  # [N]
        counts = jnp.sum(jnp.where(rows, state.black[None, :], 0), axis=1)  # [N]
        found = jnp.sum(counts)
        # The last uncounted number holds what the others leave.
        uncounted = ~counted
        last = uncounted & (jnp.sum(uncounted) == 1)
        counts = jnp.where(last, length - found, counts)
        known = (found == length) | (jnp.sum(uncounted) <= 1)
        probe = jnp.full((length,), jnp.argmax(uncounted) + 1, jnp.int32)
        # The counted numbers in order, then every order of the L positions.
        multiset = jnp.repeat(digits, counts, total_repeat_length=length).astype(jnp.int32)
        candidates = multiset[jnp.asarray(self._arrangements)]  # [L!, L]
        arranged = candidates[jnp.argmin(self._agreement(state, candidates) > 0)]
        return jnp.where(known, arranged, probe)

    def _sampled_guess(self, state: State) -> jax.Array:
        config = self.config
        key = jax.random.fold_in(jax.random.wrap_key_data(state.key), state.turn)
        shape = (config.oracle_candidates, config.code_length)
        if config.duplicate_numbers:
            candidates = jax.random.randint(key, shape, 1, config.num_numbers + 1)
        else:
            keys = jax.random.split(key, config.oracle_candidates)
            draw = jax.vmap(lambda k: jax.random.permutation(k, config.num_numbers))
            candidates = draw(keys)[:, : config.code_length] + 1
        candidates = candidates.astype(jnp.int32)
        made = jnp.arange(config.guess_limit) < state.num_guesses
        repeat = jnp.any(
            made & jnp.all(candidates[:, None, :] == state.guesses[None], axis=-1), axis=1
        )
        miss = self._agreement(state, candidates) + jnp.where(repeat, 1 << 20, 0)
        return candidates[jnp.argmin(miss)]

    def _ban_repeats(self, state, prefix, position, allowed):
        """At the last digit, bans the digits that would complete an earlier guess (unless
        every allowed one would: a forced repeat is still a guess)."""
        config, vocab = self.config, self.vocab
        last = config.code_length - 1
        head = (prefix[:last] - vocab.first_digit + 1)[None, :]
        made = jnp.arange(config.guess_limit) < state.num_guesses
        same_head = made & jnp.all(state.guesses[:, :last] == head, axis=1)  # [G]
        tokens = state.guesses[:, last] + vocab.first_digit - 1
        banned = jnp.zeros(allowed.shape, jnp.int32).at[tokens].max(same_head.astype(jnp.int32))
        banned = banned > 0
        novel = allowed & ~banned
        novel = jnp.where(jnp.any(novel), novel, allowed)
        return jnp.where(position == last, novel, allowed)

    def _obs(self, status: jax.Array, state: State | None) -> jax.Array:
        """`[L + 3]` int32 [status, latest valid guess, B_black, W_white] (PAD before any)."""
        length, vocab = self.config.code_length, self.vocab
        if state is None:
            return jnp.concatenate([status[None], jnp.full((length + 2,), PAD, jnp.int32)])
        latest = jnp.maximum(state.num_guesses - 1, 0)
        any_guess = state.num_guesses > 0
        body = jnp.concatenate([
            state.guesses[latest] + vocab.first_digit - 1,
            jnp.stack([vocab.first_black + state.black[latest],
                       vocab.first_white + state.white[latest]]),
        ])  # fmt: skip
        body = jnp.where(any_guess, body, PAD)
        return jnp.concatenate([status[None], body]).astype(jnp.int32)

    def _zero_signals(self) -> Signals:
        zero, izero = jnp.float32(0.0), jnp.int32(0)
        return Signals(zero, zero, zero, zero, jnp.bool_(False), izero, izero, izero, izero)

    def _timestep(self, state: State, signals: Signals, step_type) -> TimeStep:
        return TimeStep(
            step_type=jnp.asarray(step_type, jnp.int8),
            reward=signals.outcome,
            discount=jnp.where(state.over, 0.0, 1.0).astype(jnp.float32),
            observation=self.observe(state),
            signals=signals,
        )


def _uniform_code(config: MastermindConfig, key: jax.Array) -> jax.Array:
    """`[L]` int32 a uniformly random code (distinct numbers unless duplicate_numbers)."""
    if config.duplicate_numbers:
        code = jax.random.randint(key, (config.code_length,), 1, config.num_numbers + 1)
    else:
        code = jax.random.permutation(key, config.num_numbers)[: config.code_length] + 1
    return code.astype(jnp.int32)


def _completion(state: State, config: MastermindConfig) -> jax.Array:
    """TextArena's `_get_percentage_completion`: (black + white / 2) / L of the latest
    guess, 0 before any."""
    latest = jnp.maximum(state.num_guesses - 1, 0)
    score = (state.black[latest] + 0.5 * state.white[latest]) / config.code_length
    return jnp.where(state.num_guesses > 0, score, 0.0)
