"""RL from the locally pretrained ToolWorld model (docs/pretrain.md) through
`experiments.hf_agent`, over seeds, against its start on held-out tasks.

Usage:
  python -m experiments.pretrained_rl --workdir=runs/pretrained_rl
  python -m experiments.pretrained_rl --workdir=W --config.seeds=0,2,4,6,8   # one share
  python -m experiments.pretrained_rl --workdir=W --config.seeds=1,3,5,7,9 --resume

`agent` is experiments/configs/hf_agent.py's config (every field, `--config.agent.train
.learning_rate=...`); its `seed` is replaced by each of `seeds`. The start (the checkpoint
as loaded) plays the same held-out evaluation episodes (the same tasks and keys) as every
seed's evaluations, so each seed is paired with it.
"""

import ml_collections

from experiments.configs import hf_agent


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.model_dir = "checkpoints/pretrained_toolworld"  # experiments.pretrain's folder.
    config.env = "toolworld_text"  # --env of experiments.hf_agent.
    config.seeds = tuple(range(10))

    agent = hf_agent.get_config()
    agent.env.toolworld_text.level = 2  # the level the pretraining's stop rule measured.
    agent.model.dtype = "float32"  # a 0.9M-parameter model: full precision costs little.
    # Turns of at most 48 tokens (the pretraining's); transcripts of at most 1,536 tokens
    # (a 1,100-token header, then about 100 a turn: an episode past it ends truncated).
    agent.sampling.max_new_tokens = 48
    agent.sampling.obs_len = 1536
    agent.sampling.max_prompt_len = 1536
    agent.train.num_updates = 6
    agent.train.num_groups = 4  # 4 tasks x 8 episodes an update (hf_agent's default).
    agent.train.learning_rate = 2e-4
    agent.eval.every = 3  # held-out evaluation after updates 3 and 6 ...
    agent.eval.episodes = 64  # ... of 64 fixed held-out level 2 episodes, sampled and greedy.
    agent.checkpoint.keep = 1
    config.agent = agent
    return config
