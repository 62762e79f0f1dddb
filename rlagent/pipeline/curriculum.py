"""A curriculum driven by success: stages as data in one program, and their scheduler.

`StageMixture(stages)` is one environment over several (the curriculum's stages, e.g.
ToolWorld levels 1-4 and longer horizons) that share the token spec, observation and turn
lengths: each episode draws its stage at reset from probabilities `probs [K]` that are
*data* (`mixture.with_probs(probs)`, traced), so every stage distribution runs in one
compiled program; shapes are the largest stage's (S = max turns, progress markers padded
with `pad_progress`). Every stage is reset from the episode's key and stepped alongside
(only the drawn stage's state is read), so a one-hot `probs` on stage k plays exactly
stage k's episodes. Per batch it reports, for each stage k, the episodes drawn
(`curriculum_episodes_<k>`) and those solved (`curriculum_solved_<k>`).

`Scheduler` decides the probabilities between chunks of updates, on the host, from those
counts (`CurriculumConfig.kind`):

* `success`: per stage an exponential moving average (EMA) of the batch success rate,
  updated on every update with episodes of that stage. Every `every` updates: the
  frontier (the hardest unlocked stage) is promoted once its EMA reaches `promote`, and
  demoted when the stage below it falls under `demote` < `promote` (hysteresis: a
  stage that has just been passed is not given back for noise between the two). The
  unlocked stages are sampled with weights that favour a success rate near `target`,
  `w_k = exp(-((p_k - target) / width)^2 / 2)` (p_k the EMA, `target` for a stage not yet
  seen), times `plateau_factor` for a stage whose EMA has not risen by `plateau_delta`
  over its best in `plateau_window` decisions (plateau detection); probabilities are
  `(1 - floor) w / sum(w) + floor / n_unlocked`. With `frontier_share` > 0 the frontier
  gets at least that probability (the other unlocked stages scaled down to the rest):
  the bump weighs a stage at 0% success as far from `target` as a mastered one, so a
  newly unlocked stage would otherwise get the fewest episodes exactly when it has the
  most to learn (docs/curriculum.md).
* `fixed`: stage `floor(update * K / num_updates)`, one-hot (a schedule set in advance).
* `final`: the last stage only (training on the final task from the start).

The scheduler state is a NamedTuple of NumPy arrays with a leading runs axis
(`SchedulerState`), checkpointed with the runner states by `rlagent.host.loop.run(
curriculum=)`, so a resumed run restores it exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlagent.envs.base import Environment
from rlagent.envs.base import turn_signals
from rlagent.envs.base import turn_success

KINDS = ("success", "fixed", "final")
STAGE_SIGNAL = "curriculum_stage"  # 1-based stage of the episode on played turns.
SOLVED_SIGNAL = "curriculum_solved"  # 1 on the turn that solves the episode.
_STAGE_SALT = 0xC0C1  # folded into the reset key to draw the stage (the stages' keys stay).


@dataclasses.dataclass(frozen=True)
class CurriculumConfig:
    """How the stage probabilities move (module docstring); validated naming the field."""

    kind: str = "success"  # 'success' | 'fixed' | 'final'.
    every: int = 5  # updates between decisions (the chunks end there).
    smoothing: float = 0.7  # EMA weight of the past: p <- s p + (1 - s) rate.
    promote: float = 0.7  # frontier EMA that unlocks the next stage.
    demote: float = 0.4  # EMA of the stage below the frontier that locks the frontier again.
    target: float = 0.5  # success rate the sampling weights favour.
    width: float = 0.25  # width of the weights' bump around `target`.
    floor: float = 0.1  # probability mass spread evenly over the unlocked stages.
    plateau_window: int = 4  # decisions without improvement that make a plateau.
    plateau_delta: float = 0.02  # improvement of the EMA over its best that counts.
    plateau_factor: float = 0.3  # weight multiplier of a plateaued stage.
    frontier_share: float = 0.0  # least probability of the frontier stage (0: no floor).

    def __post_init__(self):
        if self.kind not in KINDS:
            self._fail("kind", f"must be one of {KINDS}")
        for name in ("every", "plateau_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                self._fail(name, "must be an integer >= 1")
        for name in ("smoothing", "floor"):
            if not 0.0 <= getattr(self, name) < 1.0:
                self._fail(name, "must be in [0, 1)")
        for name in ("promote", "demote", "target", "plateau_factor", "frontier_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                self._fail(name, "must be in [0, 1]")
        if self.demote >= self.promote:
            self._fail("demote", f"must be below promote={self.promote} (hysteresis)")
        if self.width <= 0:
            self._fail("width", "must be > 0")
        if self.plateau_delta < 0:
            self._fail("plateau_delta", "must be >= 0")

    def _fail(self, name: str, message: str):
        raise ValueError(f"CurriculumConfig.{name} {message}, got {getattr(self, name)!r}.")


class SchedulerState(NamedTuple):
    """Per run (leading axis R) and stage (K)."""

    frontier: np.ndarray  # [R] int32: hardest unlocked stage.
    ema: np.ndarray  # [R, K] float32: success EMA (0 until seen).
    seen: np.ndarray  # [R, K] bool: the stage had episodes.
    best: np.ndarray  # [R, K] float32: best EMA at a decision (plateau detection).
    stale: np.ndarray  # [R, K] int32: decisions since the EMA last beat `best` + delta.


class Scheduler:
    """The host side of a curriculum over `mixture`'s stages (`rlagent.host.loop.run(
    curriculum=)`): `init`, `observe` (every update), `decide` (every `config.every`
    updates), `probs`, and the environments of training (`env(probs)`) and evaluation."""

    def __init__(self, config: CurriculumConfig, mixture: StageMixture, num_updates: int):
        self.config = config
        self.mixture = mixture
        self.num_stages = len(mixture.stages)
        self.num_updates = int(num_updates)

    @property
    def every(self) -> int:
        return self.config.every

    @property
    def eval_env(self) -> Environment:
        """Held-out evaluation plays the final stage (the task the curriculum is for)."""
        return self.mixture.stages[-1]

    def env(self, probs: jax.Array) -> StageMixture:
        return self.mixture.with_probs(probs)

    def init(self, num_runs: int) -> SchedulerState:
        return init_state(num_runs, self.num_stages)

    def observe(self, state: SchedulerState, metrics: Mapping[str, np.ndarray]) -> SchedulerState:
        """One update's batch metrics (`[R]` per name) into the success EMAs."""
        episodes, solved = stage_counts(metrics, self.num_stages)
        return observe(self.config, state, episodes, solved)

    def decide(self, state: SchedulerState) -> SchedulerState:
        if self.config.kind != "success":
            return state
        return decide(self.config, state)

    def probs(self, state: SchedulerState, update: int) -> np.ndarray:
        """`[R, K]` float32 stage probabilities of the updates from `update` (done) on."""
        runs, k = state.frontier.shape[0], self.num_stages
        if self.config.kind == "final":
            return np.tile(np.eye(k, dtype=np.float32)[-1], (runs, 1))
        if self.config.kind == "fixed":
            stage = min(k - 1, update * k // max(self.num_updates, 1))
            return np.tile(np.eye(k, dtype=np.float32)[stage], (runs, 1))
        return sampling_probs(self.config, state)

    def columns(self, state: SchedulerState, probs: np.ndarray) -> dict[str, np.ndarray]:
        """Metric columns (`[R]` each) of the updates run with `probs` from `state`."""
        out = {"curriculum_frontier": state.frontier.astype(np.float32)}
        if self.config.kind == "fixed":
            out["curriculum_frontier"] = np.argmax(probs, axis=1).astype(np.float32)
        elif self.config.kind == "final":
            out["curriculum_frontier"] = np.full(probs.shape[0], self.num_stages - 1, np.float32)
        for k in range(self.num_stages):
            out[f"curriculum_p{k}"] = probs[:, k]
            out[f"curriculum_ema{k}"] = state.ema[:, k]
        return out


def init_state(num_runs: int, num_stages: int) -> SchedulerState:
    zeros = np.zeros((num_runs, num_stages), np.float32)
    return SchedulerState(
        frontier=np.zeros((num_runs,), np.int32),
        ema=zeros.copy(),
        seen=np.zeros((num_runs, num_stages), bool),
        best=zeros.copy(),
        stale=np.zeros((num_runs, num_stages), np.int32),
    )


def stage_counts(metrics: Mapping[str, Any], num_stages: int) -> tuple[np.ndarray, np.ndarray]:
    """`(episodes [R, K], solved [R, K])` from a batch's `curriculum_*_<k>` metrics."""
    episodes = np.stack(
        [np.asarray(metrics[f"curriculum_episodes_{k}"]) for k in range(num_stages)], -1
    )
    solved = np.stack(
        [np.asarray(metrics[f"curriculum_solved_{k}"]) for k in range(num_stages)], -1
    )
    return episodes.astype(np.float32), solved.astype(np.float32)


def observe(
    config: CurriculumConfig, state: SchedulerState, episodes: np.ndarray, solved: np.ndarray
) -> SchedulerState:
    """EMA update of the stages with episodes in this batch (the first sets the EMA)."""
    played = episodes > 0
    rate = solved / np.maximum(episodes, 1.0)
    mixed = config.smoothing * state.ema + (1.0 - config.smoothing) * rate
    ema = np.where(played, np.where(state.seen, mixed, rate), state.ema).astype(np.float32)
    return state._replace(ema=ema, seen=state.seen | played)


def decide(config: CurriculumConfig, state: SchedulerState) -> SchedulerState:
    """Plateau counters, then promotion / demotion of the frontier (with hysteresis)."""
    improved = state.ema > state.best + config.plateau_delta
    best = np.where(improved, state.ema, state.best).astype(np.float32)
    stale = np.where(improved | ~state.seen, 0, state.stale + 1).astype(np.int32)
    runs = np.arange(state.frontier.shape[0])
    last = state.ema.shape[1] - 1
    at_frontier = state.ema[runs, state.frontier]
    promote = state.seen[runs, state.frontier] & (at_frontier >= config.promote)
    promote &= state.frontier < last
    below = np.maximum(state.frontier - 1, 0)
    demote = (
        (state.frontier > 0) & state.seen[runs, below] & (state.ema[runs, below] < config.demote)
    )
    frontier = (state.frontier + promote - (demote & ~promote)).astype(np.int32)
    return state._replace(frontier=frontier, best=best, stale=stale)


def sampling_probs(config: CurriculumConfig, state: SchedulerState) -> np.ndarray:
    """`[R, K]` probabilities over the unlocked stages (module docstring)."""
    k = state.ema.shape[1]
    unlocked = np.arange(k)[None, :] <= state.frontier[:, None]
    p = np.where(state.seen, state.ema, config.target)
    weights = np.exp(-0.5 * ((p - config.target) / config.width) ** 2)
    weights = np.where(
        state.stale >= config.plateau_window, weights * config.plateau_factor, weights
    )
    weights = np.where(unlocked, weights, 0.0)
    count = unlocked.sum(axis=1, keepdims=True)
    total = weights.sum(axis=1, keepdims=True)
    share = np.where(total > 0, weights / np.where(total > 0, total, 1.0), unlocked / count)
    probs = (1.0 - config.floor) * share + config.floor * unlocked / count
    if config.frontier_share > 0:
        at_front = np.arange(k)[None, :] == state.frontier[:, None]
        front = np.sum(probs * at_front, axis=1, keepdims=True)
        least = np.maximum(front, config.frontier_share)
        rest = np.where(front < 1.0, (1.0 - least) / np.maximum(1.0 - front, 1e-12), 0.0)
        probs = np.where(at_front, least, probs * rest)
    return probs.astype(np.float32)


# The stages as one environment ------------------------------------------------------------


class MixtureState(NamedTuple):
    stage: jax.Array  # [] int32: the episode's stage.
    states: tuple  # every stage's state (only `stage`'s is read).


class Observation(NamedTuple):
    tokens: jax.Array  # [O] int32.
    progress: jax.Array  # [K_max] int32, padded with `pad_progress`.


class TimeStep(NamedTuple):
    step_type: jax.Array  # [] int8.
    reward: jax.Array  # [] float32.
    discount: jax.Array  # [] float32.
    observation: Observation
    signals: dict  # the stages' signals by name, success, and the curriculum signals.


class StageMixture:
    """The stages of a curriculum as one environment (module docstring)."""

    def __init__(self, stages: Sequence[Environment], *, pad_progress: int = 0, probs=None):
        stages = tuple(stages)
        if not stages:
            raise ValueError("StageMixture needs at least one stage.")
        first = stages[0]
        for i, stage in enumerate(stages[1:], 1):
            for name in ("token_spec", "obs_len", "turn_len", "signal_names", "reward_components"):
                if getattr(stage, name) != getattr(first, name):
                    raise ValueError(
                        f"StageMixture: stage {i} has {name}={getattr(stage, name)!r}, stage 0 "
                        f"{getattr(first, name)!r}; every stage must share it."
                    )
        self.stages = stages
        self.pad_progress = int(pad_progress)
        self.probs = probs

    def with_probs(self, probs: jax.Array) -> StageMixture:
        """The same stages drawn with probabilities `probs [K]` (data: may be traced)."""
        return StageMixture(self.stages, pad_progress=self.pad_progress, probs=probs)

    def __hash__(self):
        return hash((self.stages, self.pad_progress))

    def __eq__(self, other):
        return (
            isinstance(other, StageMixture)
            and self.probs is None
            and other.probs is None
            and (self.stages, self.pad_progress) == (other.stages, other.pad_progress)
        )

    @property
    def config(self) -> dict[str, Any]:
        """What provenance records: every stage's config."""
        return {"stages": [getattr(s, "config", repr(s)) for s in self.stages],
                "pad_progress": self.pad_progress}  # fmt: skip

    # The environment protocol (rlagent.envs.base) -------------------------------------
    @property
    def max_turns(self) -> int:
        return max(s.max_turns for s in self.stages)

    @property
    def num_markers(self) -> int:
        return max(s.num_markers for s in self.stages)

    @property
    def obs_len(self) -> int:
        return self.stages[0].obs_len

    @property
    def turn_len(self) -> int:
        return self.stages[0].turn_len

    @property
    def token_spec(self):
        return self.stages[0].token_spec

    @property
    def signal_names(self) -> tuple[str, ...]:
        return (*self.stages[0].signal_names, STAGE_SIGNAL, SOLVED_SIGNAL)

    @property
    def reward_components(self) -> tuple[str, ...]:
        return self.stages[0].reward_components

    @property
    def requires_constrained(self) -> bool:
        return any(getattr(s, "requires_constrained", False) for s in self.stages)

    def reset(self, key: jax.Array) -> tuple[MixtureState, TimeStep]:
        probs = self.probs
        if probs is None:
            probs = jnp.full((len(self.stages),), 1.0 / len(self.stages))
        logits = jnp.log(jnp.maximum(jnp.asarray(probs, jnp.float32), 0.0))
        stage = jax.random.categorical(jax.random.fold_in(key, _STAGE_SALT), logits)
        results = [s.reset(key) for s in self.stages]
        state = MixtureState(stage.astype(jnp.int32), tuple(r[0] for r in results))
        return state, self._timestep(state, [r[1] for r in results])

    def step(self, state: MixtureState, action: jax.Array) -> tuple[MixtureState, TimeStep]:
        results = [s.step(x, action) for s, x in zip(self.stages, state.states, strict=True)]
        new = MixtureState(state.stage, tuple(r[0] for r in results))
        return new, self._timestep(new, [r[1] for r in results])

    def allowed_tokens(self, state: MixtureState, prefix: jax.Array, position) -> jax.Array:
        return self._pick(state, lambda s, x: s.allowed_tokens(x, prefix, position))

    def episode_over(self, state: MixtureState) -> jax.Array:
        return self._pick(state, lambda s, x: s.episode_over(x))

    def episode_turn(self, state: MixtureState) -> jax.Array:
        return self._pick(state, lambda s, x: s.episode_turn(x))

    def observe(self, state: MixtureState) -> Observation:
        return self._pick(state, lambda s, x: self._pad(s.observe(x)))

    def oracle_action(self, state: MixtureState) -> jax.Array:
        return self._pick(state, lambda s, x: s.oracle_action(x))

    def episode_metrics(self, signals, turn_mask, action_tokens) -> dict[str, jax.Array]:
        """The final stage's metrics of the batch, and per stage k the episodes drawn and
        solved (`curriculum_episodes_<k>`, `curriculum_solved_<k>`, counts)."""
        own = {k: v for k, v in signals.items() if k not in (STAGE_SIGNAL, SOLVED_SIGNAL)}
        out = dict(self.stages[-1].episode_metrics(own, turn_mask, action_tokens))
        stage = jnp.max(signals[STAGE_SIGNAL], axis=1) - 1.0  # [B], -1 if nothing was played
        solved = jnp.max(signals[SOLVED_SIGNAL], axis=1)
        for k in range(len(self.stages)):
            drawn = (stage == k).astype(jnp.float32)
            out[f"curriculum_episodes_{k}"] = jnp.sum(drawn)
            out[f"curriculum_solved_{k}"] = jnp.sum(drawn * solved)
        return out

    # Helpers ---------------------------------------------------------------------------
    def _pick(self, state: MixtureState, fn):
        """`fn(stage, stage_state)` of the episode's stage (every stage computed, selected)."""
        values = [fn(s, x) for s, x in zip(self.stages, state.states, strict=True)]
        return jax.tree.map(lambda *xs: jnp.stack(xs)[state.stage], *values)

    def _pad(self, observation) -> Observation:
        progress = observation.progress
        extra = self.num_markers - progress.shape[-1]
        progress = jnp.pad(progress, (0, extra), constant_values=self.pad_progress)
        return Observation(tokens=observation.tokens, progress=progress.astype(jnp.int32))

    def _timestep(self, state: MixtureState, timesteps: Sequence[Any]) -> TimeStep:
        steps = []
        for stage, timestep in zip(self.stages, timesteps, strict=True):
            played = jnp.ones((), bool)
            signals = turn_signals(stage, timestep, played)
            signals["success"] = turn_success(timestep, played)
            steps.append(TimeStep(
                step_type=jnp.asarray(timestep.step_type, jnp.int8),
                reward=jnp.asarray(timestep.reward, jnp.float32),
                discount=jnp.asarray(timestep.discount, jnp.float32),
                observation=self._pad(timestep.observation),
                signals=signals,
            ))  # fmt: skip
        picked = jax.tree.map(lambda *xs: jnp.stack(xs)[state.stage], *steps)
        picked.signals[STAGE_SIGNAL] = state.stage.astype(jnp.float32) + 1.0
        picked.signals[SOLVED_SIGNAL] = picked.signals["success"].astype(jnp.float32)
        return picked
