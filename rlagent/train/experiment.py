"""Experiments as data: ConfigDict -> typed configs -> runs -> metrics, plots, tables.

Launchers in experiments/ only parse flags and call these functions, so a notebook can
run the same experiment (see colab/quickstart.ipynb).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import jax
import ml_collections

from rlagent.envs import ToolWorld
from rlagent.envs import ToolWorldConfig
from rlagent.envs import dsl
from rlagent.models import PolicyConfig
from rlagent.rollout import RolloutConfig
from rlagent.train import loop
from rlagent.train import report
from rlagent.train.config import TrainConfig
from rlagent.train.writers import MetricWriter


class Setup(NamedTuple):
    env: ToolWorld
    policy_config: PolicyConfig
    rollout_config: RolloutConfig
    train_config: TrainConfig


class Run(NamedTuple):
    name: str  # folder under the workdir.
    conditions: tuple[str, ...]  # labels in tables and plots, one per reward form trained.
    config: ml_collections.ConfigDict  # the full experiment config of this run.


def build(config: ml_collections.ConfigDict) -> Setup:
    """Typed configs from the `env`, `model`, `rollout` and `train` sections."""
    env = ToolWorld(_make(ToolWorldConfig, config.env, "env"))
    model = dict(config.model)
    model.setdefault("vocab_size", dsl.VOCAB_SIZE)
    return Setup(
        env=env,
        policy_config=_make(PolicyConfig, model, "model"),
        rollout_config=_make(RolloutConfig, config.rollout, "rollout"),
        train_config=TrainConfig.from_mapping(config.train),
    )


def reward_runs(config: ml_collections.ConfigDict) -> list[Run]:
    """All reward forms of `config.conditions` (comma-separated) in one run.

    They differ only in data (the reward weights), so they train side by side in one
    compiled program, every condition with every seed.
    """
    return [Run("rewards", tuple(_names(config.conditions)), config)]


def guardrail_runs(config: ml_collections.ConfigDict) -> list[Run]:
    """The first reward condition with the guardrail rule layer off / penalise / mask.

    penalise: a violation ends the episode and costs `violation_penalty` (1.0 unless set);
    mask: the sampler may only emit tokens the rules allow.
    """
    reward = _names(config.conditions)[0]
    runs = []
    for mode in ("off", "penalise", "mask"):
        run_config = ml_collections.ConfigDict(config.to_dict())
        run_config.env.guardrail = mode
        if mode == "penalise" and not run_config.train.get("violation_penalty"):
            run_config.train.violation_penalty = 1.0
        runs.append(Run(f"guardrail_{mode}", (f"{reward}/guardrail={mode}",), run_config))
    return runs


def run_and_report(
    runs: Sequence[Run],
    config: ml_collections.ConfigDict,
    *,
    workdir: str,
    resume: bool = False,
    title: str = "",
    mesh: jax.sharding.Mesh | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Trains every run (seeds in parallel), then writes metrics.csv, curves.png, summary.*."""
    os.makedirs(workdir, exist_ok=True)
    seeds = list(range(config.first_seed, config.first_seed + config.seeds))
    rows = []
    for run in runs:
        setup = build(run.config)
        conditions = [label.split("/")[0] for label in run.conditions]
        run_rows = loop.run(
            setup.train_config,
            setup.env,
            setup.policy_config,
            setup.rollout_config,
            seeds=seeds,
            conditions=conditions,
            workdir=os.path.join(workdir, run.name),
            chunk_size=config.chunk_size,
            resume=resume,
            mesh=mesh,
            progress=progress,
        )
        labels = dict(zip(conditions, run.conditions, strict=True))
        rows += [{**row, "condition": labels[row["condition"]]} for row in run_rows]
    merged = MetricWriter(workdir, tensorboard=False)
    merged.clear()
    merged.write(rows)
    report.plot_curves(rows, os.path.join(workdir, "curves.png"), title=title)
    summary = report.summarize(rows)
    preface = f"# {title}\n\n" if title else ""
    report.write_summary(
        summary,
        os.path.join(workdir, "summary.md"),
        os.path.join(workdir, "summary.json"),
        preface=preface,
    )
    print(preface + report.markdown_table(summary))
    return summary


def _make(cls, values: Mapping[str, Any], section: str):
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"Unknown {section} config fields {unknown}; known: {sorted(known)}.")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def _names(text: str) -> list[str]:
    names = [name.strip() for name in str(text).split(",") if name.strip()]
    if not names:
        raise ValueError("config.conditions names no reward form.")
    return names
