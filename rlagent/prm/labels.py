"""Automatic step labels from Monte-Carlo continuations, and their quality.

Both label kinds read `rlagent.credit.mc.MCValues` (success probabilities estimated from N
continuations per fork), so their cost is that of the continuations played:

* Completion labels (Math-Shepherd, Wang et al. 2024): from the state after turn s,
  continuations by a *completer*; soft label = the fraction that succeed
  (`MCValues.q_success`), hard label = at least one succeeds.
* Progress labels (process advantage under a prover, PAV, Setlur et al. 2024): the
  change in the prover's success probability caused by the step,
  `Q_mu(s, a_s) - V_mu(s) = q_success - success` in [-1, 1], mapped to [0, 1] as
  `(1 + A_mu) / 2` so it trains a scorer with the same cross-entropy (`losses.prm_loss`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlagent.credit import accuracy as credit_accuracy
from rlagent.credit.mc import MCValues


def completion_labels(values: MCValues, turn_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(hard, soft)` completion labels `[B, S]` float32 in [0, 1]; 0 on unplayed turns."""
    soft = jnp.where(turn_mask, values.q_success, 0.0).astype(jnp.float32)
    hard = (soft > 0).astype(jnp.float32)
    return hard, soft


def progress_labels(values: MCValues, turn_mask: jax.Array) -> jax.Array:
    """`[B, S]` float32 progress labels `(1 + q_success - success) / 2`; 0 off `turn_mask`."""
    advantage = values.q_success - values.success
    return jnp.where(turn_mask, (1.0 + advantage) / 2.0, 0.0).astype(jnp.float32)


class LabelQuality(NamedTuple):
    """Step labels scored against the oracle verdict (turns with a non-zero verdict)."""

    accuracy: jax.Array  # fraction of turns where (label > threshold) == (verdict > 0).
    auroc: jax.Array  # verdict_auroc of the labels.
    num_turns: jax.Array  # turns with a non-zero verdict that were scored.


def label_quality(
    labels: jax.Array, turn_mask: jax.Array, verdict: jax.Array, *, threshold: float = 0.5
) -> LabelQuality:
    """Accuracy and AUROC of `[B, S]` labels in [0, 1] against the oracle verdict.

    Turns the oracle judged neutral (verdict 0) are left out of both; NaN when none is left.
    """
    judged = turn_mask & (verdict != 0)
    correct = ((labels > threshold) == (verdict > 0)) & judged
    count = jnp.sum(judged).astype(jnp.float32)
    accuracy = jnp.where(count > 0, jnp.sum(correct) / jnp.maximum(count, 1.0), jnp.nan)
    return LabelQuality(
        accuracy=accuracy.astype(jnp.float32),
        auroc=credit_accuracy.verdict_auroc(labels, turn_mask, verdict),
        num_turns=count,
    )
