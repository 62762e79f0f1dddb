"""Per-turn training rewards built from a trajectory's environment signals.

The environment reports, per turn, the sparse outcome, the oracle process verdict, the
efficiency signal and guardrail violations (see `rlagent.types.Trajectory`). Which of
them the learner sees is the experimental variable of sparse-vs-dense studies. Every
reward form is a weighted sum of a few per-turn *components*; the weights are data (a
`[C]` array in the runner state), so runs that differ only in their reward form share
one compiled program and train side by side under `vmap`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rlagent.returns import prm_rewards
from rlagent.train.config import REWARDS
from rlagent.train.config import TrainConfig
from rlagent.types import Trajectory

# Per-turn reward components, in the order of the weight vectors.
COMPONENTS = ("outcome", "process", "efficiency", "potential", "prm_min", "violations")

# Potential Phi_s = POTENTIAL_SCALE * (number of valid plan steps taken before turn s):
# one valid step is worth half the outcome, so shaping and outcome share one scale.
POTENTIAL_SCALE = 0.5


def reward_weights(config: TrainConfig, reward: str | None = None) -> np.ndarray:
    """`[C]` float32 weights of COMPONENTS for a reward form (default `config.reward`).

      outcome:   r_s = outcome_s (1 on the final turn of a solved episode).
      process:   r_s = verdict_s, the oracle process verdict in {-1, 0, +1}.
      composed:  w_o * outcome_s + w_p * verdict_s + w_e * efficiency_s, the mix of
                 `compose_rewards` with `config.reward_weights` (default 0.5 / 0.3 / 0.2).
      prm_sum:   outcome_s + prm_rewards(verdict, form="sum")_s.
      prm_min:   outcome_s + prm_rewards(verdict, form="min", temperature)_s.
      potential: outcome_s + gamma * Phi_{s+1} - Phi_s, Phi_s = progress before turn s
                 (Ng et al., 1999: leaves the optimal policy unchanged).
    Every form subtracts `config.violation_penalty` per guardrail violation.
    """
    reward = config.reward if reward is None else reward
    if reward not in REWARDS:
        raise ValueError(f"Unknown reward {reward!r}; expected one of {REWARDS}.")
    outcome_w, process_w, efficiency_w = config.reward_weights
    forms = {
        "outcome": {"outcome": 1.0},
        "process": {"process": 1.0},
        "composed": {"outcome": outcome_w, "process": process_w, "efficiency": efficiency_w},
        "prm_sum": {"outcome": 1.0, "process": 1.0},
        "prm_min": {"outcome": 1.0, "prm_min": 1.0},
        "potential": {"outcome": 1.0, "potential": 1.0},
    }
    weights = dict.fromkeys(COMPONENTS, 0.0)
    weights.update(forms[reward])
    weights["violations"] = -config.violation_penalty
    return np.asarray([weights[name] for name in COMPONENTS], np.float32)


def reward_components(trajectory: Trajectory, config: TrainConfig) -> jax.Array:
    """`[B, S, C]` float32 per-turn components (0 on unplayed turns), C = len(COMPONENTS)."""
    turn_mask = trajectory.turn_mask
    valid = turn_mask.astype(jnp.float32)
    verdict = trajectory.verdict * valid
    steps_done = jnp.cumsum(verdict > 0, axis=1) - (verdict > 0)
    potential = POTENTIAL_SCALE * steps_done.astype(jnp.float32)
    # A truncated row that the estimator bootstraps from V(s_S) ends in a non-terminal
    # state whose potential is that of every step taken; otherwise the episode's end is
    # terminal (Phi = 0) and the shaping telescopes to -Phi_0.
    final_potential = None
    if config.bootstrap_truncated:
        truncated = turn_mask[:, -1] & ~trajectory.done[:, -1]
        steps_total = POTENTIAL_SCALE * jnp.sum(verdict > 0, axis=1).astype(jnp.float32)
        final_potential = jnp.where(truncated, steps_total, 0.0)
    components = (
        trajectory.outcome,
        verdict,
        trajectory.efficiency,
        prm_rewards(
            potential,
            turn_mask,
            form="potential",
            gamma=config.gamma,
            final_potential=final_potential,
        ),
        prm_rewards(verdict, turn_mask, form="min", temperature=config.prm_temperature),
        trajectory.violations.astype(jnp.float32),
    )
    return jnp.stack([c * valid for c in components], axis=-1).astype(jnp.float32)


def turn_rewards(
    trajectory: Trajectory, config: TrainConfig, weights: jax.Array | None = None
) -> jax.Array:
    """Per-turn rewards `[B, S]` float32: `reward_components @ weights`.

    `weights` (`[C]`, e.g. traced from the runner state) default to
    `reward_weights(config)`.
    """
    if weights is None:
        weights = reward_weights(config)
    weights = jnp.asarray(weights, jnp.float32)
    if weights.shape != (len(COMPONENTS),):
        raise ValueError(f"weights must have shape ({len(COMPONENTS)},), got {weights.shape}.")
    return reward_components(trajectory, config) @ weights
