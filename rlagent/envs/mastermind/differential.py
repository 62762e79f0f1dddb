"""The JAX Mastermind played against TextArena's own `MastermindEnv`, move by move.

`compare(config, num_games, seed)` draws secrets and move sequences that mix every kind of
move (`MOVE_KINDS`: random well-formed guesses, the secret, repeats of earlier moves, and
format, length, range and duplicate errors), plays them through the textarena package
(one game at a time, as its player would type them: `Vocabulary.turn_text`) and through
`Mastermind` (vmapped), and returns where they disagree on a move's validity (and
reason), pegs or the end of the game, or on the reward. textarena is imported only here,
when called (`pip install textarena`; its import needs nltk, websockets, requests, rich).
"""

from __future__ import annotations

import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlagent.envs.mastermind import rules
from rlagent.envs.mastermind.config import MastermindConfig
from rlagent.envs.mastermind.env import Mastermind

# Move kinds, and their probabilities in each profile of game (a game draws one): 'mixed'
# ends most games early (a win, or two invalid moves in a row), 'long' reaches the turn
# limit, 'alternating' (an invalid move before every guess) plays the longest games.
MOVE_KINDS = ("guess", "secret", "repeat", "format", "length", "range", "duplicate")
# guess: a uniformly random well-formed guess (may repeat one by chance); secret: the
# secret code (a win); repeat: an earlier move of the game again; format: a non-digit
# token before END, or END first; length: END too early, or no END (L + 1 digits); range:
# a number above num_numbers (needs digit_tokens > num_numbers); duplicate: a digit twice.
PROFILES = {
    "mixed": (0.5, 0.04, 0.14, 0.1, 0.1, 0.06, 0.06),
    "long": (0.9, 0.0, 0.04, 0.02, 0.02, 0.01, 0.01),
    "alternating": None,  # even moves: format/length/range/duplicate/repeat; odd: guess.
}
# TextArena's invalid-move messages (`MastermindEnv.step`) by reason.
_REASON_TEXT = {
    rules.FORMAT: "square brackets",
    rules.LENGTH: "should contain exactly",
    rules.RANGE: "must be between",
    rules.DUPLICATE: "Duplicate numbers are not allowed",
    rules.REPEAT: "You have already guessed",
}


class Played(NamedTuple):
    """Moves of B games (`[B, S]`; after a game's end: reason -1, pegs 0)."""

    reason: np.ndarray  # [B, S] int rules.VALID or the invalid-move reason, -1 after the end.
    black: np.ndarray  # [B, S] int
    white: np.ndarray  # [B, S] int
    over: np.ndarray  # [B, S] bool the game is over after the move.
    reward: np.ndarray  # [B] float the game's reward (NaN if it did not end).


def compare(config: MastermindConfig, num_games: int, seed: int) -> dict[str, object]:
    """Plays `num_games` generated games through textarena and the JAX port.

    Returns {'games', 'moves', 'mismatched_games' (indices), 'first_mismatch' (a
    description or None), 'reasons' (moves of each outcome), 'endings' (games won, ended
    by the turn limit, by invalid moves, or unfinished)}.
    """
    rng = np.random.default_rng(seed)
    env = Mastermind(config)
    secrets = draw_secrets(config, rng, num_games)
    actions = draw_moves(env, secrets, rng)
    ours = play_jax(env, secrets, actions)
    theirs = play_textarena(config, env.vocab, secrets, actions)
    bad = np.zeros(num_games, bool)
    for field in ("reason", "black", "white", "over"):
        bad |= np.any(getattr(ours, field) != getattr(theirs, field), axis=1)
    bad |= ~np.isclose(ours.reward, theirs.reward, rtol=0, atol=1e-6)
    mismatched = np.flatnonzero(bad)
    reasons = ours.reason[ours.reason >= 0]
    return {
        "games": num_games,
        "moves": int(reasons.size),
        "mismatched_games": mismatched.tolist(),
        "first_mismatch": _describe(env, secrets, actions, ours, theirs, mismatched),
        "reasons": {
            name: int(np.sum(reasons == code))
            for code, name in enumerate(("valid", *rules.REASONS))
        },
        "endings": _endings(theirs),
    }


def draw_secrets(config: MastermindConfig, rng: np.random.Generator, num: int) -> np.ndarray:
    """`[B, L]` int32 secrets, as TextArena draws them (`random.sample` / `choices`)."""
    numbers = np.arange(1, config.num_numbers + 1)
    if config.duplicate_numbers:
        return rng.choice(numbers, (num, config.code_length)).astype(np.int32)
    keys = rng.random((num, config.num_numbers))
    return numbers[np.argsort(keys, axis=1)[:, : config.code_length]].astype(np.int32)


def draw_moves(env: Mastermind, secrets: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`[B, S, L + 1]` int32 move tokens, of kinds drawn by a profile per game (`PROFILES`)."""
    config, vocab = env.config, env.vocab
    num_games, moves = secrets.shape[0], env.max_turns
    profiles = rng.integers(len(PROFILES), size=num_games)
    mixed = np.asarray(PROFILES["mixed"]) / np.sum(PROFILES["mixed"])
    long = np.asarray(PROFILES["long"]) / np.sum(PROFILES["long"])
    errors = MOVE_KINDS.index("repeat"), *range(MOVE_KINDS.index("format"), len(MOVE_KINDS))
    drawn = np.stack([
        rng.choice(len(MOVE_KINDS), (num_games, moves), p=mixed),
        rng.choice(len(MOVE_KINDS), (num_games, moves), p=long),
        np.where(np.arange(moves) % 2 == 0, rng.choice(errors, (num_games, moves)), 0),
    ])[profiles, np.arange(num_games)]  # fmt: skip
    actions = np.zeros((num_games, moves, env.turn_len), np.int32)
    for game in range(num_games):
        for move in range(moves):
            kind = MOVE_KINDS[drawn[game, move]]
            if kind == "repeat" and move > 0:
                actions[game, move] = actions[game, rng.integers(move)]
            else:
                actions[game, move] = _move(kind, config, vocab, secrets[game], rng)
    return actions


def play_jax(env: Mastermind, secrets: np.ndarray, actions: np.ndarray) -> Played:
    """Plays `actions [B, S, L + 1]` from `secrets [B, L]` through the JAX port (vmapped)."""

    def game(secret, moves):
        state, _ = env.reset(jax.random.key(0))
        state = state._replace(secret=secret)

        def move(state, action):
            new, timestep = env.step(state, action)
            signals = timestep.signals
            reason = jnp.where(state.over, -1, signals.reason)
            return new, (reason, signals.black, signals.white, new.over, signals.outcome)

        _, out = jax.lax.scan(move, state, moves)
        return out

    reason, black, white, over, outcome = jax.jit(jax.vmap(game))(
        jnp.asarray(secrets), jnp.asarray(actions)
    )
    over = np.asarray(over)
    reward = np.where(over[:, -1], np.asarray(outcome).sum(axis=1), np.nan)
    return Played(np.asarray(reason), np.asarray(black), np.asarray(white), over, reward)


def play_textarena(
    config: MastermindConfig, vocab: rules.Vocabulary, secrets: np.ndarray, actions: np.ndarray
) -> Played:
    """Plays the same games through textarena's `MastermindEnv`, one move at a time."""
    from textarena.envs.Mastermind.env import MastermindEnv

    num_games, moves = actions.shape[:2]
    reason = np.full((num_games, moves), -1)
    black = np.zeros((num_games, moves), int)
    white = np.zeros((num_games, moves), int)
    over = np.zeros((num_games, moves), bool)
    reward = np.full(num_games, np.nan)
    kwargs = dict(
        code_length=config.code_length,
        num_numbers=config.num_numbers,
        max_turns=config.max_turns,
        duplicate_numbers=config.duplicate_numbers,
    )
    for game in range(num_games):
        env = MastermindEnv(**kwargs)
        env.reset(num_players=1)
        env.state.error_allowance = config.error_allowance
        env.state.game_state["secret_code"] = secrets[game].tolist()
        history = env.state.game_state["history"]
        for move in range(moves):
            made = len(history)
            done, _ = env.step(vocab.turn_text(actions[game, move]))
            if len(history) > made:
                reason[game, move] = rules.VALID
                black[game, move], white[game, move] = history[-1]["black"], history[-1]["white"]
            else:
                reason[game, move] = _reason_of(env.state)
            if done:
                over[game, move:] = True
                reward[game] = env.state.rewards[0]
                break
    return Played(reason, black, white, over, reward)


def _move(kind, config, vocab, secret, rng) -> np.ndarray:
    """One move `[L + 1]` of `kind` (not 'repeat')."""
    length, numbers = config.code_length, config.num_numbers
    if config.duplicate_numbers:
        guess = rng.integers(1, numbers + 1, length)
    else:
        guess = rng.permutation(numbers)[:length] + 1
    if kind == "secret":
        guess = secret.copy()
    elif kind == "range" and config.digit_tokens > numbers:
        guess[rng.integers(length)] = rng.integers(numbers + 1, config.digit_tokens + 1)
    elif kind == "duplicate" and length > 1:
        first, second = rng.choice(length, 2, replace=False)
        guess[second] = guess[first]
    tokens = vocab.guess_tokens(guess)
    if kind == "format":
        # Any token but a digit or END: PAD, a peg count or a status token.
        others = [rules.PAD, *range(vocab.first_black, vocab.size)]
        position = rng.integers(length + 1)
        tokens[position] = others[rng.integers(len(others))]
        if rng.random() < 0.2:
            tokens[:] = rules.PAD
            tokens[0] = rules.END  # an empty turn
    elif kind == "length":
        if rng.random() < 0.5:
            cut = rng.integers(1, length) if length > 1 else 0
            tokens[cut] = rules.END
            tokens[cut + 1 :] = rules.PAD
        else:
            tokens[length] = tokens[rng.integers(length)]  # L + 1 digits, no END
    return tokens


def _endings(played: Played) -> dict[str, int]:
    moves = np.sum(played.reason >= 0, axis=1)
    last = played.reason[np.arange(moves.size), np.maximum(moves - 1, 0)]
    ended = ~np.isnan(played.reward)
    won = ended & np.isclose(played.reward, 1.0) & (last == rules.VALID)
    return {
        "won": int(np.sum(won)),
        "turn_limit": int(np.sum(ended & ~won & (last == rules.VALID))),
        "invalid_moves": int(np.sum(ended & (last != rules.VALID))),
        "unfinished": int(np.sum(~ended)),
    }


def _reason_of(state) -> int:
    """The reason of TextArena's last invalid move (its warning, or the game's end)."""
    text = state.game_info[0].get("reason") or ""
    if not text.startswith("Invalid Move"):
        text = state.logs[-1][1]
    for code, needle in _REASON_TEXT.items():
        if re.search(re.escape(needle), text):
            return code
    raise ValueError(f"Unrecognised TextArena invalid-move message: {text!r}")


def _describe(env, secrets, actions, ours, theirs, mismatched) -> str | None:
    if mismatched.size == 0:
        return None
    game = int(mismatched[0])
    moves = [env.vocab.turn_text(a) for a in actions[game]]
    return (
        f"game {game}: secret {secrets[game].tolist()}, moves {moves}; "
        f"jax {jax.tree.map(lambda x: x[game].tolist(), ours._asdict())}; "
        f"textarena {jax.tree.map(lambda x: x[game].tolist(), theirs._asdict())}"
    )
