"""PPO training for multi-turn agents: config, pure update, host loop, metric writers."""

from rlagent.train.config import TrainConfig
from rlagent.train.estimators import anchor_ids
from rlagent.train.estimators import estimate_advantages
from rlagent.train.loop import run
from rlagent.train.ppo import RunnerState
from rlagent.train.ppo import Trainer
from rlagent.train.ppo import make_train
from rlagent.train.rewards import turn_rewards
from rlagent.train.writers import MetricWriter
