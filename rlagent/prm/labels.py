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
  With `best_of=K` the prover is best-of-K of the same continuations (PAV's `BoK(pi)`
  prover, no oracle anywhere): its success probability is estimated without bias from
  the N continuations by `best_of_k` (pass@K).
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


def progress_labels(
    values: MCValues, turn_mask: jax.Array, *, best_of: int = 1, num_samples: int | None = None
) -> jax.Array:
    """`[B, S]` float32 progress labels `(1 + q_success - success) / 2`; 0 off `turn_mask`.

    With `best_of=K > 1` both probabilities are those of best-of-K continuations
    (`best_of_k` of the `num_samples` continuations each was estimated from).
    """
    success, q_success = values.success, values.q_success
    if best_of > 1:
        if num_samples is None:
            raise ValueError("progress_labels(best_of > 1) needs num_samples (N of mc_values).")
        success = best_of_k(success, num_samples, best_of)
        q_success = best_of_k(q_success, num_samples, best_of)
    advantage = q_success - success
    return jnp.where(turn_mask, (1.0 + advantage) / 2.0, 0.0).astype(jnp.float32)


def best_of_k(p: jax.Array, num_samples: int, k: int) -> jax.Array:
    """P(at least one of K continuations succeeds), unbiased from the success fraction `p`
    of N = `num_samples` continuations (pass@K, Chen et al. 2021):
    `1 - C(N - c, K) / C(N, K)` with `c = p N` successes, for 1 <= K <= N: the traced
    twin of `rlagent.analysis.paired.pass_at_k` (host integers), elementwise on arrays."""
    if not 1 <= int(k) <= int(num_samples):
        raise ValueError(f"best_of_k needs 1 <= k <= num_samples, got k={k}, N={num_samples}.")
    failures = int(num_samples) - jnp.round(p * num_samples)
    none = jnp.ones_like(failures, jnp.float32)
    for i in range(int(k)):  # C(N - c, K) / C(N, K) = prod_i (N - c - i) / (N - i)
        none = none * jnp.maximum(failures - i, 0.0) / (num_samples - i)
    return (1.0 - none).astype(jnp.float32)


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
