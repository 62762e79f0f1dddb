"""Forking episodes and Monte-Carlo values: the ground-truth credit of every played turn.

ToolWorld is a pure-JAX pytree and deterministic given its state, so the world at the
start of any turn of any played episode can be copied and continued many times in one
vmapped program. From the start of each played turn s, N continuations under a
*continuation policy* estimate

    V(s)    = E[G_s | the state before turn s]                (continue from turn s)
    Q(s, a) = E[G_s | the state before turn s, a_s = a]       (replay a_s, then continue)
    A(s)    = Q(s, a_s) - V(s)

with G_s = sum_{t >= s} gamma^{t-s} r_t the return of training (`rlagent.train.rewards`:
the same reward components, weights, `gamma` and `prm_temperature`). Rewards are computed
on the *whole* episode, the played turns before the fork followed by the continuation,
so forms that look at the past (potential shaping counts plan steps since the start) or
at the whole episode (`prm_min`'s softmax over turns) are exactly those of training.

Replaying a_s from the state before turn s gives, deterministically, the state before
turn s + 1 of the played episode; Q(s, a_s) therefore continues from the fork at turn
s + 1 (with the played turn s in the prefix), with its own N continuations, independent
of those of V(s) and V(s + 1). The fork carries thus only need to exist at turn starts.
When turn s ended the episode, Q(s, a_s) is the deterministic return of the prefix.

Continuation policies: `oracle`, `uniform_random` and `mixture` (an epsilon-mixture of a
policy with a *prover*, e.g. the oracle, by a coin per continuation or per turn) act on
the environment state; `rlagent.credit.lm` continues with the policy LM from rollout
carries.

Cost and memory: a fork evaluation plays up to S - s turns, so estimating every played
turn of B episodes of S turns costs O(B * S * 2N * S / 2) environment (or policy) turns:
linear in B and N, quadratic in S (each of S forks plays the rest of the episode). The
continuations run `chunk_size` at a time (`lax.map`); forks are sorted by start turn and
those of finished episodes come last, so a chunk's episodes end at similar times and a
chunk without a running fork is skipped (environment-level policies also stop a chunk
once all its episodes ended; LM continuations play S turns, see `rlagent.credit.lm`). Memory is
O(chunk_size * (carry + S)) for the chunk plus O(B * S * 2N * R) floats for the
per-continuation returns of R reward forms, whatever S.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from rlagent.envs.base import Environment
from rlagent.envs.base import random_action
from rlagent.envs.base import require_oracle
from rlagent.envs.base import terminated
from rlagent.envs.base import turn_signals
from rlagent.envs.base import turn_success
from rlagent.train.config import TrainConfig
from rlagent.train.rewards import COMPONENTS
from rlagent.train.rewards import turn_rewards
from rlagent.types import Trajectory
from rlagent.types import episode_success

# (state, episode_key, turn_key) -> action [L] int32: an environment-level policy. The
# episode key is fixed over one continuation, the turn key is fresh every turn.
EnvPolicy = Callable[[Any, jax.Array, jax.Array], jax.Array]
State = Any  # an environment's state pytree
# (fork carries [M], keys [M]) -> TurnSignals [M, S]: plays the M forked episodes to their
# end and reports the signals of the turns it played at their absolute turn index.
Play = Callable[[Any, jax.Array], "TurnSignals"]
MIXTURES = ("episode", "turn")
# Folded into a key to draw a mixture's coin (a path the inner policies never take).
COIN = 0xC011


class TurnSignals(NamedTuple):
    """The per-turn part of a `Trajectory`: everything `rewards.reward_components` reads."""

    turn_mask: jax.Array  # [..., S] bool: turn s was played.
    signals: dict[str, jax.Array]  # {name: [..., S] float32}: env.signal_names.
    success: jax.Array  # [..., S] bool: the environment's success flag.
    done: jax.Array  # [..., S] bool: the episode terminated at turn s.


class MCValues(NamedTuple):
    """Monte-Carlo values of every played turn; `[..., B, S]`, 0 on unplayed turns.

    The leading `...` are those of the reward weights (`[R, C]` -> `[R, B, S]`).
    """

    value: jax.Array  # V(s).
    q_value: jax.Array  # Q(s, a_s).
    advantage: jax.Array  # A(s) = Q(s, a_s) - V(s).
    value_se: jax.Array  # standard errors of the means over N continuations.
    q_value_se: jax.Array
    advantage_se: jax.Array  # sqrt(se_V^2 + se_Q^2): V and Q use independent samples.
    success: jax.Array  # [B, S] P(success) from the state before turn s.
    q_success: jax.Array  # [B, S] P(success) after the taken action a_s.
    turns: jax.Array  # [] float32: environment turns the continuations played (their cost).


def trajectory_signals(trajectory: Trajectory) -> TurnSignals:
    """The `[B, S]` signals of a rollout's trajectory."""
    return TurnSignals(
        trajectory.turn_mask, trajectory.signals, trajectory.success, trajectory.done
    )


def timestep_signals(env: Environment, timestep: Any, played: jax.Array) -> TurnSignals:
    """Signals of one environment step, zero where not `played`."""
    return TurnSignals(
        turn_mask=played,
        signals=turn_signals(env, timestep, played),
        success=turn_success(timestep, played),
        done=played & terminated(timestep),
    )


# Continuation policies on the environment state ------------------------------------------


def oracle(env: Environment) -> EnvPolicy:
    """The environment's oracle (`env.oracle_action`, e.g. ToolWorld's shortest correct
    plan); refused for an environment without one."""
    require_oracle(env, "oracle continuations")
    return lambda state, episode_key, turn_key: env.oracle_action(state)


def uniform_random(env: Environment) -> EnvPolicy:
    """A turn sampled token by token, uniformly over the environment's allowed tokens
    (ToolWorld: grammatical; with its guardrail in mask mode, keeping the rules too)."""
    return lambda state, episode_key, turn_key: random_action(env, state, turn_key)


def mixture(policy: EnvPolicy, prover: EnvPolicy, epsilon: float, per: str = "turn") -> EnvPolicy:
    """Plays `prover` with probability `epsilon`, else `policy` (an epsilon-prover).

    Args:
      policy: the base policy.
      prover: the policy mixed in (e.g. `oracle(env)`).
      epsilon: probability of the prover, in [0, 1].
      per: `"turn"`: a fresh coin every turn (a Markov policy); `"episode"`: one coin per
        continuation (the continuation is the prover's or the policy's throughout).
    """
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    if per not in MIXTURES:
        raise ValueError(f"per must be one of {MIXTURES}, got {per!r}")

    def act(state: State, episode_key: jax.Array, turn_key: jax.Array) -> jax.Array:
        coin_key = jax.random.fold_in(episode_key if per == "episode" else turn_key, COIN)
        use_prover = jax.random.uniform(coin_key) < epsilon
        return jnp.where(
            use_prover,
            prover(state, episode_key, turn_key),
            policy(state, episode_key, turn_key),
        )

    return act


# Forks and continuations of environment-level policies ----------------------------------


def replay_states(env: Environment, env_keys: jax.Array, actions: jax.Array) -> State:
    """Environment states at the start of every turn, by replaying the played actions.

    The environment is deterministic given its reset key, so `reset(env_keys)` followed by
    the actions of a rollout reproduces its episodes exactly.

    Args:
      env: the environment of the rollout.
      env_keys: `[B]` reset keys of the rollout (typed or `[B, 2]` uint32).
      actions: `[B, S, L]` int32 played turns (`Trajectory.action_tokens`).
    Returns:
      State with leaves `[B, S, ...]`: the state before turn s (absorbing once ended).
    """
    chex.assert_rank(actions, 3)
    state, _ = jax.vmap(env.reset)(env_keys)

    def turn(state, action):
        next_state, _ = jax.vmap(env.step)(state, action)
        return next_state, state

    _, states = jax.lax.scan(turn, state, jnp.swapaxes(actions, 0, 1))
    return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), states)


class EnvEpisodes(NamedTuple):
    """A batch of episodes of an environment-level policy, ready to fork."""

    states: State  # leaves [B, S, ...]: the state before turn s.
    actions: jax.Array  # [B, S, L] int32 played turns.
    signals: TurnSignals  # [B, S].


def rollout_env_policy(
    env: Environment, policy: EnvPolicy, env_keys: jax.Array, keys: jax.Array
) -> EnvEpisodes:
    """Plays B episodes of `policy` for max_turns turns (absorbing after the end).

    Args:
      env: the environment.
      policy: an environment-level policy.
      env_keys: `[B]` reset keys.
      keys: `[B]` policy keys (episode key; turn keys are `fold_in(key, turn)`).
    """
    state, _ = jax.vmap(env.reset)(env_keys)

    def turn(state, _):
        played = ~jax.vmap(env.episode_over)(state)
        turn_keys = jax.vmap(jax.random.fold_in)(keys, jax.vmap(env.episode_turn)(state))
        action = jax.vmap(policy)(state, keys, turn_keys)
        next_state, timestep = jax.vmap(env.step)(state, action)
        return next_state, (state, action, timestep_signals(env, timestep, played))

    _, out = jax.lax.scan(turn, state, None, length=env.max_turns)
    return EnvEpisodes(*jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), out))


def sample_env_episodes(
    env: Environment, policy: EnvPolicy, key: jax.Array, num_episodes: int
) -> EnvEpisodes:
    """`num_episodes` fresh episodes of `policy` (`rollout_env_policy`), their reset and
    policy keys split from `key`."""
    env_key, policy_key = jax.random.split(key)
    return rollout_env_policy(
        env,
        policy,
        jax.random.split(env_key, num_episodes),
        jax.random.split(policy_key, num_episodes),
    )


def env_trajectory(env: Environment, episodes: EnvEpisodes) -> Trajectory:
    """The `Trajectory` of environment-level episodes (`rollout_env_policy`) for the
    trainer's estimators: generated tokens up to END, log-probs and values 0; the
    observations and markers are those the states hold (`env.observe(state)`)."""
    actions = episodes.actions
    signals = episodes.signals
    is_end = actions == env.token_spec.end
    action_mask = (jnp.cumsum(is_end, axis=-1) - is_end) == 0  # tokens up to END
    observation = jax.vmap(jax.vmap(env.observe))(episodes.states)
    last = signals.turn_mask & ~jnp.pad(signals.turn_mask[:, 1:], ((0, 0), (0, 1)))
    return Trajectory(
        obs_tokens=observation.tokens,
        progress=observation.progress,
        action_tokens=actions,
        action_mask=action_mask,
        logp=jnp.zeros(actions.shape, jnp.float32),
        values=jnp.zeros(actions.shape, jnp.float32),
        turn_mask=signals.turn_mask,
        signals=signals.signals,
        success=signals.success,
        # Time-outs end the return as terminations do (training's bootstrap_truncated=False).
        done=last,
        bootstrap_value=jnp.zeros(actions.shape[:1], jnp.float32),
    )


def play_env_policy(env: Environment, policy: EnvPolicy) -> Play:
    """`play(states [M], keys [M]) -> TurnSignals [M, S]` for an environment-level policy.

    Plays every forked episode from its state until it terminates or reaches max_turns
    (a `lax.while_loop` that stops once all M episodes have ended); signals land at the
    absolute turn index `state.turn`. Turn keys are `fold_in(key, turn)`.
    """
    num_turns = env.max_turns
    step = jax.vmap(env.step)
    act = jax.vmap(policy)
    turn_of = jax.vmap(env.episode_turn)

    def play(states: State, keys: jax.Array) -> TurnSignals:
        size = keys.shape[0]
        signals = _no_turns(env.signal_names, size, num_turns)

        def running(states):
            return ~jax.vmap(env.episode_over)(states)

        def body(loop):
            states, signals = loop
            played = running(states)
            turns = turn_of(states)
            turn_keys = jax.vmap(jax.random.fold_in)(keys, turns)
            next_states, timestep = step(states, act(states, keys, turn_keys))
            column = jnp.clip(turns, 0, num_turns - 1)
            new = timestep_signals(env, timestep, played)
            rows = jnp.arange(size)
            signals = jax.tree.map(
                lambda old, x: old.at[rows, column].set(jnp.where(played, x, old[rows, column])),
                signals,
                new,
            )
            return next_states, signals

        _, signals = jax.lax.while_loop(
            lambda loop: running(loop[0]).any(), body, (states, signals)
        )
        return signals

    return play


# The Monte-Carlo engine -----------------------------------------------------------------


def mc_values(
    play: Play,
    forks: Any,
    prefix: TurnSignals,
    key: jax.Array,
    *,
    num_samples: int,
    reward_weights: jax.Array,
    config: TrainConfig,
    chunk_size: int = 4096,
    q_only: bool = False,
) -> MCValues:
    """V, Q, A and success probabilities of every played turn, with standard errors.

    (Its length is the docstring's: the contract of every argument and of the memory
    scaling; the body is one chunked map over forks.)

    Args:
      play: plays forked episodes to their end (`play_env_policy`, `rlagent.credit.lm`).
      forks: carries `play` starts from, leaves `[B, S, ...]`: the episode at the start of
        turn s (e.g. `replay_states`, or the rollout's carries at turn starts).
      prefix: `[B, S]` signals of the played episodes (`trajectory_signals`).
      key: PRNG key of the continuations.
      num_samples: N continuations per value (V and Q each); with N = 1 the standard
        errors are NaN (labels from single completions, `rlagent.prm.labels`).
      reward_weights: `[C]` or `[R, C]` weights of `rewards.COMPONENTS` (e.g.
        `rewards.reward_weights(config, form)`): one reward form or R of them, estimated
        from the same continuations. The `learned_*` components read a PRM's scores,
        which continuations have none of: they count 0 here.
      config: gives `gamma` and `prm_temperature` (as in training).
      chunk_size: continuations played at once (memory bound; rounded to whole forks).
      q_only: estimate Q(s, a_s) and `q_success` only, at half the cost (completion
        labels, `rlagent.prm.labels`, need no V); the V-derived fields are then NaN on
        played turns.
    Returns:
      MCValues; value fields `[B, S]` or `[R, B, S]`, success fields `[B, S]`.
    """
    turn_mask = prefix.turn_mask
    weights = jnp.asarray(reward_weights, jnp.float32)
    _check_mc_inputs(turn_mask, forks, weights, num_samples)
    batch, num_turns = turn_mask.shape
    forms = weights.reshape(-1, len(COMPONENTS))
    b, r, fork, runs, order = _evaluations(turn_mask, q_only)
    num_evals = order.shape[0]
    per_chunk = min(max(1, chunk_size // num_samples), num_evals)
    num_chunks = -(-num_evals // per_chunk)
    padded = jnp.pad(order, (0, num_chunks * per_chunk - num_evals), constant_values=order[-1])
    eval_keys = jax.random.split(key, num_evals)

    def evaluate(chunk_evals):
        eb, er, ef, erun = b[chunk_evals], r[chunk_evals], fork[chunk_evals], runs[chunk_evals]
        eb, er, ef, erun = (jnp.repeat(x, num_samples) for x in (eb, er, ef, erun))
        sample_keys = jax.vmap(lambda k: jax.random.split(k, num_samples))(eval_keys[chunk_evals])
        carries = jax.tree.map(lambda x: x[eb, jnp.minimum(ef, num_turns - 1)], forks)
        flat_keys = sample_keys.reshape(-1, *sample_keys.shape[2:])
        # Forks are sorted running-first: a chunk with no running fork plays nothing.
        played = jax.lax.cond(
            erun.any(),
            lambda: play(carries, flat_keys),
            lambda: _no_turns(prefix.signals, erun.shape[0], num_turns),
        )
        after = (jnp.arange(num_turns)[None, :] >= ef[:, None]) & erun[:, None]
        before = jnp.arange(num_turns)[None, :] < ef[:, None]
        episode = jax.tree.map(
            lambda p, c: jnp.where(before, p[eb], jnp.where(after, c, jnp.zeros_like(c))),
            prefix,
            played,
        )
        returns = jax.vmap(lambda w: _returns_from(episode, er, w, config))(forms)  # [R, M]
        success = episode_success(episode.success, episode.turn_mask)
        shape = (per_chunk, num_samples)
        # The padding repeats the last evaluation: only a chunk's distinct ones count.
        distinct = (chunk_evals != jnp.roll(chunk_evals, 1)).at[0].set(True)
        distinct = jnp.repeat(distinct, num_samples)
        turns = jnp.sum(distinct[:, None] & after & played.turn_mask)
        return (
            returns.reshape(forms.shape[0], *shape).transpose(1, 0, 2),
            success.reshape(shape),
            turns,
        )

    returns, success, turns = jax.lax.map(evaluate, padded.reshape(num_chunks, per_chunk))
    return _mc_fields(
        returns, success, turns, order, turn_mask, forms_shape=weights.shape[:-1], q_only=q_only
    )


def _check_mc_inputs(
    turn_mask: jax.Array, forks: Any, weights: jax.Array, num_samples: int
) -> None:
    """Checks `mc_values`'s inputs: `turn_mask [B, S]`, forks `[B, S, ...]`, weights."""
    chex.assert_rank(turn_mask, 2)
    chex.assert_type(turn_mask, bool)
    batch, num_turns = turn_mask.shape
    if weights.shape[-1] != len(COMPONENTS) or weights.ndim not in (1, 2):
        raise ValueError(
            f"reward_weights must be [C] or [R, C] with C = {len(COMPONENTS)}, got {weights.shape}"
        )
    for leaf in jax.tree.leaves(forks):
        if leaf.shape[:2] != (batch, num_turns):
            raise ValueError(f"forks leaves must be [B, S, ...] = [{batch}, {num_turns}, ...]")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")


def _evaluations(
    turn_mask: jax.Array, q_only: bool
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """The evaluations of `mc_values`, each `[E]`: `(b, r, fork, runs, order)`.

    Evaluation (episode b, turn r, kind) with kind 0 = V(r) (fork at r), 1 = Q(r) (fork at
    r + 1), in (b, r, kind) order; `q_only` keeps kind 1 only. A fork runs only if the
    episode is still going at its turn; `order` sorts running forks first, by start turn.
    """
    batch, num_turns = turn_mask.shape
    kinds = jnp.arange(1, 2) if q_only else jnp.arange(2)
    b, r, kind = jnp.meshgrid(jnp.arange(batch), jnp.arange(num_turns), kinds, indexing="ij")
    b, r, kind = b.reshape(-1), r.reshape(-1), kind.reshape(-1)
    fork = r + kind
    runs = turn_mask[b, r] & (fork < num_turns) & turn_mask[b, jnp.minimum(fork, num_turns - 1)]
    order = jnp.lexsort((fork, ~runs))  # running forks first, by start turn
    return b, r, fork, runs, order


def _mc_fields(
    returns: jax.Array,
    success: jax.Array,
    turns: jax.Array,
    order: jax.Array,
    turn_mask: jax.Array,
    *,
    forms_shape: tuple[int, ...],
    q_only: bool,
) -> MCValues:
    """`MCValues` from the chunked map's per-continuation `returns [chunks, per_chunk, R,
    N]`, `success [chunks, per_chunk, N]` and played `turns [chunks]` (evaluations in
    `order`); `forms_shape` is `()` for one reward form, `(R,)` for R of them."""
    batch, num_turns = turn_mask.shape
    num_evals = order.shape[0]
    num_forms, num_samples = returns.shape[-2:]
    num_kinds = 1 if q_only else 2
    returns = returns.reshape(-1, num_forms, num_samples)[:num_evals]  # [E, R, N]
    success = success.reshape(-1, num_samples)[:num_evals].astype(jnp.float32)
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(num_evals))
    returns, success = returns[inverse], success[inverse]  # back to (b, r, kind) order

    mean = returns.mean(-1).reshape(batch, num_turns, num_kinds, -1)
    se = (returns.std(-1, ddof=1) / jnp.sqrt(num_samples)).reshape(mean.shape)
    p = success.mean(-1).reshape(batch, num_turns, num_kinds)
    if q_only:  # no V: NaN in its place
        mean, se, p = (
            jnp.concatenate([jnp.full_like(x, jnp.nan), x], axis=2) for x in (mean, se, p)
        )
    valid = turn_mask[..., None]

    def out(x):  # [B, S, R] -> [..., B, S], 0 on unplayed turns
        x = jnp.where(valid, x, 0.0)
        return jnp.moveaxis(x, -1, 0).reshape(*forms_shape, batch, num_turns)

    value, q_value = mean[:, :, 0], mean[:, :, 1]
    return MCValues(
        value=out(value),
        q_value=out(q_value),
        advantage=out(q_value - value),
        value_se=out(se[:, :, 0]),
        q_value_se=out(se[:, :, 1]),
        advantage_se=out(jnp.sqrt(se[:, :, 0] ** 2 + se[:, :, 1] ** 2)),
        success=jnp.where(turn_mask, p[:, :, 0], 0.0),
        q_success=jnp.where(turn_mask, p[:, :, 1], 0.0),
        turns=jnp.sum(turns).astype(jnp.float32),
    )


def _no_turns(names: Any, size: int, num_turns: int) -> TurnSignals:
    """No turn played: `[size, num_turns]` signals of `names` (or of a TurnSignals's)."""
    zeros = jnp.zeros((size, num_turns), jnp.float32)
    never = jnp.zeros((size, num_turns), bool)
    return TurnSignals(never, {name: zeros for name in names}, never, never)


def _returns_from(
    episode: TurnSignals, start: jax.Array, weights: jax.Array, config: TrainConfig
) -> jax.Array:
    """`[M]` discounted return from turn `start [M]` of whole episodes `[M, S]`."""
    rewards = turn_rewards(episode, config, weights)  # [M, S], 0 on unplayed turns
    offset = jnp.arange(rewards.shape[1])[None, :] - start[:, None]
    discount = jnp.where(offset >= 0, config.gamma ** jnp.maximum(offset, 0), 0.0)
    return jnp.sum(rewards * discount, axis=1)
