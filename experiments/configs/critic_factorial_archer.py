"""ArCHer's claim with the critics that rescue turn-level GAE: token- against turn-level
credit under the process verdict, with the shared, separate and return-normalised critic.

Usage (two runs on the same machine and commit; their seeds share the warm start, so
the analysis pairs them by seed):
  python -m experiments.critic_factorial --workdir=runs/critic_factorial_archer_turn \
      --config=experiments/configs/critic_factorial_archer.py:turn
  python -m experiments.critic_factorial --workdir=runs/critic_factorial_archer_token \
      --config=experiments/configs/critic_factorial_archer.py:token
  python -m experiments.analyses.critic_factorial_archer \
      runs/critic_factorial_archer_turn runs/critic_factorial_archer_token

The 20-seed horizon study (configs/horizon_estimators_heldout.py) found token-level GAE
(lambda 0.9) ahead of turn-level GAE under the verdict with the critic on the policy's
trunk (h = 12: +0.196 [+0.141, +0.246], p_holm 1.2e-4), so ArCHer's claim (a turn-level
critic beats token-level credit) did not hold there; the critic factorial then found
that a separate or return-normalised critic lifts turn GAE under the verdict (0.85 /
0.93 at h = 12), but ran turn GAE only, so docs/papers.md reads "cannot tell" for those
critics. Here, declared before the run: the critic factorial's three critics (shared,
separate, normalized) x the process verdict x h = 12, 20 seeds, 60 updates of 8 x 8
episodes, ToolWorld's task split (training and the warm start's demonstrations on the
training cells, the evaluation on 64 held-out-task episodes, sampled and greedy), once
with turn-level GAE (`:turn`, the factorial's estimator) and once with token-level GAE
at lambda 0.9 (`:token`, the horizon study's).

Family (pre-declared; the analysis script): per critic, token minus turn GAE in held-out
sampled success and in AUC at equal environment turns, paired over the 20 seeds (exact
sign-flip test, Holm over the 6 comparisons). ArCHer's claim holds for a critic if turn
beats token there (rejecting), does not hold if token beats turn, and cannot be told
otherwise.
"""

import ml_collections

from experiments.configs import check_variant
from experiments.configs import critic_factorial
from experiments.studies.envs import env_section

# Variant: the estimator of every run (TrainConfig fields).
VARIANTS = {"turn": {"estimator": "gae_turn"}, "token": {"estimator": "gae_token", "lam": 0.9}}


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
    check_variant("critic_factorial_archer", variant, VARIANTS, required=True)
    config = critic_factorial.get_config()
    config.horizons = "12"
    config.conditions = "process"
    config.seeds = 20
    config.env = env_section("toolworld", task_split="train")
    config.eval.tasks = "heldout"
    for field, value in VARIANTS[variant].items():
        config.train[field] = value
    return config
