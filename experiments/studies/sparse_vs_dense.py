"""The main study: sparse outcome reward vs dense process rewards (ToolWorld, or the
environment `config.env.kind` names).

`run` trains every reward form of `config.conditions` side by side (`reward_runs`), or,
with `guardrail_sweep`, the first one with the guardrail rule layer off / penalise / mask
(`guardrail_runs`), and reports them (`common.run_and_report`).
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections

from experiments.studies import common
from experiments.studies import envs
from experiments.studies.common import Run


def reward_runs(config: ml_collections.ConfigDict) -> list[Run]:
    """All reward forms of `config.conditions` (comma-separated) in one run.

    They differ only in data (the reward weights), so they train side by side in one
    compiled program, every condition with every seed.
    """
    return [Run("rewards", tuple(common.plain_forms(config.conditions)), config)]


def guardrail_runs(config: ml_collections.ConfigDict) -> list[Run]:
    """The first reward condition with the guardrail rule layer off / penalise / mask.

    penalise: a violation ends the episode and costs `violation_penalty` (1.0 unless set);
    mask: the sampler may only emit tokens the rules allow.
    """
    reward = common.plain_forms(config.conditions)[0]
    if "guardrail" not in config.env:
        kind = config.env.get("kind", "toolworld")
        raise ValueError(f"--guardrail_sweep: config.env.kind {kind!r} has no guardrail field.")
    runs = []
    for mode in ("off", "penalise", "mask"):
        run_config = ml_collections.ConfigDict(config.to_dict())
        run_config.env.guardrail = mode
        if mode == "penalise" and not run_config.train.get("violation_penalty"):
            run_config.train.violation_penalty = 1.0
        runs.append(Run(f"guardrail_{mode}", (f"{reward}/guardrail={mode}",), run_config))
    return runs


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
    guardrail_sweep: bool = False,
    mesh: jax.sharding.Mesh | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Trains and reports the reward forms (or the guardrail sweep) into `workdir`."""
    if guardrail_sweep:
        runs = guardrail_runs(config)
        title = "ToolWorld: guardrail rule layer off / penalise / mask"
    else:
        runs = reward_runs(config)
        title = f"{envs.title(config.env)}: sparse outcome vs dense process rewards"
    return common.run_and_report(
        runs, config, workdir=workdir, resume=resume, overwrite=overwrite, title=title,
        mesh=mesh, progress=progress,
    )  # fmt: skip
