"""Jitted multi-turn rollout of a token-level policy in ToolWorld, and teacher-forced scoring.

`rollout = make_rollout(env, graphdef, config)` returns a pure function
`rollout(params, env_keys, policy_keys) -> Trajectory` that plays B episodes of exactly
S = env.max_turns turns: a `lax.scan` over turns whose body builds the policy's context
(`rlagent.models.state_encoder`), samples the L tokens of the turn with a KV cache (one
prefill, then one cached pass per token), and steps the environment. Turns after an episode
ended are played against the absorbing terminal state and masked out (`turn_mask`).

`score = make_score(env, graphdef, config)` recomputes, teacher-forced, the log-probs,
values and entropies of a trajectory's tokens from the *same* contexts, all turns in
parallel (one `[B * S, C + L]` forward pass over the played turns in windowed mode, one
`[B, S (O + K + L)]` pass in full-context mode); only the summary recurrence is a scan over
turns. Gradients flow
through everything, the summary included.

Context of turn s (see `rlagent.models.state_encoder`), slot by slot:
  windowed (W = config.window):  [summary (M) | block(s-W) .. block(s-1) | obs_s | markers_s]
  full (config.window = None):   [block(0) .. block(s-1) | obs_s | markers_s]
followed by the L action tokens, with block(t) = [obs_t (O) | markers_t (K) | action_t (L)].
In full mode the rollout keeps one KV cache per episode across turns (the transcript is
append-only), so a turn attends over S (O + K + L) slots; in windowed mode a turn runs on a
fresh cache of C + L slots, C = M + W (O + K + L) + O + K, independent of the episode length.

Sampling conventions (`rlagent.models.sampler`): log-probs are those of
pi = softmax(logits / temperature + mask); `mask` always bans PAD (the policy never writes
padding; with a constrained mask PAD stays allowed only if nothing else is), and with
`constrained=True` it is the env's grammar (and rule) mask, stored in
`Trajectory.token_mask` so that `score` renormalises over the same set. Values:
`values[b, s, i]` is V of the state before token i of turn s (read where the logits of
token i are read); `bootstrap_value` is V of the state after the last turn when the
episode was truncated (max_turns reached without termination), else 0.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlagent.envs import StepType
from rlagent.envs import dsl
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
_SCORE_CHUNKS = 8


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How the policy reads its history and samples (hashable, static under jit)."""

    window: int | None = 4  # W turns kept verbatim; None = full context (all turns).
    temperature: float = 1.0  # tau of pi = softmax(logits / tau + mask); 0 = greedy.
    top_k: int = 0  # sample among the k most likely tokens (0 = off; not part of pi).
    top_p: float = 1.0  # nucleus sampling mass (1 = off; not part of pi).
    constrained: bool = False  # apply env.allowed_tokens (DSL grammar) while sampling.
    rules: bool = False  # also the guardrail rules in that mask (needs constrained).

    def __post_init__(self):
        if self.window is not None and self.window < 0:
            raise ValueError(f"RolloutConfig.window must be >= 0 or None, got {self.window}")
        if self.temperature < 0:
            raise ValueError(f"RolloutConfig.temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"RolloutConfig.top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"RolloutConfig.top_p must be in (0, 1], got {self.top_p}")
        if self.rules and not self.constrained:
            raise ValueError("RolloutConfig.rules=True needs constrained=True (it is a mask)")


class Dims(NamedTuple):
    """Static sizes of one rollout."""

    turns: int  # S
    obs_len: int  # O
    num_markers: int  # K
    turn_len: int  # L
    window: int | None  # W (None: full context)
    num_slots: int  # M

    @property
    def block(self) -> int:
        """O + K + L: slots of one turn in the transcript."""
        return self.obs_len + self.num_markers + self.turn_len

    @property
    def context(self) -> int:
        """C: slots before the first action token (windowed mode)."""
        return self.num_slots + self.window * self.block + self.obs_len + self.num_markers

    @property
    def full_cache(self) -> int:
        """Slots of the full-context transcript, plus the observation after the last turn."""
        return self.turns * self.block + self.obs_len + self.num_markers


def make_rollout(
    env: Any, graphdef: nnx.GraphDef, config: RolloutConfig = RolloutConfig()
) -> Callable[[nnx.State, jax.Array, jax.Array], Trajectory]:
    """Builds `rollout(params, env_keys, policy_keys) -> Trajectory` (pure, jit/vmap-safe).

    Args:
      env: a ToolWorld (reset / step / allowed_tokens, max_turns, obs_len, turn_len,
        num_markers).
      graphdef: from `nnx.split(Policy(...))`.
      config: RolloutConfig.
    Returns:
      rollout(params, env_keys [B] keys or [B, 2] uint32, policy_keys [B]) -> Trajectory
      with [B, S, ...] fields, S = env.max_turns. Episodes sharing an env key share a task;
      the result is a deterministic function of (params, keys).
    """
    reset = jax.vmap(env.reset)
    step = jax.vmap(env.step)
    allowed_fn = jax.vmap(
        functools.partial(env.allowed_tokens, rules=config.rules), in_axes=(0, 0, None)
    )

    def rollout(params: nnx.State, env_keys: jax.Array, policy_keys: jax.Array) -> Trajectory:
        policy = _merge(graphdef, params)
        dims = _dims(env, policy, config)
        batch = env_keys.shape[0]
        if policy_keys.shape[0] != batch:
            raise ValueError(f"policy_keys has {policy_keys.shape[0]} rows, env_keys has {batch}")
        actor, critic = policy.actor, policy.critic
        readers = (actor,) if critic is None else (actor, critic)
        state, ts = reset(env_keys)
        memory = tuple(_init_memory(m, dims, batch) for m in readers)
        window = _batched_empty_window(dims, batch)
        alive = jnp.ones((batch,), bool)
        obs = ts.observation
        # Tokens of the observations visible so far (full mode: all of them, a running max).
        seen = jnp.zeros((batch, policy.config.vocab_size), jnp.float32)
        vocab, pad = policy.config.vocab_size, policy.config.pad_id

        def turn(carry, s):
            state, obs, alive, window, memory, seen = carry
            # Copy-gate support: tokens of the observations in the context of turn s, i.e.
            # `visible_observations` computed from the window (or a running max in full
            # mode) so that the cost of a turn stays independent of the episode length.
            current = observed_tokens(obs.tokens, vocab, pad)
            if dims.window is None:
                seen = jnp.maximum(seen, current)
                visible = seen
            else:
                in_window = observed_tokens(window.obs, vocab, pad) * window.valid[..., None]
                visible = jnp.maximum(current, in_window.max(axis=1, initial=0.0))
            turn_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(policy_keys, s)
            hidden, cache, start = _prefill(actor, memory[0], window, obs, s, dims)
            sampled = _sample_turn(
                actor,
                hidden,
                cache,
                start,
                state,
                turn_keys,
                dims,
                config,
                allowed_fn,
                visible,
            )
            action, live, logp, values, allowed, cache = sampled
            new_memory = [_Memory(memory[0].summary, cache)]
            if critic is not None:
                values, critic_cache = _critic_values(
                    critic, memory[1], window, obs, action, live, s, dims
                )
                new_memory.append(_Memory(memory[1].summary, critic_cache))
            state, ts = step(state, action)
            extras = ts.extras
            last = ts.step_type == StepType.LAST
            outputs = dict(
                obs_tokens=obs.tokens,
                progress=obs.progress,
                action_tokens=action,
                action_mask=live & alive[:, None],
                logp=jnp.where(live & alive[:, None], logp, 0.0),
                values=jnp.where(live & alive[:, None], values, 0.0),
                turn_mask=alive,
                outcome=jnp.where(alive, extras["outcome"].astype(jnp.float32), 0.0),
                verdict=jnp.where(alive, extras["verdict"].astype(jnp.float32), 0.0),
                efficiency=jnp.where(alive, extras["efficiency"].astype(jnp.float32), 0.0),
                violations=jnp.where(alive, extras["violations"].astype(jnp.int32), 0),
                done=alive & last & (ts.discount == 0),
            )
            if config.constrained:
                outputs["token_mask"] = allowed
            if dims.window is not None:
                new_memory = [
                    _Memory(_absorb_leaving(m, mem.summary, window, obs, action, live, dims), None)
                    for m, mem in zip(readers, new_memory, strict=True)
                ]
                window = jax.vmap(push_window)(window, obs.tokens, obs.progress, action, live)
            carry = (state, ts.observation, alive & ~last, window, tuple(new_memory), seen)
            return carry, outputs

        carry, out = jax.lax.scan(
            turn,
            (state, obs, alive, window, memory, seen),
            jnp.arange(dims.turns, dtype=jnp.int32),
        )
        _, final_obs, _, final_window, final_memory, _ = carry
        out = {k: jnp.swapaxes(v, 0, 1) for k, v in out.items()}
        value_model = policy.value_model
        hidden, _, _ = _prefill(
            value_model, final_memory[-1], final_window, final_obs, dims.turns, dims
        )
        truncated = out["turn_mask"][:, -1] & ~out["done"][:, -1]
        bootstrap = jnp.where(truncated, value_model.values(hidden), 0.0)
        return Trajectory(bootstrap_value=bootstrap, **out)

    return rollout


def make_score(
    env: Any, graphdef: nnx.GraphDef, config: RolloutConfig = RolloutConfig()
) -> Callable[[nnx.State, Trajectory], tuple[jax.Array, jax.Array, jax.Array]]:
    """Builds `score(params, traj) -> (logp, values, entropy)`, each [B, S, L] float32.

    Teacher-forced recomputation over the rollout's contexts: logp = log pi(a_t) and
    entropy = H(pi) with pi = softmax(logits / tau + mask) (`traj.token_mask` when present,
    else the PAD ban), values = V before each token. Zero where not
    `traj.action_mask & traj.turn_mask`. Differentiable in `params`.
    """

    def score(params: nnx.State, traj: Trajectory) -> tuple[jax.Array, jax.Array, jax.Array]:
        policy = _merge(graphdef, params)
        dims = _dims(env, policy, config)
        _check_trajectory(traj, dims, policy.config.vocab_size)
        actor_hidden = turn_hidden_states(policy.actor, traj, window=config.window)
        observed = observed_tokens(traj.obs_tokens, policy.config.vocab_size, policy.config.pad_id)
        visible = visible_observations(observed, config.window)
        logits = policy.actor.logits(actor_hidden, visible[:, :, None, :])
        if policy.critic is None:
            values = policy.actor.values(actor_hidden)
        else:
            values = policy.critic.values(
                turn_hidden_states(policy.critic, traj, window=config.window)
            )
        if traj.token_mask is None:
            allowed = _ban_pad(jnp.ones(logits.shape, bool))
        else:
            allowed = traj.token_mask
        log_pi = policy_log_probs(
            logits, temperature=config.temperature, mask=allowed_to_mask(allowed)
        )
        logp = jnp.take_along_axis(log_pi, traj.action_tokens[..., None], axis=-1)[..., 0]
        entropy = entropy_from_log_probs(log_pi)
        played = traj.action_mask & traj.turn_mask[..., None]
        return (
            jnp.where(played, logp, 0.0),
            jnp.where(played, values, 0.0),
            jnp.where(played, entropy, 0.0),
        )

    return score


def turn_hidden_states(model: ContextLM, traj: Trajectory, *, window: int | None) -> jax.Array:
    """Final hidden states that predict each action token, all turns in parallel.

    Windowed: contexts of every (episode, turn) are rows of one `[B * S, C + L]` causal
    pass, computed only for played turns (`live_rows`); the summaries come from a scan
    over turns (`summary_sequence`). Full: one causal pass over each episode's transcript
    `[B, S (O + K + L)]`. Either way the last block runs only at the read positions.

    Args:
      model: the actor or critic `ContextLM`.
      traj: obs_tokens [B, S, O], progress [B, S, K], action_tokens / action_mask [B, S, L].
    Returns:
      [B, S, L, D]: entry i of turn s is the state before token i (its logits / value);
      zeros in turns not played (windowed mode).
    """
    obs, progress = traj.obs_tokens, traj.progress
    action = traj.action_tokens
    action_mask = traj.action_mask & traj.turn_mask[..., None]
    batch, turns, turn_len = action.shape
    num_markers = progress.shape[-1]
    enc, embed = model.encoder, model.embed
    if window is None:
        x, valid = jax.vmap(functools.partial(full_context, enc, embed))(
            obs, progress, action, action_mask
        )
        block = obs.shape[-1] + num_markers + turn_len
        first = obs.shape[-1] + num_markers - 1  # slot predicting token 0 of turn 0
        index = np.arange(turns)[:, None] * block + first + np.arange(turn_len)[None, :]
        hidden, _ = model.lm(x, valid, read=index.reshape(-1))
        return hidden.reshape(batch, turns, turn_len, -1)

    def episode(obs, progress, action, action_mask):
        summaries = summary_sequence(enc, embed, obs, progress, action, action_mask, window)
        windows = jax.vmap(lambda s: gather_window(obs, progress, action, action_mask, s, window))(
            jnp.arange(turns)
        )
        return summaries[:turns], windows

    summaries, windows = jax.vmap(episode)(obs, progress, action, action_mask)  # [B, S, ...]
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
        read = np.arange(context - 1, context - 1 + turn_len)  # the slots predicting action_s
        return model.lm(x, valid, read=read)[0]

    def rows(x):
        return x.reshape(batch * turns, *x.shape[2:])

    inputs = jax.tree.map(rows, (windows, obs, progress, action, action_mask))
    # Each (episode, turn) is one row; rows of turns that were not played are skipped.
    hidden = live_rows(hidden_rows, _SCORE_CHUNKS)(
        params, rows(summaries), inputs, traj.turn_mask.reshape(-1)
    )
    return hidden.reshape(batch, turns, turn_len, -1)


# Helpers -----------------------------------------------------------------------------------


class _Memory(NamedTuple):
    """What one reader (actor or critic) carries between turns."""

    summary: jax.Array | None  # [B, summary_dim] H_{max(0, s-W)} (windowed mode).
    cache: KVCache | None  # the episode's transcript cache (full mode).


def _merge(graphdef: nnx.GraphDef, params: nnx.State) -> Policy:
    policy = nnx.merge(graphdef, params)
    if not isinstance(policy, Policy):
        raise ValueError(f"graphdef must describe a Policy, got {type(policy).__name__}")
    return policy


def _dims(env: Any, policy: Policy, config: RolloutConfig) -> Dims:
    pcfg = policy.config
    if pcfg.vocab_size != dsl.VOCAB_SIZE:
        raise ValueError(
            f"PolicyConfig.vocab_size={pcfg.vocab_size} differs from the env's "
            f"dsl.VOCAB_SIZE={dsl.VOCAB_SIZE}"
        )
    if pcfg.pad_id != dsl.PAD:
        raise ValueError(f"PolicyConfig.pad_id={pcfg.pad_id} differs from dsl.PAD={dsl.PAD}")
    if env.num_markers > pcfg.max_markers:
        raise ValueError(
            f"env has {env.num_markers} progress markers, PolicyConfig.max_markers is "
            f"{pcfg.max_markers}"
        )
    return Dims(
        turns=env.max_turns,
        obs_len=env.obs_len,
        num_markers=env.num_markers,
        turn_len=env.turn_len,
        window=config.window,
        num_slots=pcfg.num_summary_slots if config.window is not None else 0,
    )


def _check_trajectory(traj: Trajectory, dims: Dims, vocab: int) -> None:
    batch = traj.turn_mask.shape[0]
    s, o, k, n = dims.turns, dims.obs_len, dims.num_markers, dims.turn_len
    chex.assert_shape(traj.obs_tokens, (batch, s, o))
    chex.assert_shape(traj.progress, (batch, s, k))
    chex.assert_shape([traj.action_tokens, traj.action_mask], (batch, s, n))
    chex.assert_shape(traj.turn_mask, (batch, s))
    chex.assert_type([traj.obs_tokens, traj.action_tokens], int)
    chex.assert_type([traj.action_mask, traj.turn_mask], bool)
    if traj.token_mask is not None:
        chex.assert_shape(traj.token_mask, (batch, s, n, vocab))


def _ban_pad(allowed: jax.Array) -> jax.Array:
    """Removes PAD from `allowed [..., V]` unless PAD is the only allowed token."""
    no_pad = allowed & (jnp.arange(allowed.shape[-1]) != dsl.PAD)
    return jnp.where(no_pad.any(axis=-1, keepdims=True), no_pad, allowed)


def _batched_empty_window(dims: Dims, batch: int) -> Window | None:
    if dims.window is None:
        return None
    one = empty_window(dims.window, dims.obs_len, dims.num_markers, dims.turn_len)
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (batch, *x.shape)), one)


def _init_memory(model: ContextLM, dims: Dims, batch: int) -> _Memory:
    if dims.window is None:
        return _Memory(None, init_cache(model.config, batch, dims.full_cache))
    h0 = model.encoder.initial_summary()
    return _Memory(jnp.broadcast_to(h0, (batch, *h0.shape)), None)


def _prefill(
    model: ContextLM, memory: _Memory, window: Window | None, obs: Any, s: jax.Array, dims: Dims
) -> tuple[jax.Array, KVCache, jax.Array]:
    """Reads the context of turn s; returns (last hidden [B, D], cache, slot of token 0)."""
    enc, embed = model.encoder, model.embed
    batch = obs.tokens.shape[0]
    if dims.window is None:
        x, valid = jax.vmap(functools.partial(enc.observation, embed))(obs.tokens, obs.progress)
        write = s * dims.block
        hidden, cache = model.lm(x, valid, memory.cache, write, read=np.array([x.shape[1] - 1]))
        return hidden[:, -1], cache, write + dims.obs_len + dims.num_markers
    x, valid = jax.vmap(functools.partial(window_context, enc, embed))(
        memory.summary, window, obs.tokens, obs.progress
    )
    cache = init_cache(model.config, batch, dims.context + dims.turn_len)
    hidden, cache = model.lm(x, valid, cache, 0, read=np.array([x.shape[1] - 1]))
    return hidden[:, -1], cache, jnp.int32(dims.context)


def _sample_turn(actor, hidden, cache, start, state, turn_keys, dims, config, allowed_fn, observed):
    """Samples the L tokens of a turn, feeding each into the cache.

    Returns (action [B, L], live [B, L], logp [B, L], values [B, L], allowed [B, L, V] or
    None, cache).
    """
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
    noise = jax.vmap(lambda k: jax.random.gumbel(k, (dims.turn_len, vocab), jnp.float32))(turn_keys)

    def token(carry, inputs):
        i, token_noise = inputs
        hidden, cache, prefix, done = carry
        logits = actor.logits(hidden, observed)
        if config.constrained:
            allowed = allowed_fn(state, prefix, i)
        else:
            allowed = jnp.ones((batch, vocab), bool)
        allowed = _ban_pad(allowed)
        tok, logp = sample(token_noise, logits, mask=allowed_to_mask(allowed))
        live = ~done
        tok = jnp.where(live, tok, dsl.PAD)
        value = actor.values(hidden) if shared_values else jnp.zeros((batch,), jnp.float32)
        x = actor.encoder.action(actor.embed, tok[:, None])
        hidden, cache = actor.lm(x, live[:, None], cache, start + i)
        prefix = prefix.at[:, i].set(tok)
        done = done | (tok == dsl.END)
        out = (tok, live, jnp.where(live, logp, 0.0), value)
        if config.constrained:
            out = out + (allowed,)
        return (hidden[:, 0], cache, prefix, done), out

    init = (hidden, cache, jnp.zeros((batch, dims.turn_len), jnp.int32), jnp.zeros((batch,), bool))
    steps = jnp.arange(dims.turn_len, dtype=jnp.int32)
    (_, cache, _, _), out = jax.lax.scan(token, init, (steps, jnp.swapaxes(noise, 0, 1)))
    out = [jnp.swapaxes(x, 0, 1) for x in out]
    allowed = out[4] if config.constrained else None
    return out[0], out[1], out[2], out[3], allowed, cache


def _critic_values(critic, memory, window, obs, action, live, s, dims):
    """Separate critic: V before each token of the sampled turn, in one chunked pass."""
    enc, embed = critic.encoder, critic.embed
    x_act = enc.action(embed, action)
    if dims.window is None:
        x_obs, v_obs = jax.vmap(functools.partial(enc.observation, embed))(obs.tokens, obs.progress)
        x = jnp.concatenate([x_obs, x_act.astype(x_obs.dtype)], axis=1)
        hidden, cache = critic.lm(
            x, jnp.concatenate([v_obs, live], axis=1), memory.cache, s * dims.block
        )
        first = dims.obs_len + dims.num_markers - 1
    else:
        x_ctx, v_ctx = jax.vmap(functools.partial(window_context, enc, embed))(
            memory.summary, window, obs.tokens, obs.progress
        )
        x = jnp.concatenate([x_ctx, x_act.astype(x_ctx.dtype)], axis=1)
        hidden, cache = critic.lm(x, jnp.concatenate([v_ctx, live], axis=1))
        first = dims.context - 1
    return critic.values(hidden[:, first : first + dims.turn_len]), cache


def _absorb_leaving(model, summary, window, obs, action, live, dims):
    """Summary for the next turn: absorb the turn that leaves the window (if any)."""
    enc, embed = model.encoder, model.embed
    if not enc.num_slots:
        return summary
    if dims.window == 0:  # the current turn leaves at once
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
