"""Jitted multi-turn rollout of a token-level policy in an environment, and teacher-forced scoring.

`rollout = make_rollout(env, graphdef, config)` returns a pure function
`rollout(params, env_keys, policy_keys) -> Trajectory` that plays B episodes of exactly
S = env.max_turns turns: a `lax.scan` over turns whose body (`make_turn`) builds the
policy's context, samples the L tokens of the turn with a KV cache (one prefill, then one
cached pass per token, stopping once every episode's turn has ended: the grammar ends
every command before L), and steps the environment. The policy plays a turn only for the
episodes still alive (`RolloutConfig.live_chunks`: static chunks of live rows in a
`while_loop`, packed across the runs of a `vmap`, `rlagent.models.live_rows.live_map`);
ended episodes step the absorbing terminal state with PAD actions and are masked out
(`turn_mask`). Rows are independent, so a row's tokens are those of playing every row
(log-probs to float32 rounding: XLA CPU picks its matmul kernel by the number of rows).

Forking episodes: the scan carry is a public `RolloutCarry` (environment state, the
observation to read next, alive flags, the policy's memory of past turns). With
`make_rollout(..., with_carries=True)` the rollout also returns the carry at the start of
every turn (`[S, B, ...]`), and `continue_ = make_continue(env, graphdef, config)` plays
`continue_(params, carry, start_turn, policy_keys, num_turns=n)` -> the next n turns of a
batch of episodes from such carries, as a `[B, n]` Trajectory. Turn s samples with
`fold_in(policy_keys[b], s)`, so continuing from the carry of turn s with the rollout's own
policy keys replays the rollout; other keys give Monte-Carlo forks of the same states.
`forks_from_carries` lays the carries out batch-major (`[B, S, ...]`), and
`branch = make_branch(env, graphdef, config)` forks chosen episodes at chosen turns and
plays them to the end, spliced after the played prefix (`splice`): the tree rollouts of
`rlagent.train.tree` and the fork pairs of online DPO.

`score = make_score(env, graphdef, config)` recomputes, teacher-forced, the log-probs,
values and entropies of a trajectory's tokens from the *same* contexts, all turns in
parallel; only the summary recurrence is a scan over turns. Gradients flow through
everything, the summary included.

Context of turn s (see `rlagent.models.state_encoder`), read by one `ContextReader`:
  windowed (W = config.window):  [summary (M) | block(s-W) .. block(s-1) | obs_s | markers_s]
  full (config.window = None):   [block(0) .. block(s-1) | obs_s | markers_s]
followed by the L action tokens, with block(t) = [obs_t (O) | markers_t (K) | action_t (L)].
`WindowedContext` runs every turn on a fresh cache of C + L slots,
C = M + W (O + K + L) + O + K, independent of the episode length, and scores the
`[B * S, C + L]` contexts of played turns in one pass. `FullContext` keeps one KV cache
per episode across turns (the transcript is append-only), so a turn attends over
S (O + K + L) slots, and scores each episode's transcript `[B, S (O + K + L)]` in one
pass. Scoring runs the last block only at the slots that predict action tokens.

Sampling conventions (`rlagent.models.sampler`): log-probs are those of
pi = softmax(logits / temperature + mask); `mask` always bans PAD (the policy never writes
padding; with a constrained mask PAD stays allowed only if nothing else is), and with
`constrained=True` it is the env's `allowed_tokens` (grammar, and rules when the env's
guardrail is in mask mode), stored in `Trajectory.sampling_mask` so that `score`
renormalises over the same set. Values: `values[b, s, i]` is V of the state before token i
of turn s (read where the logits of token i are read); `bootstrap_value` is V of the state
after the last turn when the episode was truncated (its last turn played without
termination), else 0.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple
from typing import Protocol

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlagent.envs.base import Environment
from rlagent.envs.base import StepType
from rlagent.envs.base import TokenSpec
from rlagent.envs.base import check_environment
from rlagent.envs.base import terminated
from rlagent.envs.base import turn_signals
from rlagent.envs.base import turn_success
from rlagent.models.live_rows import live_map
from rlagent.models.live_rows import live_row_sum
from rlagent.models.live_rows import live_rows
from rlagent.models.llama import KVCache
from rlagent.models.llama import init_cache
from rlagent.models.policy import ContextLM
from rlagent.models.policy import Policy
from rlagent.models.policy import observed_tokens
from rlagent.models.policy import visible_observations
from rlagent.models.sampler import allowed_to_mask
from rlagent.models.sampler import entropy_from_log_probs
from rlagent.models.sampler import policy_log_probs
from rlagent.models.sampler import sample_with_noise
from rlagent.models.state_encoder import Window
from rlagent.models.state_encoder import empty_window
from rlagent.models.state_encoder import full_context
from rlagent.models.state_encoder import gather_window
from rlagent.models.state_encoder import push_window
from rlagent.models.state_encoder import summary_sequence
from rlagent.models.state_encoder import window_context
from rlagent.types import Trajectory

# Teacher-forced scoring cuts the B * S turn rows into this many chunks and computes only
# those holding a played turn (`rlagent.models.live_rows`).
_SCORE_CHUNKS = 16


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How the policy reads its history and samples (hashable, static under jit)."""

    window: int | None = 4  # W turns kept verbatim; None = full context (all turns).
    temperature: float = 1.0  # tau of pi = softmax(logits / tau + mask); 0 = greedy.
    top_k: int = 0  # sample among the k most likely tokens (0 = off; not part of pi).
    top_p: float = 1.0  # nucleus sampling mass (1 = off; not part of pi).
    constrained: bool = False  # sample from env.allowed_tokens (grammar, mask-mode rules).
    # Play each turn's policy calls on the episodes still alive only, in this many static
    # chunks of the batch (`live_map`); 0 = every row, ended episodes included. Off by
    # default: 8 chunks take 1.9x less rollout time on the main experiment and play the
    # same tokens, but log-probs and values differ by float32 rounding (XLA CPU's matmul
    # kernel depends on the row count) and the rollout compiles in about twice the time
    # (docs/benchmarks.md), so the committed results keep the every-row numbers.
    live_chunks: int = 0

    def __post_init__(self):
        if self.window is not None and self.window < 0:
            raise ValueError(f"RolloutConfig.window must be >= 0 or None, got {self.window}")
        if not self.temperature >= 0:  # also NaN
            raise ValueError(f"RolloutConfig.temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"RolloutConfig.top_k must be >= 0, got {self.top_k}")
        if self.live_chunks < 0:
            raise ValueError(f"RolloutConfig.live_chunks must be >= 0, got {self.live_chunks}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"RolloutConfig.top_p must be in (0, 1], got {self.top_p}")


class Dims(NamedTuple):
    """Static sizes of one rollout."""

    turns: int  # S
    obs_len: int  # O
    num_markers: int  # K
    turn_len: int  # L
    pad: int = 0  # the PAD token (env.token_spec.pad, the policy's pad_id)

    @property
    def block(self) -> int:
        """O + K + L: slots of one turn in the transcript."""
        return self.obs_len + self.num_markers + self.turn_len


class WindowMemory(NamedTuple):
    """Windowed mode: what the policy remembers of past turns (batched)."""

    window: Window  # [B, W, ...] the last W turn blocks.
    summaries: tuple[jax.Array, ...]  # per reader (actor[, critic]): [B, summary_dim] H.


class TranscriptMemory(NamedTuple):
    """Full-context mode: what the policy remembers of past turns (batched)."""

    caches: tuple[KVCache, ...]  # per reader (actor[, critic]): the transcript's KV cache.
    seen: jax.Array  # [B, V] float32: tokens of every observation read so far (copy gate).


Memory = WindowMemory | TranscriptMemory


class RolloutCarry(NamedTuple):
    """State of a batch of episodes at the start of a turn: all a rollout needs to go on."""

    env_state: Any  # [B] environment states.
    obs: Any  # [B] the observation the next turn reads (tokens [B, O], progress [B, K]).
    alive: jax.Array  # [B] bool: the episode has not ended.
    memory: Memory  # the policy's memory of the turns played so far.


class TurnOutput(NamedTuple):
    """What one turn adds to the trajectory (the `[B, S]` / `[B, S, ...]` fields, per turn)."""

    obs_tokens: jax.Array  # [B, O] int32.
    progress: jax.Array  # [B, K] int32.
    action_tokens: jax.Array  # [B, L] int32.
    action_mask: jax.Array  # [B, L] bool.
    logp: jax.Array  # [B, L] float32.
    values: jax.Array  # [B, L] float32.
    turn_mask: jax.Array  # [B] bool.
    signals: dict[str, jax.Array]  # {name: [B] float32} of env.signal_names.
    success: jax.Array  # [B] bool.
    done: jax.Array  # [B] bool.
    sampling_mask: jax.Array | None  # [B, L, V] bool (constrained decoding), else None.


class Prefill(NamedTuple):
    """A reader's context of one turn, read into a KV cache."""

    hidden: jax.Array  # [B, D] last hidden state: predicts token 0 of the turn.
    cache: KVCache  # the cache holding the context.
    start: jax.Array  # [] int32 slot of token 0 of the turn.


class TurnInputs(NamedTuple):
    """What `_sample_turn` needs beyond the (static) actor and sampling settings."""

    prefill: Prefill
    env_state: Any  # [B] environment states (for `allowed_tokens`).
    keys: jax.Array  # [B] PRNG keys of the turn.
    visible: jax.Array  # [B, V] float32 tokens visible in the context (copy gate).


class SampledTurn(NamedTuple):
    """The L tokens of a turn, sampled."""

    action: jax.Array  # [B, L] int32 (PAD after END).
    live: jax.Array  # [B, L] bool: generated tokens (END included).
    logp: jax.Array  # [B, L] float32 behaviour log-probs, 0 where not live.
    values: jax.Array  # [B, L] float32 shared-head values, 0 where not live (or critic).
    sampling_mask: jax.Array | None  # [B, L, V] bool allowed tokens (constrained), else None.
    cache: KVCache  # the actor's cache with the turn written in.


class ContextReader(Protocol):
    """How the policy reads its history: one implementation per context mode.

    Rollout side (batched, one turn at a time): `init` the memory, the tokens `visible` to
    the copy gate, `prefill` a reader's context, `critic_values` of a sampled turn, and
    `advance` the memory past the turn. Scoring side (all turns in parallel, from a
    trajectory): `hidden_states` and `visible_observations`. Both sides build the same
    contexts, which is what makes `score` reproduce the rollout's log-probs and values.
    """

    def init(self, readers: Sequence[ContextLM], batch: int, vocab: int) -> Memory: ...

    def visible(self, memory: Memory, current: jax.Array) -> tuple[jax.Array, Memory]: ...

    def prefill(
        self, model: ContextLM, memory: Memory, reader: int, obs: Any, turn: jax.Array
    ) -> Prefill: ...

    def critic_values(
        self,
        critic: ContextLM,
        memory: Memory,
        obs: Any,
        action: jax.Array,
        live: jax.Array,
        turn: jax.Array,
    ) -> tuple[jax.Array, KVCache | None]: ...

    def advance(
        self,
        readers: Sequence[ContextLM],
        memory: Memory,
        caches: tuple[KVCache | None, ...],
        obs: Any,
        action: jax.Array,
        live: jax.Array,
    ) -> Memory: ...

    def hidden_states(self, model: ContextLM, traj: Trajectory) -> jax.Array: ...

    def visible_observations(self, observed: jax.Array) -> jax.Array: ...


def make_rollout(
    env: Environment,
    graphdef: nnx.GraphDef,
    config: RolloutConfig = RolloutConfig(),
    *,
    with_carries: bool = False,
) -> Callable[..., Trajectory | tuple[Trajectory, RolloutCarry]]:
    """Builds `rollout(params, env_keys, policy_keys) -> Trajectory` (pure, jit/vmap-safe).

    Args:
      env: an `Environment` (e.g. ToolWorld).
      graphdef: from `nnx.split(Policy(...))`.
      config: RolloutConfig.
      with_carries: also return the `RolloutCarry` at the start of every turn, stacked
        turn-major (`[S, B, ...]`; `jax.tree.map(lambda x: x[s], carries)` is the batch at
        turn s), to fork episodes with `make_continue`. Static; nothing is kept when False.
    Returns:
      rollout(params, env_keys [B] keys or [B, 2] uint32, policy_keys [B]) -> Trajectory
      with [B, S, ...] fields, S = env.max_turns (and the carries when `with_carries`).
      Episodes sharing an env key share a task; the result is a deterministic function of
      (params, keys).
    """
    _check_env(env, config)
    reset = jax.vmap(env.reset)

    def rollout(params: nnx.State, env_keys: jax.Array, policy_keys: jax.Array):
        policy = _merge(graphdef, params)
        reader = _context_reader(env, policy, config)
        batch = env_keys.shape[0]
        state, ts = reset(env_keys)
        vocab = policy.config.vocab_size
        carry = RolloutCarry(
            env_state=state,
            obs=ts.observation,
            alive=jnp.ones((batch,), bool),
            memory=reader.init(_readers(policy), batch, vocab),
        )
        traj, carries = _play(
            env,
            policy,
            reader,
            config,
            carry,
            0,
            policy_keys=policy_keys,
            num_turns=env.max_turns,
            with_carries=with_carries,
        )
        return (traj, carries) if with_carries else traj

    return rollout


def make_continue(
    env: Environment, graphdef: nnx.GraphDef, config: RolloutConfig = RolloutConfig()
) -> Callable[..., Trajectory]:
    """Builds `continue_(params, carry, start_turn, policy_keys, *, num_turns) -> Trajectory`.

    Plays turns `start_turn .. start_turn + num_turns - 1` of B episodes from `carry` (a
    `RolloutCarry` of the batch at the start of `start_turn`, e.g. sliced from the carries
    of `make_rollout(..., with_carries=True)`), with the same turn body as the rollout.
    `start_turn` may be traced; `num_turns` is static (jit with `static_argnames`), and
    `start_turn + num_turns <= env.max_turns` is the caller's to keep (the full-context
    cache has room for S turns). The `[B, num_turns]` Trajectory bootstraps from V after
    its last turn where that turn was played without termination.
    """
    _check_env(env, config)

    def continue_(
        params: nnx.State,
        carry: RolloutCarry,
        start_turn: jax.Array | int,
        policy_keys: jax.Array,
        *,
        num_turns: int,
    ) -> Trajectory:
        policy = _merge(graphdef, params)
        reader = _context_reader(env, policy, config)
        start = jnp.asarray(start_turn, jnp.int32)
        traj, _ = _play(
            env,
            policy,
            reader,
            config,
            carry,
            start,
            policy_keys=policy_keys,
            num_turns=num_turns,
            with_carries=False,
        )
        return traj

    return continue_


def forks_from_carries(carries: RolloutCarry) -> RolloutCarry:
    """Turn-major carries of `make_rollout(with_carries=True)` -> forks, every leaf `[B, S, ...]`.

    Carry leaves are batch-first except the KV cache's keys and values, which are
    layer-major (`[num_layers, B, ...]`): their batch axis moves to the front too.
    """

    def batch_major(node):
        if isinstance(node, KVCache):  # [S, layers, B, ...] for k and v, [S, B, T] valid
            return KVCache(
                k=jnp.moveaxis(node.k, 2, 0),
                v=jnp.moveaxis(node.v, 2, 0),
                valid=jnp.swapaxes(node.valid, 0, 1),
            )
        return jnp.swapaxes(node, 0, 1)

    return jax.tree.map(batch_major, carries, is_leaf=_is_cache)


def continue_fork(
    continue_: Callable, params: Any, carry: Any, start: jax.Array, key: jax.Array,
    num_turns: int,
) -> Trajectory:  # fmt: skip
    """One fork (a carry of `forks_from_carries`, batch axis dropped) continued by
    `continue_ = make_continue(...)` from turn `start` for `num_turns` turns: a
    trajectory with a batch of one. Past max_turns the environment is absorbing and the
    turns are masked, so running S turns from any start keeps one compiled program for
    every fork."""
    single = jax.tree.map(_batch_of_one, carry, is_leaf=_is_cache)
    return continue_(params, single, start, key[None], num_turns=num_turns)


def splice(prefix: Trajectory, continuation: Trajectory, start: jax.Array) -> Trajectory:
    """Whole episodes `[M, S]`: turns `< start[m]` of `prefix`, then `continuation`.

    `continuation` `[M, S]` holds in column k the turn `start + k` (as
    `make_continue(num_turns=S)` plays it from the carry at `start`); columns past S are
    dropped. `bootstrap_value` is the continuation's (0 where it started after turn 0:
    its column S - 1 lies past the episode's last turn).
    """
    num_turns = prefix.turn_mask.shape[1]
    offset = jnp.arange(num_turns)[None, :] - start[:, None]
    before = offset < 0
    index = jnp.clip(offset, 0, num_turns - 1)

    def merge(p, c):
        if p is None:
            return None
        if p.ndim < 2 or p.shape[1] != num_turns:  # bootstrap_value [M]
            return c
        moved = jnp.take_along_axis(c, index.reshape(*index.shape, *[1] * (c.ndim - 2)), axis=1)
        return jnp.where(before.reshape(*before.shape, *[1] * (p.ndim - 2)), p, moved)

    return jax.tree.map(merge, prefix, continuation, is_leaf=lambda x: x is None)


def make_branch(
    env: Environment, graphdef: nnx.GraphDef, config: RolloutConfig = RolloutConfig()
) -> Callable[..., Trajectory]:
    """Builds `branch(params, trajectory, carries, rows, start, keys) -> Trajectory [M, S]`.

    Episode `rows[m]` of a rollout (`trajectory` `[B, S]` and its turn-major `carries`
    from `make_rollout(with_carries=True)`) is forked at the start of turn `start[m]` and
    played to its end with policy keys `keys[m]` (turn s samples `fold_in(keys[m], s)`),
    then spliced after the played prefix (`splice`): turns before `start[m]` are the
    rollout's, the rest the fork's. Every fork plays S turns from its start (masked past
    the episode's end), so one program serves every start. Pure and jit / vmap-safe.
    """
    continue_ = make_continue(env, graphdef, config)
    num_turns = env.max_turns

    def branch(params, trajectory, carries, rows, start, keys) -> Trajectory:
        forks = forks_from_carries(carries)  # [B, S, ...]
        carry = jax.tree.map(lambda x: x[rows, start], forks)

        def one(carry, start, key):
            return continue_fork(continue_, params, carry, start, key, num_turns)

        branches = jax.tree.map(lambda x: x[:, 0], jax.vmap(one)(carry, start, keys))
        return splice(jax.tree.map(lambda x: x[rows], trajectory), branches, start)

    return branch


def _is_cache(node) -> bool:
    return isinstance(node, KVCache)


def _batch_of_one(node):
    """One fork's carry (batch axis dropped) -> a batch of one, layer-major KV caches."""
    if isinstance(node, KVCache):
        return KVCache(k=node.k[:, None], v=node.v[:, None], valid=node.valid[None])
    return node[None]


def make_turn(
    env: Environment,
    policy: Policy,
    reader: ContextReader,
    config: RolloutConfig,
    policy_keys: jax.Array,
) -> Callable[[RolloutCarry, jax.Array], tuple[RolloutCarry, TurnOutput]]:
    """The body of the scan over turns: `turn(carry, s) -> (carry after turn s, TurnOutput)`.

    `policy_keys [B]`: turn s samples with `fold_in(policy_keys[b], s)`. With
    `config.live_chunks` the policy plays only the episodes still alive (`live_map`), and
    ended episodes get PAD actions, a zero sampling mask and zero memory.
    """
    step = jax.vmap(env.step)
    play_rows = _policy_turn(env, policy, reader, config)
    params = nnx.state(policy)
    pad = policy.config.pad_id

    def turn(carry: RolloutCarry, s: jax.Array) -> tuple[RolloutCarry, TurnOutput]:
        obs, alive = carry.obs, carry.alive
        turn_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(policy_keys, s)
        rows = (_batch_major(carry.memory), obs, carry.env_state, turn_keys)
        if config.live_chunks:
            played = live_map(play_rows, config.live_chunks)((params, s), rows, alive)
            action = jnp.where(alive[:, None], played.action, pad)
        else:
            played = play_rows((params, s), rows)
            action = played.action
        state, ts = step(carry.env_state, action)
        last = ts.step_type == StepType.LAST
        live = played.live & alive[:, None]
        output = TurnOutput(
            obs_tokens=obs.tokens,
            progress=obs.progress,
            action_tokens=action,
            action_mask=live,
            logp=jnp.where(live, played.logp, 0.0),
            values=jnp.where(live, played.values, 0.0),
            turn_mask=alive,
            signals=turn_signals(env, ts, alive),
            success=turn_success(ts, alive),
            done=alive & terminated(ts),
            sampling_mask=played.sampling_mask,
        )
        memory = _batch_major(played.memory)
        return RolloutCarry(state, ts.observation, alive & ~last, memory), output

    return turn


class PlayedTurn(NamedTuple):
    """The policy's part of a turn for a batch of rows (`_policy_turn`)."""

    action: jax.Array  # [B, L] int32 (PAD after END).
    live: jax.Array  # [B, L] bool: generated tokens (END included).
    logp: jax.Array  # [B, L] float32 behaviour log-probs, 0 where not live.
    values: jax.Array  # [B, L] float32 values (shared head or critic).
    sampling_mask: jax.Array | None  # [B, L, V] bool allowed tokens (constrained), else None.
    memory: Memory  # the memory after the turn, batch-major (`_batch_major`).


def _policy_turn(
    env: Environment, policy: Policy, reader: ContextReader, config: RolloutConfig
) -> Callable[[tuple[nnx.State, jax.Array], tuple], PlayedTurn]:
    """`play((params, s), (memory, obs, env_state, keys)) -> PlayedTurn` of turn s.

    Rows are independent (a row's numbers do not depend on the rows beside it), so that
    `live_map` may run any subset of them; `memory` is batch-major (`_batch_major`).
    """
    allowed_fn = jax.vmap(env.allowed_tokens, in_axes=(0, 0, None))
    graphdef = nnx.graphdef(policy)
    vocab, pad = policy.config.vocab_size, policy.config.pad_id

    def play(shared, rows):
        params, s = shared
        memory, obs, env_state, keys = rows
        policy = nnx.merge(graphdef, params)
        actor, critic = policy.actor, policy.critic
        memory = _batch_major(memory)
        # Copy-gate support: tokens of the observations in the context of turn s, kept
        # incrementally so that the cost of a turn stays independent of the episode length.
        visible, memory = reader.visible(memory, observed_tokens(obs.tokens, vocab, pad))
        prefill = reader.prefill(actor, memory, 0, obs, s)
        sampled = _sample_turn(
            actor,
            TurnInputs(prefill, env_state, keys, visible),
            turn_len=env.turn_len,
            tokens=env.token_spec,
            config=config,
            allowed_fn=allowed_fn,
        )
        values, caches = sampled.values, (sampled.cache,)
        if critic is not None:
            values, critic_cache = reader.critic_values(
                critic, memory, obs, sampled.action, sampled.live, s
            )
            caches = caches + (critic_cache,)
        memory = reader.advance(_readers(policy), memory, caches, obs, sampled.action, sampled.live)
        return PlayedTurn(
            sampled.action,
            sampled.live,
            sampled.logp,
            values,
            sampled.sampling_mask,
            _batch_major(memory),
        )

    return play


def make_score(
    env: Environment, graphdef: nnx.GraphDef, config: RolloutConfig = RolloutConfig()
) -> Callable[[nnx.State, Trajectory], tuple[jax.Array, jax.Array, jax.Array]]:
    """Builds `score(params, traj) -> (logp, values, entropy)`, each [B, S, L] float32.

    Teacher-forced recomputation over the rollout's contexts: logp = log pi(a_t) and
    entropy = H(pi) with pi = softmax(logits / tau + mask) (`traj.sampling_mask` when
    present, else the PAD ban), values = V before each token. Zero where not
    `traj.loss_mask`. Differentiable in `params`.
    """

    def score(params: nnx.State, traj: Trajectory) -> tuple[jax.Array, jax.Array, jax.Array]:
        policy = _merge(graphdef, params)
        reader = _context_reader(env, policy, config)
        _check_trajectory(traj, _dims(env), policy.config.vocab_size)
        actor_hidden = reader.hidden_states(policy.actor, traj)
        if policy.critic is None:
            values = policy.actor.values(actor_hidden)
        else:
            values = policy.critic.values(reader.hidden_states(policy.critic, traj))
        visible = _visible(reader, policy, traj)
        scores = _token_scores(
            policy.actor, actor_hidden, values, visible, traj.action_tokens, traj.sampling_mask,
            config=config,
        )  # fmt: skip
        played = traj.loss_mask
        return TokenScores(*(jnp.where(played, x, 0.0) for x in scores))

    return score


class TokenScores(NamedTuple):
    """Teacher-forced scores of action tokens, each `[..., L]` float32."""

    logp: jax.Array  # log pi(a_t).
    values: jax.Array  # V before each token.
    entropy: jax.Array  # H(pi).


def make_score_sum(
    env: Environment,
    graphdef: nnx.GraphDef,
    config: RolloutConfig,
    token_sum: Callable[[TokenScores, Any], tuple[jax.Array, Any]],
) -> Callable[[nnx.State, Trajectory, Any], tuple[jax.Array, Any]]:
    """Builds `score_sum(params, traj, extras) -> (value [], stats)`: a loss over turns.

    `token_sum(scores, rows) -> (value [n], stats)` maps the `TokenScores [n, L]` of n
    turns (as `make_score` gives them, before its masking) and `rows`, the turns' slices
    of `extras` (a pytree of [B, S, ...] arrays), to a value and a pytree of `[n, ...]`
    stats per turn; `score_sum` sums both over played turns (`traj.turn_mask`), and only
    the value is differentiated (stats are diagnostics). `token_sum` must give zero for
    tokens outside `traj.loss_mask` (it reads the mask from `extras`).

    With a window and a shared value head the turns are scored, summed and
    differentiated in one pass over chunks of played turns (`live_row_sum`); otherwise
    `make_score`'s scores are summed.
    """
    score = make_score(env, graphdef, config)

    def score_sum(params: nnx.State, traj: Trajectory, extras: Any) -> tuple[jax.Array, Any]:
        policy = _merge(graphdef, params)
        reader = _context_reader(env, policy, config)
        _check_trajectory(traj, _dims(env), policy.config.vocab_size)
        batch, turns, turn_len = traj.action_tokens.shape
        live = traj.turn_mask.reshape(-1)

        def rows(x):
            return x.reshape(batch * turns, *x.shape[2:])

        if not isinstance(reader, WindowedContext) or policy.critic is not None:
            scores = jax.tree.map(rows, TokenScores(*score(params, traj)))
            value, stats = token_sum(scores, jax.tree.map(rows, extras))
            stats = jax.tree.map(
                lambda x: jnp.sum(jnp.where(live.reshape(-1, *[1] * (x.ndim - 1)), x, 0), 0),
                jax.lax.stop_gradient(stats),
            )
            return jnp.sum(jnp.where(live, value, 0.0)), stats
        hidden_rows, actor_graphdef, actor_params, summaries, inputs = reader.row_pass(
            policy.actor, traj
        )

        def row(params, summaries, aux):
            inputs, (visible, action_tokens, sampling_mask, extras) = aux
            actor = nnx.merge(actor_graphdef, params)
            hidden = hidden_rows(params, summaries, inputs)
            scores = _token_scores(
                actor,
                hidden,
                actor.values(hidden),
                visible,
                action_tokens,
                sampling_mask,
                config=config,
            )
            return token_sum(scores, extras)

        turn = (_visible(reader, policy, traj), traj.action_tokens, traj.sampling_mask, extras)
        aux = (inputs, jax.tree.map(rows, turn))
        return live_row_sum(row, _SCORE_CHUNKS)(actor_params, rows(summaries), aux, live)

    return score_sum


def _visible(reader: ContextReader, policy: Policy, traj: Trajectory) -> jax.Array:
    """[B, S, V] tokens visible to the copy gate in the context of each turn."""
    vocab, pad = policy.config.vocab_size, policy.config.pad_id
    return reader.visible_observations(observed_tokens(traj.obs_tokens, vocab, pad))


def _token_scores(
    actor: ContextLM,
    hidden: jax.Array,
    values: jax.Array,
    visible: jax.Array,
    action_tokens: jax.Array,
    sampling_mask: jax.Array | None,
    *,
    config: RolloutConfig,
) -> TokenScores:
    """Scores of `action_tokens [..., L]` read from the actor's `hidden [..., L, D]`.

    `visible [..., V]`: the copy gate's tokens of each turn; `sampling_mask [..., L, V]`
    (or None: the PAD ban) renormalises pi as when sampling. Not masked.
    """
    logits = actor.logits(hidden, visible[..., None, :])
    if sampling_mask is None:
        allowed = ban_pad(jnp.ones(logits.shape, bool), actor.config.pad_id)
    else:
        allowed = sampling_mask
    log_pi = policy_log_probs(logits, temperature=config.temperature, mask=allowed_to_mask(allowed))
    logp = jnp.take_along_axis(log_pi, action_tokens[..., None], axis=-1)[..., 0]
    return TokenScores(logp, values, entropy_from_log_probs(log_pi))


def turn_hidden_states(model: ContextLM, traj: Trajectory, *, window: int | None) -> jax.Array:
    """Final hidden states that predict each action token, all turns in parallel.

    Args:
      model: the actor or critic `ContextLM`.
      traj: obs_tokens [B, S, O], progress [B, S, K], action_tokens / action_mask [B, S, L].
      window: W turns kept verbatim, None for full context.
    Returns:
      [B, S, L, D]: entry i of turn s is the state before token i (its logits / value);
      zeros in turns not played (windowed mode).
    """
    _, turns, obs_len = traj.obs_tokens.shape
    dims = Dims(
        turns, obs_len, traj.progress.shape[-1], traj.action_tokens.shape[-1], model.config.pad_id
    )
    return context_reader(dims, window, model.encoder.num_slots).hidden_states(model, traj)


def context_reader(dims: Dims, window: int | None, num_slots: int) -> ContextReader:
    """The `ContextReader` of a context mode: `FullContext` if `window` is None."""
    if window is None:
        return FullContext(dims)
    return WindowedContext(dims, window, num_slots)


@dataclasses.dataclass(frozen=True)
class WindowedContext:
    """`[summary (M) | block(s-W) .. block(s-1) | obs_s | markers_s]`, a fresh cache a turn."""

    dims: Dims
    window: int  # W
    num_slots: int  # M

    @property
    def context(self) -> int:
        """C: slots before the first action token."""
        d = self.dims
        return self.num_slots + self.window * d.block + d.obs_len + d.num_markers

    def init(self, readers: Sequence[ContextLM], batch: int, vocab: int) -> WindowMemory:
        d = self.dims
        one = empty_window(self.window, d.obs_len, d.num_markers, d.turn_len)
        window = jax.tree.map(lambda x: jnp.broadcast_to(x, (batch, *x.shape)), one)
        summaries = []
        for model in readers:
            h0 = model.encoder.initial_summary()
            summaries.append(jnp.broadcast_to(h0, (batch, *h0.shape)))
        return WindowMemory(window, tuple(summaries))

    def visible(self, memory: WindowMemory, current: jax.Array) -> tuple[jax.Array, WindowMemory]:
        """Tokens of the current observation and of those in the window: `[B, V]`."""
        window = memory.window
        # `_context_reader` checked that the policy's PAD is the env's.
        in_window = observed_tokens(window.obs, current.shape[-1], self.dims.pad)
        in_window = in_window * window.valid[..., None]
        return jnp.maximum(current, in_window.max(axis=1, initial=0.0)), memory

    def prefill(
        self, model: ContextLM, memory: WindowMemory, reader: int, obs: Any, turn: jax.Array
    ) -> Prefill:
        x, valid = self._context(model, memory, reader, obs)
        cache = init_cache(model.config, obs.tokens.shape[0], self.context + self.dims.turn_len)
        hidden, cache = model.lm(x, valid, cache, 0, read=np.array([x.shape[1] - 1]))
        return Prefill(hidden[:, -1], cache, jnp.int32(self.context))

    def critic_values(self, critic, memory, obs, action, live, turn):
        """V before each token of the sampled turn: context + turn in one pass, no cache."""
        x_ctx, v_ctx = self._context(critic, memory, -1, obs)
        x_act = critic.encoder.action(critic.embed, action)
        x = jnp.concatenate([x_ctx, x_act.astype(x_ctx.dtype)], axis=1)
        hidden, cache = critic.lm(x, jnp.concatenate([v_ctx, live], axis=1))
        first = self.context - 1
        return critic.values(hidden[:, first : first + self.dims.turn_len]), cache

    def advance(self, readers, memory, caches, obs, action, live) -> WindowMemory:
        """Each reader's summary absorbs the turn leaving the window; the turn enters it."""
        summaries = tuple(
            _absorb_leaving(
                model, summary, memory.window, obs, action, live, window_size=self.window
            )
            for model, summary in zip(readers, memory.summaries, strict=True)
        )
        window = jax.vmap(push_window)(memory.window, obs.tokens, obs.progress, action, live)
        return WindowMemory(window, summaries)

    def hidden_states(self, model: ContextLM, traj: Trajectory) -> jax.Array:
        """The `[B * S, C + L]` contexts as rows of one causal pass, played turns only.

        Summaries come from a scan over turns (`summary_sequence`); each (episode, turn)
        row is built and run only when the turn was played (`live_rows`), and the last
        block runs only at the L slots that predict the action tokens. Rows of turns not
        played are zeros (`make_score` masks them).
        """
        batch, turns, turn_len = traj.action_tokens.shape
        hidden_rows, _, params, summaries, inputs = self.row_pass(model, traj)
        hidden = live_rows(hidden_rows, _SCORE_CHUNKS)(
            params, summaries.reshape(batch * turns, -1), inputs, traj.turn_mask.reshape(-1)
        )
        return hidden.reshape(batch, turns, turn_len, -1)

    def row_pass(self, model: ContextLM, traj: Trajectory):
        """The scoring pass of `hidden_states` as rows, one per (episode, turn).

        Returns `(hidden_rows, graphdef, params, summaries, inputs)`: `hidden_rows(params,
        summaries [n, H], inputs) -> [n, L, D]` runs n turns' contexts (rows independent),
        `nnx.merge(graphdef, params)` is `model`, `summaries [B, S, H]` (differentiable in
        the params) and `inputs` (a pytree of `[B * S, ...]` token arrays) are its inputs.
        """
        obs, progress, action = traj.obs_tokens, traj.progress, traj.action_tokens
        action_mask = traj.loss_mask
        batch, turns, turn_len = action.shape
        enc, embed, window = model.encoder, model.embed, self.window

        def episode(obs, progress, action, action_mask):
            summaries = summary_sequence(
                enc, embed, obs, progress, action, action_mask, window=window
            )
            windows = jax.vmap(
                lambda s: gather_window(obs, progress, action, action_mask, s, window)
            )(jnp.arange(turns))
            return summaries[:turns], windows

        summaries, windows = jax.vmap(episode)(obs, progress, action, action_mask)  # [B, S, ..]
        graphdef, params = nnx.split(model)

        def hidden_rows(params, summary, inputs):
            model = nnx.merge(graphdef, params)
            enc, embed = model.encoder, model.embed

            def one_turn(summary, win, obs, progress, action, action_mask):
                x, valid = window_context(enc, embed, summary, win, obs, progress)
                x = jnp.concatenate([x, enc.action(embed, action).astype(x.dtype)], axis=0)
                return x, jnp.concatenate([valid, action_mask], axis=0)

            x, valid = jax.vmap(one_turn)(summary, *inputs)
            context = x.shape[1] - turn_len
            read = np.arange(context - 1, context - 1 + turn_len)  # slots predicting action_s
            return model.lm(x, valid, read=read)[0]

        def rows(x):
            return x.reshape(batch * turns, *x.shape[2:])

        inputs = jax.tree.map(rows, (windows, obs, progress, action, action_mask))
        return hidden_rows, graphdef, params, summaries, inputs

    def visible_observations(self, observed: jax.Array) -> jax.Array:
        return visible_observations(observed, self.window)

    def _context(self, model, memory, reader, obs):
        """`window_context` of the batch: ([B, C, D], valid [B, C])."""
        return jax.vmap(functools.partial(window_context, model.encoder, model.embed))(
            memory.summaries[reader], memory.window, obs.tokens, obs.progress
        )


@dataclasses.dataclass(frozen=True)
class FullContext:
    """`[block(0) .. block(s-1) | obs_s | markers_s]`: one KV cache per episode across turns."""

    dims: Dims

    @property
    def cache_len(self) -> int:
        """Slots of the transcript, plus the observation after the last turn."""
        d = self.dims
        return d.turns * d.block + d.obs_len + d.num_markers

    def init(self, readers: Sequence[ContextLM], batch: int, vocab: int) -> TranscriptMemory:
        caches = tuple(init_cache(model.config, batch, self.cache_len) for model in readers)
        return TranscriptMemory(caches, jnp.zeros((batch, vocab), jnp.float32))

    def visible(
        self, memory: TranscriptMemory, current: jax.Array
    ) -> tuple[jax.Array, TranscriptMemory]:
        """Tokens of every observation read so far, a running max: `[B, V]`."""
        seen = jnp.maximum(memory.seen, current)
        return seen, memory._replace(seen=seen)

    def prefill(
        self, model: ContextLM, memory: TranscriptMemory, reader: int, obs: Any, turn: jax.Array
    ) -> Prefill:
        d = self.dims
        x, valid = self._observation(model, obs)
        write = turn * d.block
        hidden, cache = model.lm(
            x, valid, memory.caches[reader], write, read=np.array([x.shape[1] - 1])
        )
        return Prefill(hidden[:, -1], cache, write + d.obs_len + d.num_markers)

    def critic_values(self, critic, memory, obs, action, live, turn):
        """V before each token of the sampled turn: observation + turn as one cached chunk."""
        d = self.dims
        x_obs, v_obs = self._observation(critic, obs)
        x_act = critic.encoder.action(critic.embed, action)
        x = jnp.concatenate([x_obs, x_act.astype(x_obs.dtype)], axis=1)
        hidden, cache = critic.lm(
            x, jnp.concatenate([v_obs, live], axis=1), memory.caches[-1], turn * d.block
        )
        first = d.obs_len + d.num_markers - 1
        return critic.values(hidden[:, first : first + d.turn_len]), cache

    def advance(self, readers, memory, caches, obs, action, live) -> TranscriptMemory:
        """The caches now hold the turn (written while sampling / scoring it)."""
        return memory._replace(caches=tuple(caches))

    def hidden_states(self, model: ContextLM, traj: Trajectory) -> jax.Array:
        """One causal pass over each episode's transcript `[B, S (O + K + L)]`.

        The last block runs only at the slots that predict action tokens.
        """
        obs, progress, action = traj.obs_tokens, traj.progress, traj.action_tokens
        batch, turns, turn_len = action.shape
        x, valid = jax.vmap(functools.partial(full_context, model.encoder, model.embed))(
            obs, progress, action, traj.loss_mask
        )
        block = obs.shape[-1] + progress.shape[-1] + turn_len
        first = obs.shape[-1] + progress.shape[-1] - 1  # slot predicting token 0 of turn 0
        index = np.arange(turns)[:, None] * block + first + np.arange(turn_len)[None, :]
        # The last block runs only at the read slots (keys / values still for all).
        hidden, _ = model.lm(x, valid, read=index.reshape(-1))
        return hidden.reshape(batch, turns, turn_len, -1)

    def visible_observations(self, observed: jax.Array) -> jax.Array:
        return visible_observations(observed, None)

    def _observation(self, model, obs):
        """The observation and markers of the batch: ([B, O + K, D], valid [B, O + K])."""
        return jax.vmap(functools.partial(model.encoder.observation, model.embed))(
            obs.tokens, obs.progress
        )


# Helpers -----------------------------------------------------------------------------------


def _play(
    env: Environment,
    policy: Policy,
    reader: ContextReader,
    config: RolloutConfig,
    carry: RolloutCarry,
    start_turn: jax.Array | int,
    *,
    policy_keys: jax.Array,
    num_turns: int,
    with_carries: bool,
) -> tuple[Trajectory, RolloutCarry | None]:
    """Scans `make_turn` over turns `start_turn + [0, num_turns)`; bootstraps after the last."""
    batch = carry.alive.shape[0]
    if policy_keys.shape[0] != batch:
        raise ValueError(f"policy_keys has {policy_keys.shape[0]} rows, the episodes {batch}")
    turn = make_turn(env, policy, reader, config, policy_keys)

    def body(carry, s):
        new_carry, output = turn(carry, s)
        return new_carry, (output, carry if with_carries else None)

    turns = start_turn + jnp.arange(num_turns, dtype=jnp.int32)
    final, (out, carries) = jax.lax.scan(body, carry, turns)
    out = jax.tree.map(lambda v: jnp.swapaxes(v, 0, 1), out)
    truncated = out.turn_mask[:, -1] & ~out.done[:, -1]
    graphdef, params = nnx.split(policy)

    def bootstrap_values(shared, rows):
        """V after the last turn (rows independent): [B]."""
        params, turn = shared
        value_model = nnx.merge(graphdef, params).value_model
        memory, obs = rows
        prefill = reader.prefill(value_model, _batch_major(memory), -1, obs, turn)
        return value_model.values(prefill.hidden)

    shared = (params, jnp.asarray(start_turn + num_turns, jnp.int32))
    rows = (_batch_major(final.memory), final.obs)
    if config.live_chunks:  # only the truncated episodes read their state's value
        bootstrap = live_map(bootstrap_values, config.live_chunks)(shared, rows, truncated)
    else:
        bootstrap = jnp.where(truncated, bootstrap_values(shared, rows), 0.0)
    return Trajectory(bootstrap_value=bootstrap, **out._asdict()), carries


def _sample_turn(
    actor: ContextLM,
    inputs: TurnInputs,
    *,
    turn_len: int,
    tokens: TokenSpec,
    config: RolloutConfig,
    allowed_fn: Callable[[Any, jax.Array, jax.Array], jax.Array],
) -> SampledTurn:
    """Samples the L tokens of a turn, feeding each into the cache, until all rows ended."""
    hidden, cache, start = inputs.prefill
    batch = hidden.shape[0]
    vocab = actor.config.vocab_size
    sample = functools.partial(
        sample_with_noise,
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
    )
    shared_values = actor.value_head is not None
    # The Gumbel noise of the whole turn in one call: no PRNG work inside the token loop.
    noise = jax.vmap(lambda k: jax.random.gumbel(k, (turn_len, vocab), jnp.float32))(inputs.keys)

    def allowed_at(prefix, i):
        if config.constrained:
            return ban_pad(allowed_fn(inputs.env_state, prefix, i), tokens.pad)
        return ban_pad(jnp.ones((batch, vocab), bool), tokens.pad)

    def token(carry):
        i, hidden, cache, prefix, done, out = carry
        logits = actor.logits(hidden, inputs.visible)
        allowed = allowed_at(prefix, i)
        token_noise = jax.lax.dynamic_index_in_dim(noise, i, 1, keepdims=False)
        tok, logp = sample(token_noise, logits, mask=allowed_to_mask(allowed))
        live = ~done
        tok = jnp.where(live, tok, tokens.pad)
        value = actor.values(hidden) if shared_values else jnp.zeros((batch,), jnp.float32)
        x = actor.encoder.action(actor.embed, tok[:, None])
        hidden, cache = actor.lm(x, live[:, None], cache, start + i)
        prefix = prefix.at[:, i].set(tok)
        done = done | (tok == tokens.end)
        new = (tok, live, jnp.where(live, logp, 0.0), jnp.where(live, value, 0.0))
        new = new + (allowed if config.constrained else None,)
        out = jax.tree.map(lambda buffer, x: buffer.at[:, i].set(x), out, new)
        return i + 1, hidden[:, 0], cache, prefix, done, out

    # The token loop stops once every row has ended its turn (under the grammar, by the
    # longest command): later tokens are PAD, not live, with logp and value 0.
    out = (
        jnp.full((batch, turn_len), tokens.pad, jnp.int32),
        jnp.zeros((batch, turn_len), bool),
        jnp.zeros((batch, turn_len), jnp.float32),
        jnp.zeros((batch, turn_len), jnp.float32),
        jnp.zeros((batch, turn_len, vocab), bool) if config.constrained else None,
    )
    init = (jnp.int32(0), hidden, cache, jnp.full((batch, turn_len), tokens.pad, jnp.int32))
    init = init + (jnp.zeros((batch,), bool), out)
    ended, _, cache, prefix, _, out = jax.lax.while_loop(
        lambda c: (c[0] < turn_len) & ~jnp.all(c[4]), token, init
    )
    action, live, logp, values, allowed = out
    if not config.constrained:
        return SampledTurn(action, live, logp, values, allowed, cache)

    # The sampling masks of the positions not played, as the loop would have read them.
    def rest(carry):
        i, allowed = carry
        return i + 1, allowed.at[:, i].set(allowed_at(prefix, i))

    _, allowed = jax.lax.while_loop(lambda c: c[0] < turn_len, rest, (ended, allowed))
    return SampledTurn(action, live, logp, values, allowed, cache)


def _batch_major(memory: Memory) -> Memory:
    """Swaps the layer and batch axes of KV caches (their own involution): every leaf of a
    batch-major memory is `[B, ...]`, as `live_map` wants its rows."""
    if not isinstance(memory, TranscriptMemory):
        return memory
    swap = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731
    caches = tuple(cache._replace(k=swap(cache.k), v=swap(cache.v)) for cache in memory.caches)
    return memory._replace(caches=caches)


def _check_env(env: Environment, config: RolloutConfig) -> None:
    check_environment(env)
    # An environment whose rules act through allowed_tokens (ToolWorld's guardrail 'mask').
    if getattr(env, "requires_constrained", False) and not config.constrained:
        raise ValueError(
            f"{type(env).__name__}'s rules act through allowed_tokens (e.g. a guardrail in "
            "'mask' mode): it needs RolloutConfig.constrained=True"
        )


def _readers(policy: Policy) -> tuple[ContextLM, ...]:
    """The networks that read the context: (actor,) or (actor, critic)."""
    return (policy.actor,) if policy.critic is None else (policy.actor, policy.critic)


def _merge(graphdef: nnx.GraphDef, params: nnx.State) -> Policy:
    policy = nnx.merge(graphdef, params)
    if not isinstance(policy, Policy):
        raise ValueError(f"graphdef must describe a Policy, got {type(policy).__name__}")
    return policy


def _dims(env: Environment) -> Dims:
    return Dims(
        turns=env.max_turns,
        obs_len=env.obs_len,
        num_markers=env.num_markers,
        turn_len=env.turn_len,
        pad=env.token_spec.pad,
    )


def _context_reader(env: Environment, policy: Policy, config: RolloutConfig) -> ContextReader:
    """The reader of `config.window`'s mode, after checking the policy fits the env."""
    pcfg = policy.config
    spec = env.token_spec
    if pcfg.vocab_size != spec.vocab_size:
        raise ValueError(
            f"PolicyConfig.vocab_size={pcfg.vocab_size} differs from the env's "
            f"token_spec.vocab_size={spec.vocab_size}"
        )
    if pcfg.pad_id != spec.pad:
        raise ValueError(
            f"PolicyConfig.pad_id={pcfg.pad_id} differs from the env's token_spec.pad={spec.pad}"
        )
    if env.num_markers > pcfg.max_markers:
        raise ValueError(
            f"env has {env.num_markers} progress markers, PolicyConfig.max_markers is "
            f"{pcfg.max_markers}"
        )
    return context_reader(_dims(env), config.window, pcfg.num_summary_slots)


def _check_trajectory(traj: Trajectory, dims: Dims, vocab: int) -> None:
    batch = traj.turn_mask.shape[0]
    s, o, k, n = dims.turns, dims.obs_len, dims.num_markers, dims.turn_len
    chex.assert_shape(traj.obs_tokens, (batch, s, o))
    chex.assert_shape(traj.progress, (batch, s, k))
    chex.assert_shape([traj.action_tokens, traj.action_mask], (batch, s, n))
    chex.assert_shape(traj.turn_mask, (batch, s))
    chex.assert_type([traj.obs_tokens, traj.action_tokens], int)
    chex.assert_type([traj.action_mask, traj.turn_mask], bool)
    if traj.sampling_mask is not None:
        chex.assert_shape(traj.sampling_mask, (batch, s, n, vocab))


def ban_pad(allowed: jax.Array, pad: int) -> jax.Array:
    """Removes `pad` from `allowed [..., V]` unless it is the only allowed token."""
    no_pad = allowed & (jnp.arange(allowed.shape[-1]) != pad)
    return jnp.where(no_pad.any(axis=-1, keepdims=True), no_pad, allowed)


def _absorb_leaving(model, summary, window, obs, action, live, *, window_size):
    """Summary for the next turn: absorb the turn that leaves the window (if any)."""
    enc, embed = model.encoder, model.embed
    if not enc.num_slots:
        return summary
    if window_size == 0:  # the current turn leaves at once
        leaving = (obs.tokens, obs.progress, action, live)
        present = jnp.ones(live.shape[:1], bool)
    else:
        leaving = (window.obs[:, 0], window.progress[:, 0], window.action[:, 0])
        leaving = leaving + (window.action_mask[:, 0],)
        present = window.valid[:, 0]

    def absorb(h, o, p, a, m):
        x, valid = enc.block(embed, o, p, a, m)
        return enc.absorb(h, x, valid)

    updated = jax.vmap(absorb)(summary, *leaving)
    return jnp.where(present[:, None], updated, summary)
