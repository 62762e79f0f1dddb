"""What a process reward model (PRM) offers the trainer.

A PRM scores every played turn with `p_s`, its probability that turn s is a good step.
The trainer turns the scores into rewards with `rlagent.returns.prm_rewards` (the
`learned_*` reward forms of `rlagent.train.rewards`) and, between updates, lets the PRM
learn from the batch it just played (`update`). Kinds (`TrainConfig.prm`):

  none:          no PRM (the oracle-verdict and outcome reward forms).
  noisy_oracle:  the oracle verdict as a binary label (verdict > 0), each flipped with
                 probability `TrainConfig.prm_noise`: a PRM of known accuracy.
  completion:    a learned scorer trained on completion labels (Math-Shepherd): the
                 fraction of N policy continuations from after the step that succeed.
  progress:      a learned scorer trained on progress labels (PAV, Setlur et al. 2024):
                 the change in a prover's success probability caused by the step.
  implicit:      an implicit PRM (Yuan et al. 2024; PRIME): token rewards
                 beta * (log pi_phi - log pi_ref) from a model trained on outcomes only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax

from rlagent.types import Trajectory

PRMS = ("none", "noisy_oracle", "completion", "progress", "implicit")


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
    """Pure functions of one PRM kind (see the module docstring)."""

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
