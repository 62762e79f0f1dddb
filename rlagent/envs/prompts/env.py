"""`PromptEnv`: one turn of `turn_len` new tokens after a random prompt, on the protocol.

The episode is a single turn. `reset` draws a prompt of `prompt_len` tokens uniformly from
the non-special tokens; `step` scores the completion with `target_fraction` (the fraction
of its `turn_len` slots holding `target`; END and the PAD after it count as misses) and
ends the episode. It exists so that the multi-turn trainer can be timed, unchanged, on
the single-turn task that single-turn GRPO trainers run (experiments/bench_peers.py), and
so that a peer's python reward function can compute the same number from token ids.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlagent.envs.base import StepType
from rlagent.envs.base import TokenSpec

PAD, END = 0, 1  # the special tokens; prompts and targets use the others.


@dataclasses.dataclass(frozen=True)
class PromptConfig:
    """Sizes of the prompt task (hashable)."""

    vocab_size: int = 128  # V, the policy's vocabulary.
    prompt_len: int = 16  # O: prompt tokens, all non-special.
    turn_len: int = 32  # L: new tokens of the one turn.
    target: int = 2  # the token the reward counts.

    def __post_init__(self):
        for name in ("vocab_size", "prompt_len", "turn_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"PromptConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not END < self.target < self.vocab_size:
            raise ValueError(
                f"PromptConfig.target must be a non-special token in ({END}, "
                f"{self.vocab_size}), got {self.target}"
            )


class PromptState(NamedTuple):
    prompt: jax.Array  # [O] int32
    over: jax.Array  # [] bool: the turn was played.


class PromptObservation(NamedTuple):
    tokens: jax.Array  # [O] int32: the prompt.
    progress: jax.Array  # [1] int32: one constant marker (no progress to show).


class PromptSignals(NamedTuple):
    outcome: jax.Array  # [] float32: target_fraction of the turn.
    success: jax.Array  # [] bool: at least half the slots hold the target.


class PromptTimeStep(NamedTuple):
    step_type: jax.Array  # [] int8
    reward: jax.Array  # [] float32
    discount: jax.Array  # [] float32: 0 once the turn is played.
    observation: PromptObservation
    signals: PromptSignals


def target_fraction(action: jax.Array, target: int) -> jax.Array:
    """`[..., L]` turn tokens -> `[...]` float32 fraction of the L slots equal to `target`."""
    return jnp.mean((action == target).astype(jnp.float32), axis=-1)


class PromptEnv:
    """A prompt, then one turn; the reward is `target_fraction` of the turn."""

    max_turns, num_markers = 1, 1
    signal_names = ("outcome",)
    reward_components = (
        "outcome", "learned_sum", "learned_min", "learned_potential", "learned_centred",
    )  # fmt: skip

    def __init__(self, config: PromptConfig | None = None):
        self.config = config if config is not None else PromptConfig()
        self.token_spec = TokenSpec(vocab_size=self.config.vocab_size, pad=PAD, end=END)

    @property
    def obs_len(self) -> int:
        return self.config.prompt_len

    @property
    def turn_len(self) -> int:
        return self.config.turn_len

    def reset(self, key: jax.Array) -> tuple[PromptState, PromptTimeStep]:
        cfg = self.config
        prompt = jax.random.randint(key, (cfg.prompt_len,), END + 1, cfg.vocab_size, jnp.int32)
        state = PromptState(prompt, jnp.bool_(False))
        return state, self._timestep(state, StepType.FIRST, jnp.float32(0.0))

    def step(self, state: PromptState, action: jax.Array) -> tuple[PromptState, PromptTimeStep]:
        # An ended episode is absorbing: signals 0, same observation.
        score = jnp.where(state.over, 0.0, target_fraction(action, self.config.target))
        new = state._replace(over=jnp.bool_(True))
        return new, self._timestep(new, StepType.LAST, score, played=~state.over)

    def _timestep(self, state, step_type, score, played=False) -> PromptTimeStep:
        return PromptTimeStep(
            step_type=jnp.asarray(step_type, jnp.int8),
            reward=jnp.asarray(score, jnp.float32),
            discount=jnp.where(state.over, 0.0, 1.0).astype(jnp.float32),
            observation=self.observe(state),
            signals=PromptSignals(
                outcome=jnp.asarray(score, jnp.float32), success=played & (score >= 0.5)
            ),
        )

    def observe(self, state: PromptState) -> PromptObservation:
        return PromptObservation(state.prompt, jnp.ones((1,), jnp.int32))

    def allowed_tokens(self, state, prefix, position) -> jax.Array:
        """Every token but PAD: the task constrains nothing (END may end the turn)."""
        return jnp.arange(self.config.vocab_size) != PAD

    def episode_over(self, state: PromptState) -> jax.Array:
        return state.over

    def episode_turn(self, state: PromptState) -> jax.Array:
        return state.over.astype(jnp.int32)

    def episode_metrics(self, signals, turn_mask, action_tokens) -> dict[str, jax.Array]:
        played = jnp.maximum(jnp.sum(turn_mask), 1)
        return {"target_fraction": jnp.sum(signals["outcome"] * turn_mask) / played}
