"""A curriculum driven by success (experiments.studies.curriculum): quick defaults.

Usage:
  python -m experiments.curriculum --config=experiments/configs/curriculum.py \
      --config.seeds=5 --config.train.num_updates=100

Quick defaults (levels 1-4, 2 seeds, 30 updates) run in minutes on a CPU;
experiments/configs/curriculum_full.py is the committed run's. Each section holds every
field of its typed config, so any field can be overridden from the command line.
"""

import ml_collections

from experiments.configs import rs_sft
from experiments.studies.sections import section
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.pipeline.curriculum import CurriculumConfig
from rlagent.train.evaluation import EvalConfig


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # Stages, easiest first: 'l<k>' ToolWorld level k, 'h<H>' horizon_config(H) tasks.
    config.stages = "l1,l2,l3,l4"
    config.schedules = "success,fixed,final"  # rlagent.pipeline.curriculum.KINDS.
    config.seeds = 2
    config.first_seed = 0
    config.chunk_size = 10  # updates per jitted call (chunks also end at decisions, evals).
    config.title = ""
    # The scheduler (rlagent.pipeline.curriculum.CurriculumConfig; kind set per schedule).
    config.curriculum = section(CurriculumConfig, every=5)
    # The base env (ToolWorldConfig fields); each stage sets its level / horizon fields.
    config.env = section(ToolWorldConfig)
    rs_sft.add_policy_sections(config, num_updates=30)
    # Held-out evaluation on the last stage (a multiple of curriculum.every keeps one program).
    config.eval = section(EvalConfig, every=10, episodes=64)
    return config
