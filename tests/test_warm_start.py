"""Behaviour cloning of oracle demonstrations before RL (rlagent.pipeline.warm_start)."""

import jax
import pytest

from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import horizon_config
from rlagent.pipeline.warm_start import WarmStartConfig
from rlagent.pipeline.warm_start import make_oracle_log_likelihood
from rlagent.pipeline.warm_start import make_warm_start
from rlagent.rollout import RolloutConfig
from rlagent.train.config import TrainConfig
from rlagent.train.ppo import make_train


def test_warm_start_raises_the_oracle_log_likelihood(tiny_policy_config):
    env = ToolWorld(horizon_config(3))
    rollout_config = RolloutConfig(window=1, constrained=True)
    trainer = make_train(TrainConfig(), env, tiny_policy_config(), rollout_config)
    params = trainer.init(jax.random.key(0)).params
    clone = make_warm_start(
        WarmStartConfig(steps=10, batch_size=4), [env], trainer.graphdef, rollout_config
    )
    cloned, losses = jax.jit(clone)(params, jax.random.key(1))
    likelihood = jax.jit(
        make_oracle_log_likelihood(env, trainer.graphdef, rollout_config), static_argnums=2
    )
    before = float(likelihood(params, jax.random.key(2), 8))
    after = float(likelihood(cloned, jax.random.key(2), 8))
    assert losses.shape == (10,) and float(losses[-1]) < float(losses[0])
    assert after > before + 1.0
    with pytest.raises(ValueError, match="steps"):
        WarmStartConfig(steps=-1)
