"""What the trainer skips for speed: the reference pass when no KL term reads it."""

import jax
import pytest

from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.envs.toolworld import dsl
from rlagent.models import PolicyConfig
from rlagent.rollout import RolloutConfig
from rlagent.train import TrainConfig
from rlagent.train.ppo import make_train

ENV = ToolWorld(ToolWorldConfig(level=1))
POLICY = PolicyConfig(vocab_size=dsl.VOCAB_SIZE, d_model=16, num_layers=1, num_heads=2,
                      num_kv_heads=1, mlp_dim=16, summary_dim=8, num_summary_slots=1)  # fmt: skip


@pytest.mark.parametrize(
    "kl, measured",
    [
        (dict(kl_placement="loss", kl_coef=0.0), False),
        (dict(kl_placement="none", kl_coef=0.1), False),
        (dict(kl_placement="loss", kl_coef=0.1), True),
        (dict(kl_placement="reward", kl_coef=0.0, kl_target=0.01), True),
    ],
)
def test_reference_pass_only_when_a_kl_term_reads_it(kl, measured):
    config = TrainConfig(num_groups=2, group_size=2, num_minibatches=1, **kl)
    trainer = make_train(config, ENV, POLICY, RolloutConfig(window=1))
    state = jax.eval_shape(trainer.init, jax.random.key(0))
    _, metrics = jax.eval_shape(trainer.update, state)
    assert ("kl_to_ref" in metrics) == measured
    assert ("kl_loss" in metrics) == (measured and config.kl_placement == "loss")
