"""Single-turn prompt environments: a prompt of tokens, one turn of new tokens, a reward
computed on the tokens (the setting of single-turn GRPO trainers such as TRL's)."""

from rlagent.envs.prompts.env import PromptConfig
from rlagent.envs.prompts.env import PromptEnv
from rlagent.envs.prompts.env import target_fraction
