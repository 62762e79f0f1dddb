"""Ground-truth credit: forkable episodes, Monte-Carlo values, estimator credit accuracy."""

from rlagent.credit.accuracy import CreditAccuracy
from rlagent.credit.accuracy import credit_accuracy
from rlagent.credit.accuracy import estimator_credit
from rlagent.credit.accuracy import turn_credit
from rlagent.credit.lm import forks_from_carries
from rlagent.credit.lm import play_policy
from rlagent.credit.mc import EnvEpisodes
from rlagent.credit.mc import MCValues
from rlagent.credit.mc import TurnSignals
from rlagent.credit.mc import mc_values
from rlagent.credit.mc import mixture
from rlagent.credit.mc import oracle
from rlagent.credit.mc import play_env_policy
from rlagent.credit.mc import replay_states
from rlagent.credit.mc import rollout_env_policy
from rlagent.credit.mc import trajectory_signals
from rlagent.credit.mc import uniform_random
