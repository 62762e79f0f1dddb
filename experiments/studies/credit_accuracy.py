"""The credit-accuracy study: every estimator's credit against Monte-Carlo advantages.

For each policy x horizon x seed, B episodes of the environment `config.env.kind`
(ToolWorld when the config has no `env` section) whose shortest solution is the
horizon (`experiments.studies.envs.horizon_env`; groups of `group_size` share a task) are
played, every played turn gets its MC advantage under each reward form
(`rlagent.credit.mc`), and each estimator's per-turn credit on the same batch is scored
(`rlagent.credit.accuracy`). One row per policy x horizon x estimator x reward x seed.

Policies of several skill levels: `random` (uniform over the grammar), `prover_<eps>`
(per turn, the oracle with probability eps, else random), `oracle`, acting on the
environment state (`env_policy`), and `ppo_<k>`, the tiny policy LM of the main
experiment after k updates of a short PPO run on the horizon's task (`ppo_0`:
untrained). The MC target is the advantage of the behaviour policy itself (continuations
by the same policy; the LM resumes from the rollout's carries).

Critic: critic-based estimators (GAE, hierarchical) read a value per token. Every one of
them gets the same *unbiased noisy critic*: V^(s) = the mean return of `critic_samples`
continuations from the start of turn s (independent of the MC target's), put on every
token of the turn, for every policy (the LM's own value head, trained on one reward form,
is not used). So differences between estimators come from how they assign credit, not
from how well a critic happened to train; a learned critic adds its bias on top.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.studies.common import LMSetup
from experiments.studies.common import check_counts
from experiments.studies.common import check_lm
from experiments.studies.common import checkpoint
from experiments.studies.common import distinct
from experiments.studies.common import env_policy
from experiments.studies.common import estimator_config
from experiments.studies.common import ints
from experiments.studies.common import lm_setup
from experiments.studies.common import names
from experiments.studies.envs import horizon_env
from experiments.studies.envs import study_kind
from rlagent import parallel
from rlagent.analysis import report
from rlagent.analysis.stats import format_mean_ci
from rlagent.credit import accuracy
from rlagent.credit import lm
from rlagent.credit import mc
from rlagent.envs.base import Environment
from rlagent.envs.base import verdict_of
from rlagent.host import provenance
from rlagent.host.workdir import prepare_workdir
from rlagent.host.workdir import refuse_resume
from rlagent.host.writers import MetricWriter
from rlagent.rollout import make_rollout
from rlagent.train.config import LEARNED_REWARDS
from rlagent.train.config import TrainConfig
from rlagent.train.rewards import check_forms
from rlagent.train.rewards import reward_weights
from rlagent.train.rewards import turn_rewards
from rlagent.types import Trajectory

METRICS = tuple(accuracy.CreditAccuracy._fields)


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Runs the study; writes credit.csv, credit_vs_horizon.png (Spearman),
    auroc_vs_horizon.png, summary.md, summary.json and provenance.json.

    A non-empty `workdir` is refused unless `overwrite` (which empties it first); the
    study keeps no checkpoints, so `resume` is refused. In a multi-process run the seeds
    are split over the processes (`parallel.split`), their rows joined in seed order
    (`parallel.gather_items`), and process 0 writes.
    """
    if resume:
        raise refuse_resume("experiments.credit_accuracy")
    study = plan(config)  # config errors before anything is written
    prepare_workdir(workdir, overwrite=overwrite, resumable=False)
    base = study.base
    weights = jnp.stack([reward_weights(base, r) for r in study.rewards])
    rows = []
    start = time.time()
    for horizon in study.horizons:
        env = horizon_env(study.kind, horizon, section=config.get("env"))
        for policy_name in study.policies:
            measure = make_measure(env, policy_name, base, config)
            seeds = range(config.first_seed, config.first_seed + config.seeds)
            mine = {}  # seed -> its rows, this process's seeds
            for seed in parallel.split(seeds):
                batch = measure(jax.random.key(seed), weights)
                mine[seed] = []
                for (spec, est_config), (r, reward) in _product(
                    study.estimators.items(), study.rewards
                ):
                    acc = _score(est_config, batch, r, weights[r])
                    mine[seed].append(
                        dict(
                            policy=policy_name,
                            horizon=horizon,
                            estimator=spec,
                            reward=reward,
                            seed=seed,
                            **{k: float(v) for k, v in acc._asdict().items()},
                            success=float(batch.success),
                            turns=float(batch.turns),
                        )
                    )
            rows += [row for rows_of in parallel.gather_items(mine, seeds) for row in rows_of]
            if parallel.is_primary():
                print(f"horizon {horizon} {policy_name}: {time.time() - start:.0f}s", flush=True)
    return parallel.primary_decides(lambda: _write_report(rows, workdir, config, start))


# Counts of the config (`common.check_counts`): Monte-Carlo continuations per value and
# behind the noisy critic, continuations played at once.
COUNTS = {
    "seeds": 1, "first_seed": None, "num_samples": 1, "critic_samples": 1, "chunk_size": 1,
}  # fmt: skip


class Plan(NamedTuple):
    """What a credit-accuracy config asks for, checked (`plan`)."""

    kind: str  # the environment (`config.env.kind`, experiments.studies.envs).
    base: TrainConfig  # TrainConfig fields every estimator shares (batch of the study).
    estimators: dict[str, TrainConfig]  # spec (`name` or `name@lam`) -> its TrainConfig.
    rewards: list[str]  # reward forms the MC target and the estimators see.
    horizons: list[int]  # shortest episodes in turns.
    policies: list[str]  # behaviour (and continuation) policies.


def plan(config: ml_collections.ConfigDict) -> Plan:
    """The checked plan of `config`; a bad value is refused naming its field (nothing is
    computed or written)."""
    kind = study_kind(config)
    base = TrainConfig.from_mapping(
        {**config.train, "num_groups": config.num_groups, "group_size": config.group_size}
    )
    estimators = {}
    for spec in names(config.estimators, "estimators", "estimator"):
        try:
            estimators[spec] = estimator_config(base, spec)
        except ValueError as error:
            raise ValueError(f"config.estimators: {spec!r}: {error}") from None
    distinct(list(estimators.items()), "estimators", "estimator")
    rewards = names(config.rewards, "rewards", "reward form")
    learned = [r for r in rewards if r in LEARNED_REWARDS]
    if learned:  # no PRM scores the Monte-Carlo episodes: their learned components are 0
        raise ValueError(f"config.rewards: {learned} read a process reward model's scores.")
    horizons, policies = _check_config(config, kind, base, rewards)
    return Plan(kind, base, estimators, rewards, horizons, policies)


def _write_report(rows, workdir: str, config, start: float) -> dict[str, Any]:
    """credit.csv, the two figures, summary.json / summary.md and provenance.json."""
    writer = MetricWriter(workdir, tensorboard=False, filename="credit.csv")
    writer.clear()
    writer.write(rows)
    plot(rows, os.path.join(workdir, "credit_vs_horizon.png"))
    plot(rows, os.path.join(workdir, "auroc_vs_horizon.png"), metric="auroc_verdict")
    summary = summarize(rows)
    provenance.write(
        workdir,
        provenance.collect(config.to_dict(), wall_s=time.time() - start, rows=len(rows)),
    )
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    table = markdown(summary)
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write(table)
    print(table)
    return summary


class _Batch(NamedTuple):
    """What the estimators and the scores need from one measured batch (device arrays)."""

    trajectory: Trajectory  # the behaviour episodes (their values are replaced).
    values: jax.Array  # [R, B, S] noisy critic per reward form.
    mc: mc.MCValues  # fields [R, B, S].
    success: jax.Array  # [] success rate of the behaviour episodes.
    turns: jax.Array  # [] mean turns per episode.


def _check_config(
    config, kind: str, base: TrainConfig, rewards: list[str]
) -> tuple[list[int], list[str]]:
    """`(horizons, policies)` of the config; a bad value is refused naming its field."""
    check_counts(config, COUNTS)
    horizons = ints(config.horizons, "horizons", "horizon")
    envs = []
    for horizon in horizons:
        try:
            envs.append(horizon_env(kind, horizon, section=config.get("env")))
        except ValueError as error:
            raise ValueError(f"config.horizons: {error}") from None
    policies = names(config.policies, "policies", "policy")
    probe = envs[0]
    check_forms(probe, base, rewards, "config.rewards")
    for name in policies:
        try:
            if name.startswith("ppo_"):
                if int(name.removeprefix("ppo_")) < 0:
                    raise ValueError(f"{name!r}: the number of updates must be >= 0")
            else:
                env_policy(probe, name)
        except ValueError as error:
            raise ValueError(f"config.policies: {error}") from None
    distinct(
        [(n, int(n.removeprefix("ppo_")) if n.startswith("ppo_") else n) for n in policies],
        "policies",
        "policy",
    )
    if any(name.startswith("ppo_") for name in policies):
        check_lm(config, probe)
    return horizons, policies


def make_measure(env: Environment, name: str, base: TrainConfig, config) -> Callable:
    """`measure(key, weights [R, C]) -> _Batch` for the policy called `name`.

    `random` and `prover_<eps>` act on the environment state; `ppo_<k>` is the policy LM
    after k updates of a short PPO run on this horizon (`config.ppo`, seed
    `config.first_seed`), continued by itself from the rollout's carries.
    """
    if name.startswith("ppo_"):
        setup = lm_setup(config, env)
        params = checkpoint(env, setup, config, int(name.removeprefix("ppo_")))
        measure = _lm_measure(env, setup, base, _Sampling.of(config))
        return lambda key, weights: measure(params, key, weights)
    policy = env_policy(env, name)
    play = mc.play_env_policy(env, policy)

    def env_episodes(params, env_keys, policy_keys):
        del params
        played = mc.rollout_env_policy(env, policy, env_keys, policy_keys)
        return mc.env_trajectory(env, played), played.states, play

    measure = _measure_fn(env_episodes, base, _Sampling.of(config))
    return lambda key, weights: measure(None, key, weights)


@functools.cache
def _lm_measure(env: Environment, setup: LMSetup, base: TrainConfig, sampling) -> Callable:
    """One compiled measurement per environment, shared by every LM checkpoint."""
    rollout = make_rollout(env, setup.graphdef, setup.rollout_config, with_carries=True)

    def episodes(params, env_keys, policy_keys):
        trajectory, carries = rollout(params, env_keys, policy_keys)
        play = lm.play_policy(env, setup.graphdef, setup.rollout_config, params)
        # Scoring reads no sampling mask: drop it so LM and environment-level batches
        # share the estimators' compiled programs.
        trajectory = trajectory._replace(sampling_mask=None)
        return trajectory, lm.forks_from_carries(carries), play

    return _measure_fn(episodes, base, sampling)


class _Sampling(NamedTuple):
    num_samples: int
    critic_samples: int
    chunk_size: int

    @classmethod
    def of(cls, config) -> _Sampling:
        return cls(config.num_samples, config.critic_samples, config.chunk_size)


def _measure_fn(episodes: Callable, base: TrainConfig, sampling: _Sampling) -> Callable:
    """Jitted `measure(params, key, weights) -> _Batch` around `episodes(params, env_keys,
    policy_keys) -> (trajectory, forks, play)`."""

    @jax.jit
    def measure(params, key, weights):
        env_key, policy_key, mc_key, critic_key = jax.random.split(key, 4)
        env_keys = jnp.repeat(jax.random.split(env_key, base.num_groups), base.group_size, 0)
        policy_keys = jax.random.split(policy_key, base.batch_size)
        trajectory, forks, play = episodes(params, env_keys, policy_keys)
        estimate = functools.partial(
            mc.mc_values,
            play,
            forks,
            mc.trajectory_signals(trajectory),
            reward_weights=weights,
            config=base,
            chunk_size=sampling.chunk_size,
        )
        target = estimate(mc_key, num_samples=sampling.num_samples)
        critic = estimate(critic_key, num_samples=sampling.critic_samples)
        success = jnp.mean(trajectory.episode_success)
        turns = jnp.mean(jnp.sum(trajectory.turn_mask, axis=1))
        return _Batch(trajectory, critic.value, target, success, turns)

    return measure


@functools.partial(jax.jit, static_argnums=0)
def _score_jit(est_config, trajectory, values, rewards, advantage, advantage_se):
    turn_mask = trajectory.turn_mask
    played = trajectory.loss_mask
    trajectory = trajectory._replace(values=jnp.where(played, values[..., None], 0.0))
    credit = accuracy.estimator_credit(trajectory, rewards, est_config)
    return accuracy.credit_accuracy(
        credit, advantage, advantage_se, turn_mask, verdict_of(trajectory)
    )


def _score(est_config: TrainConfig, batch: _Batch, r: int, weights) -> accuracy.CreditAccuracy:
    rewards = turn_rewards(batch.trajectory, est_config, weights)
    return _score_jit(
        est_config,
        batch.trajectory,
        batch.values[r],
        rewards,
        batch.mc.advantage[r],
        batch.mc.advantage_se[r],
    )


# Reports --------------------------------------------------------------------------------


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean and 95% CI over seeds of every metric, keyed reward / policy / estimator / horizon."""
    cells = report.group_rows(
        rows, lambda row: (row["reward"], row["policy"], row["estimator"], row["horizon"])
    )
    summary: dict[str, Any] = {}
    for (reward, policy, estimator, horizon), cell in cells.items():
        entry = report.cell_mean_cis(cell, METRICS + ("success", "turns"))
        node = summary.setdefault(reward, {}).setdefault(policy, {}).setdefault(estimator, {})
        node[str(horizon)] = entry
    return summary


def markdown(summary: Mapping[str, Any], metric: str = "spearman") -> str:
    """One table per reward form and policy: estimators x horizons, mean ± 95% CI."""
    lines = [f"# Credit accuracy ({metric} with the Monte-Carlo advantage, mean ± 95% CI)\n"]
    for reward, policies in summary.items():
        for policy, estimators in policies.items():
            horizons = list(next(iter(estimators.values())))
            first = next(iter(estimators.values()))
            lines.append(f"\n## reward {reward}, policy {policy}\n")
            table = [
                [estimator] + [format_mean_ci(by_horizon[h][metric]) for h in horizons]
                for estimator, by_horizon in estimators.items()
            ]
            table.append(
                ["behaviour success"] + [format_mean_ci(first[h]["success"]) for h in horizons]
            )
            table.append(
                ["turns / episode"] + [format_mean_ci(first[h]["turns"]) for h in horizons]
            )
            lines += report.markdown_rows(["estimator"] + [f"h={h}" for h in horizons], table)
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[Mapping[str, Any]], path: str, metric: str = "spearman") -> None:
    """Accuracy vs horizon, one line per estimator (95% CI over seeds): reward x policy grid.

    Bands are Student-t 95% intervals of the mean over seeds, clipped to the metric's
    range (correlations [-1, 1], AUROC and sign agreement [0, 1]).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarize(rows)
    limits = (-1.0, 1.0) if metric in ("spearman", "pearson") else (0.0, 1.0)
    rewards = list(summary)
    policies = list(next(iter(summary.values())))
    fig, axes = plt.subplots(
        len(rewards),
        len(policies),
        figsize=(3.6 * len(policies), 3.0 * len(rewards)),
        squeeze=False,
        sharex=True,
        sharey=True,
    )
    for i, reward in enumerate(rewards):
        for j, policy in enumerate(policies):
            ax = axes[i, j]
            for estimator, by_horizon in summary[reward][policy].items():
                points = [(int(h), e[metric]) for h, e in by_horizon.items() if e[metric]]
                points.sort()
                if not points:
                    continue
                x = [h for h, _ in points]
                mean = np.array([s["mean"] for _, s in points])
                ci = np.array([s["ci95"] for _, s in points])
                (line,) = ax.plot(x, mean, marker="o", markersize=3, label=estimator)
                low, high = np.clip(mean - ci, *limits), np.clip(mean + ci, *limits)
                ax.fill_between(x, low, high, alpha=0.15, color=line.get_color())
            ax.set_ylim(limits[0] - 0.05, limits[1] + 0.05)
            ax.set_title(f"{reward} / {policy}", fontsize=9)
            ax.grid(alpha=0.3)
            if i == len(rewards) - 1:
                ax.set_xlabel("horizon (shortest plan, turns)")
            if j == 0:
                ax.set_ylabel(metric)
    axes[0, -1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _product(first, second):
    second = list(enumerate(second))
    return [(a, b) for a in first for b in second]
