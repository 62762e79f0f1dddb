"""The implicit PRM (rlagent.prm.implicit): tiny policy, a tiny ToolWorld level-1 batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlagent.credit.accuracy import verdict_auroc
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import level_config
from rlagent.models import Policy
from rlagent.prm import PRMInputs
from rlagent.prm import make_implicit_prm
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_rollout
from rlagent.rollout import make_score

BATCH = 8
BETA = 0.5
LEARNING_RATE = 1e-2
ENV = ToolWorld(level_config(1, max_turns=4))
CONFIG = RolloutConfig(window=1, constrained=True)


@pytest.fixture(scope="module")
def setup(tiny_policy_config):
    """Two runs under jit(vmap): phi = the initial policy (run 0) and another init (run 1).

    Half of the episodes are marked successful at their first turn, whatever they did:
    the PRM only reads the labels, and a mixed batch is what it learns from. The returns
    `R_s = beta sum (log pi_phi - log pi_ref)` of run 1 are computed by hand with make_score.
    """
    graphdef, ref_params = nnx.split(Policy(tiny_policy_config(), rngs=nnx.Rngs(0)))
    _, other_params = nnx.split(Policy(tiny_policy_config(), rngs=nnx.Rngs(1)))
    keys = jax.random.split(jax.random.key(0), 2 * BATCH)
    traj = jax.jit(make_rollout(ENV, graphdef, CONFIG))(ref_params, keys[:BATCH], keys[BATCH:])
    success = jnp.arange(BATCH) % 2 == 0
    traj = traj._replace(success=jnp.zeros_like(traj.success).at[:, 0].set(success))
    score = make_score(ENV, graphdef, CONFIG)
    hand_returns = jax.jit(
        lambda: BETA * jnp.sum(score(other_params, traj)[0] - score(ref_params, traj)[0], axis=-1)
    )()
    prm = make_implicit_prm(ENV, graphdef, CONFIG, beta=BETA, learning_rate=LEARNING_RATE)
    inputs = PRMInputs(ref_params, ref_params, traj, None)
    return dict(
        prm=prm,
        scores=jax.jit(jax.vmap(prm.scores)),
        update=jax.jit(jax.vmap(prm.update)),
        graphdef=graphdef,
        states=_stack(*(prm.init(jax.random.key(0), p) for p in (ref_params, other_params))),
        inputs=_stack(inputs, inputs),
        keys=jax.random.split(jax.random.key(1), 2),
        traj=traj,
        success=np.asarray(success),
        hand_returns=hand_returns,
    )


def test_scores_start_at_one_half(setup):
    played = np.asarray(setup["traj"].turn_mask)
    scores = np.asarray(setup["scores"](setup["states"], setup["inputs"], setup["keys"]))
    assert scores.shape == (2, *played.shape) and scores.dtype == np.float32
    assert played.any() and not played.all()  # both kinds of turn are checked
    np.testing.assert_allclose(scores[0], np.where(played, 0.5, 0.0), atol=1e-6)
    _, metrics = setup["update"](setup["states"], setup["inputs"], setup["keys"])
    np.testing.assert_allclose(metrics["prm_loss"][0], np.log(2.0), rtol=1e-6)  # logit 0
    assert np.all(metrics["label_turns"] == 0) and np.all(np.isnan(metrics["label_auroc"]))


def test_turn_reward_is_beta_times_the_log_ratio(setup):
    traj, returns = setup["traj"], setup["hand_returns"]
    assert np.abs(np.asarray(returns)).max() > 0.1  # phi and ref differ
    scores = setup["scores"](setup["states"], setup["inputs"], setup["keys"])
    expected = jnp.where(traj.turn_mask, jax.nn.sigmoid(returns), 0.0)
    np.testing.assert_allclose(scores[1], expected, atol=1e-5)
    _, metrics = setup["update"](setup["states"], setup["inputs"], setup["keys"])
    # prm_auroc is that of the scores before the step (the batch is new to phi).
    auroc = verdict_auroc(expected, traj.turn_mask, traj.signals["verdict"])
    np.testing.assert_allclose(metrics["prm_auroc"][1], auroc, atol=1e-6)


def test_updates_fit_the_outcomes(setup):
    states, inputs, keys = setup["states"], setup["inputs"], setup["keys"]
    played, success = np.asarray(setup["traj"].turn_mask), setup["success"]
    losses, gaps = [], []
    for _ in range(6):
        scores = np.asarray(setup["scores"](states, inputs, keys))
        # R_s = logit(p_s); unplayed turns (p = 0) count as R = 0, p = 1/2.
        p = np.where(played, scores, 0.5)
        episode = np.sum(np.log(p) - np.log1p(-p), axis=-1)  # [2, B]
        gaps.append(episode[:, success].mean(-1) - episode[:, ~success].mean(-1))
        states, metrics = setup["update"](states, inputs, keys)
        losses.append(np.asarray(metrics["prm_loss"]))
    assert np.all(losses[-1] < losses[0] - 0.05), losses
    assert gaps[0][0] == pytest.approx(0.0, abs=1e-5)
    assert np.all(gaps[-1] > gaps[0] + 0.1), gaps


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(beta=0.0), "beta"),
        (dict(beta=-1.0), "beta"),
        (dict(learning_rate=0.0), "learning_rate"),
        (dict(learning_rate=-1e-3), "learning_rate"),
    ],
)
def test_bad_arguments(setup, kwargs, name):
    with pytest.raises(ValueError, match=name):
        make_implicit_prm(ENV, setup["graphdef"], CONFIG, **kwargs)


def _stack(*trees):
    """Runs along a new leading axis."""
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)
