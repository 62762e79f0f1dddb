"""Monte-Carlo values against values computed another way (rlagent.credit.mc).

* oracle continuations are deterministic: V = 1 until a task fails (outcome reward), and
  every value equals the plain-Python reference playing its own oracle to the end;
* uniform-random continuations on level 1 agree, within standard errors, with the exact
  expectation enumerated over every grammatical turn through the reference;
* the telescoping identity sum_s A(s) = G - V(s_0) holds within standard errors;
* standard errors shrink as 1 / sqrt(N).
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlagent import credit
from rlagent.envs.toolworld import ReferenceToolWorld
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import dsl
from rlagent.envs.toolworld import level_config
from rlagent.train.config import TrainConfig
from rlagent.train.rewards import reward_weights
from rlagent.train.rewards import turn_rewards

BATCH = 8
CONFIG = TrainConfig(gamma=1.0)
FORMS = ("outcome", "process")
WEIGHTS = jnp.stack([reward_weights(CONFIG, form) for form in FORMS])


@pytest.fixture(scope="module")
def env():
    return ToolWorld(level_config(1))


@pytest.fixture(scope="module")
def episodes(env):
    """Uniform-random episodes of level 1 (S = 4 turns), with their reset keys."""
    keys = jax.random.split(jax.random.key(3), 2 * BATCH)
    policy = credit.uniform_random(env)
    rollout = jax.jit(lambda env_keys, keys: credit.rollout_env_policy(env, policy, env_keys, keys))
    return keys[:BATCH], rollout(keys[:BATCH], keys[BATCH:])


@functools.cache
def _estimator(env, policy_name, num_samples, gamma=1.0):
    policies = {
        "oracle": credit.oracle(env),
        "random": credit.uniform_random(env),
        "prover": credit.mixture(credit.uniform_random(env), credit.oracle(env), 1.0),
    }
    play = credit.play_env_policy(env, policies[policy_name])
    config = TrainConfig(gamma=gamma)
    return jax.jit(
        lambda forks, prefix, key: credit.mc_values(
            play,
            forks,
            prefix,
            key,
            num_samples=num_samples,
            reward_weights=WEIGHTS,
            config=config,
            chunk_size=256,
        )
    )


def test_replay_reproduces_the_rollout_states(env, episodes):
    env_keys, ep = episodes
    states = credit.replay_states(env, env_keys, ep.actions)
    states, played = (s._replace(key=jax.random.key_data(s.key)) for s in (states, ep.states))
    for replayed, original in zip(jax.tree.leaves(states), jax.tree.leaves(played), strict=True):
        np.testing.assert_array_equal(np.asarray(replayed), np.asarray(original))


def test_oracle_values_match_the_reference_oracle(env, episodes):
    """A prover mixing in the oracle with probability 1 continues as the oracle."""
    _, ep = episodes
    mc = _estimator(env, "prover", 2)(ep.states, ep.signals, jax.random.key(0))
    mask = np.asarray(ep.signals.turn_mask)
    ref = ReferenceToolWorld(env.config)
    for b in range(BATCH):
        failed = False
        for s in range(env.max_turns):
            if not mask[b, s]:
                continue
            state = ref.load(jax.tree.map(lambda x, b=b, s=s: x[b, s], ep.states))
            outcome, process = _oracle_returns(ref, state)
            assert mc.value[0, b, s] == outcome
            assert mc.value[1, b, s] == process
            # V = 1 until a task fails or the oracle runs out of turns.
            failed |= bool(np.any(np.asarray(ep.states.progress[b, s]) == 3))
            if failed:
                assert mc.value[0, b, s] == 0.0
    np.testing.assert_array_equal(np.asarray(mc.value_se), 0.0)
    np.testing.assert_array_equal(np.asarray(mc.advantage_se), 0.0)
    np.testing.assert_array_equal(np.asarray(mc.success), np.asarray(mc.value[0]))


def test_q_only_estimates_q_alone(env, episodes):
    """Q without V (completion labels): the same Q of the oracle, V NaN, only Q's turns."""
    _, ep = episodes
    play = credit.play_env_policy(env, credit.oracle(env))
    estimate = jax.jit(
        lambda q_only: credit.mc_values(
            play,
            ep.states,
            ep.signals,
            jax.random.key(0),
            num_samples=2,
            reward_weights=WEIGHTS,
            config=CONFIG,
            chunk_size=256,
            q_only=q_only,
        ),
        static_argnums=0,
    )
    both, q = estimate(False), estimate(True)
    mask = np.asarray(ep.signals.turn_mask)
    np.testing.assert_array_equal(q.q_value, both.q_value)
    np.testing.assert_array_equal(q.q_success, both.q_success)
    for field in ("value", "advantage", "success"):
        values = np.asarray(getattr(q, field))
        assert np.isnan(values[..., mask]).all() and not values[..., ~mask].any()
    # V(s) continues from every played turn: at least one turn per sample each.
    assert float(q.turns) + 2 * mask.sum() <= float(both.turns)


def test_oracle_values_from_the_start_with_discount(env):
    """Oracle episodes: V(s_0) = gamma^(plan - 1) (outcome), sum_t gamma^t (process), A = 0."""
    keys = jax.random.split(jax.random.key(5), 2 * BATCH)
    policy = credit.oracle(env)
    rollout = jax.jit(lambda env_keys, keys: credit.rollout_env_policy(env, policy, env_keys, keys))
    ep = rollout(keys[:BATCH], keys[BATCH:])
    mc = _estimator(env, "oracle", 2, gamma=0.5)(ep.states, ep.signals, jax.random.key(0))
    np.testing.assert_allclose(np.asarray(mc.value[:, :, 0]), [[0.5] * BATCH, [1.5] * BATCH])
    mask = np.asarray(ep.signals.turn_mask)
    np.testing.assert_array_equal(np.asarray(mc.success)[mask], 1.0)
    np.testing.assert_array_equal(np.asarray(mc.advantage)[:, mask], 0.0)
    # The oracle plays the P - r turns left from a fork at turn r (V at r, Q at r + 1):
    # sum_r (P - r) + sum_{r < P - 1} (P - r - 1) = P^2 per episode, N = 2 each.
    plan = mask.sum(axis=1)
    assert float(mc.turns) == 2 * np.sum(plan**2)
    # Chunks padded with a repeated evaluation count it once.
    chunked = credit.mc_values(
        credit.play_env_policy(env, policy),
        ep.states,
        ep.signals,
        jax.random.key(0),
        num_samples=2,
        reward_weights=WEIGHTS,
        config=TrainConfig(gamma=0.5),
        chunk_size=6,
    )
    assert float(chunked.turns) == float(mc.turns)


def test_random_values_match_exhaustive_enumeration(env, episodes):
    """V and Q of the last two turns, exactly: every grammatical turn through the reference."""
    _, ep = episodes
    mc = _estimator(env, "random", 64)(ep.states, ep.signals, jax.random.key(1))
    mask = np.asarray(ep.signals.turn_mask)
    ref = ReferenceToolWorld(env.config)
    turns = _grammar(env)
    z_scores = []
    for b in range(BATCH):
        for s in range(env.max_turns - 2, env.max_turns):
            if not mask[b, s]:
                continue
            state = ref.load(jax.tree.map(lambda x, b=b, s=s: x[b, s], ep.states))
            exact_v = _exact_value(ref, state, turns)
            after, timestep = ref.step(copy.deepcopy(state), np.asarray(ep.actions[b, s]))
            exact_q = _outcome_verdict(timestep) + _exact_value(ref, after, turns)
            for f in range(len(FORMS)):
                for estimate, se, exact in (
                    (mc.value[f, b, s], mc.value_se[f, b, s], exact_v[f]),
                    (mc.q_value[f, b, s], mc.q_value_se[f, b, s], exact_q[f]),
                ):
                    if se == 0:
                        assert estimate == pytest.approx(exact, abs=1e-5)
                    else:
                        z_scores.append((float(estimate) - exact) / float(se))
    z_scores = np.asarray(z_scores)
    assert len(z_scores) >= 5
    assert np.all(np.abs(z_scores) < 4.5), z_scores
    assert np.mean(z_scores**2) < 2.5, z_scores  # calibrated standard errors


def test_telescoping_sum_of_advantages(env, episodes):
    """sum_s A(s) = G - V(s_0) in expectation, per episode, within standard errors."""
    _, ep = episodes
    mc = _estimator(env, "random", 64)(ep.states, ep.signals, jax.random.key(2))
    for f, weights in enumerate(WEIGHTS):
        played_return = np.asarray(turn_rewards(ep.signals, CONFIG, weights)).sum(axis=1)
        gap = np.asarray(mc.advantage[f]).sum(axis=1) - (played_return - mc.value[f, :, 0])
        # sum_s A - (G - V_0) = sum_s Q_s - sum_{s >= 1} V_s - G: independent errors.
        var = np.sum(np.asarray(mc.q_value_se[f]) ** 2, axis=1)
        var += np.sum(np.asarray(mc.value_se[f, :, 1:]) ** 2, axis=1)
        assert np.all(np.abs(gap) <= 4.5 * np.sqrt(var) + 1e-5), (gap, np.sqrt(var))


def test_standard_errors_shrink_as_one_over_sqrt_n(env, episodes):
    _, ep = episodes
    small = _estimator(env, "random", 16)(ep.states, ep.signals, jax.random.key(3))
    large = _estimator(env, "random", 64)(ep.states, ep.signals, jax.random.key(4))
    positive = (np.asarray(small.value_se) > 0) & (np.asarray(large.value_se) > 0)
    ratio = np.mean(np.asarray(small.value_se)[positive]) / np.mean(
        np.asarray(large.value_se)[positive]
    )
    assert 1.6 < ratio < 2.5, ratio  # sqrt(64 / 16) = 2


def test_rejects_bad_arguments(env, episodes):
    _, ep = episodes
    play = credit.play_env_policy(env, credit.oracle(env))
    kwargs = dict(num_samples=2, config=CONFIG)
    with pytest.raises(ValueError, match="reward_weights"):
        credit.mc_values(
            play, ep.states, ep.signals, jax.random.key(0), reward_weights=[1.0], **kwargs
        )
    with pytest.raises(ValueError, match="num_samples"):
        credit.mc_values(
            play,
            ep.states,
            ep.signals,
            jax.random.key(0),
            reward_weights=WEIGHTS[0],
            num_samples=0,
            config=CONFIG,
        )
    with pytest.raises(ValueError, match="epsilon"):
        credit.mixture(credit.oracle(env), credit.oracle(env), 1.5)


# Independent computations through the plain-Python reference ------------------------------


def _outcome_verdict(timestep) -> np.ndarray:
    """`[2]` outcome and verdict of a reference step (its rewards under the two forms)."""
    return np.array([timestep.signals.outcome, timestep.signals.verdict])


def _oracle_returns(ref, state):
    """(outcome, process) returns of the reference oracle played to the end."""
    state = copy.deepcopy(state)
    outcome = process = 0.0
    while not (state.terminated or state.truncated):
        state, timestep = ref.step(state, ref.oracle(state))
        outcome, process = np.array([outcome, process]) + _outcome_verdict(timestep)
    return outcome, process


def _grammar(env):
    """Every grammatical turn with its probability under token-by-token uniform sampling."""
    allowed = jax.jit(lambda prefix, position: env.allowed_tokens(None, prefix, position))
    turns = []

    def walk(prefix, position, prob):
        if position == env.turn_len:
            turns.append((list(prefix), prob))
            return
        options = np.flatnonzero(np.asarray(allowed(jnp.asarray(prefix), position)))
        for token in options:
            walk(
                prefix[:position] + [int(token)] + prefix[position + 1 :],
                position + 1,
                prob / len(options),
            )

    walk([dsl.PAD] * env.turn_len, 0, 1.0)
    assert sum(p for _, p in turns) == pytest.approx(1.0)
    return turns


def _exact_value(ref, state, turns, memo=None):
    """Expected (outcome, process) return of uniform-random play from `state`, exactly.

    Memoised on the state without its observation (which the dynamics never read).
    """
    memo = {} if memo is None else memo
    if state.terminated or state.truncated:
        return np.zeros(2)
    key = repr(dataclasses.replace(state, obs=None))
    if key not in memo:
        total = np.zeros(2)
        for action, prob in turns:
            after, timestep = ref.step(copy.deepcopy(state), action)
            total += prob * (_outcome_verdict(timestep) + _exact_value(ref, after, turns, memo))
        memo[key] = total
    return memo[key]
