"""The long-horizon question: from a start with no success, does a reward with no oracle
anywhere reach the oracle verdict's success?

  python -m experiments.horizon_sweep --config=experiments/configs/horizon_no_oracle.py \
      --workdir=runs/horizon_no_oracle

The weak start of the horizon study's first run: every horizon warm-started on
demonstrations of 3-, 5- and 7-turn tasks only (0 sampled success at h = 12 and 16, where
the outcome reward gives no signal). Under token-level GAE (lambda 0.9, the estimator
that did best with the verdict from this start: 0.62 [0.32, 0.79] at h = 12), the oracle
verdict (`process`) against process rewards that read no oracle: the implicit PRM
(outcome labels only) and the MC-completion PRM (labels from the policy's own
continuations), both in potential form, and the outcome reward. Measured at 30ace1d: 903 s
on the 2-core CPU (docs/horizon_sweep.md, "The long-horizon question").

`--config=experiments/configs/horizon_no_oracle.py:heldout`: the same question at 20
paired seeds on held-out tasks, with the two no-oracle signals the first run left out
(declared before its run). Training and the warm start's demonstrations draw only the
training cells of ToolWorld's task generator (`env.task_split='train'`), the evaluation
after the last update only held-out ones (`eval.tasks='heldout'`), sampled and greedy.
Conditions, each from the same weak start per seed: the outcome reward and the oracle
verdict (token GAE, lambda 0.9, as above); PAV's progress PRM with the prover best-of-2
of the policy's own 4 continuations (`prm.prover_epsilon=0`, `prm.prover_best_of=2`: no
oracle anywhere, rlagent.prm.labels.best_of_k) and the implicit PRM, both in potential
form; and tree rollouts from forks under the outcome reward (`tree_grpo`, K = 2 leaves
branched at the policy's most surprising turn, TreeRL's choice, with Tree-GRPO's
within-tree baseline), which may find a first success where independent chains do not.
The MC-completion PRM is left out: its labels are the policy's own success rate, which
the best-of-2 prover bounds from above.

Family (pre-declared, `paired_to`): every condition against the outcome reward and every
no-oracle condition against the oracle verdict at its horizon (7 pairs per horizon, 14
per metric: held-out sampled success and AUC at equal turns), exact sign-flip test over
the 20 paired seeds, Holm within each metric's family (one sign in all 20 seeds: p =
2 / 2^20; x 14 = 3e-5). "Reaches the oracle's success" reads: the condition's held-out
sampled success minus the verdict's has a 95% paired CI that holds 0.
"""

import ml_collections

from experiments.configs import check_variant
from experiments.configs import horizon_sweep
from experiments.studies.envs import env_section

VARIANTS = ("heldout",)


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
    check_variant("horizon_no_oracle", variant, VARIANTS)
    config = horizon_sweep.get_config()
    config.horizons = "12,16"
    config.warm_start_horizons = "3,5,7"
    config.conditions = (
        "outcome,process,learned_potential/prm=implicit,learned_potential/prm=completion"
    )
    config.estimators = ""
    config.train.estimator = "gae_token"
    config.train.lam = 0.9
    if variant == "heldout":
        config.conditions = (
            "outcome,process,learned_potential/prm=progress,learned_potential/prm=implicit"
        )
        config.prm.prover_epsilon = 0.0
        config.prm.prover_best_of = 2
        config.estimators = "tree_grpo+tree_branch_at=surprisal"
        config.estimator_reward = "outcome"
        config.estimator_horizons = "12,16"
        config.train.tree_branches = 2
        config.paired_to = "process/gae_token"
        config.seeds = 20
        config.env = env_section("toolworld", task_split="train")
        config.eval.tasks = "heldout"
    return config
