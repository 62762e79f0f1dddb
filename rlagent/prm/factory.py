"""`make_prm`: the process reward model of a `TrainConfig.prm` kind."""

from __future__ import annotations

from collections.abc import Callable

from flax import nnx

from rlagent.envs.base import Environment
from rlagent.prm.base import ProcessRewardModel
from rlagent.prm.implicit import make_implicit_prm
from rlagent.prm.learned import make_learned_prm
from rlagent.prm.learned import make_noisy_oracle
from rlagent.rollout import RolloutConfig
from rlagent.train.config import TrainConfig

# kind -> factory(config, env, graphdef, rollout_config); "none" builds nothing.
FACTORIES: dict[
    str, Callable[[TrainConfig, Environment, nnx.GraphDef, RolloutConfig], ProcessRewardModel]
] = {
    "noisy_oracle": lambda config, env, graphdef, rollout_config: make_noisy_oracle(config, env),
    "completion": make_learned_prm,
    "progress": make_learned_prm,
    "implicit": lambda config, env, graphdef, rollout_config: make_implicit_prm(
        env, graphdef, rollout_config, beta=config.prm_beta, learning_rate=config.prm_learning_rate
    ),
}


def prm_factory(
    config: TrainConfig, env: Environment, rollout_config: RolloutConfig
) -> Callable[[nnx.GraphDef], ProcessRewardModel] | None:
    """`make_train(prm=)` for `config.prm` (None for "none"); an unknown kind is refused
    here, before anything is built."""
    if config.prm == "none":
        return None
    _check_kind(config)
    return lambda graphdef: make_prm(config, env, graphdef, rollout_config)


def _check_kind(config: TrainConfig) -> None:
    if config.prm not in FACTORIES:
        raise ValueError(
            f"TrainConfig.prm {config.prm!r} has no process reward model to build; "
            f"expected one of {('none', *FACTORIES)}."
        )


def make_prm(
    config: TrainConfig, env: Environment, graphdef: nnx.GraphDef, rollout_config: RolloutConfig
) -> ProcessRewardModel:
    """The PRM of `config.prm` for a `Policy(graphdef)` rolled out in `env`."""
    _check_kind(config)
    return FACTORIES[config.prm](config, env, graphdef, rollout_config)
