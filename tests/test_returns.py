"""Tests for rlagent.returns against NumPy references written from the formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from rlagent import compose_rewards
from rlagent import discounted_returns
from rlagent import gae
from rlagent import lambda_returns
from rlagent import prm_rewards

B, T, S = 3, 12, 6


def compress(rewards, mask):
    """Per row: unmasked indices and segment reward sums (masked rewards go to the
    closest earlier unmasked position, rewards before the first one are dropped)."""
    idx = np.nonzero(mask)[0]
    ends = np.append(idx[1:], len(rewards))[: len(idx)]
    return idx, np.array([rewards[i:end].sum() for i, end in zip(idx, ends, strict=True)])


def np_lambda_returns(rewards, values, mask, gamma, lam, boot):
    out = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        idx, seg = compress(rewards[b], mask[b])
        vals = np.append(values[b, idx], boot[b])
        g = boot[b]
        for k in reversed(range(len(idx))):
            g = seg[k] + gamma * ((1 - lam) * vals[k + 1] + lam * g)
            out[b, idx[k]] = g
    return out


def np_discounted(rewards, mask, gamma, boot):
    out = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        idx, seg = compress(rewards[b], mask[b])
        g = boot[b]
        for k in reversed(range(len(idx))):
            g = seg[k] + gamma * g
            out[b, idx[k]] = g
    return out


def random_rows(seed, shape=(B, T), p=0.6):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=shape).astype(np.float32)
    values = rng.normal(size=shape).astype(np.float32)
    mask = rng.random(shape) < p
    boot = rng.normal(size=shape[:1]).astype(np.float32)
    return rewards, values, mask, boot


@pytest.mark.parametrize("seed", [0, 1])
def test_discounted_returns_matches_numpy(variant, seed):
    rewards, _, mask, boot = random_rows(seed)
    fn = variant(discounted_returns, gamma=0.9)
    got = fn(rewards, mask, bootstrap_value=boot)
    np.testing.assert_allclose(got, np_discounted(rewards, mask, 0.9, boot), rtol=1e-5, atol=1e-5)
    assert got.dtype == jnp.float32
    assert np.all(np.asarray(got)[~mask] == 0.0)


def test_discounted_returns_hand_computed():
    # policy, tool, tool(reward 1), policy(reward 2): the tool reward goes to token 0.
    rewards = np.array([[0.0, 0.0, 1.0, 2.0]], np.float32)
    mask = np.array([[True, False, False, True]])
    got = discounted_returns(rewards, mask, gamma=0.5)
    np.testing.assert_allclose(got, [[1.0 + 0.5 * 2.0, 0.0, 0.0, 2.0]])


@pytest.mark.parametrize("seed", [0, 1])
def test_lambda_returns_matches_numpy_and_gae(variant, seed):
    rewards, values, mask, boot = random_rows(seed)
    fn = variant(lambda_returns, gamma=0.95, lam=0.7)
    got = fn(rewards, values, mask, bootstrap_value=boot)
    want = np_lambda_returns(rewards, values, mask, 0.95, 0.7, boot)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    gae_returns = gae(rewards, values, mask, gamma=0.95, lam=0.7, bootstrap_value=boot).returns
    np.testing.assert_allclose(got, gae_returns, rtol=1e-5, atol=1e-5)


def test_lambda_one_is_discounted_return():
    rewards, values, mask, boot = random_rows(3)
    got = lambda_returns(rewards, values, mask, gamma=0.9, lam=1.0, bootstrap_value=boot)
    want = discounted_returns(rewards, mask, gamma=0.9, bootstrap_value=boot)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def np_compose(outcome, process, efficiency, turn_mask, weights):
    out = weights[1] * process + weights[2] * efficiency
    for b in range(outcome.shape[0]):
        valid = np.nonzero(turn_mask[b])[0]
        if len(valid):
            out[b, valid[-1]] += weights[0] * outcome[b]
    return np.where(turn_mask, out, 0.0)


def test_compose_rewards(variant):
    rng = np.random.default_rng(0)
    outcome = rng.random(B).astype(np.float32)
    process = rng.normal(size=(B, S)).astype(np.float32)
    efficiency = -rng.random((B, S)).astype(np.float32)
    turn_mask = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0] * 6], bool)
    weights = (0.6, 0.3, 0.1)
    got = variant(compose_rewards, weights=weights)(outcome, process, efficiency, turn_mask)
    want = np_compose(outcome, process, efficiency, turn_mask, weights)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def np_prm(scores, turn_mask, form, temperature, gamma):
    out = np.zeros(scores.shape)
    for b in range(scores.shape[0]):
        idx = np.nonzero(turn_mask[b])[0]
        x = scores[b, idx].astype(np.float64)
        if form == "sum":
            r = x
        elif form == "potential":
            r = gamma * np.append(x[1:], 0.0) - x
        else:
            soft_min = []
            for k in range(len(x)):
                w = np.exp(-(x[k:] - x[k:].min()) / temperature)
                soft_min.append(np.sum(w / w.sum() * x[k:]))
            soft_min = np.append(soft_min, 0.0)
            r = soft_min[:-1] - soft_min[1:]
        out[b, idx] = r
    return out


@pytest.mark.parametrize("form", ["sum", "min", "potential"])
def test_prm_rewards_matches_numpy(variant, form):
    rng = np.random.default_rng(1)
    scores = rng.random((B, S)).astype(np.float32)
    turn_mask = np.array([[1, 1, 0, 1, 1, 0], [1] * 6, [1, 0, 0, 0, 0, 0]], bool)
    fn = variant(prm_rewards, form=form, temperature=0.3, gamma=0.9)
    got = fn(scores, turn_mask)
    want = np_prm(scores, turn_mask, form, 0.3, 0.9)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


_prm_potential = jax.jit(lambda s, m: prm_rewards(s, m, form="potential", gamma=1.0))
_prm_min = jax.jit(lambda s, m: prm_rewards(s, m, form="min", temperature=1e-3))
_scores = st.lists(st.floats(-1.0, 1.0, width=32), min_size=B * S, max_size=B * S)
_masks = st.lists(st.booleans(), min_size=B * S, max_size=B * S)


@settings(max_examples=25, deadline=None)
@given(_scores, _masks)
def test_potential_shaping_telescopes(scores, mask):
    scores = np.asarray(scores, np.float32).reshape(B, S)
    mask = np.asarray(mask).reshape(B, S)
    rewards = np.asarray(_prm_potential(scores, mask))
    first = np.array([scores[b, np.argmax(mask[b])] if mask[b].any() else 0.0 for b in range(B)])
    np.testing.assert_allclose(rewards.sum(axis=1), -first, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(_scores, _masks)
def test_min_form_return_tends_to_min_future_score(scores, mask):
    scores = np.asarray(scores, np.float32).reshape(B, S)
    mask = np.asarray(mask).reshape(B, S)
    rewards = np.asarray(_prm_min(scores, mask), np.float64)
    returns = np.cumsum(rewards[:, ::-1], axis=1)[:, ::-1]
    for b in range(B):
        for s in np.nonzero(mask[b])[0]:
            future_min = scores[b, s:][mask[b, s:]].min()
            # softmin-weighted mean lies in [min, min + T log n].
            assert future_min - 1e-5 <= returns[b, s] <= future_min + 1e-3 * np.log(S) + 1e-5


def test_bad_inputs_are_rejected():
    rewards, values, mask, boot = random_rows(0)
    with pytest.raises(AssertionError, match="rewards"):
        discounted_returns(rewards[0], mask[0], gamma=0.9)
    with pytest.raises(AssertionError, match="rewards"):
        discounted_returns(rewards.astype(np.int32), mask, gamma=0.9)
    with pytest.raises(AssertionError, match="mask"):
        discounted_returns(rewards, mask[:, :-1], gamma=0.9)
    with pytest.raises(AssertionError, match="mask"):
        discounted_returns(rewards, mask.astype(np.float32), gamma=0.9)
    with pytest.raises(AssertionError, match="bootstrap_value"):
        discounted_returns(rewards, mask, gamma=0.9, bootstrap_value=boot[:-1])
    with pytest.raises(AssertionError, match="values"):
        lambda_returns(rewards, values[:, :-1], mask, gamma=0.9, lam=0.9)
    scores = np.zeros((B, S), np.float32)
    with pytest.raises(ValueError, match="form"):
        prm_rewards(scores, scores > 0, form="max")
    with pytest.raises(ValueError, match="temperature"):
        prm_rewards(scores, scores > 0, form="min", temperature=0.0)
    with pytest.raises(AssertionError, match="efficiency"):
        compose_rewards(scores[:, 0], scores, scores[:, :-1], scores > 0)
    with pytest.raises(AssertionError, match="outcome"):
        compose_rewards(scores[:-1, 0], scores, scores, scores > 0)
    with pytest.raises(ValueError, match="weights"):
        compose_rewards(scores[:, 0], scores, scores, scores > 0, weights=(1.0, 0.0))


@pytest.mark.parametrize("length", [5, 32, 77])
def test_blocked_and_sequential_solves_agree_with_the_reference(length):
    """A static discount takes the blocked solve, a traced one the sequential scan."""
    rng = np.random.default_rng(length)
    rewards = rng.normal(size=(4, length)).astype(np.float32)
    values = rng.normal(size=(4, length)).astype(np.float32)
    mask = rng.random((4, length)) < 0.6
    mask[0] = True
    mask[1, : length // 2] = False
    boot = rng.normal(size=4).astype(np.float32)

    traced = jax.jit(
        lambda g, l: (
            discounted_returns(rewards, mask, gamma=g, bootstrap_value=boot),
            lambda_returns(rewards, values, mask, gamma=g, lam=l, bootstrap_value=boot),
        )
    )
    for gamma, lam in [(1.0, 1.0), (0.97, 0.9), (0.6, 0.5)]:
        blocked_disc = discounted_returns(rewards, mask, gamma=gamma, bootstrap_value=boot)
        blocked_lam = lambda_returns(
            rewards, values, mask, gamma=gamma, lam=lam, bootstrap_value=boot
        )
        scan_disc, scan_lam = traced(jnp.float32(gamma), jnp.float32(lam))
        ref_disc = np_discounted(rewards, mask, gamma, boot)
        ref_lam = np_lambda_returns(rewards, values, mask, gamma, lam, boot)
        for out in (blocked_disc, scan_disc):
            np.testing.assert_allclose(out, ref_disc, rtol=1e-5, atol=1e-5)
        for out in (blocked_lam, scan_lam):
            np.testing.assert_allclose(out, ref_lam, rtol=1e-5, atol=1e-5)
