"""Multi-turn environments: the protocol every layer relies on (`base`) and ToolWorld.

`rlagent.envs.base` is what the rollout, trainer, credit and PRM code import; each
environment lives in its own subpackage (`toolworld`, `dialogue`, `mastermind`), which
nothing outside it imports except its tests, experiments and the launchers' configs.
"""

from rlagent.envs.base import Environment
from rlagent.envs.base import StepType
from rlagent.envs.base import TokenSpec
from rlagent.envs.base import check_components
from rlagent.envs.base import check_environment
from rlagent.envs.base import random_action
