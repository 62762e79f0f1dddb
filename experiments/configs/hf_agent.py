"""A pretrained HF checkpoint trained with GRPO or PPO on a text environment.

Usage:
  python -m experiments.hf_agent --model_dir=checkpoints/Qwen2.5-0.5B-Instruct \
      --env=toolworld_text --config.algorithm=grpo --config.train.num_updates=50

  python -m experiments.hf_agent --model_dir=... --env=bfcl \
      --config.env.bfcl.category=multi_turn_base --config.env.bfcl.split=train

Sections: `env` (one sub-section per --env: `toolworld_text`, ToolWorldConfig fields;
`bfcl`, the task pool), `sampling` (rlagent.text.TextConfig fields: tokens per turn,
prompt sizes, temperature), `train` (the update: rlagent.train.config.TrainConfig fields: updates,
tasks per update = num_groups, group_size, learning rate, KL to the reference, ...; the
fields left None take the algorithm's values, rlagent.text.train.ALGORITHMS) and `model`
(parameter dtype; end-of-turn and padding tokens, '' = the tokenizer's eos / pad token).
"""

import ml_collections
from ml_collections import config_dict

from experiments.studies.sections import section
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.text.loop import TextConfig
from rlagent.train.config import TrainConfig


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.algorithm = "grpo"  # grpo | ppo (rlagent.text.train.ALGORITHMS).
    config.seed = 0  # every task draw and sampling key derives from (seed, update).

    config.model = ml_collections.ConfigDict()
    config.model.dtype = "float32"  # parameter and matmul dtype: float32 | bfloat16.
    config.model.end_token = ""  # end-of-turn token; '' = the tokenizer's eos_token.
    config.model.pad_token = ""  # padding token; '' = the tokenizer's pad_token.

    config.env = ml_collections.ConfigDict()
    # ToolWorld in text mode (rlagent.text.toolworld): a task is a world seed.
    config.env.toolworld_text = section(ToolWorldConfig, level=1)
    # BFCL multi-turn (rlagent.text.bfcl): the tasks of a category's split that share the
    # tools of `task` ('' = the split's first task).
    config.env.bfcl = ml_collections.ConfigDict(
        dict(category="multi_turn_base", split="train", task="", max_turns=16, max_steps=20)
    )

    # The text loop (rlagent.text.TextConfig): the prompts must hold the tool schemas.
    config.sampling = section(
        TextConfig, max_new_tokens=128, obs_len=4096, max_prompt_len=6144, temperature=1.0
    )

    # The update (rlagent.train.config.TrainConfig); None: the algorithm's value.
    config.train = section(
        TrainConfig,
        num_updates=100,
        num_groups=4,  # tasks per update ...
        group_size=8,  # ... times episodes per task.
        reward="composed",  # outcome / process / efficiency mix of both environments.
        malformed_penalty=0.1,  # per turn that is no well-formed call.
        entropy_coef=0.0,
        kl_placement="loss",
        kl_coef=0.02,  # KL to the reference (the checkpoint as loaded).
        learning_rate=1e-6,
        max_grad_norm=1.0,
    )
    # Left to the algorithm unless set (e.g. --config.train.num_epochs=4).
    config.train.estimator = config_dict.placeholder(str)
    config.train.num_epochs = config_dict.placeholder(int)
    config.train.num_minibatches = config_dict.placeholder(int)
    return config
