"""Per-turn training rewards built from a trajectory's environment signals.

The environment reports, per turn, the sparse outcome, the oracle process verdict, the
efficiency signal and guardrail violations (see `rlagent.types.Trajectory`). Which of
them the learner sees is the experimental variable of sparse-vs-dense studies, so it is
chosen here by `TrainConfig.reward` and nowhere else.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlagent.returns import compose_rewards
from rlagent.returns import prm_rewards
from rlagent.train.config import TrainConfig
from rlagent.types import Trajectory

# Potential Phi_s = POTENTIAL_SCALE * (number of valid plan steps taken before turn s):
# one valid step is worth as much as the outcome of a two-step task, so shaping and
# outcome live on one scale.
POTENTIAL_SCALE = 0.5


def turn_rewards(trajectory: Trajectory, config: TrainConfig) -> jax.Array:
    """Returns the per-turn reward `[B, S]` float32 (0 on unplayed turns).

    Forms (`config.reward`):
      outcome:   r_s = outcome_s (1 on the final turn of a solved episode).
      process:   r_s = verdict_s, the oracle process verdict in {-1, 0, +1}.
      composed:  compose_rewards(outcome, verdict, efficiency, weights).
      prm_sum:   r_s = outcome_s + prm_rewards(verdict, form="sum").
      prm_min:   r_s = outcome_s + prm_rewards(verdict, form="min", temperature).
      potential: r_s = outcome_s + gamma * Phi_{s+1} - Phi_s, Phi_s = progress before s
                 (Ng et al., 1999: leaves the optimal policy unchanged).
    Every form subtracts `violation_penalty` per guardrail violation.
    """
    turn_mask = trajectory.turn_mask
    valid = turn_mask.astype(jnp.float32)
    outcome = trajectory.outcome * valid
    verdict = trajectory.verdict * valid
    if config.reward == "outcome":
        rewards = outcome
    elif config.reward == "process":
        rewards = verdict
    elif config.reward == "composed":
        rewards = compose_rewards(
            outcome.sum(axis=1),
            verdict,
            trajectory.efficiency * valid,
            turn_mask,
            weights=config.reward_weights,
        )
    elif config.reward == "prm_sum":
        rewards = outcome + prm_rewards(verdict, turn_mask, form="sum")
    elif config.reward == "prm_min":
        rewards = outcome + prm_rewards(
            verdict, turn_mask, form="min", temperature=config.prm_temperature
        )
    elif config.reward == "potential":
        steps_done = jnp.cumsum(verdict > 0, axis=1) - (verdict > 0)
        potential = POTENTIAL_SCALE * steps_done.astype(jnp.float32)
        rewards = outcome + prm_rewards(potential, turn_mask, form="potential", gamma=config.gamma)
    else:  # TrainConfig validates the name; keep the error for direct callers.
        raise ValueError(f"Unknown reward {config.reward!r}.")
    penalty = config.violation_penalty * trajectory.violations.astype(jnp.float32)
    return ((rewards - penalty) * valid).astype(jnp.float32)
