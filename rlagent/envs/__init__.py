"""JAX-native multi-turn environments: ToolWorld, its token DSL, rules and helpers.

Layout: `types` (enums and pytrees), `dsl` (vocabulary and command grammar), `guardrail`
(rules), `config` (ToolWorldConfig), `messages` (what the agent reads), `generator`
(episode sampling), `toolworld` (reset / step / allowed_tokens), then `policies`,
`curriculum`, `reference` (plain-Python twin) and `render`.
"""

from rlagent.envs import dsl
from rlagent.envs.config import KIND_COST
from rlagent.envs.config import KIND_NAMES
from rlagent.envs.config import ToolWorldConfig
from rlagent.envs.curriculum import Promotion
from rlagent.envs.curriculum import horizon_config
from rlagent.envs.curriculum import level_config
from rlagent.envs.dsl import Command
from rlagent.envs.guardrail import RULE_NAMES
from rlagent.envs.guardrail import Rule
from rlagent.envs.policies import oracle_policy
from rlagent.envs.policies import random_policy
from rlagent.envs.policies import unroll
from rlagent.envs.reference import ReferenceToolWorld
from rlagent.envs.render import render_trajectory
from rlagent.envs.render import render_transcript
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.types import Observation
from rlagent.envs.types import Progress
from rlagent.envs.types import Signals
from rlagent.envs.types import State
from rlagent.envs.types import StepType
from rlagent.envs.types import TaskKind
from rlagent.envs.types import TimeStep
