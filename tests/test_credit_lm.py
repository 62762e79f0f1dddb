"""LM continuations from rollout carries (rlagent.credit.lm) and the in-training probe."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlagent.credit import lm
from rlagent.credit import mc
from rlagent.credit import probe as probe_lib
from rlagent.credit.probe import ProbeConfig
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import dsl
from rlagent.envs.toolworld import level_config
from rlagent.host.extras import trainer_extras
from rlagent.models import Policy
from rlagent.models import PolicyConfig
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_rollout
from rlagent.train import make_train
from rlagent.train.config import TrainConfig
from rlagent.train.rewards import reward_weights

B = 3
POLICY = PolicyConfig(
    vocab_size=dsl.VOCAB_SIZE,
    d_model=16,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    mlp_dim=32,
    summary_dim=16,
    num_summary_slots=1,
)
CONFIG = TrainConfig()
WEIGHTS = jnp.stack([reward_weights(CONFIG, form) for form in ("outcome", "process")])


@pytest.fixture(scope="module")
def env():
    return ToolWorld(level_config(2))


@functools.cache
def _greedy_batch(env, window):
    """Greedy rollout with carries and a jitted MC estimator of its LM continuations."""
    graphdef, params = nnx.split(Policy(POLICY, rngs=nnx.Rngs(0)))
    config = RolloutConfig(window=window, temperature=0.0, constrained=True)
    keys = jax.random.split(jax.random.key(0), 2 * B)
    traj, carries = jax.jit(make_rollout(env, graphdef, config, with_carries=True))(
        params, keys[:B], keys[B:]
    )

    @jax.jit
    def estimate(epsilon, key):
        play = lm.play_policy(env, graphdef, config, params, oracle_epsilon=epsilon)
        forks = lm.forks_from_carries(carries)
        return mc.mc_values(
            play,
            forks,
            mc.trajectory_signals(traj),
            key,
            num_samples=2,
            reward_weights=WEIGHTS,
            config=CONFIG,
            chunk_size=64,
        )

    return traj, carries, estimate


@pytest.mark.parametrize("window", [1, None])
def test_greedy_continuations_replay_the_episode(env, window):
    """Forks resume the policy's memory exactly: a greedy policy replays its own episode."""
    traj, _, estimate = _greedy_batch(env, window)
    out = estimate(0.0, jax.random.key(1))
    mask = np.asarray(traj.turn_mask)
    for f, reward in enumerate(("outcome", "verdict")):
        rewards = np.asarray(traj.signals[reward]) * mask
        to_go = np.flip(np.cumsum(np.flip(rewards, 1), 1), 1) * mask
        np.testing.assert_allclose(np.asarray(out.value[f]), to_go, atol=1e-6)
        np.testing.assert_allclose(np.asarray(out.q_value[f]), to_go, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(out.value_se), 0.0)


def test_prover_with_epsilon_one_is_the_oracle(env):
    traj, carries, estimate = _greedy_batch(env, 1)
    out = estimate(1.0, jax.random.key(1))
    oracle = mc.mc_values(
        mc.play_env_policy(env, mc.oracle(env)),
        lm.forks_from_carries(carries).env_state,
        mc.trajectory_signals(traj),
        jax.random.key(2),
        num_samples=2,
        reward_weights=WEIGHTS,
        config=CONFIG,
    )
    np.testing.assert_allclose(np.asarray(out.value), np.asarray(oracle.value))
    np.testing.assert_allclose(np.asarray(out.q_value), np.asarray(oracle.q_value))


def test_training_logs_credit_accuracy_every_k_updates(env):
    config = TrainConfig(
        num_updates=2,
        num_groups=2,
        group_size=2,
        num_epochs=1,
        num_minibatches=1,
    )
    rollout_config = RolloutConfig(window=1, constrained=True)
    probe = ProbeConfig(every=2, episodes=2, samples=2)
    trainer = make_train(
        config, env, POLICY, rollout_config,
        **trainer_extras(config, env, rollout_config, probe=probe),
    )  # fmt: skip
    _, metrics = jax.jit(trainer.train)(jax.random.key(0))
    turns = np.asarray(metrics["credit_num_turns"])
    assert turns[0] > 0 and np.isnan(turns[1])  # measured on update 0, not on update 1
    assert np.isfinite(np.asarray(metrics["credit_relative_variance"])[0])
    rmse = np.asarray(metrics["credit_value_rmse"])  # gae_turn trains a critic.
    assert rmse[0] >= abs(float(metrics["credit_value_bias"][0])) and np.isnan(rmse[1])
    cosine = np.asarray(metrics["credit_grad_cosine"])  # the shared trunk's two gradients.
    assert -1.0 <= cosine[0] <= 1.0 and cosine[0] != 0.0 and np.isnan(cosine[1])


def test_value_error_is_the_critic_minus_the_monte_carlo_value_on_played_turns():
    values = np.zeros((2, 3, 4), np.float32)  # [B, S, L]; V before a turn at its token 0.
    values[:, :, 0] = [[0.5, 0.2, 9.0], [1.0, 0.0, 0.0]]
    values[:, :, 1:] = 7.0  # other tokens' values are not read.
    mc_value = np.array([[0.0, 0.6, 0.0], [1.0, 0.0, 0.0]], np.float32)
    played = np.array([[True, True, False], [True, False, False]])
    zeros = np.zeros((2, 3), np.float32)
    prefix = mc.TurnSignals(played, {}, played, played)
    mc_values = mc.MCValues(*[zeros] * len(mc.MCValues._fields))._replace(value=mc_value)
    out = probe_lib._value_error(jnp.asarray(values), mc_values, prefix)
    errors = np.array([0.5, -0.4, 0.0])  # the 9.0 of an unplayed turn is left out.
    np.testing.assert_allclose(float(out["credit_value_rmse"]), np.sqrt(np.mean(errors**2)),
                               rtol=1e-6)  # fmt: skip
    np.testing.assert_allclose(float(out["credit_value_bias"]), errors.mean(), rtol=1e-6)
    assert all(np.isnan(float(x)) for x in probe_lib._value_error(None, None, None).values())


def test_only_the_measured_updates_trace_the_monte_carlo(env, monkeypatch):
    """Under vmap over runs, the updates between measurements must not hold the MC."""
    traced = []
    mc_values = mc.mc_values
    monkeypatch.setattr(mc, "mc_values", lambda *a, **k: traced.append(1) or mc_values(*a, **k))
    config = TrainConfig(num_groups=2, group_size=2)
    rollout_config = RolloutConfig(window=1, constrained=True)
    probe = ProbeConfig(every=2, episodes=2, samples=2)
    trainer = make_train(
        config, env, POLICY, rollout_config,
        **trainer_extras(config, env, rollout_config, probe=probe),
    )  # fmt: skip
    states = jax.vmap(trainer.init)(jax.random.split(jax.random.key(0), 2))
    jax.eval_shape(jax.vmap(trainer.update), states)
    assert not traced
    # Steps 1, 2, 3: a plain head, then one block whose first update (step 2) measures.
    _, metrics = jax.eval_shape(jax.vmap(lambda s: trainer.updates(s, 3, first_step=1)), states)
    assert len(traced) == 1
    assert metrics["credit_num_turns"].shape == (2, 3)
    plain = make_train(TrainConfig(num_groups=2, group_size=2), env, POLICY, RolloutConfig())
    with pytest.raises(ValueError, match="ProbeConfig with every > 0"):
        plain.update(states, measure_credit=True)


def test_probe_options_are_validated(env):
    small = TrainConfig(num_groups=2, group_size=2)
    with pytest.raises(ValueError, match=r"ProbeConfig.episodes .*batch_size=4"):
        trainer_extras(small, env, RolloutConfig(), probe=ProbeConfig(every=1, episodes=5))
    assert trainer_extras(small, env, RolloutConfig(), probe=ProbeConfig(episodes=5)) == {
        "prm": None,
        "credit_probe": None,
    }  # off: nothing built, nothing checked against the batch
    for field, value in (("every", -1), ("episodes", 0), ("samples", 1)):
        with pytest.raises(ValueError, match=f"ProbeConfig.{field}"):
            ProbeConfig(**{field: value})
    with pytest.raises(ValueError, match=r"Unknown ProbeConfig fields \['credit_every'\]"):
        ProbeConfig.from_mapping({"credit_every": 2})
