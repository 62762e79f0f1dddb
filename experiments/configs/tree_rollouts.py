"""Tree rollouts from forks as a training estimator, against GRPO, GiGPO and turn GAE.

Usage:
  python -m experiments.horizon_sweep --workdir=runs/tree_rollouts \
      --config=experiments/configs/tree_rollouts.py

Budget: the horizon sweep (experiments/configs/horizon_sweep.py: 60 updates of 8 tasks
x 8 episodes, each horizon warm-started on its own tasks, held-out evaluation after the
last update) under the sparse outcome reward at horizons 8 and 12, 10 seeds, with turn
GAE (the reference; a critic on the shared trunk), GRPO (episode groups of 8), GiGPO
(episode plus anchor-state step groups) and Tree-GRPO (`tree_grpo`,
rlagent.train.tree: each group of 8 leaves is 4 root episodes of the task, each branched
at a uniformly drawn played turn into 2 leaves; the within-tree baseline on the turns
after the branch, the group baseline on every turn). Every estimator trains on 64
episodes per update; the tree's siblings replay no prefix, so it plays fewer
environment turns per update, and `auc` (training success over the horizon's common
budget of environment turns) is the equal-turn comparison. Expected time: about 45 min on
the 2-core CPU alone.

`--config=experiments/configs/tree_rollouts.py:k4_surprisal`: the follow-up on the same
seeds, turn GAE, GRPO (the pairing reference) and Tree-GRPO (K = 2, uniform) again
beside trees of K = 4 leaves branched uniformly, of K = 2 branched at the most
surprising turn (TreeRL's choice), and of K = 4 at the most surprising turn
(`+field=value` estimator options). Expected time: about 55 min on the 2-core CPU alone.

`--config=experiments/configs/tree_rollouts.py:surprisal_confirm`: the confirmation of
the follow-up's one lead (surprisal-branched trees above GRPO in AUC at equal turns at
h = 12) on 20 fresh seeds (10-29): turn GAE, GRPO and the two surprisal variants at
h = 12 only. Expected time: about 25 min on the 2-core CPU alone.

`--config=experiments/configs/tree_rollouts.py:surprisal_heldout`: the confirmed result
(K = 2, surprisal) against GRPO on held-out *tasks*: training draws only the training
cells of the task generator (`env.task_split='train'`), evaluation only the held-out ones
(`eval.tasks='heldout'`), 20 more fresh seeds (30-49), h = 12. Expected time: about 18
min on the 2-core CPU alone.
"""

import ml_collections

from experiments.configs import check_variant
from experiments.configs import horizon_sweep
from experiments.studies.envs import env_section

# The follow-up's trees: K = 4 uniform, K = 2 at the most surprising turn, and both.
TREE_VARIANTS = (
    "tree_grpo+tree_branches=4",
    "tree_grpo+tree_branch_at=surprisal",
    "tree_grpo+tree_branches=4+tree_branch_at=surprisal",
)


VARIANTS = ("k4_surprisal", "surprisal_confirm", "surprisal_heldout")


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
    check_variant("tree_rollouts", variant, VARIANTS)
    config = horizon_sweep.get_config()
    config.horizons = "8,12"
    config.conditions = "outcome"  # with train.estimator = gae_turn: the reference.
    config.estimators = "grpo,gigpo,tree_grpo"
    config.estimator_reward = "outcome"
    config.estimator_horizons = "8,12"
    config.seeds = 10
    config.train.tree_branches = 2
    config.train.tree_branch_at = "uniform"
    config.paired_to = "outcome/grpo"  # Tree-GRPO's claim is against independent chains
    if variant == "k4_surprisal":
        config.estimators = ",".join(("grpo", "tree_grpo", *TREE_VARIANTS))
    if variant == "surprisal_confirm":
        config.horizons = config.estimator_horizons = "12"
        config.estimators = ",".join(("grpo", *TREE_VARIANTS[1:]))
        config.seeds, config.first_seed = 20, 10
    if variant == "surprisal_heldout":
        config.horizons = config.estimator_horizons = "12"
        config.estimators = ",".join(("grpo", TREE_VARIANTS[1]))
        config.seeds, config.first_seed = 20, 30
        config.env = env_section("toolworld", task_split="train")
        config.eval.tasks = "heldout"
    return config
