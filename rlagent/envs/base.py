"""The environment protocol: what rollout, trainer, credit and PRM code may rely on.

An environment plays one episode of turns (Jumanji style, one episode per call; batch
with `vmap`). It offers:

* `reset(key) -> (state, timestep)` and `step(state, action [L] int32) -> (state,
  timestep)`. `timestep.observation` has `tokens [O]` int32 (what the policy reads before
  the next turn: a user message, a tool return) and `progress [K]` int32 (task-progress
  markers, K may be 0); `timestep.step_type == StepType.LAST` ends the episode and
  `timestep.discount` is 0 on termination (1 on truncation). Stepping an ended episode
  returns it unchanged with zero signals (an absorbing state).
* `timestep.signals`: the environment's per-turn signals, a pytree of its own (a
  NamedTuple or dict, as Jumanji's `TimeStep.extras`). Two names are read by every layer:
  `success` ([] bool, True on the turn that solves the episode: episode success is the
  environment's, never recomputed) and the scalar signals the environment lists in
  `signal_names`, which the rollout records as `Trajectory.signals[name]` (`[B, S]`
  float32, 0 on unplayed turns). What the signals mean is the environment's to say.
* An environment that knows which turns were good reports it as the signal named
  `VERDICT` ("verdict": > 0 a useful turn, < 0 a harmful one, 0 neutral). Credit
  accuracy's and the PRMs' AUROCs and the noisy-oracle PRM read it (`verdict_of`);
  without it those AUROCs are NaN and the noisy oracle is refused.
* `token_spec`: a `TokenSpec` (vocabulary size, PAD, END) shared with the policy; the
  rollout pads with PAD and ends a turn at END.
* `allowed_tokens(state, prefix [L], position) -> [V] bool`: the tokens a constrained
  sampler may draw at `position` of a turn, given the turn so far.
* `max_turns` (S), `obs_len` (O), `turn_len` (L), `num_markers` (K);
  `episode_over(state) -> [] bool` and `episode_turn(state) -> [] int32` (turns played),
  `observe(state)`, the observation the state shows (as its last timestep's), which
  environment-level policies and forks of a state read.
* `reward_components`: the names of the training-reward components it offers
  (`rlagent.train.rewards.COMPONENTS` lists every one the trainer can build and the
  signals each reads); a reward form that weights a component the environment does not
  offer is refused naming both (`check_components`).
* `episode_metrics(signals, turn_mask, action_tokens) -> dict[str, []]`: the
  environment's own metrics of a batch of `[B, S]` signals (float32 scalars; the trainer
  logs them beside success, turns and tokens).
* optionally `oracle_action(state) -> [L]`: a known good next turn (a scripted expert),
  used by oracle continuations and demonstrations; environments without one leave it out
  and those features refuse them (`require_oracle`).
* optionally `heldout_env() -> Environment`: the same environment drawing only held-out
  tasks, for environments whose task generator has a train / held-out split (the
  `task_split` of ToolWorld, the dialogue and Mastermind: `rlagent.envs.splits`); held-out
  evaluation (`EvalConfig.tasks='heldout'`) needs it.

`random_action` is the uniform policy over `allowed_tokens` that every environment gets;
`unroll` plays any state-level policy for a fixed number of turns.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple
from typing import Protocol
from typing import runtime_checkable

import jax
import jax.numpy as jnp


class StepType(enum.IntEnum):
    """Jumanji step types (stored as int8)."""

    FIRST = 0
    MID = 1
    LAST = 2


class TokenSpec(NamedTuple):
    """The token conventions an environment and its policy share."""

    vocab_size: int  # V
    pad: int  # pads a turn after END; the policy never writes it.
    end: int  # ends a turn.


@runtime_checkable
class Environment(Protocol):
    """What the rollout, the trainer, credit and PRMs need from an environment."""

    @property
    def max_turns(self) -> int: ...  # S

    @property
    def obs_len(self) -> int: ...  # O

    @property
    def turn_len(self) -> int: ...  # L

    @property
    def num_markers(self) -> int: ...  # K

    @property
    def token_spec(self) -> TokenSpec: ...

    @property
    def signal_names(self) -> tuple[str, ...]: ...

    @property
    def reward_components(self) -> tuple[str, ...]: ...

    def reset(self, key: jax.Array) -> tuple[Any, Any]: ...

    def step(self, state: Any, action: jax.Array) -> tuple[Any, Any]: ...

    def allowed_tokens(self, state: Any, prefix: jax.Array, position: jax.Array) -> jax.Array: ...

    def episode_over(self, state: Any) -> jax.Array: ...

    def episode_turn(self, state: Any) -> jax.Array: ...

    def observe(self, state: Any) -> Any: ...

    def episode_metrics(
        self, signals: dict[str, jax.Array], turn_mask: jax.Array, action_tokens: jax.Array
    ) -> dict[str, jax.Array]: ...


# The name of the per-turn oracle process verdict, for environments that have one.
VERDICT = "verdict"


def verdict_of(turns: Any) -> jax.Array:
    """`[..., S]` oracle verdict of a Trajectory / TurnSignals (0 where the env has none)."""
    verdict = turns.signals.get(VERDICT)
    return jnp.zeros(turns.turn_mask.shape, jnp.float32) if verdict is None else verdict


def env_name(env: Any) -> str:
    return type(env).__name__


def turn_signals(env: Environment, timestep: Any, played: jax.Array) -> dict[str, jax.Array]:
    """`{name: float32}` of `env.signal_names` from one timestep, 0 where not `played`."""
    return {
        name: jnp.where(played, _signal(timestep, name).astype(jnp.float32), 0.0)
        for name in env.signal_names
    }


def turn_success(timestep: Any, played: jax.Array) -> jax.Array:
    """The environment's `success` signal of one timestep, False where not `played`."""
    return played & _signal(timestep, "success").astype(bool)


def _signal(timestep: Any, name: str) -> jax.Array:
    """Signal `name` of a timestep whose signals are a dict or a NamedTuple."""
    signals = timestep.signals
    return jnp.asarray(signals[name] if isinstance(signals, dict) else getattr(signals, name))


def terminated(timestep: Any) -> jax.Array:
    """The step ended the episode by termination (discount 0), not by truncation."""
    return (timestep.step_type == StepType.LAST) & (timestep.discount == 0)


def check_components(env: Any, components: Sequence[str], what: str) -> None:
    """Refuses `components` (of a reward form, `what`) the environment does not offer."""
    offered = tuple(env.reward_components)
    missing = [name for name in components if name not in offered]
    if missing:
        raise ValueError(
            f"{what} uses reward component(s) {missing}, which environment {env_name(env)} "
            f"does not offer (it offers {offered})."
        )


def require_oracle(env: Any, what: str) -> None:
    """Refuses `what` (a feature that plays the environment's oracle) without one."""
    if not callable(getattr(env, "oracle_action", None)):
        raise ValueError(
            f"{what} needs an oracle policy, and environment {env_name(env)} has no "
            f"oracle_action(state)."
        )


def random_action(env: Environment, state: Any, key: jax.Array) -> jax.Array:
    """A turn `[L]` sampled token by token, uniformly over `env.allowed_tokens`."""

    def sample(prefix, inputs):
        position, position_key = inputs
        allowed = env.allowed_tokens(state, prefix, position)
        token = jax.random.categorical(position_key, jnp.where(allowed, 0.0, -jnp.inf))
        return prefix.at[position].set(token.astype(jnp.int32)), None

    positions = jnp.arange(env.turn_len)
    keys = jax.random.split(key, env.turn_len)
    prefix = jnp.zeros((env.turn_len,), jnp.int32)
    action, _ = jax.lax.scan(sample, prefix, (positions, keys))
    return action


class Unroll(NamedTuple):
    """One scripted episode, turn-major (S = number of turns played)."""

    first: Any  # the reset timestep.
    actions: jax.Array  # [S, L] int32.
    timesteps: Any  # leaves [S, ...]: the timestep returned by turn s.


def unroll(
    env: Environment,
    policy: Callable[[Any, jax.Array], jax.Array],
    key: jax.Array,
    num_turns: int | None = None,
) -> Unroll:
    """Plays `policy(state, key) -> [L]` for `num_turns` turns (default env.max_turns).

    Turns after the end of the episode hit the absorbing state (reward and signals 0),
    so the result has fixed shapes; jit/vmap-safe (vmap over `key` for a batch).
    """
    num_turns = env.max_turns if num_turns is None else num_turns
    reset_key, policy_key = jax.random.split(key)
    state, first = env.reset(reset_key)

    def turn(state, turn_key):
        action = policy(state, turn_key)
        state, timestep = env.step(state, action)
        return state, (action, timestep)

    _, (actions, timesteps) = jax.lax.scan(turn, state, jax.random.split(policy_key, num_turns))
    return Unroll(first=first, actions=actions, timesteps=timesteps)


def check_environment(env: Any) -> None:
    """Refuses an object that lacks part of the protocol, naming what is missing."""
    needed = (
        "max_turns", "obs_len", "turn_len", "num_markers", "token_spec", "signal_names",
        "reward_components", "reset", "step", "allowed_tokens", "episode_metrics",
        "episode_over", "episode_turn", "observe",
    )  # fmt: skip
    missing = [name for name in needed if not hasattr(env, name)]
    if missing:
        raise TypeError(f"{env_name(env)} is not an Environment: it lacks {missing}.")
    if "success" in env.signal_names:
        raise ValueError(
            f"{env_name(env)}.signal_names must not list 'success' (it is its own field)."
        )
