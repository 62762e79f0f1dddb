"""What the trainer accepts as extras (`make_train(..., prm=, credit_probe=)`).

The trainer imports no PRM and no credit code: a process reward model (`rlagent.prm`) and
the in-training credit probe (`rlagent.credit.probe`) are built by their packages and
passed in as factories of the policy's graph definition, in the shape of Brax's
`train(..., network_factory, progress_fn)`. This module holds the interfaces they meet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
from flax import nnx

from rlagent.types import Trajectory


class PRMState(NamedTuple):
    """A PRM's learned state, carried in the trainer's RunnerState (one per run)."""

    params: Any  # the scorer's parameters (nnx.State); () when it learns nothing.
    opt_state: Any  # its optax state; () when it learns nothing.


class PRMInputs(NamedTuple):
    """What the trainer hands a PRM after a rollout."""

    policy_params: Any  # the current policy's parameters (nnx.State).
    ref_params: Any  # the frozen initial policy (the implicit PRM's reference).
    trajectory: Trajectory  # the batch just played, [B, S, ...].
    # Rollout carries at turn starts (make_rollout(with_carries=True)), from which MC
    # labels fork continuations; None when `ProcessRewardModel.needs_carries` is False.
    carries: Any | None
    # [B, S] the scores this batch's rewards used (`ProcessRewardModel.scores`, computed
    # before `update`), handed to `update` for its `prm_auroc`; None when scoring.
    scores: jax.Array | None = None


class ProcessRewardModel(NamedTuple):
    """Pure functions of one PRM (`rlagent.prm`)."""

    # init(key, initial policy params) -> PRMState.
    init: Callable[[jax.Array, Any], PRMState]
    # scores(state, inputs, key) -> [B, S] float32 in [0, 1], P(turn s is a good step);
    # 0 on unplayed turns. Not differentiated (the policy's rewards).
    scores: Callable[[PRMState, PRMInputs, jax.Array], jax.Array]
    # update(state, inputs, key) -> (state, metrics): one learning step on the batch;
    # metrics are float32 scalars: `label_turns` (environment turns its labels cost this
    # update, 0 without labels), `prm_loss` (before the step; NaN when it does not learn),
    # `prm_auroc` (`verdict_auroc` of `inputs.scores` on the turns it does not train on
    # this update) and `label_auroc` (`verdict_auroc` of its labels; NaN without labels).
    update: Callable[[PRMState, PRMInputs, jax.Array], tuple[PRMState, dict[str, jax.Array]]]
    needs_carries: bool  # whether `update` reads `PRMInputs.carries`.


class CreditProbe(NamedTuple):
    """Credit accuracy measured during training (`rlagent.credit.probe`)."""

    rollout: Callable[..., tuple[Trajectory, Any]]  # make_rollout(..., with_carries=True)
    # measure(params, carries, trajectory, advantages [B,S,L], reward_weights [C], key)
    measure: Callable[..., dict[str, jax.Array]]
    skipped: Callable[[], dict[str, jax.Array]]  # the same metrics, NaN (updates not measured)
    every: int  # >= 1: the updates at steps divisible by it measure (ProbeConfig.every).


# Factories of the extras, called by `make_train` with the policy's graph definition.
PRMFactory = Callable[[nnx.GraphDef], ProcessRewardModel]
ProbeFactory = Callable[[nnx.GraphDef], CreditProbe]
