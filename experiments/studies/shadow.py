"""Shadow mode: a served checkpoint's logs train and evaluate its next version.

1. Serve: the policy `config.policy` (v0) plays `config.rounds` rounds of
   `config.tasks_per_round` tasks `config.samples` times each (tasks from their own
   stream, disjoint from the held-out sets), and every episode is appended to
   `shadow_log.jsonl` (`rlagent.host.shadow`: one fsync per round).
2. Train from the log, read back by name: RS-SFT (`shadow.make_sft` on the episodes the
   judge accepts) and offline DPO (`shadow.dpo_records` -> `pairs.jsonl` in the
   preference format -> `load_records` -> `records_to_pairs` -> `make_offline_dpo`),
   each starting from v0; both new versions are saved as run folders (`v1_rs_sft/`,
   `v1_dpo/`) and loaded back from disk for what follows.
3. Off-policy evaluation: each version's sampled success estimated from v0's log alone
   (`shadow.off_policy_estimate`: per-episode importance sampling, plain and
   self-normalised, with bootstrap CIs and the effective sample size).
4. The truth: an A/B test (`experiments.studies.ab_test.compare_arms`) of v0 against each
   new version on held-out tasks, whose sampled success is what the OPE estimates.

Writes shadow_log.jsonl, pairs.jsonl, v1_*/, summary.md, summary.json, provenance.json.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.studies import ab_test
from experiments.studies.common import check_counts
from experiments.studies.sections import make
from rlagent.analysis.stats import format_interval
from rlagent.analysis.stats import takeoff_rate
from rlagent.host import provenance
from rlagent.host import shadow
from rlagent.host.workdir import prepare_workdir
from rlagent.host.workdir import refuse_resume
from rlagent.pipeline.warm_start import WarmStartConfig
from rlagent.preference import data as pref_data
from rlagent.preference import pairs as pairing
from rlagent.preference.dpo import DPOConfig
from rlagent.preference.dpo import make_offline_dpo
from rlagent.rollout import make_score
from rlagent.train.ppo import policy_graphdef

# Root of the served tasks' keys: a stream neither training nor the held-out sets use.
TRAFFIC_STREAM = 0x5AD0_7AFF
# Counts of the config (`check_config`): rounds, tasks per round, episodes per task (DPO
# ranks K >= 2 of one task), the seeds (the traffic seed is folded into a key: >= 0).
COUNTS = {"rounds": 1, "tasks_per_round": 1, "samples": 2, "traffic_seed": 0, "seed": None}
JUDGES = ("outcome", "guardrail")  # rlagent.host.shadow.judge_scores
LOG = "shadow_log.jsonl"
PAIRS = "pairs.jsonl"


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Serves v0, trains v1 versions from its log, estimates and tests them."""
    if resume:
        raise refuse_resume("shadow")
    if not config.policy:
        raise ValueError("shadow needs the served policy: --policy=RUN_FOLDER[@STEP]")
    sft_config = make(WarmStartConfig, config.sft, "sft")
    dpo_config = DPOConfig.from_mapping(config.dpo)
    check_config(config)
    start = time.time()
    served = ab_test.load_arm("v0", config.policy)
    prepare_workdir(workdir, overwrite=overwrite, resumable=False)
    record = provenance.collect(
        config.to_dict(),
        policy={
            "version": served.checkpoint.version,
            "provenance": provenance.read(ab_test.folder(config.policy)),
        },
    )
    provenance.write(workdir, record)
    log_path = os.path.join(workdir, LOG)
    serving = serve(served, config, log_path)
    records = shadow.read_logs([log_path])  # from here on, everything reads the log
    versions = {
        "v1_rs_sft": train_rs_sft(served, records, sft_config, config),
        "v1_dpo": train_dpo(served, records, dpo_config, config, workdir),
    }
    arms = {"v0": served}
    for name, (params, info) in versions.items():
        folder = os.path.join(workdir, name)
        shadow.save_checkpoint(folder, params, _policy_config(served, name, info), step=1)
        arms[name] = ab_test.load_arm(name, folder)  # the version as stored on disk
    summary = {
        "serving": serving,
        "training": {name: info for name, (_, info) in versions.items()},
        "ope": off_policy(arms, records),
        "ab": {name: ab_test.compare_arms(served, arms[name], config.ab) for name in versions},
    }
    write_report(summary, workdir)
    provenance.write(
        workdir, provenance.finish({**record, "wall_s": round(time.time() - start, 1)})
    )
    return summary


def check_config(config: ml_collections.ConfigDict) -> None:
    """Serving, judging and the A/B section's settings, refused naming the field before
    anything is served or written."""
    check_counts(config, COUNTS)
    if config.judge not in JUDGES:
        raise ValueError(f"config.judge must be one of {JUDGES}, got {config.judge!r}.")
    if not math.isfinite(float(config.accept)):
        raise ValueError(f"config.accept must be a finite score, got {config.accept!r}.")
    ab_test.check_config(config.ab, "config.ab")


def serve(arm: ab_test.Arm, config: ml_collections.ConfigDict, path: str) -> dict[str, Any]:
    """Plays the rounds and appends each one's episodes to the log (acknowledged after its
    fsync); returns counts and the logged success rate with a Clopper-Pearson CI."""
    tasks, samples = int(config.tasks_per_round), int(config.samples)
    rollout = ab_test.rollout_of(arm)
    sampling = {
        "temperature": arm.rollout_config.temperature,
        "constrained": arm.rollout_config.constrained,
        "window": arm.rollout_config.window,
    }
    root = jax.random.fold_in(jax.random.PRNGKey(TRAFFIC_STREAM), int(config.traffic_seed))
    successes = []
    with shadow.ShadowLog(path) as log:
        for index in range(int(config.rounds)):
            env_root, policy_root = jax.random.split(jax.random.fold_in(root, index))
            env_keys = jnp.repeat(jax.random.split(env_root, tasks), samples, axis=0)
            policy_keys = jax.random.split(policy_root, tasks * samples)
            played_at = shadow.now()
            trajectory = rollout(arm.checkpoint.params, env_keys, policy_keys)
            records = shadow.make_records(
                trajectory,
                env_keys,
                arm.env,
                id_prefix=f"round{index}",
                played_at=played_at,
                policy={"name": "v0", "version": arm.checkpoint.version},
                sampling=sampling,
            )
            log.append(records)
            successes += [float(r["success"]) for r in records]
    rate = takeoff_rate(successes, 0.5)  # the fraction of successful episodes, exact CI
    return {
        "episodes": len(successes),
        "tasks": tasks * int(config.rounds),
        "samples": samples,
        "success": {"value": rate["rate"], "low": rate["low"], "high": rate["high"]},
    }


def train_rs_sft(arm, records, sft_config: WarmStartConfig, config) -> tuple[Any, dict[str, Any]]:
    """v0 fine-tuned on the logged episodes the judge accepts (rejection sampling -> SFT)."""
    kept = shadow.accepted(records, judge=config.judge, threshold=float(config.accept))
    if not kept:
        raise ValueError(f"no logged episode is accepted by judge {config.judge!r}; log more")
    demonstrations, _ = shadow.to_trajectory(kept, arm.env, constrained=False)
    graphdef = policy_graphdef(ab_test.policy_config_of(arm))
    sft = jax.jit(shadow.make_sft(arm.env, graphdef, arm.rollout_config, sft_config))
    params, losses = sft(
        arm.checkpoint.params, demonstrations, jax.random.PRNGKey(int(config.seed))
    )
    losses = np.asarray(losses)
    info = {
        "accepted": len(kept),
        "episodes": len(records),
        "steps": sft_config.steps,
        "loss_first": float(losses[0]),
        "loss_last": float(losses[-1]),
    }
    return params, info


def train_dpo(arm, records, dpo_config: DPOConfig, config, workdir) -> tuple[Any, dict[str, Any]]:
    """v0 trained by offline DPO on the best-vs-worst pairs of each logged task, written to
    and read back from `pairs.jsonl` (the preference format)."""
    key = jax.random.PRNGKey(int(config.seed))
    path = os.path.join(workdir, PAIRS)
    pref_data.write_records(path, shadow.dpo_records(records, arm.env, judge=config.judge, key=key))
    loaded = pref_data.load_records(path)
    if not loaded:
        raise ValueError("no logged task has episodes the judge tells apart; log more")
    batch = pairing.records_to_pairs(
        loaded,
        arm.env,
        constrained=arm.rollout_config.constrained,
        level=dpo_config.level,
        segment_turns=dpo_config.segment_turns,
    )
    trainer = make_offline_dpo(
        dpo_config, arm.env, ab_test.policy_config_of(arm), arm.rollout_config
    )
    state = trainer.init(key, len(loaded), params=arm.checkpoint.params)
    reference = jax.jit(trainer.reference)(state, batch)
    updates = jax.jit(trainer.updates, static_argnums=3)
    state, metrics = updates(state, batch, reference, dpo_config.num_updates)
    metrics = jax.device_get(metrics)
    info = {
        "pairs": len(loaded),
        "steps": dpo_config.num_updates,
        **{f"{k}_last": float(np.asarray(v)[-1]) for k, v in metrics.items()},
    }
    return state.params, info


def off_policy(arms: dict[str, ab_test.Arm], records) -> dict[str, Any]:
    """Each version's success estimated from v0's log (importance sampling)."""
    served = arms["v0"]
    trajectory, _ = shadow.to_trajectory(
        records, served.env, constrained=served.rollout_config.constrained
    )
    score = jax.jit(
        make_score(
            served.env, policy_graphdef(ab_test.policy_config_of(served)), served.rollout_config
        )
    )
    returns = np.asarray([float(r["success"]) for r in records])
    return {
        name: shadow.off_policy_estimate(
            shadow.episode_log_ratios(score, arm.checkpoint.params, trajectory), returns
        )
        for name, arm in arms.items()
    }


def write_report(summary: dict[str, Any], workdir: str) -> None:
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    text = markdown(summary)
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write(text)
    print(text)


def markdown(summary: dict[str, Any]) -> str:
    serving, training = summary["serving"], summary["training"]
    fmt = format_interval
    lines = [
        "# Shadow mode: v0's logs train and evaluate v1",
        "",
        f"Served: {serving['episodes']} episodes ({serving['tasks']} tasks x "
        f"{serving['samples']}), logged success {fmt(serving['success'])} (Clopper-Pearson).",
        f"RS-SFT: {training['v1_rs_sft']['accepted']} accepted episodes, "
        f"{training['v1_rs_sft']['steps']} steps, NLL {training['v1_rs_sft']['loss_first']:.3f}"
        f" -> {training['v1_rs_sft']['loss_last']:.3f}.",
        f"DPO: {training['v1_dpo']['pairs']} pairs, {training['v1_dpo']['steps']} steps, "
        f"final loss {training['v1_dpo']['dpo_loss_last']:.3f}.",
        "",
        "| version | held-out sampled success (A/B arm) [95% CI] | OPE: IS [95% CI] "
        "| OPE: WIS [95% CI] | ESS | largest weight share |",
        "|---|---|---|---|---|---|",
    ]
    first = next(iter(summary["ab"].values()))["comparisons"]["success"]
    truth = {"v0": first["a_interval"]}
    truth.update({n: ab["comparisons"]["success"]["b_interval"] for n, ab in summary["ab"].items()})
    for name, ope in summary["ope"].items():
        lines.append(
            f"| {name} | {fmt(truth[name])} | {fmt(ope['is'])} | {fmt(ope['wis'])} | "
            f"{ope['ess']:.1f} / {ope['episodes']} | {ope['max_weight_share']:.3f} |"
        )
    lines += ["", "A/B tests against v0 on held-out tasks (experiments.studies.ab_test):", ""]
    for name, ab in summary["ab"].items():
        lines += [f"- {name}: **{ab['verdict']}**", *[f"  - {line}" for line in ab["lines"][1:]]]
    lines += [
        "",
        "OPE: per-episode importance weights pi_v(episode) / pi_v0(episode) over the "
        "policy tokens of v0's logged episodes; IS = mean(w R), WIS = sum(w R) / sum(w); "
        "percentile bootstrap 95% CIs over episodes; ESS = (sum w)^2 / sum w^2.",
        "",
    ]
    return "\n".join(lines)


def _policy_config(served: ab_test.Arm, name: str, info: dict[str, Any]) -> dict[str, Any]:
    """The resolved config of a new version: v0's env, model and rollout, and its origin."""
    config = served.checkpoint.config
    return {
        "env": config["env"],
        "model": config["model"],
        "rollout": config["rollout"],
        "trained_from": {"parent": served.checkpoint.version, "method": name, **info},
    }
