"""What a process reward model (PRM) offers the trainer.

A PRM scores every played turn with `p_s`, its probability that turn s is a good step.
The trainer turns the scores into rewards with `rlagent.returns.prm_rewards` (the
`learned_*` reward forms of `rlagent.train.rewards`) and, between updates, lets the PRM
learn from the batch it just played (`update`). Kinds (`PRMConfig.kind`,
`rlagent.prm.config`):

  none:          no PRM (the oracle-verdict and outcome reward forms).
  noisy_oracle:  the oracle verdict as a binary label (verdict > 0), each flipped with
                 probability `PRMConfig.noise`: a PRM of known accuracy.
  completion:    a learned scorer trained on completion labels (Math-Shepherd): the
                 fraction of N policy continuations from after the step that succeed.
  progress:      a learned scorer trained on progress labels (PAV, Setlur et al. 2024):
                 the change in a prover's success probability caused by the step.
  implicit:      an implicit PRM (Yuan et al. 2024; PRIME): token rewards
                 beta * (log pi_phi - log pi_ref) from a model trained on outcomes only.
"""

from __future__ import annotations

# The interfaces the trainer accepts live with the trainer (it imports no PRM code).
from rlagent.train.extras import PRMInputs  # noqa: F401
from rlagent.train.extras import PRMState  # noqa: F401
from rlagent.train.extras import ProcessRewardModel  # noqa: F401

PRMS = ("none", "noisy_oracle", "completion", "progress", "implicit")
