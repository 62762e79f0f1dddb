"""The long-horizon study: reward forms and estimators from short to long plans.

For every horizon h of `config.horizons` in the environment `config.env.kind` names
(`envs.horizon_section`; ToolWorld without one: the shortest plan, level-4 exchanges and
distractors, `config.slack` turns to spare; Mastermind: the guess limit), the reward forms of
`config.conditions` train with `config.train.estimator`; at the horizons of
`config.estimator_horizons`, `config.estimator_reward` also trains with every estimator
of `config.estimators` (one compiled program per estimator and process reward model,
reward forms being data). Conditions are reward forms, or learned reward forms with their
PRM (`form/prm=<kind>`, `common.prm_groups`); labels are `condition/estimator`.
Every condition of a horizon starts from the same policy per seed: fresh, or
warm-started by behaviour cloning of oracle demonstrations (`rlagent.pipeline.warm_start`,
when `config.warm_start.steps > 0`) of the tasks of `config.warm_start_horizons`: fixed
horizons shared by the whole sweep (e.g. short ones: the distance from the
demonstrations then grows with the horizon), or `same` (each horizon clones its own
tasks, so no horizon is further from its demonstrations than another).

Each horizon is an `common.run_and_report` under `<workdir>/h<h>` (metrics.csv,
curves, summaries, checkpoints); the sweep then writes `horizon.csv` (one row per
horizon, condition and seed), `horizon.png`, `summary.md`, `summary.json` and
`provenance.json` (`summarize` defines every number).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from experiments.studies import common
from experiments.studies import envs as env_kinds
from experiments.studies.common import Run
from experiments.studies.common import estimator_fields
from experiments.studies.common import ints
from experiments.studies.common import names
from experiments.studies.envs import horizon_env
from experiments.studies.envs import horizon_section
from experiments.studies.envs import study_kind
from experiments.studies.sections import make
from rlagent import parallel
from rlagent.analysis import paired
from rlagent.analysis import report
from rlagent.analysis import stats
from rlagent.host import loop
from rlagent.host import provenance
from rlagent.host.writers import MetricWriter
from rlagent.pipeline.warm_start import WarmStartConfig
from rlagent.pipeline.warm_start import make_warm_start
from rlagent.train.config import TrainConfig
from rlagent.train.ppo import make_train

FILES = ("horizon.csv", "horizon.png", "summary.md", "summary.json", provenance.FILENAME)
# Credit-accuracy scores (rlagent.credit.probe) kept per seed: first and last measurement.
# The probe's credit scores, the critic's error against the Monte-Carlo V(s)
# (`rlagent.credit.probe.VALUE_METRICS`) and the cosine between the policy's and the
# value's gradients (`train.ppo._gradient_cosine`); the last three NaN without a critic.
CREDIT_METRICS = (
    "spearman", "sign_agreement", "auroc_verdict", "value_rmse", "value_bias", "grad_cosine",
)  # fmt: skip
# Folded into a seed's key for its warm start (the training keys stay as they are).
WARM_START_STREAM = 0xB0C
# `config.warm_start_horizons` value: every horizon clones demonstrations of its own tasks.
SAME_HORIZON = "same"


def plan(config: ml_collections.ConfigDict) -> list[tuple[int, list[Run]]]:
    """The runs of every horizon, `[(h, runs)]`; every config error is raised here."""
    common.check_counts(config, {**common.RUN_COUNTS, "slack": 0})
    horizons = ints(config.horizons, "horizons", "horizon")
    kind = study_kind(config)
    envs = {h: _env_section(kind, h, config) for h in horizons}
    groups = common.prm_groups(config.conditions)
    rewards = [label for group in groups for label in group.labels]
    base = TrainConfig.from_mapping(config.train)
    estimators = names(config.estimators, "estimators", "estimator") if config.estimators else []
    specs, trained = {}, {base: f"train.estimator={base.estimator}"}
    for spec in estimators:
        try:  # the run's train fields: the spec's, and lam as the baseline's unless given
            specs[spec] = {"lam": base.lam, **estimator_fields(spec)}
            trained_config = dataclasses.replace(base, **specs[spec])
        except ValueError as error:
            raise ValueError(f"config.estimators: {spec!r}: {error}") from None
        twin = trained.setdefault(trained_config, spec)
        if twin != spec:  # the same runs twice (train.estimator's are the baseline)
            raise ValueError(f"config.estimators: {spec!r} trains what {twin!r} trains.")
    estimator_horizons = []
    if estimators and config.estimator_horizons:
        estimator_horizons = ints(config.estimator_horizons, "estimator_horizons", "horizon")
        outside = sorted(set(estimator_horizons) - set(horizons))
        if outside:
            raise ValueError(f"config.estimator_horizons {outside} are not in config.horizons.")
        if config.estimator_reward not in rewards:
            raise ValueError(
                f"config.estimator_reward {config.estimator_reward!r} must be one of "
                f"config.conditions ({', '.join(rewards)}): its {base.estimator} run is the "
                "baseline of the estimator comparison."
            )
        (estimator_group,) = [g for g in groups if config.estimator_reward in g.labels]
    if make(WarmStartConfig, config.warm_start, "warm_start").steps:
        for horizon in _demo_horizons(config, horizons[0]):
            try:  # a demonstration horizon it cannot build
                horizon_section(kind, horizon, int(config.slack), config.get("env"))
            except ValueError as error:
                raise ValueError(f"config.warm_start_horizons: {error}") from None
    plans = []
    for horizon in horizons:
        env = envs[horizon]
        runs = [_run(config, env, base.estimator, group, group.labels) for group in groups]
        if horizon in estimator_horizons:
            for spec, fields in specs.items():
                group = estimator_group
                runs.append(_run(config, env, spec, group, [config.estimator_reward], fields))
        common.check_runs(runs, config)
        plans.append((horizon, runs))
    _check_paired_to(config, plans)
    return plans


def _check_paired_to(config: ml_collections.ConfigDict, plans) -> None:
    """`config.paired_to` names conditions the sweep trains (`<condition>/<estimator>`):
    another would pair nothing, silently."""
    if not config.get("paired_to"):
        return
    labels = [label for _, runs in plans for run in runs for label in run.conditions]
    unknown = [name for name in names(config.paired_to, "paired_to") if name not in labels]
    if unknown:
        known = ", ".join(dict.fromkeys(labels))
        raise ValueError(f"config.paired_to: {unknown} are not trained; trained: {known}.")


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
    mesh: jax.sharding.Mesh | None = None,
    progress: bool = True,
    report_only: bool = False,
) -> dict[str, Any]:
    """Runs the sweep (see the module docstring); returns the summary of `summarize`.

    A non-empty `workdir` needs `resume` (continue; the config must match the stored one)
    or `overwrite`. A diverged run is reported and `loop.Diverged` raised at the end.
    `report_only` only rewrites the report of a finished sweep (`write_report`).
    `mesh`: every batch's episodes are split over its devices, which may span processes
    (docs/distributed.md); the warm start (a few cloning steps) runs in every process,
    and process 0 writes the reports.
    """
    if report_only:
        if not MetricWriter(workdir, tensorboard=False, filename="horizon.csv").read():
            raise ValueError(f"--report_only: {workdir} holds no finished sweep (horizon.csv).")
        return parallel.primary_decides(lambda: write_report(workdir, config))
    plans = plan(config)
    resuming = common.prepare(workdir, config, resume=resume, overwrite=overwrite)
    start = time.time()
    record = common.start_record(
        workdir, resuming, config.to_dict(), horizons=[h for h, _ in plans]
    )
    rows, diverged, warm = [], [], {}
    for horizon, runs in plans:
        demos = tuple(_demo_horizons(config, horizon))
        if demos not in warm:  # once when shared by every horizon, else per horizon
            warm = {demos: _warm_start(config, runs[0], demos, start)}
        initial, initial_config = warm[demos]
        _log(start, f"horizon {horizon}: {', '.join(r.name for r in runs)}")
        folder = os.path.join(workdir, f"h{horizon:02d}")
        try:
            summary = common.run_and_report(
                runs, config, workdir=folder, resume=resume, overwrite=overwrite,
                title=f"{env_kinds.title(runs[0].config.env)}, horizon {horizon} turns",
                progress=progress, mesh=mesh,
                initial_params=initial, initial_params_config=initial_config,
            )  # fmt: skip
        except loop.Diverged as error:  # reported; its rows still summarise the seeds
            diverged.append(f"h={horizon}: {error}")
            summary = report.summarize(error.rows)
        rows += seed_rows(horizon, MetricWriter(folder, tensorboard=False).read(), summary)
        loop.clear_compiled()  # no horizon's programs run again (an OOM in compiles otherwise)
        _log(start, f"horizon {horizon} done")
    writer = MetricWriter(workdir, tensorboard=False, filename="horizon.csv")
    writer.clear()
    writer.write(rows)
    summary = parallel.primary_decides(lambda: write_report(workdir, config))
    provenance.write(workdir, {**record, "wall_s": round(time.time() - start, 1)})
    if diverged:
        raise loop.Diverged(" ".join(diverged), rows)
    return summary


def write_report(workdir: str, config: ml_collections.ConfigDict) -> dict[str, Any]:
    """summary.md, summary.json and horizon.png from `<workdir>/horizon.csv` (also alone,
    to redraw a finished sweep's report); the gaps are to the first reward form with
    `train.estimator`."""
    rows = MetricWriter(workdir, tensorboard=False, filename="horizon.csv").read()
    reference = f"{names(config.conditions)[0]}/{config.train.estimator}"
    also = names(config.paired_to, "paired_to") if config.get("paired_to") else []
    summary = summarize(rows, reference=reference, paired_to=also)
    plot(summary, os.path.join(workdir, "horizon.png"))
    table = markdown(summary)
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write(table)
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(table, flush=True)
    return summary


def seed_rows(
    horizon: int, metrics: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """One row per condition and seed of a horizon's run (`horizon.csv`).

    From `summary` (`report.summarize` of the horizon): `final_success` (training
    batches, last 10% of updates), held-out `eval_sampled_success` / `eval_greedy_success`
    (last evaluation), `auc` (area under the training success curve over the horizon's
    common budget of turns) and `turns_to_50/80`
    (censored at that budget, `reached_50/80`). From the metric rows: `initial_success`
    (the first batch, sampled from the starting policy), `env_turns` (experience), and the
    first and last credit-accuracy measurements `credit_<m>_first` / `credit_<m>_last`.
    """
    out = []
    for (condition, seed), run_rows in sorted(report.seed_curves(metrics).items()):
        reward, _, estimator = condition.rpartition("/")
        row = dict(horizon=horizon, condition=condition, reward=reward, estimator=estimator)
        row.update(seed=seed, updates=int(run_rows[-1]["update"]))
        row["initial_success"] = float(run_rows[0]["success"])
        row["env_turns"] = float(run_rows[-1]["env_turns_total"])
        entry = summary["conditions"][condition]
        index = entry["seeds"].index(seed)
        # A list shorter than the seeds (e.g. evaluations a diverged seed missed) is unaligned.
        aligned = {k: v for k, v in entry["per_seed"].items() if len(v) == len(entry["seeds"])}
        per_seed = {k: v[index] for k, v in aligned.items()}
        for key in ("final_success", "eval_sampled_success", "eval_greedy_success", "auc"):
            row[key] = float(per_seed.get(key, np.nan))
        for p in (50, 80):
            row[f"turns_to_{p}"] = float(per_seed.get(f"turns_to_{p}", np.nan))
            row[f"reached_{p}"] = float(per_seed.get(f"reached_{p}", np.nan))
        for name in CREDIT_METRICS:
            measured = [
                float(r[f"credit_{name}"])
                for r in run_rows
                if np.isfinite(r.get(f"credit_{name}", np.nan))
            ]
            row[f"credit_{name}_first"] = measured[0] if measured else float("nan")
            row[f"credit_{name}_last"] = measured[-1] if measured else float("nan")
        out.append(row)
    return out


def summarize(
    rows: Sequence[Mapping[str, Any]],
    *,
    reference: str,
    takeoff: float = 0.5,
    reps: int | None = None,
    paired_to: Sequence[str] = (),
) -> dict[str, Any]:
    """Per horizon and condition, from `horizon.csv` rows; comparisons within each horizon.

    `paired`: per metric, the pre-declared family of each condition against `reference`
    and against every condition of `paired_to` at its horizon, paired over seeds (`_paired`).

    `success` is the held-out sampled success when every seed was evaluated, else the
    final training success (`settings.success` says which). Per cell: IQM and mean of
    success and of `auc` with stratified bootstrap 95% CIs (rliable), the take-off rate
    (success >= `takeoff`, Clopper-Pearson 95%), the mean initial success, and mean with
    Student-t 95% CI of each last credit-accuracy score where measured, and `gain`: IQM
    and mean (CIs as above) of success minus the seed's initial success, what training
    added to the starting policy (which differs between horizons, e.g. after a warm start).
    Per horizon:
    Holm-corrected Mann-Whitney comparisons of success over every pair of conditions
    (`stats.pairwise_comparisons`), and `gaps`: mean success of each condition minus that
    of `reference` (e.g. the sparse outcome reward), with a 95% percentile bootstrap CI
    over seeds (resampled independently per condition).
    """
    if not rows:
        raise ValueError("summarize needs at least one row.")
    reps = stats.bootstrap_reps(reps)
    evaluated = all(np.isfinite(float(r["eval_sampled_success"])) for r in rows)
    key = "eval_sampled_success" if evaluated else "final_success"
    cells = report.group_rows(rows, lambda row: (int(row["horizon"]), str(row["condition"])))
    horizons: dict[str, Any] = {}
    for (horizon, condition), seeds in sorted(cells.items()):
        success = [float(r[key]) for r in seeds]
        gain = [s - float(r["initial_success"]) for s, r in zip(success, seeds, strict=True)]
        entry = {
            "num_seeds": len(seeds),
            "success": stats.interval_estimates({condition: success}, reps=reps)[condition],
            "auc": stats.interval_estimates(
                {condition: [float(r["auc"]) for r in seeds]}, reps=reps
            )[condition],
            "gain": stats.interval_estimates({condition: gain}, reps=reps)[condition],
            "takeoff": stats.takeoff_rate(success, takeoff),
            "initial_success": float(np.mean([float(r["initial_success"]) for r in seeds])),
            "per_seed": {
                "seed": [int(r["seed"]) for r in seeds],
                "success": success,
                "auc": [float(r["auc"]) for r in seeds],
            },
        }
        for name in CREDIT_METRICS:
            credit = stats.finite_mean_ci([float(r[f"credit_{name}_last"]) for r in seeds])
            if credit is not None:
                entry[f"credit_{name}"] = credit
        horizons.setdefault(str(horizon), {"conditions": {}})["conditions"][condition] = entry
    for cell in horizons.values():
        scores = {name: e["per_seed"]["success"] for name, e in cell["conditions"].items()}
        cell["comparisons"] = stats.pairwise_comparisons(scores) if len(scores) > 1 else []
        cell["gaps"] = {
            name: stats.bootstrap_mean_difference(values, scores[reference], reps=reps)
            for name, values in scores.items()
            if reference in scores and name != reference
        }
    settings = {"success": key, "takeoff_threshold": takeoff, "reference": reference,
                "bootstrap_reps": reps}  # fmt: skip
    paired_families = _paired(horizons, [reference, *paired_to], reps)
    return {"horizons": horizons, "settings": settings, "paired": paired_families}


# Metrics of the paired family (per-seed keys of a cell): held-out success, AUC at equal turns.
PAIRED_METRICS = ("success", "auc")


def _paired(horizons: Mapping[str, Any], references: Sequence[str], reps: int) -> dict[str, list]:
    """Per metric of PAIRED_METRICS, the family of every condition against each of
    `references` at its horizon (each pair once), paired over the seeds (the runs of a
    seed share its warm start): mean difference `condition - reference` with a paired
    bootstrap CI, exact sign-flip p, Holm over the family."""
    out = {}
    for metric in PAIRED_METRICS:
        comparisons, seen = [], set()
        for h, cell in sorted(horizons.items(), key=lambda item: int(item[0])):
            conditions = cell["conditions"]
            by_seed = {
                name: dict(zip(e["per_seed"]["seed"], e["per_seed"][metric], strict=True))
                for name, e in conditions.items()
            }
            for ref in (r for r in references if r in conditions):
                for name in conditions:
                    if name != ref and (h, frozenset((ref, name))) not in seen:
                        seen.add((h, frozenset((ref, name))))
                        comparisons.append(
                            (f"{h}|{ref}", f"{h}|{name}", by_seed[ref], by_seed[name])
                        )
        out[metric] = paired.paired_family(comparisons, reps=reps)
    return out


def markdown(summary: Mapping[str, Any]) -> str:
    """Tables with one row per condition and one column per horizon, then the gaps."""
    settings = summary["settings"]
    reference = settings["reference"]
    horizons = sorted(summary["horizons"], key=int)
    cells = [summary["horizons"][h]["conditions"] for h in horizons]
    conditions = list(dict.fromkeys(c for cell in cells for c in cell))
    what = settings["success"].replace("eval_sampled_success", "held-out sampled success")
    what = what.replace("final_success", "final training success")
    tables = [
        (f"{what}: IQM [95% CI]", lambda e: _interval(e["success"]["iqm"])),
        (
            "sample efficiency (AUC of training success, the horizon's turn budget): IQM [95% CI]",
            lambda e: _interval(e["auc"]["iqm"]),
        ),
        (f"take-off ({what} >= {settings['takeoff_threshold']:g}): k/n [95% CI]", _takeoff),
        ("success of the starting policy (first training batch, mean)", _initial),
        (
            f"gain over the starting policy ({what} minus first-batch success): IQM [95% CI]",
            lambda e: _interval(e["gain"]["iqm"]),
        ),
    ]
    if any("credit_spearman" in e for cell in cells for e in cell.values()):
        tables.append(
            ("credit accuracy at the last measurement (Spearman vs MC): mean ± 95% CI", _credit)
        )
    out = "# Long-horizon study: reward forms and estimators vs the shortest plan\n"
    for title, show in tables:
        out += f"\n### {title}\n\n| condition | " + " | ".join(f"h={h}" for h in horizons)
        out += " |\n|---|" + "---|" * len(horizons) + "\n"
        for condition in conditions:
            shown = ["" if condition not in cell else show(cell[condition]) for cell in cells]
            out += f"| {condition} | " + " | ".join(shown) + " |\n"
    out += f"\n### gap to {reference}: difference of mean {what} [95% bootstrap CI]\n\n"
    out += "| horizon | condition | gap | P(condition > reference) | p (Holm, per horizon) |\n"
    out += "|---|---|---|---|---|\n"
    for h in horizons:
        cell = summary["horizons"][h]
        for c in cell["comparisons"]:
            if reference not in (c["x"], c["y"]):
                continue
            name = c["y"] if c["x"] == reference else c["x"]
            prob = c["prob_improvement"] if c["x"] == name else 1.0 - c["prob_improvement"]
            mark = " *" if c["significant"] else ""
            gap = _interval(cell["gaps"][name])
            out += f"| {h} | {name} | {gap} | {prob:.2f} | {c['p_holm']:.3g}{mark} |\n"
    out += _paired_markdown(summary.get("paired", {}), what)
    out += (
        "\nIQM and mean with stratified bootstrap 95% CIs over seeds (rliable); take-off with "
        "exact Clopper-Pearson CIs; comparisons: two-sided Mann-Whitney U, Holm-corrected over "
        "the pairs of conditions of a horizon (* p < 0.05); the paired table pairs runs by "
        "seed instead. Estimator conditions train only at the estimator horizons.\n"
    )
    return out


def _paired_markdown(families: Mapping[str, list], what: str) -> str:
    """The paired families (`_paired`) as one table."""
    rows = [(m, e) for m in PAIRED_METRICS for e in families.get(m, [])]
    if not rows:
        return ""
    out = (
        "\n### paired differences (same seeds, same warm start): condition minus the "
        "reference, mean [95% paired bootstrap CI], exact sign-flip p, Holm within each "
        "metric's family\n\n"
        "| metric | horizon | condition | minus | difference | pairs | p | p (Holm) |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    names = {"success": what, "auc": "AUC at equal turns"}
    for metric, e in rows:
        horizon, _, condition = e["b"].partition("|")
        d, mark = e["difference"], " *" if e["significant"] else ""
        out += (
            f"| {names[metric]} | {horizon} | {condition} | {e['a'].partition('|')[2]} "
            f"| {d['value']:+.3f} "
            f"[{d['low']:+.3f}, {d['high']:+.3f}] | {e['num_pairs']} | {e['p_value']:.3g} | "
            f"{e['p_holm']:.3g}{mark} |\n"
        )
    return out


def plot(summary: Mapping[str, Any], path: str) -> None:
    """Success and sample efficiency (and credit accuracy) vs horizon, one line per condition.

    IQM with its bootstrap 95% CI band (credit: mean ± 95% CI); estimator-comparison
    conditions are dashed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    horizons = sorted(summary["horizons"], key=int)
    cells = [summary["horizons"][h]["conditions"] for h in horizons]
    conditions = list(dict.fromkeys(c for cell in cells for c in cell))
    reference_estimator = summary["settings"]["reference"].rpartition("/")[2]
    success = summary["settings"]["success"].replace("eval_", "held-out ").replace("_", " ")
    panels = [
        ("success", f"{success} (IQM, 95% CI)"),
        ("auc", "AUC of training success (IQM, 95% CI)"),
        ("gain", "gain over the starting policy (IQM, 95% CI)"),
    ]
    if any("credit_spearman" in e for cell in cells for e in cell.values()):
        panels.append(("credit_spearman", "credit accuracy, last (Spearman, mean ± CI)"))
    colors = {condition: f"C{i % 10}" for i, condition in enumerate(conditions)}
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (key, label) in zip(axes, panels, strict=True):
        for condition in conditions:
            points = [
                (int(h), cell[condition][key])
                for h, cell in zip(horizons, cells, strict=True)
                if key in cell.get(condition, {})
            ]
            if not points:
                continue
            x = [h for h, _ in points]
            if key == "credit_spearman":
                y = np.array([p["mean"] for _, p in points])
                low, high = y - [p["ci95"] for _, p in points], y + [p["ci95"] for _, p in points]
            else:
                y = [p["iqm"]["value"] for _, p in points]
                low, high = (
                    [p["iqm"]["low"] for _, p in points],
                    [p["iqm"]["high"] for _, p in points],
                )
            style = "-" if condition.rpartition("/")[2] == reference_estimator else "--"
            ax.plot(x, y, style, marker="o", label=condition, color=colors[condition])
            ax.fill_between(x, low, high, alpha=0.15, color=colors[condition])
        ax.set_xticks([int(h) for h in horizons])
        ax.set_xlabel("shortest plan (turns)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _warm_start(config, first_run: Run, horizons: Sequence[int], start: float):
    """Each seed's parameters `[seeds]` warm-started on the tasks of `horizons`, and their
    config, or (None, None); `first_run` builds the policy."""
    warm = WarmStartConfig(**dict(config.warm_start))
    if not warm.steps:
        return None, None
    setup = common.build(first_run.config)
    kind = study_kind(config)
    demos = [horizon_env(kind, h, int(config.slack), config.get("env")) for h in horizons]
    trainer = make_train(
        setup.train_config, setup.env, setup.policy_config, setup.rollout_config,
        **setup.extras(),
    )  # fmt: skip
    clone = make_warm_start(warm, demos, trainer.graphdef, setup.rollout_config)
    keys = jax.numpy.stack(
        [jax.random.PRNGKey(s) for s in range(config.first_seed, config.first_seed + config.seeds)]
    )

    def seed_start(key):
        return clone(trainer.init(key).params, jax.random.fold_in(key, WARM_START_STREAM))

    shown = ",".join(map(str, horizons))
    _log(start, f"warm start: {warm.steps} behaviour-cloning steps on horizons {shown}")
    params, losses = jax.jit(jax.vmap(seed_start))(keys)
    losses = np.asarray(losses)
    nll = f"{losses[:, 0].mean():.3f} -> {losses[:, -1].mean():.3f}"
    _log(start, f"warm start done: demonstration NLL {nll}")
    return params, {**dataclasses.asdict(warm), "horizons": shown}


def _demo_horizons(config, horizon: int) -> list[int]:
    """The horizons whose oracle episodes warm-start the runs of `horizon`."""
    if str(config.warm_start_horizons).strip() == SAME_HORIZON:
        return [horizon]
    return ints(config.warm_start_horizons, "warm_start_horizons", "horizon")


def _run(
    config,
    env: Mapping[str, Any],
    spec: str,
    group: common.PRMGroup,
    labels: Sequence[str],
    train_fields: Mapping[str, Any] | None = None,
) -> Run:
    """The run of `labels` (conditions of PRM `group`) with estimator `spec` at `env`;
    labels become `<condition>/<spec>`, the run's folder `<spec>[_<group.name>]`. Runs
    with a PRM do not measure credit accuracy (`probe.every` = 0)."""
    run_config = group.with_prm(config)
    run_config.env = ml_collections.ConfigDict(dict(env))
    run_config.train.update(dict(train_fields or {}))
    if group.kind != "none" and "probe" in run_config:  # the probe scores no PRM's rewards
        run_config.probe.every = 0
    run_config.conditions = ",".join(labels)
    name = spec.replace("@", "_lam") + ("" if group.kind == "none" else f"_{group.name}")
    return Run(name, tuple(f"{label}/{spec}" for label in labels), run_config)


def _env_section(kind: str, horizon: int, config) -> dict[str, Any]:
    """The env section of a horizon (`envs.horizon_section`; ToolWorld: max_turns = h +
    slack; Mastermind: the guess limit of `config.env`'s code)."""
    try:
        return horizon_section(kind, horizon, int(config.slack), config.get("env"))
    except ValueError as error:
        raise ValueError(f"config.horizons: {error}") from None


def _takeoff(entry: Mapping[str, Any]) -> str:
    return stats.format_takeoff(entry["takeoff"])


def _initial(entry: Mapping[str, Any]) -> str:
    return f"{entry['initial_success']:.3f}"


def _credit(entry: Mapping[str, Any]) -> str:
    return stats.format_mean_ci(entry.get("credit_spearman"))


_interval = stats.format_interval


def _log(start: float, message: str) -> None:
    print(f"[horizon_sweep {time.time() - start:6.0f}s] {message}", flush=True)
