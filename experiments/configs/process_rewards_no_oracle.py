"""Process rewards with no oracle anywhere in training: PAV's best-of-K prover, the
centred sum form.

Usage:
  python -m experiments.process_rewards --workdir=runs/process_rewards_no_oracle \
      --config=experiments/configs/process_rewards_no_oracle.py

The process-rewards study (experiments/configs/process_rewards.py: ToolWorld level 2,
5 seeds, 100 updates of 8 x 8 episodes, held-out evaluation after the last update) with
PRMs whose labels read no oracle: MC-completion (the policy's own continuations), PAV
progress with the prover best-of-2 of the policy's own 4 continuations
(`prm.prover_epsilon=0`, `prm.prover_best_of=2`, rlagent.prm.labels.best_of_k) and the
implicit PRM (outcomes only). Each in the sum form that collapsed in the study (every
step 2 p - 1 < 0 early in training) and the centred sum form `learned_centred` (2 (p -
the batch's mean score): an average step earns 0), PAV also in the potential form;
against the outcome reward and the oracle verdict's potential. The label-quality part is
cut to the policy completer (its oracle-based completers are the study's, not
training's).
"""

import ml_collections

from experiments.configs import process_rewards


def get_config() -> ml_collections.ConfigDict:
    config = process_rewards.get_config()
    config.conditions = ",".join(
        ["outcome", "potential"]
        + [f"{form}/prm={kind}" for kind in ("completion", "progress", "implicit")
           for form in ("learned_sum", "learned_centred")]
        + ["learned_potential/prm=progress"]
    )  # fmt: skip
    config.prm.prover_epsilon = 0.0
    config.prm.prover_best_of = 2
    config.labels.completers = "policy"
    config.labels.samples = "2,4"
    config.labels.seeds = 2
    return config
