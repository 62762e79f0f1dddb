"""TextArena's Mastermind (`Mastermind-v0`, `-hard`, `-extreme`) as a JAX environment.

Layout: `config` (MastermindConfig, LEVELS, level_config, the code space `all_codes` and
its held-out codes `heldout_codes`), `rules` (vocabulary, pegs, the text of a turn), `env`
(Mastermind: reset / step / allowed_tokens / oracle / heldout_env). docs/mastermind.md
states the rules as ported, the verdict and the oracle's numbers;
tests/test_envs_mastermind.py plays it against the textarena package.
"""

from rlagent.envs.mastermind import rules
from rlagent.envs.mastermind.config import LEVELS
from rlagent.envs.mastermind.config import TEXTARENA_IDS
from rlagent.envs.mastermind.config import MastermindConfig
from rlagent.envs.mastermind.config import all_codes
from rlagent.envs.mastermind.config import heldout_codes
from rlagent.envs.mastermind.config import horizon_config
from rlagent.envs.mastermind.config import level_config
from rlagent.envs.mastermind.env import Mastermind
from rlagent.envs.mastermind.env import Observation
from rlagent.envs.mastermind.env import Signals
from rlagent.envs.mastermind.env import State
from rlagent.envs.mastermind.env import TimeStep
from rlagent.envs.mastermind.rules import Vocabulary
