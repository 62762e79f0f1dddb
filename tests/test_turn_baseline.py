"""A turn-level baseline when the agent chooses how many turns to take, checked exactly.

The task: at each turn t < S the agent goes on (probability sigmoid(theta_t), reward
GO[t]) or stops (reward STOP[t]); going on at the last turn ends the episode. Every
trajectory, and every group of G of them, is enumerated with its probability, so the true
policy gradient and each estimator's expected gradient are exact numbers, not samples.
`rloo_turn` (`advantages.turn_rloo_advantages`) must give the true gradient; the
per-turn-index normalisation of MT-GRPO-style estimators (the reference below, as
verl-project/verl#7244 describes it) must not.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from rlagent.advantages import turn_rloo_advantages

S, G = 3, 3
THETA = np.array([0.3, -0.5, 0.8])
GO = np.array([0.5, 0.3, 0.0])  # intermediate rewards: the bias grows with their mean.
STOP = np.array([0.0, 0.5, 2.0])


def _trajectories():
    """[(actions, rewards)] of every trajectory: stop at turn k < S, or go on S times."""
    out = []
    for k in range(S + 1):
        actions = [1] * min(k, S) + ([0] if k < S else [])  # 1: go on, 0: stop.
        rewards = [GO[t] if a else STOP[t] for t, a in enumerate(actions)]
        out.append((actions, rewards))
    return out


def _log_prob(theta, actions):
    p = jax.nn.sigmoid(theta)
    return sum(jnp.log(p[t]) if a else jnp.log1p(-p[t]) for t, a in enumerate(actions))


def _true_gradient():
    def objective(theta):
        return sum(jnp.exp(_log_prob(theta, a)) * sum(r) for a, r in _trajectories())

    return np.asarray(jax.grad(objective)(jnp.asarray(THETA)), np.float64)


def _score(actions):
    """[S, S] grad_theta log pi(a_t | t) per turn (rows t)."""
    p = 1.0 / (1.0 + np.exp(-THETA))
    rows = np.zeros((S, S))
    for t, a in enumerate(actions):
        rows[t, t] = (1.0 - p[t]) if a else -p[t]
    return rows


def _groups():
    """Every group of G trajectories: its probability, rewards [G, S] and mask [G, S]."""
    trajectories = _trajectories()
    probs = [float(np.exp(_log_prob(THETA, a))) for a, _ in trajectories]
    for combo in itertools.product(range(len(trajectories)), repeat=G):
        rewards, mask = np.zeros((G, S)), np.zeros((G, S), bool)
        for i, index in enumerate(combo):
            played = trajectories[index][1]
            rewards[i, : len(played)], mask[i, : len(played)] = played, True
        yield np.prod([probs[i] for i in combo]), combo, rewards, mask


def _expected_gradient(advantages_of):
    trajectories, total = _trajectories(), np.zeros(S)
    for prob, combo, rewards, mask in _groups():
        advantages = advantages_of(rewards, mask)
        for i, index in enumerate(combo):
            score = _score(trajectories[index][0])
            total += prob * (score * (advantages[i] * mask[i])[:, None]).sum(axis=0) / G
    return total


def _turn_rloo(rewards, mask):
    returns = np.flip(np.cumsum(np.flip(rewards, 1), 1), 1) * mask
    out = turn_rloo_advantages(
        jnp.asarray(returns, jnp.float32), jnp.asarray(mask), jnp.zeros(G, jnp.int32),
        num_groups=1,
    )  # fmt: skip
    return np.asarray(out, np.float64)


def _per_turn_index(rewards, mask):
    """MT-GRPO-style: A_{i,t} = sum over the turns k >= t that i plays of r_{i,k} minus the
    mean reward at index k of the episodes that play k (i included)."""
    alive = mask.sum(axis=0)
    mean = np.where(alive > 0, (rewards * mask).sum(axis=0) / np.maximum(alive, 1), 0.0)
    centred = (rewards - mean) * mask
    return np.flip(np.cumsum(np.flip(centred, 1), 1), 1) * mask


def test_turn_rloo_is_the_other_members_return_from_the_same_turn_index():
    rewards = np.array([[0.5, 1.0, 0.0], [0.5, 0.3, 2.0], [0.0, 0.0, 0.0]])
    mask = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0]], bool)
    # Returns from each turn: [1.5, 1.0, -], [2.8, 2.3, 2.0], [0, -, -].
    expected = np.array([[1.5 - 1.4, 1.0 - 1.15, 0.0],
                         [2.8 - 0.75, 2.3 - 0.5, 2.0 - 0.0],
                         [0.0 - 2.15, 0.0, 0.0]])  # fmt: skip
    np.testing.assert_allclose(_turn_rloo(rewards, mask), expected, atol=1e-6)


def test_turn_rloo_is_unbiased_and_per_turn_index_normalisation_is_not():
    true = _true_gradient()
    assert np.abs(true).min() > 0.05  # every parameter's gradient is non-trivial.
    rloo = _expected_gradient(_turn_rloo)
    per_index = _expected_gradient(_per_turn_index)
    # Exact expectations: equal up to float32 rounding of the advantages.
    np.testing.assert_allclose(rloo, true, atol=2e-6)
    # The per-turn-index baseline moves the gradient of the go-on decisions (turns 0 and
    # 1) by more than 10% of the largest true component; at turn 1 it even points the
    # other way (true +0.0567, per-index -0.0125; turn 0: +0.283 vs +0.081).
    bias = per_index - true
    assert np.abs(bias[:2]).min() > 0.1 * np.abs(true).max(), (true, per_index)
    assert np.sign(per_index[1]) != np.sign(true[1]), (true, per_index)
