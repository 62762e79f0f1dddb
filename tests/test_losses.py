"""Tests for rlagent.losses against NumPy references written from the formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from jax.test_util import check_grads

from rlagent import aggregate
from rlagent import dpo_loss
from rlagent import entropy
from rlagent import kl_penalty
from rlagent import ppo_policy_loss
from rlagent import prm_loss
from rlagent import value_loss

B, T = 3, 8
MASK = np.array([[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1], [0] * 8], bool)


def rows(seed, scale=0.3):
    rng = np.random.default_rng(seed)
    return [rng.normal(0, scale, size=(B, T)).astype(np.float32) for _ in range(3)]


def np_aggregate(x, mask, mode):
    x = np.where(mask, x, 0.0).astype(np.float64)
    tokens = mask.sum(1)
    rows = tokens > 0
    if mode == "token-mean":
        return x.sum() / max(mask.sum(), 1)
    if mode == "seq-mean-token-sum":
        return x.sum(1)[rows].mean()
    if mode == "seq-mean-token-mean":
        return (x.sum(1)[rows] / tokens[rows]).mean()
    return x.sum() / (x.shape[0] * x.shape[1])


MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("mode", MODES)
def test_aggregate(variant, mode):
    x = rows(0)[0]
    got = variant(aggregate, mode=mode)(x, MASK)
    np.testing.assert_allclose(got, np_aggregate(x, MASK, mode), rtol=1e-5)


def test_token_mean_masking_equals_slicing():
    x = rows(1)[0]
    got = aggregate(x, MASK, "token-mean")
    np.testing.assert_allclose(got, x[MASK].mean(), rtol=1e-5)


def np_ppo(logp, old, adv, mask, cl, ch, dual):
    ratio = np.exp(logp - old)
    loss = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - cl, 1 + ch))
    if dual is not None:
        loss = np.where(adv < 0, np.minimum(loss, -adv * dual), loss)
    return np_aggregate(loss, mask, "token-mean")


@pytest.mark.parametrize("dual_clip", [None, 1.5])
def test_ppo_policy_loss_matches_numpy(variant, dual_clip):
    logp, old, adv = rows(2, scale=0.5)
    adv = adv * 4
    fn = variant(ppo_policy_loss, clip_low=0.2, clip_high=0.28, dual_clip=dual_clip)
    loss, metrics = fn(logp, old, adv, MASK)
    np.testing.assert_allclose(loss, np_ppo(logp, old, adv, MASK, 0.2, 0.28, dual_clip), rtol=1e-5)
    ratio = np.exp(logp - old)
    np.testing.assert_allclose(metrics.ratio_mean, ratio[MASK].mean(), rtol=1e-5)
    k3 = np.exp(old - logp) - (old - logp) - 1
    np.testing.assert_allclose(metrics.approx_kl, k3[MASK].mean(), rtol=1e-4)
    assert 0.0 < float(metrics.clip_fraction) < 1.0


def test_ppo_policy_loss_grads():
    logp, old, adv = rows(3, scale=0.05)  # ratios stay inside the clip range
    for dual in (None, 3.0):
        fn = lambda lp, d=dual: ppo_policy_loss(lp, old, adv, MASK, dual_clip=d)[0]  # noqa: E731
        check_grads(fn, (logp,), order=1, modes=["rev"], atol=1e-2, rtol=1e-2)


_ppo_grad = jax.jit(
    jax.grad(lambda lp, old, adv: ppo_policy_loss(lp, old, adv, np.ones((B, T), bool))[0])
)
_vals = st.lists(st.floats(-1.0, 1.0, width=32), min_size=B * T, max_size=B * T)


@settings(max_examples=25, deadline=None)
@given(_vals, _vals, _vals)
def test_ppo_gradient_is_zero_where_ratio_is_clipped(logp, old, adv):
    logp, old, adv = (np.asarray(x, np.float32).reshape(B, T) for x in (logp, old, adv))
    grad = np.asarray(_ppo_grad(logp, old, adv))
    ratio = np.exp(logp.astype(np.float64) - old)
    clipped = ((adv > 0) & (ratio > 1.2 + 1e-4)) | ((adv < 0) & (ratio < 0.8 - 1e-4))
    assert np.all(grad[clipped] == 0.0)
    active = ~clipped & (np.abs(adv) > 1e-3) & (np.abs(ratio - 1.2) > 1e-4)
    active &= np.abs(ratio - 0.8) > 1e-4
    np.testing.assert_allclose(grad[active], (-adv * ratio / (B * T))[active], rtol=1e-3)


@pytest.mark.parametrize("clip", [None, 0.1])
def test_value_loss(variant, clip):
    values, old, returns = rows(4)
    got = variant(value_loss, clip=clip)(values, old, returns, MASK)
    err = (values - returns) ** 2
    if clip is not None:
        err = np.maximum(err, (old + np.clip(values - old, -clip, clip) - returns) ** 2)
    np.testing.assert_allclose(got, np_aggregate(0.5 * err, MASK, "token-mean"), rtol=1e-5)
    fn = lambda v: value_loss(v, old, returns, MASK, clip=clip)  # noqa: E731
    check_grads(fn, (values,), order=1, modes=["rev"], atol=1e-2, rtol=1e-2)


def test_kl_penalty(variant):
    logp, ref, _ = rows(5)
    d = logp.astype(np.float64) - ref
    want = {"k1": d, "abs": np.abs(d), "k2": 0.5 * d**2, "k3": np.exp(-d) + d - 1}
    for kind, expected in want.items():
        got = variant(kl_penalty, kind=kind)(logp, ref)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
        check_grads(lambda x, k=kind: kl_penalty(x, ref, k), (logp,), order=1, modes=["rev"])
    extreme = kl_penalty(np.array([-100.0, 100.0], np.float32), np.zeros(2, np.float32), "k3")
    assert np.all(np.isfinite(extreme)) and float(extreme.max()) == 10.0


_k3 = jax.jit(lambda a, b: kl_penalty(a, b, kind="k3"))


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(-50, 0, width=32), min_size=16, max_size=16),
    st.lists(st.floats(-50, 0, width=32), min_size=16, max_size=16),
)
def test_k3_is_nonnegative(logp, ref):
    assert np.all(np.asarray(_k3(np.float32(logp), np.float32(ref))) >= 0.0)


def test_entropy(variant):
    logits = np.random.default_rng(6).normal(size=(B, T, 5)).astype(np.float32)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(variant(entropy)(logits), -(p * np.log(p)).sum(-1), rtol=1e-5)
    check_grads(entropy, (logits,), order=1, modes=["rev"], atol=1e-2, rtol=1e-2)
    # A token removed by constrained decoding (-inf logit) contributes nothing.
    masked = logits.copy()
    masked[..., 0] = -np.inf
    np.testing.assert_allclose(entropy(masked), entropy(logits[..., 1:]), rtol=1e-5)
    grad = jax.grad(lambda x: entropy(x).sum())(jnp.asarray(masked))
    assert np.all(np.isfinite(grad))


@pytest.mark.parametrize("kind", ["sigmoid", "ipo", "hinge"])
def test_dpo_loss(variant, kind):
    rng = np.random.default_rng(7)
    pc, pr, rc, rr = (rng.normal(-5, 1, size=6).astype(np.float32) for _ in range(4))
    out = variant(dpo_loss, beta=0.5, kind=kind, label_smoothing=0.1)(pc, pr, rc, rr)
    h = (pc - pr) - (rc - rr).astype(np.float64)

    def log_sigmoid(z):
        return -np.log1p(np.exp(-z))

    want = {
        "sigmoid": -0.9 * log_sigmoid(0.5 * h) - 0.1 * log_sigmoid(-0.5 * h),
        "ipo": (h - 1.0) ** 2,
        "hinge": np.maximum(0.0, 1 - 0.5 * h),
    }[kind]
    np.testing.assert_allclose(out.losses, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.chosen_rewards, 0.5 * (pc - rc), rtol=1e-5)
    np.testing.assert_allclose(out.rejected_rewards, 0.5 * (pr - rr), rtol=1e-5)
    if kind != "hinge":  # the hinge has a kink
        fn = lambda a, b: dpo_loss(a, b, rc, rr, beta=0.5, kind=kind).losses  # noqa: E731
        check_grads(fn, (pc, pr), order=1, modes=["rev"], atol=1e-2, rtol=1e-2)


def test_prm_loss(variant):
    rng = np.random.default_rng(8)
    logits = rng.normal(size=(B, T)).astype(np.float32)
    labels = rng.random((B, T)).astype(np.float32)  # soft labels
    got = variant(prm_loss)(logits, labels, MASK)
    p = 1 / (1 + np.exp(-logits.astype(np.float64)))
    bce = -(labels * np.log(p) + (1 - labels) * np.log(1 - p))
    np.testing.assert_allclose(got, bce[MASK].mean(), rtol=1e-5)
    check_grads(lambda z: prm_loss(z, labels, MASK), (logits,), order=1, modes=["rev"])


def test_bad_inputs_are_rejected():
    logp, old, adv = rows(9)
    with pytest.raises(ValueError, match="agg"):
        ppo_policy_loss(logp, old, adv, MASK, agg="mean")
    with pytest.raises(ValueError, match="agg"):
        aggregate(logp, MASK, "sum")
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_policy_loss(logp, old, adv, MASK, dual_clip=0.5)
    with pytest.raises(AssertionError, match="advantages"):
        ppo_policy_loss(logp, old, adv[:, 1:], MASK)
    with pytest.raises(AssertionError, match="logp"):
        ppo_policy_loss(logp[0], old[0], adv[0], MASK[0])
    with pytest.raises(AssertionError, match="mask"):
        value_loss(logp, old, adv, MASK.astype(np.int32))
    with pytest.raises(ValueError, match="kind"):
        kl_penalty(logp, old, "k4")
    with pytest.raises(AssertionError, match="ref_logp"):
        kl_penalty(logp, old.astype(np.int32), "k1")
    with pytest.raises(ValueError, match="kind"):
        dpo_loss(logp[0], old[0], adv[0], adv[0], beta=0.1, kind="orpo")
    with pytest.raises(AssertionError, match="labels"):
        prm_loss(logp, MASK.astype(np.int32), MASK)
    with pytest.raises(AssertionError, match="logits"):
        entropy(np.zeros((2, 3), np.int32))
