"""JAX-native multi-turn environments: ToolWorld, its token DSL, rules and helpers.

Layout: `types` (enums and pytrees), `dsl` (vocabulary and command grammar), `guardrail`
(rules), `config` (ToolWorldConfig), `messages` (what the agent reads), `generator`
(episode sampling), `toolworld` (reset / step / allowed_tokens), then `policies`,
`curriculum`, `reference` (plain-Python twin) and `render`.
"""

from rlagent.envs.toolworld import dsl
from rlagent.envs.toolworld.config import KIND_COST
from rlagent.envs.toolworld.config import KIND_NAMES
from rlagent.envs.toolworld.config import ToolWorldConfig
from rlagent.envs.toolworld.curriculum import Promotion
from rlagent.envs.toolworld.curriculum import horizon_config
from rlagent.envs.toolworld.curriculum import level_config
from rlagent.envs.toolworld.dsl import Command
from rlagent.envs.toolworld.env import ToolWorld
from rlagent.envs.toolworld.guardrail import RULE_NAMES
from rlagent.envs.toolworld.guardrail import Rule
from rlagent.envs.toolworld.policies import oracle_policy
from rlagent.envs.toolworld.policies import random_policy
from rlagent.envs.toolworld.policies import unroll
from rlagent.envs.toolworld.reference import ReferenceToolWorld
from rlagent.envs.toolworld.render import render_trajectory
from rlagent.envs.toolworld.render import render_transcript
from rlagent.envs.toolworld.types import Observation
from rlagent.envs.toolworld.types import Progress
from rlagent.envs.toolworld.types import Signals
from rlagent.envs.toolworld.types import State
from rlagent.envs.toolworld.types import StepType
from rlagent.envs.toolworld.types import TaskKind
from rlagent.envs.toolworld.types import TimeStep
