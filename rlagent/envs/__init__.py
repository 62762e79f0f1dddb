"""JAX-native multi-turn environments: ToolWorld, its token DSL, rules and helpers."""

from rlagent.envs import dsl
from rlagent.envs.curriculum import Promotion
from rlagent.envs.curriculum import horizon_config
from rlagent.envs.curriculum import level_config
from rlagent.envs.guardrail import RULE_NAMES
from rlagent.envs.policies import oracle_policy
from rlagent.envs.policies import random_policy
from rlagent.envs.policies import unroll
from rlagent.envs.reference import ReferenceToolWorld
from rlagent.envs.render import render_trajectory
from rlagent.envs.render import render_transcript
from rlagent.envs.toolworld import KIND_NAMES
from rlagent.envs.toolworld import Observation
from rlagent.envs.toolworld import State
from rlagent.envs.toolworld import StepType
from rlagent.envs.toolworld import TimeStep
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.envs.wrappers import AutoResetWrapper
from rlagent.envs.wrappers import VmapWrapper
from rlagent.envs.wrappers import batch_reset
from rlagent.envs.wrappers import batch_step
