"""A task-oriented dialogue environment with an agenda-based simulated user.

Layout: `types` (markers and pytrees), `dsl` (vocabulary and the act grammar), `config`
(Persona, DialogueConfig, the shortest dialogue), `messages` (what the agent reads),
`generator` (catalogue and goal at reset), `env` (DialogueEnv), then `policies`,
`curriculum` and `reference` (plain-Python twin). See docs/dialogue.md.
"""

from rlagent.envs.dialogue import dsl
from rlagent.envs.dialogue.config import DialogueConfig
from rlagent.envs.dialogue.config import Persona
from rlagent.envs.dialogue.config import shortest_dialogue
from rlagent.envs.dialogue.curriculum import horizon_config
from rlagent.envs.dialogue.curriculum import level_config
from rlagent.envs.dialogue.dsl import Act
from rlagent.envs.dialogue.env import DialogueEnv
from rlagent.envs.dialogue.policies import oracle_policy
from rlagent.envs.dialogue.policies import random_policy
from rlagent.envs.dialogue.policies import unroll
from rlagent.envs.dialogue.reference import ReferenceDialogue
from rlagent.envs.dialogue.types import Marker
from rlagent.envs.dialogue.types import Observation
from rlagent.envs.dialogue.types import Signals
from rlagent.envs.dialogue.types import State
from rlagent.envs.dialogue.types import TimeStep
