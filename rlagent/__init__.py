"""rlagent: credit assignment for long multi-turn trajectories of LLM agents, in JAX."""

from rlagent.advantages import gae
from rlagent.advantages import gigpo_advantages
from rlagent.advantages import grpo_advantages
from rlagent.advantages import hierarchical_advantages
from rlagent.advantages import reinforce_pp_returns
from rlagent.advantages import rloo_advantages
from rlagent.advantages import tokens_to_turns
from rlagent.advantages import turns_to_tokens
from rlagent.advantages import whiten
from rlagent.losses import aggregate
from rlagent.losses import dpo_loss
from rlagent.losses import entropy
from rlagent.losses import kl_penalty
from rlagent.losses import ppo_policy_loss
from rlagent.losses import prm_loss
from rlagent.losses import value_loss
from rlagent.returns import compose_rewards
from rlagent.returns import discounted_returns
from rlagent.returns import lambda_returns
from rlagent.returns import prm_rewards
from rlagent.types import TokenView
from rlagent.types import Trajectory
from rlagent.types import token_view

__version__ = "0.1.0"
