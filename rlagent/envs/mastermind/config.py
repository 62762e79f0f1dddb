"""Configuration of Mastermind: TextArena's game parameters, the token interface, verdict,
the code space (`all_codes`) and its held-out codes (`heldout_codes`).

Game fields carry TextArena's names (`textarena/envs/Mastermind/env.py`,
`MastermindEnv.__init__`), so a registered configuration's kwargs build a config as they
are: `MastermindConfig(**ENV_REGISTRY["Mastermind-v0"].kwargs)`. `LEVELS` holds the
three registered ones (textarena 0.7.4, `textarena/envs/__init__.py`) and two more.

    level      code_length  num_numbers  max_turns  duplicate_numbers  codes
    tiny       2            4            6          False              12
    v0         4            6            20         False              360
    classic    4            6            10         True               1,296
    hard       4            8            30         False              1,680
    extreme    6            12           50         True               2,985,984

v0, hard and extreme are Mastermind-v0, -v0-hard and -v0-extreme (`TEXTARENA_IDS`);
classic is the board game (duplicates allowed), tiny a small one for tests.

`max_turns` is TextArena's: its turn-limit check reads the count of earlier valid guesses
before the current one is counted, so a game allows max_turns + 1 valid guesses (ported as
is; `guess_limit`). Invalid moves do not count as guesses: `error_allowance` (TextArena's
`SinglePlayerState` default, 1) consecutive invalid moves are warned, the next one ends
the game.

Held-out codes (`task_split`): a code's *cell* is the code itself, its index in mixed
radix over num_numbers (`heldout_codes`); a fixed pseudo-random quarter of the codes is
held out (`rlagent.envs.splits`, as in ToolWorld and the dialogue).
'train' never draws a held-out secret, 'heldout' draws only held-out ones
(`Mastermind.heldout_env`), 'all' draws as before.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from rlagent.envs.splits import check_sides
from rlagent.envs.splits import check_split
from rlagent.envs.splits import heldout_index

LEVELS: dict[str, dict[str, object]] = {
    "tiny": dict(code_length=2, num_numbers=4, max_turns=6, duplicate_numbers=False),
    "v0": dict(code_length=4, num_numbers=6, max_turns=20, duplicate_numbers=False),
    "classic": dict(code_length=4, num_numbers=6, max_turns=10, duplicate_numbers=True),
    "hard": dict(code_length=4, num_numbers=8, max_turns=30, duplicate_numbers=False),
    "extreme": dict(code_length=6, num_numbers=12, max_turns=50, duplicate_numbers=True),
}
# TextArena's registered ids of the levels ported from it.
TEXTARENA_IDS = {
    "v0": "Mastermind-v0",
    "hard": "Mastermind-v0-hard",
    "extreme": "Mastermind-v0-extreme",
}
# allowed_tokens: 'well_formed' = code_length digits in range (distinct when duplicates are
# not allowed) then END; 'novel' = well-formed and not a guess already made; 'free' = any
# token but PAD at every position (the uniform policy then makes invalid moves too).
GRAMMARS = ("well_formed", "novel", "free")
# verdict: 'exact' = the consistent set is enumerated (code spaces up to
# max_enumerated_codes); 'consistent' = +1 iff the guess is consistent with all feedback so
# far (exact for the guesses it labels +1, blind to informative inconsistent guesses);
# 'auto' = exact where enumeration fits, else consistent.
VERDICTS = ("auto", "exact", "consistent")
_INTEGER_FIELDS = (
    "code_length", "num_numbers", "max_turns", "error_allowance", "digit_tokens",
    "max_enumerated_codes", "oracle_candidates",
)  # fmt: skip
MAX_NUMBERS = 99  # numbers 1..99 (two decimal digits in TextArena's text).


@dataclasses.dataclass(frozen=True)
class MastermindConfig:
    """Static configuration of Mastermind (hashable: safe as a static jit argument).

    A bad field raises a ValueError that names it.
    """

    code_length: int = 4  # digits of the secret code (TextArena's code_length).
    num_numbers: int = 6  # each digit is one of 1..num_numbers.
    max_turns: int = 20  # TextArena's turn limit (the game allows max_turns + 1 guesses).
    duplicate_numbers: bool = False  # the secret and the guesses may repeat a digit.
    error_allowance: int = 1  # consecutive invalid moves warned before one ends the game.
    # Digit tokens 1..digit_tokens in the vocabulary (None: num_numbers). More than
    # num_numbers makes out-of-range guesses expressible and lets levels share a vocabulary.
    digit_tokens: int | None = None
    grammar: str = "well_formed"  # what allowed_tokens permits (GRAMMARS).
    verdict: str = "auto"  # how the process verdict is computed (VERDICTS).
    max_enumerated_codes: int = 65536  # largest code space enumerated (exact verdict, oracle).
    verdict_invalid: float = -1.0  # verdict of an invalid move (<= 0).
    oracle_candidates: int = 1024  # random candidates of the oracle in unenumerated spaces.
    # Held-out codes: a fixed quarter of the codes (`heldout_codes`); 'train' secrets are
    # none of them, 'heldout' secrets only them, 'all' draws as before
    # (splits.TASK_SPLITS).
    task_split: str = "all"

    def __post_init__(self):
        if self.digit_tokens is None:
            object.__setattr__(self, "digit_tokens", self.num_numbers)
        self._check_types()
        self._check_ranges()
        self._check_split()

    @property
    def num_codes(self) -> int:
        """Size of the code space: N^L with duplicates, N! / (N - L)! without."""
        if self.duplicate_numbers:
            return self.num_numbers**self.code_length
        return math.perm(self.num_numbers, self.code_length)

    @property
    def enumerated(self) -> bool:
        """The code space is enumerated (exact verdict, first-consistent oracle)."""
        return self.verdict != "consistent" and self.num_codes <= self.max_enumerated_codes

    @property
    def guess_limit(self) -> int:
        """Valid guesses a game allows: max_turns + 1 (TextArena's turn-limit check)."""
        return self.max_turns + 1

    @property
    def episode_turns(self) -> int:
        """S, the longest game in moves: every guess after error_allowance invalid moves."""
        return (self.error_allowance + 1) * self.guess_limit

    def _fail(self, name: str, message: str):
        raise ValueError(f"MastermindConfig.{name}: {message}, got {getattr(self, name)!r}")

    def _check_types(self):
        for name in _INTEGER_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                self._fail(name, "must be an integer")
        if not isinstance(self.duplicate_numbers, bool):
            self._fail("duplicate_numbers", "must be a bool")
        value = self.verdict_invalid
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            self._fail("verdict_invalid", "must be a finite number")
        if not math.isfinite(value):
            self._fail("verdict_invalid", "must be a finite number")

    def _check_ranges(self):
        if self.code_length < 1:
            self._fail("code_length", "must be >= 1")
        if not 1 <= self.num_numbers <= MAX_NUMBERS:
            self._fail("num_numbers", f"must be in [1, {MAX_NUMBERS}]")
        if not self.duplicate_numbers and self.code_length > self.num_numbers:
            self._fail(
                "code_length",
                f"must be <= num_numbers={self.num_numbers} without duplicate_numbers "
                f"(no code of distinct digits exists)",
            )
        if self.max_turns < 0:
            self._fail("max_turns", "must be >= 0")
        if self.error_allowance < 0:
            self._fail("error_allowance", "must be >= 0")
        if not self.num_numbers <= self.digit_tokens <= MAX_NUMBERS:
            self._fail(
                "digit_tokens", f"must be in [num_numbers={self.num_numbers}, {MAX_NUMBERS}]"
            )
        if self.grammar not in GRAMMARS:
            self._fail("grammar", f"must be one of {GRAMMARS}")
        if self.verdict not in VERDICTS:
            self._fail("verdict", f"must be one of {VERDICTS}")
        if self.max_enumerated_codes < 1:
            self._fail("max_enumerated_codes", "must be >= 1")
        if self.verdict == "exact" and self.num_codes > self.max_enumerated_codes:
            self._fail(
                "verdict",
                f"'exact' enumerates the {self.num_codes} codes, more than "
                f"max_enumerated_codes={self.max_enumerated_codes}",
            )
        if self.verdict_invalid > 0:
            self._fail("verdict_invalid", "must be <= 0")
        if self.oracle_candidates < 1:
            self._fail("oracle_candidates", "must be >= 1")
        check_split(self.task_split, self._fail)

    def _check_split(self):
        """A split of an enumerable code space needs codes on both sides (larger spaces hold
        out a quarter, up to sampling noise far below one code)."""
        if self.task_split == "all" or self.num_codes > self.max_enumerated_codes:
            return
        with jax.ensure_compile_time_eval():  # concrete even if built under a trace.
            check_sides([heldout_codes(self, all_codes(self))], "codes", self._fail)


def all_codes(config: MastermindConfig) -> np.ndarray:
    """`[C, L]` int32 every code of the config, in lexicographic order (C = num_codes)."""
    numbers = range(1, config.num_numbers + 1)
    if config.duplicate_numbers:
        codes = itertools.product(numbers, repeat=config.code_length)
    else:
        codes = itertools.permutations(numbers, config.code_length)
    return np.asarray(list(codes), np.int32).reshape(-1, config.code_length)


def heldout_codes(config: MastermindConfig, codes) -> jax.Array:
    """`[...]` bool: whether each code `[..., L]` (numbers 1..N) is held out.

    A code's cell is its index in mixed radix over N = num_numbers: digit i (number d_i)
    adds (d_i - 1) * N**i, modulo 2**32 (the exact index while N**L < 2**32; defined with
    or without duplicates). It is held out iff `splits.heldout_index(index)`: a fixed
    pseudo-random quarter.
    """
    n = config.num_numbers
    weights = np.array([pow(n, i, 1 << 32) for i in range(config.code_length)], np.uint32)
    digits = (jnp.asarray(codes) - 1).astype(jnp.uint32)
    index = jnp.sum(digits * jnp.asarray(weights), axis=-1, dtype=jnp.uint32)
    return heldout_index(index)


def level_config(level: str, **overrides) -> MastermindConfig:
    """The config of a level (`LEVELS`), with field overrides (code_length, num_numbers,
    max_turns: see `horizon_config`)."""
    if level not in LEVELS:
        raise ValueError(f"Unknown Mastermind level {level!r}; expected one of {tuple(LEVELS)}.")
    return MastermindConfig(**{**LEVELS[level], **overrides})


def horizon_config(guesses: int, **overrides) -> MastermindConfig:
    """The game that allows `guesses` valid guesses: max_turns = guesses - 1 (TextArena's
    turn limit, `guess_limit`), on Mastermind-v0's code (4 numbers of 1..6, distinct)
    unless `overrides` set code_length / num_numbers / duplicate_numbers.

    The horizon of the studies that sweep it (`experiments.studies.envs.horizon_env`). Unlike
    ToolWorld's shortest plan, it bounds a game rather than fixing it: a lucky guess wins at
    once, and a policy that solves the code in fewer guesses (the oracle: at most 6 on the
    v0 code) plays no longer games as the limit grows. `overrides` may not set max_turns.
    """
    if "max_turns" in overrides:
        raise ValueError("horizon_config sets max_turns = guesses - 1 itself; drop max_turns.")
    if isinstance(guesses, bool) or not isinstance(guesses, numbers.Integral) or guesses < 1:
        raise ValueError(f"horizon_config: guesses must be an integer >= 1, got {guesses!r}")
    return level_config("v0", max_turns=int(guesses) - 1, **overrides)
