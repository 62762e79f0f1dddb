"""Training a pretrained HF checkpoint on a text environment: the text loop plays a batch,
the text update trains on it, the host writes metrics and checkpoints (docs/text.md).

    tasks = toolworld_tasks(ToolWorldConfig(level=1))      # or bfcl_tasks(...)
    model = check_model("checkpoints/Qwen2.5-0.5B-Instruct", tasks.tools)
    rows = run_text(train_config("grpo", num_updates=50), TextConfig(...), tasks, model,
                    workdir="runs/hf_agent")

Every update u: `num_groups` tasks drawn with `np.random.default_rng([seed, u])`, each
played by `group_size` episodes (`rlagent.text.loop`, keys `fold_in(key(seed), u)`); the
reference's log-probs (the checkpoint as loaded, frozen) and the update
(`rlagent.text.update`: rewards, the project's estimators, PPO-clip, KL to the reference);
one metric row and one checkpoint. Everything random is a function of (seed, update), so
a resumed run (`--resume`: the policy and optimiser state of the newest checkpoint) equals
an uninterrupted one. The run folder is the host loop's (`rlagent.host.loop.open_run`,
`run_files`): a non-empty folder refused without resume / overwrite, `provenance.json`,
metrics.csv, Orbax checkpoints (step 0, the start, and the newest two), a non-finite loss
stopping the run with `Diverged`.

`check_model` refuses, before anything is written, a folder that is no checkpoint the
loader reads (`rlagent.models.checkpoint.read_checkpoint`), a tokenizer the folder lacks or
one without a chat template (`rlagent.text.chat.make_chat`), and a vocabulary mismatch
(`chat.check_vocab`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import time
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlagent import losses
from rlagent.envs.toolworld.config import ToolWorldConfig
from rlagent.host import loop as host_loop
from rlagent.host import provenance
from rlagent.models import checkpoint
from rlagent.models.hf import CheckpointError
from rlagent.text import bfcl
from rlagent.text.chat import ChatFormat
from rlagent.text.chat import check_vocab
from rlagent.text.chat import make_chat
from rlagent.text.loop import TextConfig
from rlagent.text.loop import make_text_loop
from rlagent.text.score import make_text_score
from rlagent.text.toolworld import ToolWorldText
from rlagent.text.update import TextTrainState
from rlagent.text.update import check_config
from rlagent.text.update import make_text_update
from rlagent.train.config import TrainConfig
from rlagent.train.ppo import NONFINITE_METRICS
from rlagent.train.ppo import episode_metrics
from rlagent.train.rewards import check_forms

# The update of each algorithm: TrainConfig fields a config leaves unset (None) take these.
# Text trajectories have no values (no critic pass yet), so PPO is PPO-clip over several
# epochs of minibatches with REINFORCE++ advantages (discounted returns whitened over the
# batch) instead of GAE; GRPO is one on-policy step on group-relative advantages.
ALGORITHMS: dict[str, dict[str, Any]] = {
    "grpo": dict(estimator="grpo", num_epochs=1, num_minibatches=1),
    "ppo": dict(estimator="reinforce_pp", num_epochs=2, num_minibatches=2),
}
DTYPES = ("float32", "bfloat16")


class TaskSet(NamedTuple):
    """Where a run's tasks come from: one tool set, a task drawn per group."""

    name: str  # the environment's name (the metric rows' `condition` is the algorithm).
    config: dict[str, Any]  # the resolved settings (provenance.json's `env`).
    tools: tuple[dict, ...] | None  # the tool schemas every task shares.
    # pick(rng) -> (make_env: () -> a fresh environment of one task, its reset seed).
    pick: Callable[[np.random.Generator], tuple[Callable[[], Any], int]]


class AgentModel(NamedTuple):
    """A checked checkpoint folder and its chat format (`check_model`)."""

    model_dir: str
    chat: ChatFormat
    checkpoint: checkpoint.Checkpoint  # its PolicyConfig carries the dtypes and pad_id.
    config_sha256: str  # of config.json: a resumed run must read the same model.


def train_config(algorithm: str, **fields: Any) -> TrainConfig:
    """The `TrainConfig` of `algorithm` (`ALGORITHMS`): `fields` that are None take the
    algorithm's value; entropy_coef defaults to 0 (the text update scores sampled ids)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"config.algorithm must be one of {tuple(ALGORITHMS)}, got {algorithm!r}")
    preset = {"entropy_coef": 0.0, **ALGORITHMS[algorithm]}
    values = {**preset, **{k: v for k, v in fields.items() if v is not None}}
    config = TrainConfig(**values)
    check_config(config)  # what a text batch cannot serve (a critic, an entropy bonus).
    if config.lr_schedule != "constant" or config.warmup_updates:
        raise ValueError(
            "TrainConfig.lr_schedule must be 'constant' and warmup_updates 0: the text update "
            f"steps at a constant learning rate (got {config.lr_schedule!r}, "
            f"{config.warmup_updates})"
        )
    return config


def toolworld_tasks(config: ToolWorldConfig) -> TaskSet:
    """ToolWorld in text mode: a task is a world seed (`ToolWorldText.reset`)."""
    tools = ToolWorldText(config).tools  # refuses guardrail='mask'.

    def pick(rng: np.random.Generator):
        return functools.partial(ToolWorldText, config), int(rng.integers(2**31 - 1))

    return TaskSet("toolworld_text", dataclasses.asdict(config), tools, pick)


def bfcl_tasks(
    category: str = "multi_turn_base", split: str = "train", task: str = "", **options: Any
) -> TaskSet:
    """BFCL multi-turn tasks of a category's split that share the tools of `task` (default:
    the split's first task); a TextLoop renders one tool set. `options`: max_turns,
    max_steps (`bfcl.BFCLText`)."""
    ids = bfcl.bfcl_task_ids(category, split)
    anchor = task or ids[0]
    if anchor not in ids:
        raise ValueError(
            f"config.env.bfcl.task={anchor!r} is not in the {split!r} split of {category!r}"
        )
    tools = bfcl.make_bfcl_text(anchor, **options).tools
    pool = tuple(i for i in ids if bfcl.make_bfcl_text(i, **options).tools == tools)

    def pick(rng: np.random.Generator):
        task_id = pool[int(rng.integers(len(pool)))]
        return functools.partial(bfcl.make_bfcl_text, task_id, **options), 0

    settings = dict(category=category, split=split, task=anchor, tasks=list(pool), **options)
    return TaskSet("bfcl", settings, tools, pick)


def check_model(
    model_dir: str, tools: tuple[dict, ...] | None, *, dtype: str = "float32",
    end_token: str | None = None, pad_token: str | None = None,
) -> AgentModel:  # fmt: skip
    """Checks a local HF checkpoint folder (config.json, safetensors, tokenizer with a chat
    template) without reading a tensor; one-line `ValueError`s name the fault."""
    if dtype not in DTYPES:
        raise ValueError(f"config.model.dtype must be one of {DTYPES}, got {dtype!r}")
    if not os.path.isdir(model_dir):
        raise CheckpointError(f"--model_dir={model_dir!r} is not a folder")
    chat = make_chat(
        load_tokenizer(model_dir), tools=tools, end_token=end_token, pad_token=pad_token
    )
    found = checkpoint.read_checkpoint(
        model_dir, pad_id=chat.pad_id, param_dtype=dtype, dtype=dtype
    )
    check_vocab(chat, found.config)
    with open(os.path.join(model_dir, "config.json"), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return AgentModel(os.path.abspath(model_dir), chat, found, digest)


def load_tokenizer(model_dir: str) -> Any:
    """The folder's own tokenizer (`transformers.AutoTokenizer`, local files only)."""
    import transformers  # the `hf` extra: imported where a tokenizer is read.

    try:
        return transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as error:
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else repr(error)
        raise CheckpointError(
            f"{model_dir}: no tokenizer transformers can load ({first})"
        ) from None


def run_text(
    config: TrainConfig, text_config: TextConfig, tasks: TaskSet, model: AgentModel, *,
    workdir: str, seed: int = 0, algorithm: str = "", resume: bool = False,
    overwrite: bool = False, tensorboard: bool = True, progress: bool = True,
) -> list[dict[str, Any]]:  # fmt: skip
    """Trains `config.num_updates` updates (module docstring); returns every metric row.

    Rows: `condition` (the algorithm), `seed`, `update`, success, return (mean episode
    return), malformed_rate and the environment's metrics, tokens_generated,
    sample_s / update_s / time_s, kl_ref (the sampled estimate of `config.kl_kind` between
    the behaviour policy and the reference, per generated token), the update's loss stats.
    """
    make_env, _ = tasks.pick(np.random.default_rng(0))
    check_forms(make_env(), config, [config.reward], "config.train.reward")
    resolved = provenance.resolved(
        train=config, sampling=text_config, env={"kind": tasks.name, **tasks.config},
        model=dict(model_dir=model.model_dir, config_sha256=model.config_sha256,
                   policy=dataclasses.asdict(model.checkpoint.config)),
        seed=int(seed), algorithm=algorithm,
    )  # fmt: skip
    resume, record = host_loop.open_run(
        workdir, resolved, lr_schedule=config.lr_schedule, resume=resume, overwrite=overwrite
    )
    run, params = make_text_run(config, text_config, tasks, model, seed=seed)
    runs = [(algorithm or config.estimator, int(seed))]
    with host_loop.run_files(
        workdir, run.program.init(params), runs, resume=resume, tensorboard=tensorboard
    ) as files:
        state, rows = files.state, list(files.rows)
        for update in range(files.done, config.num_updates):
            state, row = _one_update(run, state, update)
            row = {"condition": runs[0][0], "update": update + 1, "seed": int(seed), **row}
            files.writer.write([row])
            rows.append(row)
            flags = {name: np.asarray([[row[name]]]) for name in NONFINITE_METRICS}
            host_loop.check_finite(flags, update, runs, files.manager, rows)
            host_loop.save_state(files.manager, update + 1, state)
            if progress:
                print(_progress_line(row, config.num_updates), flush=True)
        provenance.write(workdir, provenance.finish(record))
    return rows


class TextRun(NamedTuple):
    """The programs and settings of a text training run (`make_text_run`)."""

    loop: Any  # rlagent.text.loop.TextLoop
    program: Any  # rlagent.text.update.TextUpdate
    reference: Any  # the frozen reference's parameters (the checkpoint as loaded).
    config: TrainConfig
    tasks: TaskSet
    seed: int


def make_text_run(
    config: TrainConfig, text_config: TextConfig, tasks: TaskSet, model: AgentModel, *,
    seed: int = 0,
) -> tuple[TextRun, nnx.State]:  # fmt: skip
    """Loads the checked model: `(its TextRun, the initial policy parameters)`."""
    llama, policy_config = checkpoint.load_pretrained(
        model.model_dir, dtype=jnp.dtype(model.checkpoint.config.param_dtype),
        pad_id=model.chat.pad_id,
    )  # fmt: skip
    graphdef, params = nnx.split(llama)
    score = make_text_score(model.chat, graphdef, policy_config, text_config)
    run = TextRun(
        loop=make_text_loop(model.chat, graphdef, policy_config, text_config),
        program=make_text_update(config, score),
        reference=jax.tree.map(jnp.copy, params),  # the update donates the state.
        config=config, tasks=tasks, seed=int(seed),
    )  # fmt: skip
    return run, params


def play_batch(run: TextRun, params: nnx.State, update: int) -> tuple[list, Any]:
    """`(episodes, Trajectory)` of update `update` (0-based): `num_groups` tasks drawn with
    `default_rng([seed, update])`, `group_size` episodes each, keys from (seed, update)."""
    config = run.config
    rng = np.random.default_rng([run.seed, update])
    episodes = []
    for _ in range(config.num_groups):  # a group: group_size episodes of one task.
        make_env, env_seed = run.tasks.pick(rng)
        episodes += [run.loop.start(make_env(), env_seed) for _ in range(config.group_size)]
    keys = jax.random.split(jax.random.fold_in(jax.random.key(run.seed), update), len(episodes))
    run.loop.play(params, episodes, keys)
    return episodes, run.loop.trajectory(episodes)


def _one_update(run: TextRun, state: TextTrainState, update: int):
    """Plays the batch of `update` (0-based) and trains on it: `(state, metric row)`."""
    config, began = run.config, time.perf_counter()
    episodes, trajectory = play_batch(run, state.params, update)
    played = {k: float(v) for k, v in episode_metrics(episodes[0].env, trajectory).items()}
    sampled = time.perf_counter()
    ref_logp = run.program.reference(run.reference, trajectory)
    kl = losses.kl_penalty(trajectory.logp, ref_logp, kind=config.kl_kind)
    mask = trajectory.loss_mask
    kl_ref = float(jnp.sum(kl * mask) / jnp.maximum(jnp.sum(mask), 1))
    state, stats = run.program.update(state, trajectory, ref_logp)
    stats = {k: float(v) for k, v in jax.device_get(stats).items()}
    done = time.perf_counter()
    return state, {
        "success": played.pop("success"), "return": stats.pop("reward"),
        "malformed_rate": played.pop("malformed_rate", float("nan")),
        "tokens_generated": stats.pop("tokens"), "tokens_per_episode": played.pop("tokens"),
        "kl_ref": kl_ref, **played, **stats, "sample_s": sampled - began,
        "update_s": done - sampled, "time_s": done - began,
    }  # fmt: skip


def _progress_line(row: dict[str, Any], total: int) -> str:
    return (
        f"update {row['update']}/{total}: success {row['success']:.3f}, return "
        f"{row['return']:.3f}, malformed {row['malformed_rate']:.3f}, kl_ref "
        f"{row['kl_ref']:.4f}, {row['tokens_generated']:.0f} tokens, sample "
        f"{row['sample_s']:.1f} s, update {row['update_s']:.1f} s"
    )
