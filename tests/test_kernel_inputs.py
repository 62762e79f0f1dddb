"""Kernel inputs that used to give silently wrong numbers: ranges, ids, edge values."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from rlagent import advantages
from rlagent import losses
from rlagent import returns

ROWS = jnp.array([[1.0, 0.0, 2.0], [0.5, 1.0, 0.0]])
MASK = jnp.array([[True, False, True], [True, True, False]])
SCORES = jnp.array([1.0, 2.0, 3.0, 5.0])


@pytest.mark.parametrize("ids", [[0, 0, 1, 2], [0, 0, -1, 1]], ids=["too_large", "negative"])
@pytest.mark.parametrize("kernel", ["grpo", "rloo", "gigpo"])
def test_group_ids_out_of_range(kernel, ids):
    ids = jnp.array(ids, jnp.int32)

    def run(group_ids, check_inputs=False):
        if kernel == "grpo":
            return advantages.grpo_advantages(
                SCORES, group_ids, num_groups=2, check_inputs=check_inputs
            )
        if kernel == "rloo":
            return advantages.rloo_advantages(
                SCORES, group_ids, num_groups=2, check_inputs=check_inputs
            )
        return advantages.gigpo_advantages(
            SCORES, jnp.zeros((4, 2)), jnp.zeros((4, 2), jnp.int32), jnp.ones((4, 2), bool),
            group_ids, num_groups=2, check_inputs=check_inputs,
        ).advantages  # fmt: skip

    with pytest.raises(ValueError, match=r"`group_ids` must lie in \[0, 2\)"):
        run(ids)  # concrete ids: checked at once.
    jax.jit(run)(ids)  # traced ids: the documented contract, no check ...
    error, _ = jax.jit(checkify.checkify(functools.partial(run, check_inputs=True)))(ids)
    with pytest.raises(checkify.JaxRuntimeError, match=r"`group_ids` must lie in \[0, 2\)"):
        error.throw()  # ... unless the checked variant is asked for.
    good = jnp.array([0, 0, 1, 1], jnp.int32)
    error, _ = jax.jit(checkify.checkify(functools.partial(run, check_inputs=True)))(good)
    error.throw()
    with pytest.raises(ValueError, match="num_groups"):
        advantages.grpo_advantages(SCORES, good, num_groups=0)


def test_tokens_to_turns_rejects_turn_ids_past_num_turns():
    token_x = jnp.arange(6.0).reshape(1, 6)
    turn_ids = jnp.array([[0, 0, -1, 1, 2, 2]], jnp.int32)
    with pytest.raises(ValueError, match=r"`turn_ids` must lie in \[-1, 2\)"):
        advantages.tokens_to_turns(token_x, turn_ids, num_turns=2)
    with pytest.raises(ValueError, match="num_turns"):
        advantages.tokens_to_turns(token_x, turn_ids, num_turns=0)
    checked = checkify.checkify(
        functools.partial(advantages.tokens_to_turns, num_turns=2, check_inputs=True)
    )
    error, _ = jax.jit(checked)(token_x, turn_ids)
    with pytest.raises(checkify.JaxRuntimeError, match="turn_ids"):
        error.throw()
    out = advantages.tokens_to_turns(token_x, turn_ids, num_turns=3)
    np.testing.assert_array_equal(out, [[0.0, 3.0, 4.0]])


NAN = float("nan")


@pytest.mark.parametrize(
    "name, value", [("gamma", 1.5), ("gamma", -0.1), ("lam", 1.01), ("gamma", NAN), ("lam", NAN)]
)
def test_discounts_outside_the_unit_interval(name, value):
    kwargs = {"gamma": 0.9, "lam": 0.95, name: value}
    with pytest.raises(ValueError, match=f"`{name}` must lie in"):
        advantages.gae(ROWS, ROWS, MASK, **kwargs)
    with pytest.raises(ValueError, match=f"`{name}` must lie in"):
        returns.lambda_returns(ROWS, ROWS, MASK, **kwargs)
    with pytest.raises(ValueError, match=f"`{name}` must lie in"):
        advantages.hierarchical_advantages(ROWS, ROWS, MASK, jnp.zeros((2, 3), jnp.int32), **kwargs)
    if name == "gamma":
        with pytest.raises(ValueError, match="`gamma` must lie in"):
            returns.discounted_returns(ROWS, MASK, gamma=value)
        with pytest.raises(ValueError, match="`gamma` must lie in"):
            returns.prm_rewards(ROWS, MASK, form="potential", gamma=value)
        with pytest.raises(ValueError, match="`gamma` must lie in"):
            advantages.reinforce_pp_returns(ROWS, MASK, gamma=value)


def test_loss_hyperparameters_out_of_range():
    logp = jnp.log(jnp.full((2, 3), 0.5))
    for kwargs in ({"clip_low": -0.2}, {"clip_high": -0.1}, {"dual_clip": 1.0}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            losses.ppo_policy_loss(logp, logp, ROWS, MASK, **kwargs)
    with pytest.raises(ValueError, match="`clip`"):
        losses.value_loss(ROWS, ROWS, ROWS, MASK, clip=-0.2)
    pair = jnp.array([-1.0, -2.0])
    for beta in (0.0, -1.0):
        for kind in ("sigmoid", "ipo", "hinge"):
            with pytest.raises(ValueError, match="`beta` must lie in"):
                losses.dpo_loss(pair, pair, pair, pair, beta=beta, kind=kind)
    with pytest.raises(ValueError, match="label_smoothing"):
        losses.dpo_loss(pair, pair, pair, pair, beta=0.1, label_smoothing=1.5)
    with pytest.raises(ValueError, match="`eps` must lie in"):
        advantages.whiten(ROWS, MASK, eps=-1e-8)
    with pytest.raises(ValueError, match="`eps` must lie in"):
        advantages.grpo_advantages(SCORES, jnp.array([0, 0, 1, 1]), num_groups=2, eps=-1.0)


@pytest.mark.parametrize("mode", losses.AGG_MODES)
def test_aggregate_of_an_empty_batch_is_zero(mode):
    empty = jnp.zeros((0, 4))
    assert float(losses.aggregate(empty, empty.astype(bool), mode)) == 0.0


def test_whiten_of_huge_values_does_not_overflow():
    mask = jnp.array([True, True, True, False])
    x = jnp.array([1.0, 2.0, 4.0, 7.0])
    expected = advantages.whiten(x, mask)
    # 5e37: the masked sum 7 * 5e37 overflows float32 (the rescaled-sum branch), and
    # max |x| = 2e38 >= 2^127 (the largest rescale).
    for scale in (1e20, 1e30, 2.0**100, 5e37):
        np.testing.assert_allclose(advantages.whiten(x * scale, mask), expected, rtol=1e-6)
    # Values that never overflowed give bit-identical results (a power-of-two rescale):
    # the formula without rescaling, op by op.
    x = jnp.array([0.3, -5.5, 1e3, 12.0])
    count = jnp.maximum(jnp.sum(mask), 1)
    mean = jnp.sum(jnp.where(mask, x, 0.0)) / count
    var = jnp.sum(jnp.where(mask, jnp.square(x - mean), 0.0)) / count
    unscaled = jnp.where(mask, (x - mean) * jax.lax.rsqrt(var + 1e-8), 0.0)
    np.testing.assert_array_equal(advantages.whiten(x, mask), unscaled)


def test_prm_min_form_with_a_traced_zero_temperature_is_the_hard_minimum():
    scores = jnp.array([[0.5, -1.0, 2.0, 0.0], [3.0, 1.0, 2.0, 4.0]])
    mask = jnp.array([[True, True, True, False], [True, False, True, True]])
    rewards = jax.jit(lambda t: returns.prm_rewards(scores, mask, form="min", temperature=t))(0.0)
    assert np.all(np.isfinite(rewards))
    # The return from turn s is the minimum of the valid future scores.
    to_go = np.cumsum(np.asarray(rewards)[:, ::-1], axis=1)[:, ::-1]
    np.testing.assert_allclose(to_go[0, :3], [-1.0, -1.0, 2.0])
    np.testing.assert_allclose(to_go[1, [0, 2, 3]], [2.0, 2.0, 4.0])
    soft = returns.prm_rewards(scores, mask, form="min", temperature=1e-3)
    np.testing.assert_allclose(rewards, soft, atol=1e-4)
    with pytest.raises(ValueError, match="`temperature` must lie in"):
        returns.prm_rewards(scores, mask, form="min", temperature=0.0)
