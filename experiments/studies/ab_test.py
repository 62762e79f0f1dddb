"""A/B test of two policy checkpoints on the same held-out tasks and keys.

Both arms play `config.tasks` held-out tasks (`rlagent.train.evaluation.eval_keys` of
set `config.heldout_set`, a stream no training run draws from), each `config.samples`
times at the checkpoint's sampling temperature with the same policy keys, and once
greedily. The task is the unit of every comparison (`rlagent.analysis.paired`): per task
the arm's mean success, violations, turns and (dialogue) satisfaction over its samples,
compared with a paired bootstrap CI of the mean difference B - A and a paired sign-flip
test (Holm-corrected over the metrics besides the primary one, sampled success), plus
the unbiased pass@k and pass^k for k = 1..samples. The two checkpoints must share the
environment and the model (`check_same` names the first differing field); the guardrail
mode of each arm may be set (`config.guardrail_a` / `guardrail_b`: the rule layer added
after training, e.g. 'mask').

Writes summary.md (the verdict line first), summary.json (every number, per-task values
included) and provenance.json (the config, both checkpoints' versions and provenance);
a non-empty workdir is refused unless `overwrite`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Mapping
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.studies.common import check_counts
from experiments.studies.envs import KINDS
from experiments.studies.envs import make_env
from experiments.studies.sections import make
from rlagent import parallel
from rlagent.analysis import paired
from rlagent.analysis.stats import format_interval
from rlagent.analysis.stats import holm
from rlagent.host import provenance
from rlagent.host import shadow
from rlagent.host.workdir import prepare_workdir
from rlagent.host.workdir import refuse_resume
from rlagent.models import PolicyConfig
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_rollout
from rlagent.train.evaluation import eval_keys
from rlagent.train.ppo import policy_graphdef

# Metrics per episode: (name, higher is better: None for turns, which giving up shortens);
# those the environment lacks are left out.
METRICS = (
    ("success", True),
    ("greedy success", True),
    ("violations", False),
    ("turns", None),
    ("satisfaction", True),
)
PRIMARY = "success"
# The fields two arms must share: what the policy reads and is (the guardrail mode of
# each arm's evaluation may be set separately).
SHARED = ("env", "model", "rollout.window")


# Counts of the config (`check_config`): at least 2 tasks (a paired comparison needs a
# spread), episodes per task, bootstrap resamples, the held-out set, the NumPy seed.
COUNTS = {"tasks": 2, "samples": 1, "reps": 1, "heldout_set": 0, "first_seed": 0}


class Arm(NamedTuple):
    name: str  # "A" or "B".
    checkpoint: shadow.Checkpoint
    env: Any
    rollout_config: RolloutConfig


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Plays both arms, compares them and writes the report (module docstring)."""
    if resume:
        raise refuse_resume("ab_test")
    if not config.a or not config.b:
        raise ValueError("ab_test needs two checkpoints: --a=RUN_FOLDER[@STEP] --b=...")
    check_config(config)
    start = time.time()
    arm_a = load_arm("A", config.a, config.guardrail_a)
    arm_b = load_arm("B", config.b, config.guardrail_b)
    check_same(arm_a.checkpoint.config, arm_b.checkpoint.config)
    prepare_workdir(workdir, overwrite=overwrite, resumable=False)
    record = provenance.collect(
        config.to_dict(),
        arms={
            arm.name: {
                "version": arm.checkpoint.version,
                "env": provenance.resolved(env=arm.env.config)["env"],
                "checkpoint_provenance": provenance.read(folder(arm_spec)),
            }
            for arm, arm_spec in ((arm_a, config.a), (arm_b, config.b))
        },
    )
    provenance.write(workdir, record)
    summary = compare_arms(arm_a, arm_b, config)
    parallel.primary_decides(lambda: write_report(summary, workdir))
    provenance.write(
        workdir, provenance.finish({**record, "wall_s": round(time.time() - start, 1)})
    )
    return summary


def check_config(config: ml_collections.ConfigDict, where: str = "config") -> None:
    """The comparison's settings, refused naming the field before anything is played or
    written (`compare_arms` reads them)."""
    check_counts(config, COUNTS, where)
    if not isinstance(config.greedy, bool):
        raise ValueError(f"{where}.greedy must be True or False, got {config.greedy!r}.")
    if not 0.0 < float(config.alpha) < 1.0:  # also NaN
        raise ValueError(f"{where}.alpha must be in (0, 1), got {config.alpha!r}.")


def load_arm(name: str, spec: str, guardrail: str = "") -> Arm:
    """Arm `name` of checkpoint `spec` (`shadow.load_checkpoint`), its environment (with
    the guardrail mode `guardrail` when given) and the rollout it was trained with
    (constrained when the guardrail masks)."""
    checkpoint = shadow.load_checkpoint(spec)
    section = env_section(checkpoint.config["env"])
    if guardrail:
        if "guardrail" not in section:
            raise ValueError(f"guardrail_{name.lower()}: {section['kind']} has no guardrail field")
        section["guardrail"] = guardrail
        try:
            make_env(section)
        except ValueError as error:
            raise ValueError(f"guardrail_{name.lower()}: {error}") from None
    env = make_env(section)
    rollout = make(RolloutConfig, checkpoint.config["rollout"], "rollout")
    if getattr(env, "requires_constrained", False):
        rollout = dataclasses.replace(rollout, constrained=True)
    return Arm(name, checkpoint, env, rollout)


def env_section(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The `env` section (`kind` and fields) of a run folder's resolved env config, which
    the host loop stores without its kind: the kind whose config has exactly its fields."""
    names = set(fields) - {"kind"}
    for kind, spec in KINDS.items():
        if names == {f.name for f in dataclasses.fields(spec.config)}:
            return {**fields, "kind": kind}
    raise ValueError(f"no environment kind has the config fields {sorted(names)}")


def check_same(config_a: Mapping[str, Any], config_b: Mapping[str, Any]) -> None:
    """Refuses two checkpoints whose environment or model differ, naming the fields."""
    diff = provenance.config_mismatch(_shared(config_a), _shared(config_b))
    if diff:
        raise ValueError(
            "checkpoints A and B differ (A -> B) in " + "; ".join(diff) + ": an A/B test "
            "compares two policies of one environment and model"
        )


def compare_arms(arm_a: Arm, arm_b: Arm, config: ml_collections.ConfigDict) -> dict[str, Any]:
    """Per-task metrics of both arms on the same keys and their paired comparisons."""
    check_config(config)
    tasks, samples = int(config.tasks), int(config.samples)
    sides = {"A": arm_a, "B": arm_b}
    per_task = {
        side: play_arm(arm, tasks, samples, int(config.heldout_set), greedy=bool(config.greedy))
        for side, arm in sides.items()
    }
    names = [(m, up) for m, up in METRICS if m in per_task["A"] and m in per_task["B"]]
    comparisons = {
        m: paired.compare(
            per_task["A"][m],
            per_task["B"][m],
            higher_is_better=up,
            reps=int(config.reps),
            seed=int(config.first_seed),
        )
        for m, up in names
    }
    secondary = [m for m in comparisons if m != PRIMARY]
    adjusted = holm([comparisons[m]["p_value"] for m in secondary]) if secondary else []
    for m, p in zip(secondary, adjusted, strict=True):
        comparisons[m]["p_holm"] = float(p)
    comparisons[PRIMARY]["p_holm"] = comparisons[PRIMARY]["p_value"]  # the one primary test
    passes = {}
    for k in range(1, samples + 1):
        estimates = {arm: paired.per_task_pass(per_task[arm]["successes"], k) for arm in ("A", "B")}
        for name in estimates["A"]:
            passes[name] = paired.compare(
                estimates["A"][name],
                estimates["B"][name],
                reps=int(config.reps),
                seed=int(config.first_seed),
            )
    alpha = float(config.alpha)
    return {
        "verdict": paired.verdict(PRIMARY, comparisons[PRIMARY], alpha=alpha),
        "lines": [
            paired.verdict(m, c, alpha=alpha, p_key="p_holm") for m, c in comparisons.items()
        ],
        "arms": {
            side: {
                "name": arm.name,
                "version": arm.checkpoint.version,
                "guardrail": getattr(arm.env.config, "guardrail", None),
            }
            for side, arm in sides.items()
        },
        "tasks": tasks,
        "samples": samples,
        "heldout_set": int(config.heldout_set),
        "alpha": alpha,
        "comparisons": comparisons,
        "pass": passes,
        "per_task": {
            arm: {m: np.asarray(v).tolist() for m, v in values.items()}
            for arm, values in per_task.items()
        },
    }


def play_arm(
    arm: Arm, tasks: int, samples: int, heldout_set: int, *, greedy: bool = True
) -> dict[str, np.ndarray]:
    """`{metric: [tasks]}` means over `samples` sampled episodes per task (plus, with
    `greedy`, the greedy episode's success, and `successes [tasks, samples]`), on the
    held-out set `heldout_set`. In a multi-process run each process plays its share of
    the tasks (`parallel.split`) and the shares are joined in task order
    (`parallel.gather_items`)."""
    if tasks < jax.process_count():
        raise ValueError(f"config.tasks={tasks} is fewer than the {jax.process_count()} processes.")
    env_keys, policy_keys = eval_keys(tasks, heldout_set)
    mine = np.asarray(parallel.split(range(tasks)), np.int32)
    env_keys, policy_keys = env_keys[mine], policy_keys[mine]
    keys = jnp.repeat(env_keys, samples, axis=0)  # [tasks * samples]: task-major
    sample_keys = jax.vmap(lambda k: jax.random.split(k, samples))(policy_keys).reshape(
        -1, *policy_keys.shape[1:]
    )
    params = arm.checkpoint.params
    episodes = episode_values(rollout_of(arm)(params, keys, sample_keys))
    out = {m: v.reshape(len(mine), samples).mean(axis=1) for m, v in episodes.items()}
    out["successes"] = episodes["success"].reshape(len(mine), samples) > 0.5
    if greedy:
        play = rollout_of(arm, greedy=True)
        out["greedy success"] = episode_values(play(params, env_keys, policy_keys))["success"]
    per_task = {int(task): {m: v[i] for m, v in out.items()} for i, task in enumerate(mine)}
    every = parallel.gather_items(per_task, range(tasks))
    return {m: np.asarray([task[m] for task in every], v.dtype) for m, v in out.items()}


def episode_values(trajectory) -> dict[str, np.ndarray]:
    """`{metric: [B]}` per episode: success, violations (turns that broke a rule), turns
    played and, with a user rating, satisfaction (stars, 3 + 2 * rating)."""
    traj = jax.device_get(trajectory)
    valid = np.asarray(traj.turn_mask, np.float64)
    out = {"success": np.asarray(traj.episode_success, np.float64), "turns": valid.sum(axis=1)}
    if "violations" in traj.signals:
        out["violations"] = (np.asarray(traj.signals["violations"]) * valid).sum(axis=1)
    if "rating" in traj.signals:
        out["satisfaction"] = 3.0 + 2.0 * (np.asarray(traj.signals["rating"]) * valid).sum(axis=1)
    return out


def write_report(summary: Mapping[str, Any], workdir: str) -> None:
    """summary.md (verdict, table of metrics, pass@k / pass^k) and summary.json."""
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write(markdown(summary))
    print(markdown(summary))


def markdown(summary: Mapping[str, Any]) -> str:
    arms = summary["arms"]
    lines = [
        "# A/B test",
        "",
        f"**{summary['verdict']}**",
        "",
        *[
            f"- {side}{'' if arm['name'] == side else ' (' + arm['name'] + ')'}: "
            f"`{arm['version']}` (guardrail {arm['guardrail']})"
            for side, arm in arms.items()
        ],
        "",
        f"{summary['tasks']} held-out tasks (set {summary['heldout_set']}), "
        f"{summary['samples']} sampled episodes per task and arm with the same keys"
        f"{', one greedy' if 'greedy success' in summary['comparisons'] else ''}.",
        "",
        "| metric | A [95% CI] | B [95% CI] | B - A [95% CI] | p | p (Holm) | |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, c in summary["comparisons"].items():
        lines.append(_row(name, c, c["p_holm"]))
    lines += [
        "",
        "| pass estimate | A [95% CI] | B [95% CI] | B - A [95% CI] | p | |",
        "|---|---|---|---|---|---|",
    ]
    for name, c in summary["pass"].items():
        lines.append(_row(name, c))
    lines += [
        "",
        *[f"- {line}" for line in summary["lines"]],
        "",
        "Per task: the mean over its sampled episodes (greedy: one episode); A and B: the "
        "mean over tasks with a percentile bootstrap 95% CI over tasks; B - A is the "
        "mean over tasks of the paired difference with a percentile bootstrap 95% CI over "
        "tasks; p: two-sided paired sign-flip test (exact up to 16 tasks that differ, else "
        "Monte Carlo); Holm over the secondary metrics (success is the primary test). "
        "pass@k / pass^k: the unbiased estimators from the sampled episodes of each task.",
        "",
    ]
    return "\n".join(lines)


def _row(name: str, c: Mapping[str, Any], p_holm: float | None = None) -> str:
    d = c["diff"]
    cells = [
        name,
        format_interval(c["a_interval"]),
        format_interval(c["b_interval"]),
        f"{d['value']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]",
        f"{c['p_value']:.3g}",
    ]
    if p_holm is not None:
        cells.append(f"{p_holm:.3g}")
    cells.append("*" if (p_holm if p_holm is not None else c["p_value"]) < 0.05 else "")
    return "| " + " | ".join(cells) + " |"


def _shared(config: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in SHARED:
        head, _, tail = path.partition(".")
        value = config.get(head, {})
        out[head] = {tail: value.get(tail)} if tail else value
    return out


def folder(spec: str) -> str:
    """The run folder of a checkpoint spec `RUN_FOLDER[@STEP][#CONDITION/SEED]`."""
    return spec.partition("#")[0].partition("@")[0]


def policy_config_of(arm: Arm) -> PolicyConfig:
    """The arm's model config (its checkpoint's `model` section)."""
    return make(PolicyConfig, arm.checkpoint.config["model"], "model")


def rollout_of(arm: Arm, *, greedy: bool = False):
    """The jitted rollout of the arm (sampled, or greedy at temperature 0); one compile per
    model, environment and rollout config."""
    config = (
        dataclasses.replace(arm.rollout_config, temperature=0.0) if greedy else arm.rollout_config
    )
    return _rollout(policy_config_of(arm), arm.env, config)


@functools.lru_cache(maxsize=8)
def _rollout(policy_config: PolicyConfig, env, rollout_config: RolloutConfig):
    return jax.jit(make_rollout(env, policy_graphdef(policy_config), rollout_config))
