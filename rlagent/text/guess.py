"""Guess-the-number, the smallest text environment (`rlagent.text.loop.TextEnvironment`).

The agent guesses a secret integer in [low, high]; each wrong guess is answered "higher"
or "lower" (by the user, or by the `guess` tool's result in tool mode), and the episode
ends at the right guess or after `max_turns` guesses. Signals: `outcome` (1 on the
solving turn), `success`.
"""

from __future__ import annotations

import random
import re

import jax
import jax.numpy as jnp

from rlagent.text.chat import Message

GUESS_TOOL = {
    "type": "function",
    "function": {
        "name": "guess",
        "description": "Submit a guess of the secret number.",
        "parameters": {
            "type": "object",
            "properties": {"number": {"type": "integer"}},
            "required": ["number"],
        },
    },
}


class GuessNumber:
    """A plain-Python text environment; copy.deepcopy forks it."""

    signal_names = ("outcome",)
    reward_components = ("outcome",)

    def __init__(self, *, low: int = 1, high: int = 9, max_turns: int = 3, use_tools: bool = False):
        if not low <= high or max_turns < 1:
            raise ValueError(
                f"GuessNumber needs low <= high and max_turns >= 1, got {low}, {high}, {max_turns}"
            )
        self.low, self.high, self.max_turns = low, high, max_turns
        self.tools = (GUESS_TOOL,) if use_tools else None
        self.secret, self.guesses = low, 0

    def reset(self, seed: int) -> list[Message]:
        self.secret = random.Random(seed).randint(self.low, self.high)
        self.guesses = 0
        return [
            {"role": "system", "content": "You guess numbers."},
            {"role": "user", "content": f"Guess my number from {self.low} to {self.high}."},
        ]

    def step(self, text: str) -> tuple[list[Message], dict[str, float], bool]:
        self.guesses += 1
        found = re.search(r"-?\d+", text)
        guess = int(found.group()) if found else None
        solved = guess == self.secret
        if solved:
            reply = "correct"
        elif guess is None:
            reply = "say a number"
        else:
            reply = "higher" if guess < self.secret else "lower"
        role = "tool" if self.tools else "user"
        done = solved or self.guesses >= self.max_turns
        signals = {"outcome": float(solved), "success": float(solved)}
        return [{"role": role, "content": reply}], signals, done

    def episode_metrics(
        self, signals: dict[str, jax.Array], turn_mask: jax.Array, action_tokens: jax.Array
    ) -> dict[str, jax.Array]:
        """The trainer's per-batch metrics (`rlagent.train.ppo.episode_metrics`)."""
        solved = jnp.any(signals["outcome"] > 0, axis=1)
        guesses = jnp.sum(turn_mask, axis=1).astype(jnp.float32)
        return {
            "guesses_when_solved": jnp.sum(jnp.where(solved, guesses, 0.0))
            / jnp.maximum(jnp.sum(solved), 1)
        }
