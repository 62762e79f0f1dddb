"""Mastermind's vocabulary, peg evaluation and the text of a turn (the code space and its
held-out codes: `config.all_codes`, `config.heldout_codes`).

Vocabulary (`Vocabulary`), in order: PAD, END, the digit tokens of numbers 1..D
(D = `digit_tokens`), black-peg counts B0..BL, white-peg counts W0..WL, then the status
tokens an observation opens with (START, FEEDBACK, WON, LIMIT and one per invalid-move
reason, `REASONS`). A turn is L digit tokens then END (`turn_len = L + 1`).

Peg evaluation is TextArena's (`MastermindEnv._evaluate_guess`, two passes that strike
matched digits), in closed form: black = #{i: g_i = s_i}, white = sum_d min(#_d(g), #_d(s))
- black. It is symmetric in secret and guess, which the consistency checks use.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rlagent.envs.mastermind.config import MastermindConfig

PAD, END = 0, 1
# Invalid-move reasons in TextArena's order of checks (`MastermindEnv.step`); 0 is a valid
# move. A guess is checked for format, then length, range, duplicates, then repetition.
VALID, FORMAT, LENGTH, RANGE, DUPLICATE, REPEAT = range(6)
REASONS = ("format", "length", "range", "duplicate", "repeat")
_STATUS = ("START", "FEEDBACK", "WON", "LIMIT", *(r.upper() for r in REASONS))


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """Token ids of a config's vocabulary (see the module docstring)."""

    code_length: int  # L
    digit_tokens: int  # D

    @classmethod
    def of(cls, config: MastermindConfig) -> Vocabulary:
        return cls(code_length=config.code_length, digit_tokens=config.digit_tokens)

    @property
    def first_digit(self) -> int:
        """The token of number 1 (number n is token first_digit + n - 1)."""
        return END + 1

    @property
    def first_black(self) -> int:
        return self.first_digit + self.digit_tokens

    @property
    def first_white(self) -> int:
        return self.first_black + self.code_length + 1

    @property
    def first_status(self) -> int:
        return self.first_white + self.code_length + 1

    @property
    def size(self) -> int:
        return self.first_status + len(_STATUS)

    def status(self, name: str) -> int:
        """Token of a status ('START', 'FEEDBACK', 'WON', 'LIMIT' or a reason, upper case)."""
        return self.first_status + _STATUS.index(name)

    def reason_token(self, reason: jax.Array) -> jax.Array:
        """Status token of an invalid-move reason code (FORMAT..REPEAT)."""
        return self.first_status + 3 + reason

    def name(self, token: int) -> str:
        """Readable name of a token: a digit's number, 'B2', 'W0', 'FEEDBACK', 'PAD'..."""
        token = int(token)
        if token == PAD:
            return "PAD"
        if token == END:
            return "END"
        if token < self.first_black:
            return str(token - self.first_digit + 1)
        if token < self.first_white:
            return f"B{token - self.first_black}"
        if token < self.first_status:
            return f"W{token - self.first_white}"
        if token < self.size:
            return _STATUS[token - self.first_status]
        return f"<{token}>"

    def turn_text(self, tokens) -> str:
        """The turn as TextArena's player would write it: '[2 1 4 5]'.

        Tokens up to the first END, each by `name`; a non-digit token (a name with letters)
        or an empty turn breaks TextArena's `\\[(\\d+(?:\\s+\\d+)*)\\]`, as a format error.
        """
        names = []
        for token in np.asarray(tokens).tolist():
            if token == END:
                break
            names.append(self.name(token))
        return "[" + " ".join(names) + "]"

    def guess_tokens(self, guess, end: bool = True) -> np.ndarray:
        """`[L (+1)]` int32 tokens of a guess (numbers), then END."""
        tokens = np.asarray(guess, np.int32) + self.first_digit - 1
        return np.append(tokens, END).astype(np.int32) if end else tokens


def pegs(secret: jax.Array, guess: jax.Array, num_values: int) -> tuple[jax.Array, jax.Array]:
    """Black and white pegs `[...]` int32 of codes `[..., L]` (numbers in [1, num_values]).

    black = #{i: g_i = s_i}; white = sum_d min(#_d(g), #_d(s)) - black (TextArena's
    two-pass count). Broadcasts over leading axes.
    """
    black = jnp.sum(secret == guess, axis=-1, dtype=jnp.int32)
    both = jnp.minimum(digit_counts(secret, num_values), digit_counts(guess, num_values))
    return black, jnp.sum(both, axis=-1, dtype=jnp.int32) - black


def digit_counts(codes: jax.Array, num_values: int) -> jax.Array:
    """`[..., num_values + 1]` int32 count of each number in codes `[..., L]`."""
    return jnp.sum(jax.nn.one_hot(codes, num_values + 1, dtype=jnp.int32), axis=-2)
