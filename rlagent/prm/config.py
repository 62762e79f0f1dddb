"""`PRMConfig`: which process reward model a run trains with, and its settings.

The PRM's fields live with the PRMs (as Tunix's algorithm configs live with their
algorithms), apart from the trainer's `TrainConfig`; experiments set them in their own
`prm` config section (`--config.prm.kind=implicit`). Checks that read another config
(episodes labelled vs the batch, a PRM beside the credit probe) are made where the
configs meet: `rlagent.host.extras.trainer_extras`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rlagent.prm.base import PRMS
from rlagent.train.config import check_fields


@dataclasses.dataclass(frozen=True)
class PRMConfig:
    """A process reward model (`rlagent.prm`) whose scores the `learned_*` reward forms
    read; `kind="none"` builds and traces none."""

    kind: str = "none"  # one of PRMS.
    noise: float = 0.0  # noisy_oracle: probability that a verdict label is flipped.
    # completion / progress: episodes of each batch labelled by Monte-Carlo continuations
    # (the scorer trains on them; prm_auroc is measured on the others; at most
    # TrainConfig.batch_size) and continuations per label.
    label_episodes: int = 8
    label_samples: int = 4
    # progress: the prover is the current policy, replaced per continuation by the oracle
    # with this probability (credit.lm.play_policy(oracle_epsilon=)).
    prover_epsilon: float = 0.5
    # progress: the prover is best-of-K of those continuations (1 = the continuations
    # themselves; K <= label_samples). With prover_epsilon = 0, PAV's BoK(pi) prover: no
    # oracle anywhere (labels.best_of_k).
    prover_best_of: int = 1
    learning_rate: float = 1e-3  # AdamW step size of a learned scorer / implicit model.
    beta: float = 0.05  # implicit: beta of the token rewards beta (log pi_phi - log pi_ref).

    def __post_init__(self):
        if self.kind not in PRMS:
            raise ValueError(f"Unknown PRMConfig.kind {self.kind!r}; expected one of {PRMS}.")
        if not 0.0 <= self.noise <= 0.5:
            raise ValueError(f"PRMConfig.noise must be in [0, 0.5], got {self.noise}.")
        for name in ("label_episodes", "label_samples"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"PRMConfig.{name} must be >= 1, got {getattr(self, name)}.")
        if not 0.0 <= self.prover_epsilon <= 1.0:
            raise ValueError(
                f"PRMConfig.prover_epsilon must be in [0, 1], got {self.prover_epsilon}."
            )
        if not 1 <= int(self.prover_best_of) <= int(self.label_samples):
            raise ValueError(
                "PRMConfig.prover_best_of must be in [1, label_samples = "
                f"{self.label_samples}] (best of K of the label's continuations), got "
                f"{self.prover_best_of}."
            )
        for name in ("learning_rate", "beta"):
            if not getattr(self, name) > 0:
                raise ValueError(f"PRMConfig.{name} must be > 0, got {getattr(self, name)}.")

    @property
    def labels(self) -> bool:
        """Whether this PRM learns from Monte-Carlo labels of `label_episodes` episodes."""
        return self.kind in ("completion", "progress")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> PRMConfig:
        """Builds a config from a dict / ConfigDict, rejecting unknown field names."""
        check_fields(cls, values)
        return cls(**dict(values))
