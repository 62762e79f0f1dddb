"""A pretrained HF checkpoint trained with GRPO or PPO on a text environment.

Usage:
  python -m experiments.hf_agent --model_dir=checkpoints/Qwen2.5-0.5B-Instruct \
      --env=toolworld_text --config.algorithm=grpo --config.train.num_updates=50

  python -m experiments.hf_agent --model_dir=... --env=bfcl \
      --config.env.bfcl.category=multi_turn_base --config.env.bfcl.split=train

Sections: `env` (one sub-section per --env: `toolworld_text`, ToolWorldConfig fields;
`bfcl`, the task pool: categories, split, one task or all), `eval` (held-out evaluation),
`preference` (online DPO), `sampling` (rlagent.text.TextConfig fields: tokens per turn,
prompt sizes, temperature, the engine: 'cached' KV caches kept across turns, the default,
or 'reprefill'), `train` (the update: rlagent.train.config.TrainConfig fields:
updates, tasks per update = num_groups, group_size, learning rate, KL to the reference,
...; the fields left None take the algorithm's values, rlagent.text.train.ALGORITHMS) and
`model` (compute and parameter dtypes, rematerialisation; end-of-turn and padding tokens,
'' = the tokenizer's eos / pad token; the chat template's enable_thinking), `mesh` (FSDP
over the devices: `--config.mesh.devices=-1` for all), `critic` (PPO's value model,
rlagent.text.critic.CriticConfig: its checkpoint folder, learning rate, warm-up updates;
read when the estimator reads values, as ppo's gae_token), `checkpoint` (a checkpoint
after every `every`-th update and the last, the newest `keep` kept beside step 0,
`asynchronous` Orbax writes while the next update runs; a resumed run may change them).

Precision (`model`, docs/text_training.md): parameters and AdamW's moments are stored in
`param_dtype` and cast to `dtype` where the forward pass uses them (activations, matmuls,
the sampler's KV cache). The default float32 master weights keep steps smaller than a
weight's bfloat16 spacing; `param_dtype='bfloat16'` (with `dtype='bfloat16'`) halves the
states' memory and loses such steps; both float32: full precision.
"""

import ml_collections
from ml_collections import config_dict

from experiments.studies.sections import section
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.host.loop import CheckpointConfig
from rlagent.text.critic import CriticConfig
from rlagent.text.judge import QUESTION
from rlagent.text.loop import TextConfig
from rlagent.train.config import TrainConfig
from rlagent.train.evaluation import EvalConfig


def _model() -> ml_collections.ConfigDict:
    """The `model` section: dtypes, special tokens, the template's thinking, remat."""
    model = ml_collections.ConfigDict()
    model.dtype = "bfloat16"  # compute dtype: bfloat16 | float32 (docs/text_training.md).
    model.param_dtype = "float32"  # parameters, AdamW moments: float32 | bfloat16.
    model.end_token = ""  # end-of-turn token; '' = the tokenizer's eos_token.
    model.pad_token = ""  # padding token; '' = the tokenizer's pad_token.
    # The chat template's enable_thinking (Qwen3: False gives the generation prompt an empty
    # think block); None = not passed, the template's default.
    model.enable_thinking = config_dict.placeholder(bool)
    # Recompute each decoder block in the backward pass: the update keeps one block's
    # activations at a time instead of every block's (docs/text_training.md, memory). Unset:
    # on for checkpoints above 100M parameters (rlagent.text.train.REMAT_ABOVE).
    model.remat = config_dict.placeholder(bool)
    return model


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.algorithm = "grpo"  # grpo | ppo | online_dpo (rlagent.text.train.ALGORITHMS).
    config.seed = 0  # every task draw and sampling key derives from (seed, update).

    config.model = _model()

    # FSDP over the devices (rlagent.models.sharding): devices 0 = one device, no mesh;
    # N = the first N devices, -1 = all (a multi-process run's: every process's, with `data`
    # a multiple of the processes, docs/distributed.md); `data` rows of them (data parallel).
    config.mesh = ml_collections.ConfigDict(dict(devices=0, data=1))

    config.env = ml_collections.ConfigDict()
    # ToolWorld in text mode (rlagent.text.toolworld): a task is a world seed.
    # task_split='train': training never draws the held-out task cells (evaluation's).
    config.env.toolworld_text = section(ToolWorldConfig, level=1, task_split="train")
    # BFCL multi-turn (rlagent.text.bfcl): every task of the split of `category` (several
    # categories separated by commas; each episode renders its own task's tools), or only
    # `task` when set.
    config.env.bfcl = ml_collections.ConfigDict(
        dict(category="multi_turn_base", split="train", task="", max_turns=16, max_steps=20)
    )

    # The text loop (rlagent.text.TextConfig): the prompts must hold the tool schemas.
    config.sampling = section(
        TextConfig, max_new_tokens=128, obs_len=4096, max_prompt_len=6144, temperature=1.0
    )

    # Held-out evaluation (rlagent.train.evaluation.EvalConfig): every `every` updates and
    # after the last (0 = off), `episodes` fixed episodes on the tasks training never draws
    # ('heldout') or on training tasks ('same'), sampled and greedy: the eval_* columns.
    config.eval = section(EvalConfig, every=25, episodes=32, tasks="heldout")

    # Online DPO / RLAIF (algorithm 'online_dpo', rlagent.text.preference): each update a
    # judge ranks the group_size episodes of each task, DPO learns from best vs worst
    # against the checkpoint as loaded. judge: 'lm' (the checkpoint reads each transcript
    # and `question`; score log p(Yes) - log p(No), rlagent.text.judge) or a judge of
    # rlagent.preference.judges (outcome, guardrail, any reward form); accuracy < 1 flips
    # pairs (a noisy judge). The DPO loss fields are rlagent.preference.dpo.DPOConfig's;
    # its learning rate, clipping and batch are config.train's.
    config.preference = ml_collections.ConfigDict(
        dict(
            judge="lm", accuracy=1.0, question=QUESTION, kind="sigmoid", beta=0.1,
            label_smoothing=0.0, level="trajectory", segment_turns=0, length_norm="none",
            num_epochs=1,
        )
    )  # fmt: skip

    # PPO's critic (rlagent.text.critic): a value model with its own AdamW, read when the
    # estimator reads values (ppo's default gae_token; gae_turn, hierarchical). model_dir
    # '' = the policy's checkpoint (another folder must share its tokenizer); learning_rate
    # None = train.learning_rate; warmup_updates: first updates that train the critic only.
    config.critic = section(CriticConfig)

    config.checkpoint = section(CheckpointConfig)  # every, keep, asynchronous (docstring).

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
