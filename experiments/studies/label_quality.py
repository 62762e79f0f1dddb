"""The label-quality study: automatic step labels scored against the oracle verdict.

A behaviour policy plays B episodes of the experiment's task; from the start of every
played turn (`rlagent.credit.mc` forks: the LM's rollout carries, or replayed environment
states) each *completer* plays continuations, and their successes give the step labels of
`rlagent.prm.labels`:

* completion labels (Math-Shepherd): hard = some continuation after the step succeeds,
  soft = the fraction that do (the completer is the policy that completes);
* progress labels (PAV): `(1 + Q_mu - V_mu) / 2` under the prover mu (the completer is the
  prover).

Every label is scored against the oracle verdict (`labels.label_quality`: accuracy and
AUROC over turns with a non-zero verdict) for N = 1, 2, 4, ... continuations, with its cost
in environment turns (`MCValues.turns`: completion labels play only the continuations
after the step, `mc_values(q_only=True)`; progress labels those before it too).

Completers (the names of `config.completers`):
  policy              the behaviour policy itself (what the learned PRM of training uses);
  policy+oracle_<eps> the behaviour policy, each continuation replaced by the oracle's with
                      probability eps (the prover of `PRMConfig.prover_epsilon`);
  random, prover_<eps>, oracle
                      environment-level policies of `common.env_policy`
                      (uniform over the grammar; per turn the oracle with probability eps).
Behaviours (`config.behaviours`) are `ppo_<k>` (the policy LM after k PPO updates,
`common.checkpoint`) or environment-level policies. The AUROC needs turns the
oracle judged good and bad in one batch: an early learner makes almost only mistakes
(level 2: 3 good of 168 judged turns at `ppo_0`), `prover_0.5` about as many of each.

The N-sweep shares its continuations: `max(N)` independent single-continuation estimates
(`mc_values(num_samples=1)`) per completer and label kind, and the label with N
continuations averages the first N of them (costing the sum of their turns). Each N is
thus an unbiased N-sample label, and the curves over N compare labels of common random
numbers.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.studies import common
from experiments.studies.common import names
from rlagent.analysis import report
from rlagent.analysis.stats import format_mean_ci
from rlagent.credit import lm
from rlagent.credit import mc
from rlagent.envs.base import verdict_of
from rlagent.envs.toolworld import ToolWorld
from rlagent.host.writers import MetricWriter
from rlagent.prm import labels
from rlagent.rollout import make_rollout
from rlagent.train.config import TrainConfig
from rlagent.train.rewards import reward_weights
from rlagent.types import Trajectory

# (labeller, label form) of every row, in table order.
LABELLERS = (("completion", "hard"), ("completion", "soft"), ("progress", "soft"))
FILENAME = "label_quality.csv"
# The counts of the study's section (`common.check_counts`): seeds, behaviour episodes per
# seed, continuations played at once.
COUNTS = {"seeds": 1, "first_seed": None, "num_episodes": 1, "chunk_size": 1}
# Summarised per labeller, completer and N: mean and 95% CI over seeds.
QUALITY_METRICS = ("accuracy", "auroc", "label_turns", "label_turns_per_turn")


def run(config: ml_collections.ConfigDict, env: ToolWorld, workdir: str) -> list[dict[str, Any]]:
    """Runs the study on `env`; writes label_quality.csv and label_quality.png to workdir.

    Args:
      config: the study's section (see experiments/configs/process_rewards.py `labels`):
        behaviours, completers, samples, seeds, first_seed, num_episodes, chunk_size, and
        model / rollout / ppo for LM behaviours (`common.checkpoint`).
      env: the task.
      workdir: output folder (created).
    Returns:
      The rows, one per behaviour x seed x completer x labeller x N.
    """
    samples = validate(config, env)
    completers = names(config.completers, "labels.completers", "completer")
    rows = []
    for behaviour_name in names(config.behaviours, "labels.behaviours", "behaviour"):
        behaviour = make_behaviour(env, behaviour_name, config)
        sweeps = {name: behaviour.sweep(name) for name in completers}
        for seed in range(config.first_seed, config.first_seed + config.seeds):
            episodes_key, labels_key = jax.random.split(jax.random.key(seed))
            trajectory, forks = behaviour.episodes(episodes_key, config.num_episodes)
            for c, name in enumerate(completers):
                values = sweeps[name](forks, trajectory, jax.random.fold_in(labels_key, c))
                rows += [
                    {"behaviour": behaviour_name, "seed": seed, **row}
                    for row in quality_rows(values, trajectory, samples, completer=name)
                ]
            print(f"label study: {behaviour_name} seed {seed} labelled", flush=True)
    os.makedirs(workdir, exist_ok=True)
    writer = MetricWriter(workdir, tensorboard=False, filename=FILENAME)
    writer.clear()
    writer.write(rows)
    plot(rows, os.path.join(workdir, "label_quality.png"))
    return rows


def validate(config: ml_collections.ConfigDict, env: ToolWorld) -> list[int]:
    """Checks the study's section before anything runs (errors name the field); returns
    the sorted distinct N of `config.samples`."""
    samples = sorted(common.ints(config.samples, "labels.samples", "N"))  # errors name it
    if samples[0] < 1:
        raise ValueError(f"config.labels.samples must be >= 1, got {samples[0]}.")
    common.check_counts(config, COUNTS, "config.labels")
    behaviours = names(config.behaviours, "labels.behaviours", "behaviour")
    for name in behaviours:
        try:
            if name.startswith("ppo_"):
                if int(name.removeprefix("ppo_")) < 0:
                    raise ValueError("the number of updates must be >= 0")
            else:
                common.env_policy(env, name)
        except ValueError as error:
            raise ValueError(f"config.labels.behaviours: {name!r}: {error}") from None
    if any(name.startswith("ppo_") for name in behaviours):
        common.check_lm(config, env, "config.labels")
    for name in names(config.completers, "labels.completers", "completer"):
        try:
            if name.startswith("policy+oracle_"):
                epsilon = float(name.removeprefix("policy+oracle_"))
                if not 0.0 <= epsilon <= 1.0:
                    raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
            elif name != "policy":
                common.env_policy(env, name)
        except ValueError as error:
            raise ValueError(f"config.labels.completers: {name!r}: {error}") from None
    return samples


class Behaviour(NamedTuple):
    """The behaviour policy of the study and the label sweeps of its completers."""

    # episodes(key, B) -> (trajectory [B, S], forks [B, S, ...]).
    episodes: Callable[[jax.Array, int], tuple[Trajectory, Any]]
    # sweep(completer) -> fn(forks, trajectory, key) -> Sweep, leading axes [max N].
    sweep: Callable[[str], Callable]


def make_behaviour(env: ToolWorld, name: str, config: ml_collections.ConfigDict) -> Behaviour:
    """The behaviour policy `name` and its label sweeps of up to max(config.samples)."""
    max_samples = max(int(n) for n in names(config.samples, "labels.samples", "N"))
    base = TrainConfig()
    chunk_size = int(config.chunk_size)
    if name.startswith("ppo_"):
        setup = common.lm_setup(config, env)
        params = common.checkpoint(env, setup, config, int(name.removeprefix("ppo_")))
        rollout = jax.jit(
            make_rollout(env, setup.graphdef, setup.rollout_config, with_carries=True)
        )

        def lm_episodes(key, num_episodes):
            env_key, policy_key = jax.random.split(key)
            trajectory, carries = rollout(
                params,
                jax.random.split(env_key, num_episodes),
                jax.random.split(policy_key, num_episodes),
            )
            return trajectory, lm.forks_from_carries(carries)

        def lm_play(completer: str) -> Callable:
            if completer == "policy" or completer.startswith("policy+oracle_"):
                epsilon = float(completer.removeprefix("policy").removeprefix("+oracle_") or 0)
                return lm.play_policy(
                    env, setup.graphdef, setup.rollout_config, params, oracle_epsilon=epsilon
                )
            play = mc.play_env_policy(env, common.env_policy(env, completer))
            return lambda carries, keys: play(carries.env_state, keys)

        return Behaviour(
            lm_episodes,
            lambda completer: _sweep(lm_play(completer), base, max_samples, chunk_size),
        )

    return Behaviour(
        _env_episodes(env, name),
        lambda completer: _env_sweep(env, name, completer, max_samples, chunk_size),
    )


# Environment-level behaviours: cached, so that every study of one process compiles once.


@functools.cache
def _env_episodes(env: ToolWorld, name: str) -> Callable:
    policy = common.env_policy(env, name)

    @functools.partial(jax.jit, static_argnums=1)
    def episodes(key, num_episodes):
        played = mc.sample_env_episodes(env, policy, key, num_episodes)
        return mc.env_trajectory(env, played), played.states

    return episodes


@functools.cache
def _env_sweep(
    env: ToolWorld, behaviour: str, completer: str, max_samples: int, chunk_size: int
) -> Callable:
    policy = common.env_policy(env, behaviour)
    if completer == "policy":
        continuation = policy
    elif completer.startswith("policy+oracle_"):
        epsilon = float(completer.removeprefix("policy+oracle_"))
        continuation = mc.mixture(policy, mc.oracle(env), epsilon, per="episode")
    else:
        continuation = common.env_policy(env, completer)
    play = mc.play_env_policy(env, continuation)
    return _sweep(play, TrainConfig(), max_samples, chunk_size)


class Sweep(NamedTuple):
    """Single-continuation MC estimates `[M, ...]` of a batch's turns, per label kind."""

    completion: mc.MCValues  # q_only (completion labels need no V): Q and q_success.
    progress: mc.MCValues  # V and Q (progress labels).


def _sweep(play: Callable, config: TrainConfig, max_samples: int, chunk_size: int) -> Callable:
    """Jitted `(forks, trajectory, key) -> Sweep`: `max_samples` single-continuation MC
    estimates per label kind, one after the other (`lax.map`, so each skips its finished
    forks); completion labels play only the Q continuations, so they cost about half."""
    weights = reward_weights(config, "outcome")

    @jax.jit
    def sweep(forks, trajectory, key):
        prefix = mc.trajectory_signals(trajectory)

        def estimates(key, q_only):
            return jax.lax.map(
                lambda k: mc.mc_values(
                    play,
                    forks,
                    prefix,
                    k,
                    num_samples=1,
                    reward_weights=weights,
                    config=config,
                    chunk_size=chunk_size,
                    q_only=q_only,
                ),
                jax.random.split(key, max_samples),
            )

        completion_key, progress_key = jax.random.split(key)
        return Sweep(estimates(completion_key, True), estimates(progress_key, False))

    return sweep


def first_samples(values: mc.MCValues, n: int) -> mc.MCValues:
    """The N = n estimate from single-continuation estimates `[M, ...]` (M >= n): means of
    the first n (standard errors dropped: NaN), turns summed."""
    mean = jax.tree.map(lambda x: jnp.mean(x[:n], axis=0), values)
    nan = jnp.full_like(mean.value_se, jnp.nan)
    return mean._replace(
        value_se=nan, q_value_se=nan, advantage_se=nan, turns=jnp.sum(values.turns[:n])
    )


def quality_rows(
    sweep: Sweep, trajectory: Trajectory, samples: Sequence[int], *, completer: str
) -> list[dict[str, Any]]:
    """Rows of every labeller x N in `samples` from a completer's `Sweep`; `label_turns`
    is the `MCValues.turns` of the N estimates a label averages."""
    turn_mask, verdict = trajectory.turn_mask, verdict_of(trajectory)
    played = float(jnp.sum(turn_mask))
    success = float(jnp.mean(trajectory.episode_success))
    rows = []
    for n in samples:
        completion = first_samples(sweep.completion, n)
        progress = first_samples(sweep.progress, n)
        hard, soft = labels.completion_labels(completion, turn_mask)
        by_labeller = {
            ("completion", "hard"): (hard, completion.turns),
            ("completion", "soft"): (soft, completion.turns),
            ("progress", "soft"): (labels.progress_labels(progress, turn_mask), progress.turns),
        }
        for (labeller, form), (label, cost) in by_labeller.items():
            quality = _quality(label, turn_mask, verdict)
            rows.append(
                dict(
                    labeller=labeller,
                    label=form,
                    completer=completer,
                    n=n,
                    accuracy=float(quality.accuracy),
                    auroc=float(quality.auroc),
                    judged_turns=float(quality.num_turns),
                    label_turns=float(cost),
                    label_turns_per_turn=float(cost) / max(played, 1.0),
                    played_turns=played,
                    episodes=int(turn_mask.shape[0]),
                    behaviour_success=success,
                )
            )
    return rows


_quality = jax.jit(labels.label_quality)


# Reports --------------------------------------------------------------------------------


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean and 95% CI over seeds of accuracy, AUROC and label turns, keyed
    `"labeller/label | behaviour"` -> completer -> str(N)."""
    cells = report.group_rows(
        rows,
        lambda row: (
            f"{row['labeller']}/{row['label']} | {row['behaviour']}",
            row["completer"],
            int(row["n"]),
        ),
    )
    summary: dict[str, Any] = {}
    for (labeller, completer, n), cell in sorted(cells.items(), key=lambda kv: kv[0][2]):
        entry: dict[str, Any] = report.cell_mean_cis(cell, QUALITY_METRICS)
        entry["seeds"] = len(cell)
        summary.setdefault(labeller, {}).setdefault(completer, {})[str(n)] = entry
    return summary


def markdown(summary: Mapping[str, Any]) -> str:
    """One table per labeller: completers x N, "AUROC / accuracy (cost)": mean ± 95% CI
    over seeds, cost = environment turns per labelled turn."""
    lines = []
    for labeller, completers in summary.items():
        samples = list(next(iter(completers.values())))
        lines.append(
            f"\n### {labeller}: AUROC / accuracy vs the oracle verdict "
            "(environment turns per labelled turn)\n"
        )
        table = [
            [completer]
            + [
                f"{format_mean_ci(by_n[n]['auroc'])} / {format_mean_ci(by_n[n]['accuracy'])} "
                f"({by_n[n]['label_turns_per_turn']['mean']:.1f})"
                for n in samples
            ]
            for completer, by_n in completers.items()
        ]
        lines += report.markdown_rows(["completer"] + [f"N={n}" for n in samples], table)
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[Mapping[str, Any]], path: str) -> None:
    """AUROC (top) and accuracy (bottom) vs N, one panel per labeller, one line per
    completer, 95% CI over seeds (clipped to [0, 1])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarize(rows)
    metrics = ("auroc", "accuracy")
    fig, axes = plt.subplots(
        len(metrics),
        len(summary),
        figsize=(3.8 * len(summary), 3.0 * len(metrics)),
        squeeze=False,
        sharex=True,
        sharey=True,
    )
    for j, (labeller, completers) in enumerate(summary.items()):
        for i, metric in enumerate(metrics):
            ax = axes[i, j]
            for completer, by_n in completers.items():
                points = sorted((int(n), e[metric]) for n, e in by_n.items() if e[metric])
                if not points:
                    continue
                x = [n for n, _ in points]
                mean = np.array([s["mean"] for _, s in points])
                ci = np.array([s["ci95"] for _, s in points])
                (line,) = ax.plot(x, mean, marker="o", markersize=3, label=completer)
                low, high = np.clip(mean - ci, 0, 1), np.clip(mean + ci, 0, 1)
                ax.fill_between(x, low, high, alpha=0.15, color=line.get_color())
            ax.set_xscale("log", base=2)
            ax.set_ylim(-0.05, 1.05)
            ax.grid(alpha=0.3)
            ax.set_title(labeller, fontsize=9)
            if i == len(metrics) - 1:
                ax.set_xlabel("N continuations per label")
            if j == 0:
                ax.set_ylabel(f"{metric} vs oracle verdict")
    axes[0, -1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
