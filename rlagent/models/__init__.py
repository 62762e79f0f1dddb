"""Policy LM (Llama-style, Flax NNX), value head, sliding-window state encoder, sampler."""

from rlagent.models.llama import KVCache
from rlagent.models.llama import Llama
from rlagent.models.llama import PolicyConfig
from rlagent.models.llama import init_cache
from rlagent.models.policy import ContextLM
from rlagent.models.policy import Policy
from rlagent.models.policy import ValueLM
from rlagent.models.policy import observed_tokens
from rlagent.models.policy import visible_observations
from rlagent.models.sampler import Generation
from rlagent.models.sampler import generate
from rlagent.models.sampler import policy_log_probs
from rlagent.models.sampler import sample_token
from rlagent.models.sampler import sample_with_noise
from rlagent.models.state_encoder import StateEncoder
from rlagent.models.state_encoder import Window
