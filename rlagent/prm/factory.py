"""`make_prm`: the process reward model of a `PRMConfig`."""

from __future__ import annotations

from collections.abc import Callable

from flax import nnx

from rlagent.envs.base import Environment
from rlagent.prm.base import ProcessRewardModel
from rlagent.prm.config import PRMConfig
from rlagent.prm.implicit import make_implicit_prm
from rlagent.prm.learned import make_learned_prm
from rlagent.prm.learned import make_noisy_oracle
from rlagent.rollout import RolloutConfig
from rlagent.train.config import TrainConfig

# kind -> factory(prm, config, env, graphdef, rollout_config); "none" builds nothing.
FACTORIES: dict[
    str,
    Callable[
        [PRMConfig, TrainConfig, Environment, nnx.GraphDef, RolloutConfig], ProcessRewardModel
    ],
] = {
    "noisy_oracle": lambda prm, config, env, graphdef, rollout_config: make_noisy_oracle(prm, env),
    "completion": make_learned_prm,
    "progress": make_learned_prm,
    "implicit": lambda prm, config, env, graphdef, rollout_config: make_implicit_prm(
        env, graphdef, rollout_config, beta=prm.beta, learning_rate=prm.learning_rate
    ),
}


def prm_factory(
    prm: PRMConfig, config: TrainConfig, env: Environment, rollout_config: RolloutConfig
) -> Callable[[nnx.GraphDef], ProcessRewardModel] | None:
    """`make_train(prm=)` for `prm.kind` (None for "none") of a run of `config`; a kind
    without a model is refused here, before anything is built."""
    if prm.kind == "none":
        return None
    _check_kind(prm)
    return lambda graphdef: make_prm(prm, config, env, graphdef, rollout_config)


def _check_kind(prm: PRMConfig) -> None:
    if prm.kind not in FACTORIES:
        raise ValueError(
            f"PRMConfig.kind {prm.kind!r} has no process reward model to build; "
            f"expected one of {tuple(FACTORIES)}."
        )


def make_prm(
    prm: PRMConfig,
    config: TrainConfig,
    env: Environment,
    graphdef: nnx.GraphDef,
    rollout_config: RolloutConfig,
) -> ProcessRewardModel:
    """The PRM of `prm.kind` for a `Policy(graphdef)` rolled out in `env`, trained with
    `config` (its batch size, and the reward settings its Monte-Carlo labels use)."""
    _check_kind(prm)
    return FACTORIES[prm.kind](prm, config, env, graphdef, rollout_config)
