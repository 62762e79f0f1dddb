"""Tests for rlagent.advantages against NumPy references written from the formulas."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from rlagent import gae
from rlagent import gigpo_advantages
from rlagent import grpo_advantages
from rlagent import hierarchical_advantages
from rlagent import reinforce_pp_returns
from rlagent import rloo_advantages
from rlagent import tokens_to_turns
from rlagent import turns_to_tokens
from rlagent import whiten

B, T, S, N = 3, 12, 4, 10


def np_plain_gae(rewards, values, boot, gamma, lam):
    """Textbook GAE on one unmasked sequence."""
    adv = np.zeros(len(rewards))
    next_values = np.append(values[1:], boot)
    running = 0.0
    for k in reversed(range(len(rewards))):
        delta = rewards[k] + gamma * next_values[k] - values[k]
        running = delta + gamma * lam * running
        adv[k] = running
    return adv


def np_bridged_gae(rewards, values, mask, gamma, lam, boot):
    """Plain GAE on the compressed sequence (the bridging invariant), scattered back."""
    adv = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        idx = np.nonzero(mask[b])[0]
        ends = np.append(idx[1:], rewards.shape[1])[: len(idx)]
        seg = np.array([rewards[b, i:end].sum() for i, end in zip(idx, ends, strict=True)])
        adv[b, idx] = np_plain_gae(seg, values[b, idx], boot[b], gamma, lam)
    return adv


def random_rows(seed, shape=(B, T)):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=shape).astype(np.float32)
    values = rng.normal(size=shape).astype(np.float32)
    mask = rng.random(shape) < 0.6
    boot = rng.normal(size=shape[:1]).astype(np.float32)
    return rewards, values, mask, boot


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 0.0), (1.0, 1.0)])
def test_gae_matches_compressed_numpy(variant, gamma, lam):
    rewards, values, mask, boot = random_rows(0)
    out = variant(gae, gamma=gamma, lam=lam)(rewards, values, mask, bootstrap_value=boot)
    want = np_bridged_gae(rewards, values, mask, gamma, lam, boot)
    np.testing.assert_allclose(out.advantages, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.returns, np.where(mask, want + values, 0), rtol=1e-5, atol=1e-5)
    assert out.advantages.dtype == jnp.float32 and out.returns.dtype == jnp.float32
    assert np.all(np.asarray(out.advantages)[~mask] == 0.0)
    assert np.all(np.asarray(out.returns)[~mask] == 0.0)


def test_gae_unmasked_equals_plain_gae_and_hand_case():
    rewards, values, _, boot = random_rows(1)
    out = gae(rewards, values, np.ones((B, T), bool), gamma=0.9, lam=0.8, bootstrap_value=boot)
    for b in range(B):
        want = np_plain_gae(rewards[b], values[b], boot[b], 0.9, 0.8)
        np.testing.assert_allclose(out.advantages[b], want, rtol=1e-5, atol=1e-5)
    # policy token (v=1), tool token carrying reward 2 (its value 9 is ignored), policy
    # token (v=0.5, reward 1); gamma=0.5, lam=1, terminal.
    out = gae(
        np.array([[0.0, 2.0, 1.0]], np.float32),
        np.array([[1.0, 9.0, 0.5]], np.float32),
        np.array([[True, False, True]]),
        gamma=0.5,
        lam=1.0,
    )
    # A_1 = 1 - 0.5; A_0 = 2 + 0.5 * 0.5 - 1 + 0.5 * 0.5
    np.testing.assert_allclose(out.advantages, [[1.5, 0.0, 0.5]])


_gae_jit = jax.jit(lambda r, v, m, b: gae(r, v, m, gamma=0.97, lam=0.9, bootstrap_value=b))
_floats = st.lists(st.floats(-3, 3, width=32), min_size=B * T, max_size=B * T)
_bools = st.lists(st.booleans(), min_size=B * T, max_size=B * T)


@settings(max_examples=30, deadline=None)
@given(_floats, _floats, _bools)
def test_gae_bridging_equals_gae_on_compressed_sequence(rewards, values, mask):
    rewards = np.asarray(rewards, np.float32).reshape(B, T)
    values = np.asarray(values, np.float32).reshape(B, T)
    mask = np.asarray(mask).reshape(B, T)
    boot = values[:, 0].copy()
    out = _gae_jit(rewards, values, mask, boot)
    want = np_bridged_gae(rewards, values, mask, 0.97, 0.9, boot)
    np.testing.assert_allclose(out.advantages, want, rtol=1e-4, atol=1e-4)


def test_turns_tokens_roundtrip(variant):
    rng = np.random.default_rng(0)
    turn_x = rng.normal(size=(B, S)).astype(np.float32)
    # Layout as produced by token_view: 1 observation token then 2 action tokens per turn.
    turn_ids = np.tile(np.array([-1, 0, 0, -1, 1, 1, -1, 2, 2, -1, 3, 3], np.int32), (B, 1))
    turn_ids[1, 10:] = -1  # row 1 never plays turn 3
    tokens = variant(turns_to_tokens, fill=-7.0)(turn_x, turn_ids)
    want = np.where(turn_ids >= 0, turn_x[np.arange(B)[:, None], np.maximum(turn_ids, 0)], -7.0)
    np.testing.assert_allclose(tokens, want)
    token_x = rng.normal(size=(B, T)).astype(np.float32)
    first = variant(tokens_to_turns, num_turns=S, position="first", fill=5.0)(token_x, turn_ids)
    last = variant(tokens_to_turns, num_turns=S, position="last", fill=5.0)(token_x, turn_ids)
    for b in range(B):
        for s in range(S):
            where = np.nonzero(turn_ids[b] == s)[0]
            assert first[b, s] == (token_x[b, where[0]] if len(where) else 5.0)
            assert last[b, s] == (token_x[b, where[-1]] if len(where) else 5.0)


def test_hierarchical_advantages(variant):
    rng = np.random.default_rng(2)
    turn_rewards = rng.normal(size=(B, S)).astype(np.float32)
    turn_values = rng.normal(size=(B, S)).astype(np.float32)
    turn_mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 1]], bool)
    turn_ids = np.tile(np.array([-1, 0, 0, -1, 1, 1, -1, 2, 2, -1, 3, 3], np.int32), (B, 1))
    turn_ids = np.where(turn_mask[np.arange(B)[:, None], np.maximum(turn_ids, 0)], turn_ids, -1)
    token_values = rng.normal(size=(B, T)).astype(np.float32)
    fn = variant(hierarchical_advantages, gamma=0.9, lam=0.8)
    plain = fn(turn_rewards, turn_values, turn_mask, turn_ids)
    based = fn(turn_rewards, turn_values, turn_mask, turn_ids, token_values=token_values)
    turn_adv = np_bridged_gae(turn_rewards, turn_values, turn_mask, 0.9, 0.8, np.zeros(B))
    np.testing.assert_allclose(plain.turn_advantages, turn_adv, rtol=1e-5, atol=1e-5)
    rows = np.arange(B)[:, None]
    safe_ids = np.maximum(turn_ids, 0)
    want_plain = np.where(turn_ids >= 0, turn_adv[rows, safe_ids], 0.0)
    np.testing.assert_allclose(plain.token_advantages, want_plain, rtol=1e-5, atol=1e-5)
    q = turn_adv + turn_values
    want_based = np.where(turn_ids >= 0, q[rows, safe_ids] - token_values, 0.0)
    np.testing.assert_allclose(based.token_advantages, want_based, rtol=1e-5, atol=1e-5)


def np_group_stats(scores, group_ids):
    groups = collections.defaultdict(list)
    for i, g in enumerate(group_ids):
        groups[g].append(scores[i])
    return {g: np.asarray(v, np.float64) for g, v in groups.items()}


GROUP_IDS = np.array([0, 0, 0, 1, 1, 2, 3, 3, 3, 3], np.int32)  # group 2 is a singleton


@pytest.mark.parametrize("scale", ["std", "none"])
def test_grpo_matches_numpy(variant, scale):
    scores = np.random.default_rng(0).normal(size=N).astype(np.float32)
    got = variant(grpo_advantages, num_groups=5, scale=scale)(scores, GROUP_IDS)
    groups = np_group_stats(scores, GROUP_IDS)
    for i, g in enumerate(GROUP_IDS):
        x = groups[g]
        want = 0.0 if len(x) == 1 else scores[i] - x.mean()
        if scale == "std" and len(x) > 1:
            want /= x.std(ddof=1) + 1e-6
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5)


def test_rloo_matches_numpy(variant):
    scores = np.random.default_rng(1).normal(size=N).astype(np.float32)
    got = variant(rloo_advantages, num_groups=5)(scores, GROUP_IDS)
    for i, g in enumerate(GROUP_IDS):
        others = [scores[j] for j in range(N) if GROUP_IDS[j] == g and j != i]
        want = scores[i] - np.mean(others) if others else 0.0
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5)


_grpo_jit = jax.jit(lambda s, g: grpo_advantages(s, g, num_groups=4, scale="std"))
_drgrpo_jit = jax.jit(lambda s, g: grpo_advantages(s, g, num_groups=4, scale="none"))
_rloo_jit = jax.jit(lambda s, g: rloo_advantages(s, g, num_groups=4))


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.floats(-5, 5, width=32), min_size=N, max_size=N),
    st.lists(st.integers(0, 3), min_size=N, max_size=N),
)
def test_group_advantages_sum_to_zero_per_group(scores, group_ids):
    scores = np.asarray(scores, np.float32)
    group_ids = np.asarray(group_ids, np.int32)
    for fn in (_grpo_jit, _drgrpo_jit, _rloo_jit):
        adv = np.asarray(fn(scores, group_ids))
        for g in range(4):
            members = group_ids == g
            assert abs(adv[members].sum()) < 1e-3 * max(1.0, np.abs(adv).max())
            if members.sum() == 1:
                assert adv[members][0] == 0.0


def np_discounted(rewards, mask, gamma):
    out = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        idx = np.nonzero(mask[b])[0]
        ends = np.append(idx[1:], rewards.shape[1])[: len(idx)]
        g = 0.0
        for i, end in reversed(list(zip(idx, ends, strict=True))):
            g = rewards[b, i:end].sum() + gamma * g
            out[b, i] = g
    return out


def test_reinforce_pp_does_not_reset_at_tool_output(variant):
    # Two policy turns separated by a tool output; reward only at the end of turn 2.
    mask = np.array([[True, True, False, False, True, True]] * 2)
    rewards = np.zeros((2, 6), np.float32)
    rewards[:, 5] = [1.0, -1.0]
    out = variant(reinforce_pp_returns, gamma=0.5)(rewards, mask)
    np.testing.assert_allclose(out.returns[0], [0.125, 0.25, 0, 0, 0.5, 1.0])
    returns = np_discounted(rewards, mask, 0.5)
    valid = returns[mask]
    want = np.where(mask, (returns - valid.mean()) / np.sqrt(valid.var() + 1e-8), 0.0)
    np.testing.assert_allclose(out.advantages, want, rtol=1e-5, atol=1e-5)


def test_whiten(variant):
    x = np.random.default_rng(3).normal(3.0, 2.0, size=(B, T)).astype(np.float32)
    mask = np.random.default_rng(4).random((B, T)) < 0.5
    got = np.asarray(variant(whiten)(x, mask))
    assert np.all(got[~mask] == 0.0)
    np.testing.assert_allclose(got[mask].mean(), 0.0, atol=1e-5)
    np.testing.assert_allclose(got[mask].std(), 1.0, rtol=1e-4)
    scaled = np.asarray(whiten(x, mask, shift_mean=False))
    np.testing.assert_allclose(scaled[mask], x[mask] / x[mask].std(), rtol=1e-4)


def np_gigpo(episode_returns, step_returns, anchor_ids, turn_mask, group_ids, omega, scale):
    def rel(x, members):
        if len(members) == 1:
            return {members[0]: 0.0}
        vals = np.array([x[m] for m in members], np.float64)
        denom = vals.std(ddof=1) + 1e-6 if scale == "std" else 1.0
        return {m: (x[m] - vals.mean()) / denom for m in members}

    episode = {}
    for g in set(group_ids.tolist()):
        episode.update(
            rel(episode_returns, [i for i in range(len(group_ids)) if group_ids[i] == g])
        )
    anchors = collections.defaultdict(list)
    for i in range(step_returns.shape[0]):
        for s in range(step_returns.shape[1]):
            if turn_mask[i, s]:
                anchors[(group_ids[i], anchor_ids[i, s])].append((i, s))
    step = {}
    for members in anchors.values():
        step.update(rel(step_returns, members))
    out = np.zeros(step_returns.shape)
    for (i, s), a in step.items():
        out[i, s] = episode[i] + omega * a
    return out


@pytest.mark.parametrize("scale", ["none", "std"])
def test_gigpo_matches_numpy(variant, scale):
    rng = np.random.default_rng(5)
    group_ids = np.array([0, 0, 0, 1, 1, 1], np.int32)
    episode_returns = rng.normal(size=6).astype(np.float32)
    step_returns = rng.normal(size=(6, S)).astype(np.float32)
    anchor_ids = rng.integers(0, 3, size=(6, S)).astype(np.int32)
    turn_mask = rng.random((6, S)) < 0.8
    fn = variant(gigpo_advantages, num_groups=2, omega=0.7, scale=scale)
    got = fn(episode_returns, step_returns, anchor_ids, turn_mask, group_ids)
    want = np_gigpo(episode_returns, step_returns, anchor_ids, turn_mask, group_ids, 0.7, scale)
    np.testing.assert_allclose(got.advantages, want, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(got.advantages)[~turn_mask] == 0.0)


def test_bad_inputs_are_rejected():
    rewards, values, mask, _ = random_rows(0)
    with pytest.raises(AssertionError, match="rewards"):
        gae(rewards[0], values[0], mask[0], gamma=0.9, lam=0.9)
    with pytest.raises(AssertionError, match="rewards"):
        gae(rewards.astype(np.int32), values, mask, gamma=0.9, lam=0.9)
    with pytest.raises(AssertionError, match="values"):
        gae(rewards, values[:, 1:], mask, gamma=0.9, lam=0.9)
    with pytest.raises(AssertionError, match="mask"):
        gae(rewards, values, mask[:, 1:], gamma=0.9, lam=0.9)
    scores = np.zeros(N, np.float32)
    with pytest.raises(ValueError, match="scale"):
        grpo_advantages(scores, GROUP_IDS, num_groups=5, scale="mad")
    with pytest.raises(AssertionError, match="group_ids"):
        grpo_advantages(scores, GROUP_IDS[:-1], num_groups=5)
    with pytest.raises(AssertionError, match="group_ids"):
        rloo_advantages(scores, GROUP_IDS.astype(np.float32), num_groups=5)
    with pytest.raises(AssertionError, match="scores"):
        rloo_advantages(GROUP_IDS, GROUP_IDS, num_groups=5)
    turn_ids = np.zeros((B, T), np.int32)
    with pytest.raises(ValueError, match="position"):
        tokens_to_turns(rewards, turn_ids, num_turns=S, position="middle")
    with pytest.raises(AssertionError, match="turn_ids"):
        turns_to_tokens(values[:, :S], turn_ids.astype(np.float32))
    with pytest.raises(AssertionError, match="anchor_ids"):
        gigpo_advantages(
            np.zeros(6, np.float32),
            np.zeros((6, S), np.float32),
            np.zeros((6, S), np.float32),
            np.ones((6, S), bool),
            np.zeros(6, np.int32),
            num_groups=1,
        )
