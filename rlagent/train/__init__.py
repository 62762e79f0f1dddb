"""PPO training for multi-turn agents: config, reward forms, estimators, the pure trainer."""

from rlagent.train.config import TrainConfig
from rlagent.train.estimators import anchor_ids
from rlagent.train.estimators import estimate_advantages
from rlagent.train.ppo import RunnerState
from rlagent.train.ppo import Trainer
from rlagent.train.ppo import make_train
from rlagent.train.rewards import turn_rewards
