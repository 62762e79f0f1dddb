"""A pretrained HF checkpoint trained on a text environment (`experiments.hf_agent`).

`run(config, workdir, model_dir=..., env=...)` builds the typed configs of
experiments/configs/hf_agent.py, checks the checkpoint folder (`rlagent.text.train
.check_model`) and the config before anything is written, then trains
(`rlagent.text.train.run_text`: the host loop's run folder, metrics.csv, provenance.json,
checkpoints, exact resume).
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import NamedTuple

import jax
import ml_collections

from experiments.studies.common import check_counts
from experiments.studies.sections import make
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.host.loop import CheckpointConfig
from rlagent.models import sharding
from rlagent.preference.dpo import DPOConfig
from rlagent.preference.judges import judge_weights
from rlagent.text import train as text_train
from rlagent.text.critic import CriticConfig
from rlagent.text.loop import TextConfig
from rlagent.train.config import TrainConfig
from rlagent.train.evaluation import EvalConfig

ENVS = ("toolworld_text", "bfcl")
BFCL_FIELDS = ("category", "split", "task", "max_turns", "max_steps")
PREFERENCE_FIELDS = ("judge", "accuracy", "question", "kind", "beta", "label_smoothing", "level",
                     "segment_turns", "length_norm", "num_epochs")  # fmt: skip


class Prepared(NamedTuple):
    """What `run` passes to `rlagent.text.train.run_text`, checked (`prepare`)."""

    train: TrainConfig
    sampling: TextConfig
    tasks: text_train.TaskSet
    agent: Any  # rlagent.text.train.AgentModel
    mesh: jax.sharding.Mesh | None
    preference: text_train.Preference | None
    evaluation: EvalConfig
    critic: CriticConfig
    checkpoints: CheckpointConfig


def prepare(config: ml_collections.ConfigDict, *, model_dir: str, env: str) -> Prepared:
    """The typed configs of `config` and the checked checkpoint of `model_dir`; refuses a
    bad value or folder, naming it, before anything is written."""
    train_config, text_config, tasks = build(config, env)
    device_mesh = mesh(config)  # a bad mesh section is refused before the checkpoint is read.
    dpo = preference(config, train_config)  # refuses bad online DPO settings first.
    evaluation = make(EvalConfig, config.eval.to_dict(), "eval")
    critic = make(CriticConfig, config.critic.to_dict(), "critic")
    checkpoints = make(CheckpointConfig, config.checkpoint.to_dict(), "checkpoint")
    model = config.model
    agent = text_train.check_model(
        model_dir, tasks.tools, dtype=model.dtype, param_dtype=model.param_dtype,
        end_token=model.end_token or None, pad_token=model.pad_token or None, remat=model.remat,
        enable_thinking=model.enable_thinking,
    )  # fmt: skip
    return Prepared(
        train_config, text_config, tasks, agent, device_mesh, dpo, evaluation, critic, checkpoints
    )


def run(
    config: ml_collections.ConfigDict, workdir: str, *, model_dir: str, env: str,
    resume: bool = False, overwrite: bool = False, progress: bool = True,
) -> list[dict[str, Any]]:  # fmt: skip
    """Trains the checkpoint of `model_dir` on `env` (one of ENVS); the metric rows."""
    p = prepare(config, model_dir=model_dir, env=env)
    return text_train.run_text(
        p.train, p.sampling, p.tasks, p.agent, workdir=workdir, seed=config.seed,
        algorithm=config.algorithm, resume=resume, overwrite=overwrite, progress=progress,
        evaluation=p.evaluation, preference=p.preference, mesh=p.mesh, critic=p.critic,
        checkpoints=p.checkpoints,
    )  # fmt: skip


def evaluate_start(
    config: ml_collections.ConfigDict, *, model_dir: str, env: str
) -> dict[str, float]:
    """The `eval_*` columns of the checkpoint of `model_dir` as loaded (no update): the
    evaluation episodes of `config.eval` (the same tasks and keys as every evaluation of a
    run of `config`, `rlagent.text.train.evaluate_text`)."""
    p = prepare(config, model_dir=model_dir, env=env)
    if not p.evaluation.every:
        raise ValueError("config.eval.every must be > 0 to evaluate the start.")
    text_run, params = text_train.make_text_run(
        p.train, p.sampling, p.tasks, p.agent, seed=config.seed, preference=p.preference,
        mesh=p.mesh, critic=p.critic,
    )  # fmt: skip
    return text_train.evaluate_text(
        text_run, params, text_train.eval_task_list(p.tasks, p.evaluation)
    )


def mesh(config: ml_collections.ConfigDict) -> jax.sharding.Mesh | None:
    """The FSDP mesh of `config.mesh`: None with `devices` = 0 (one device), else the first
    `devices` devices (-1: all of them; every process's in a multi-process run, which
    needs them all) as `data` rows (`sharding.fsdp_mesh`). Over several processes `data`
    must be a multiple of their number, so that each row is one process's devices."""
    section = config.mesh.to_dict()
    unknown = sorted(set(section) - {"devices", "data"})
    if unknown:
        raise ValueError(f"Unknown mesh config fields {unknown}; known: ['data', 'devices'].")
    devices, data = int(section["devices"]), int(section["data"])
    every, processes = jax.devices(), jax.process_count()
    if processes > 1 and devices not in (-1, len(every)):
        raise ValueError(
            f"config.mesh.devices must be -1 (or {len(every)}) in a run over {processes} "
            f"processes: the mesh spans every process's devices; got {devices}."
        )
    if devices == 0:
        return None
    if devices == -1:
        devices = len(every)
    if not 1 <= devices <= len(every):
        raise ValueError(
            f"config.mesh.devices must be -1, 0 or 1..{len(every)} (the devices), got {devices}."
        )
    if data < 1 or devices % data:
        raise ValueError(f"config.mesh.data = {data} must divide config.mesh.devices = {devices}.")
    if data % processes:
        raise ValueError(
            f"config.mesh.data = {data} must be a multiple of the {processes} processes (each "
            "row of the mesh is one process's devices)."
        )
    return sharding.fsdp_mesh(every[:devices], data=data)


def preference(
    config: ml_collections.ConfigDict, train: TrainConfig
) -> text_train.Preference | None:
    """The online DPO settings of algorithm 'online_dpo' (None otherwise); refuses an
    unknown field or judge naming it."""
    if config.algorithm != "online_dpo":
        return None
    values = config.preference.to_dict()
    unknown = sorted(set(values) - set(PREFERENCE_FIELDS))
    if unknown:
        raise ValueError(f"Unknown preference config fields {unknown}; known: {PREFERENCE_FIELDS}.")
    judge, accuracy, question = values.pop("judge"), values.pop("accuracy"), values.pop("question")
    if judge != "lm":
        judge_weights(train, judge)  # an unknown judge raises, naming the choices.
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"config.preference.accuracy must be in [0, 1], got {accuracy}")
    dpo = DPOConfig(
        **values, learning_rate=train.learning_rate, max_grad_norm=train.max_grad_norm,
        num_groups=train.num_groups, group_size=train.group_size,
    )  # fmt: skip
    return text_train.Preference(dpo, judge, float(accuracy), question)


def build(
    config: ml_collections.ConfigDict, env: str
) -> tuple[TrainConfig, TextConfig, text_train.TaskSet]:
    """The typed configs and the task set; refuses bad values naming the field."""
    if env not in ENVS:
        raise ValueError(f"--env must be one of {ENVS}, got {env!r}")
    check_counts(config, {"seed": None})
    train = config.train.to_dict()
    known = {field.name for field in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(train) - known)
    if unknown:
        raise ValueError(f"Unknown train config fields {unknown}; known: {sorted(known)}.")
    train = {k: tuple(v) if isinstance(v, list) else v for k, v in train.items()}
    train_config = text_train.train_config(config.algorithm, **train)
    text_config = make(TextConfig, config.sampling.to_dict(), "sampling")
    if env == "toolworld_text":
        tasks = text_train.toolworld_tasks(
            make(ToolWorldConfig, config.env.toolworld_text.to_dict(), "env.toolworld_text")
        )
    else:
        options = config.env.bfcl.to_dict()
        unknown = sorted(set(options) - set(BFCL_FIELDS))
        if unknown:
            raise ValueError(f"Unknown env.bfcl config fields {unknown}; known: {BFCL_FIELDS}.")
        tasks = text_train.bfcl_tasks(**options)
    return train_config, text_config, tasks
