"""A/B test of two checkpoints (experiments.ab_test; fields are overridable by flag).

Usage:
  python -m experiments.ab_test --a=runs/x/rewards@30 --b=runs/x/rewards@60
  python -m experiments.ab_test --a=CKPT --b=CKPT --guardrail_b=mask   # the rule layer
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # The arms: RUN_FOLDER[@STEP][#CONDITION/SEED] (rlagent.host.shadow.load_checkpoint);
    # the launcher's --a / --b set them.
    config.a = ""
    config.b = ""
    # Guardrail mode of each arm's environment ('' = as trained; off / penalise / mask).
    config.guardrail_a = ""
    config.guardrail_b = ""
    config.tasks = 256  # held-out tasks, the unit of the paired comparisons.
    config.samples = 4  # sampled episodes per task and arm (pass@k, pass^k for k <= it).
    config.greedy = True  # also one greedy episode per task and arm (temperature 0).
    config.heldout_set = 1  # rlagent.train.evaluation.eval_keys set (0: the loop's evaluation).
    config.reps = 10000  # bootstrap resamples of the tasks.
    config.alpha = 0.05  # level of the verdict's test.
    config.first_seed = 0  # NumPy seed of the bootstrap and Monte-Carlo sign flips.
    return config
