"""The process-rewards study (experiments/process_rewards.py).

1. PPO with every condition of `config.conditions` (`common.prm_runs`: one
   compiled program per PRM kind), success against *total* environment turns (experience
   plus the turns labelling continuations played, `report.TOTAL_TURNS`), 95% CIs over seeds.
2. The label-quality study (`label_quality`, section `config.labels`).
3. Reward hacking of a learned PRM (`hacking`): per PRM, its sum / min / potential forms
   side by side. The sum form pays for every step the PRM scores above 1/2, so a PRM that
   over-scores some steps invites farming them (more turns, less success; Cheng et al.
   2025, "Stop Summation"); the min form pays the worst step, potential shaping telescopes.

Training runs first, so that a refused workdir is refused before anything is computed.
`summary.md` / `summary.json` hold the training summary (`report.summarize`), the label
study and the hacking table.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections

from experiments.studies import common
from experiments.studies import envs
from experiments.studies import label_quality as study
from rlagent import parallel
from rlagent.analysis import paired
from rlagent.analysis import report
from rlagent.analysis import stats
from rlagent.analysis.stats import format_mean_ci
from rlagent.envs.base import Environment
from rlagent.host import provenance
from rlagent.host.writers import MetricWriter

# Per-seed means over the final updates, per learned condition (the hacking table).
HACKING_METRICS = ("success", "turns", "turns_over_plan", "collapse_rate", "prm_auroc")
# The PRM-weighted forms compared, in table order; the first is the one suspected of farming.
FORMS = ("learned_sum", "learned_min", "learned_centred", "learned_potential")
# The paired family's metrics (per-seed keys of `report.summarize`): held-out sampled
# success and AUC at equal total turns.
PAIRED_METRICS = ("eval_sampled_success", "auc")
PAIRED_NAMES = {"eval_sampled_success": "held-out sampled success", "auc": "AUC at equal turns"}
TITLE = "process rewards without hand labels"


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
    """Trains, labels and reports into `workdir`; returns the summary written to JSON.

    With `resume`, a finished label study (label_quality.csv) is kept, not recomputed.
    `report_only` only rewrites the report (summary.*, the plots) of a finished study from
    its metrics.csv and label_quality.csv; provenance.json is left as the run wrote it.
    """
    start = time.time()
    runs, label_env = plan(config)  # config errors before anything is written
    title = f"{envs.title(config.env)}: {TITLE}"
    label_writer = MetricWriter(workdir, tensorboard=False, filename=study.FILENAME)
    if report_only:
        rows, label_rows = MetricWriter(workdir, tensorboard=False).read(), label_writer.read()
        if not rows or not label_rows:
            raise ValueError(f"--report_only: {workdir} holds no finished study to report")

        def rebuild() -> dict[str, Any]:
            summary = common.write_training_report(
                rows, workdir, title=title, experience=report.TOTAL_TURNS
            )
            return write_report(workdir, summary, rows, label_rows, title=title)

        return parallel.primary_decides(rebuild)  # process 0 writes, the others wait.
    summary = common.run_and_report(
        runs,
        config,
        workdir=workdir,
        resume=resume,
        overwrite=overwrite,
        title=title,
        mesh=mesh,
        progress=progress,
        experience=report.TOTAL_TURNS,
    )
    rows = MetricWriter(workdir, tensorboard=False).read()
    label_rows = label_writer.read() if resume else []
    if not label_rows:
        label_rows = study.run(config.labels, label_env, workdir)
    full = parallel.primary_decides(
        lambda: write_report(workdir, summary, rows, label_rows, title=title)
    )  # process 0 writes, the others wait.
    # run_and_report recorded the checkout at the start; the label study adds its rows.
    record = provenance.read(workdir) or provenance.collect(config.to_dict())
    record = {**record, "label_rows": len(label_rows), "wall_s": round(time.time() - start, 1)}
    provenance.write(workdir, provenance.finish(record))
    return full


def plan(config: ml_collections.ConfigDict) -> tuple[list[common.Run], Environment]:
    """The training runs (`common.prm_runs`) and the label study's environment of `config`,
    checked: every config error is raised here, naming its field."""
    runs = common.prm_runs(config)
    common.check_runs(runs, config)
    label_env = _label_env(config)
    study.validate(config.labels, label_env)
    return runs, label_env


def write_report(
    workdir: str,
    summary: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    label_rows: Sequence[Mapping[str, Any]],
    *,
    title: str,
) -> dict[str, Any]:
    """curves.png, summary.md and summary.json of the training summary, the paired
    family, the label study and the hacking table; prints all but the training table."""
    plot_curves(rows, os.path.join(workdir, "curves.png"), title=title)
    hacking = hacking_table(rows)
    family = paired_table(summary)
    full = {
        **summary,
        "paired": family,
        "label_quality": study.summarize(label_rows),
        "hacking": hacking,
    }
    text = (
        f"# {title}\n\n## PPO: success vs total environment turns\n\n"
        + report.markdown_table(summary)
        + paired_markdown(family)
        + "\n## Label quality (automatic step labels vs the oracle verdict)\n"
        + study.markdown(full["label_quality"])
        + "\n## Reward hacking: sum vs min vs centred vs potential form of each PRM\n\n"
        + hacking_markdown(hacking)
    )
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(full, f, indent=2)
    print(text[text.index("## Label quality") :])
    return full


def plot_curves(rows: Sequence[Mapping[str, Any]], path: str, *, title: str = TITLE) -> None:
    """Success vs total environment turns, 95% CI over seeds: one panel per PRM kind
    (noise levels of the noisy oracle together; conditions without a PRM first), each
    with the outcome-only condition for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        spec = str(row["condition"]).partition("/prm=")[2]
        panels[spec.partition("@")[0] or "no PRM (oracle verdict)"].append(row)
    reference = [row for row in rows if row["condition"] == "outcome"]
    columns = min(3, len(panels))
    height = -(-len(panels) // columns)
    fig, axes = plt.subplots(
        height, columns, figsize=(5.2 * columns, 3.8 * height), squeeze=False, sharey=True
    )
    for ax, (name, panel) in zip(axes.flat, panels.items(), strict=False):
        extra = reference if panel[0]["condition"] != "outcome" else []
        report.draw_curves(ax, extra + panel, experience=report.TOTAL_TURNS, band="ci95")
        ax.set_title(name, fontsize=10)
        ax.legend(fontsize=7)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def paired_table(
    summary: Mapping[str, Any], *, reference: str = "outcome", reps: int = 10_000
) -> dict[str, list[dict[str, Any]]]:
    """The pre-declared paired family per metric of PAIRED_METRICS: every condition
    against `reference`, and every other form of a PRM against its sum form (the form the
    study found to collapse), paired over seeds (a seed's runs share its initial policy
    and keys). Each: mean difference with a paired bootstrap CI, sign-flip p, Holm over
    the metric's family (`paired.paired_family`). Empty without `reference`'s runs."""
    conditions = summary["conditions"]
    if reference not in conditions:
        return {}
    pairs = [(reference, name) for name in conditions if name != reference]
    for name in conditions:
        form, _, spec = name.partition("/prm=")
        summed = f"{FORMS[0]}/prm={spec}"
        if spec and form in FORMS[1:] and summed in conditions:
            pairs.append((summed, name))
    return paired.summary_families(conditions, pairs, PAIRED_METRICS, reps=reps)


def paired_markdown(family: Mapping[str, list[dict[str, Any]]]) -> str:
    """`paired_table` as one Markdown table (empty string when there is nothing)."""
    return paired.families_markdown(family, PAIRED_NAMES)


def _label_env(config: ml_collections.ConfigDict) -> Environment:
    """The label study's environment: the experiment's, or its kind at `labels.horizon`."""
    common.check_counts(config.labels, {"horizon": 0}, "config.labels")
    horizon = config.labels.horizon
    if horizon:
        try:
            return envs.horizon_env(envs.study_kind(config), horizon, section=config.env)
        except ValueError as error:
            raise ValueError(f"config.labels.horizon: {error}") from None
    return common.build(config).env


def hacking_table(
    rows: Sequence[Mapping[str, Any]], *, final_fraction: float = 0.1
) -> dict[str, Any]:
    """Per PRM (the `prm=...` part of a condition), its learned forms side by side.

    Per seed, each of HACKING_METRICS is averaged over the last `final_fraction` of updates
    (NaN entries, e.g. `prm_auroc` of updates it was not measured, skipped); a form's entry
    is the mean ± 95% CI over seeds (`stats.mean_ci`; None when no seed measured it).
    `vs_sum` holds, for every other form, the paired per-seed difference sum - form of
    success and turns: farming shows as turns > 0 and success < 0; a PRM that scores most
    steps below 1/2 makes every sum-form step cost, and giving up (turns < 0) pays instead.

    Returns {prm: {"forms": {form: {metric: mean_ci | None}}, "vs_sum": {form: {...}}}}.
    """
    per_seed: dict[str, dict[str, dict[int, dict[str, float]]]] = defaultdict(dict)
    for (condition, seed), curve in report.seed_curves(rows).items():
        form, _, spec = condition.partition("/prm=")
        if form not in FORMS or not spec:
            continue
        per_seed[spec].setdefault(form, {})[seed] = {
            metric: report.final_mean(curve, metric, final_fraction, finite_only=True)
            for metric in HACKING_METRICS
        }
    table = {}
    for prm, forms in per_seed.items():
        entry = {"forms": {}, "vs_sum": {}}
        for form in (f for f in FORMS if f in forms):
            entry["forms"][form] = {
                metric: _mean_ci([s[metric] for s in forms[form].values()])
                for metric in HACKING_METRICS
            }
        if FORMS[0] in forms:
            summed = forms[FORMS[0]]
            for form in (f for f in FORMS[1:] if f in forms):
                seeds = sorted(set(summed) & set(forms[form]))
                entry["vs_sum"][form] = {
                    metric: _mean_ci([summed[s][metric] - forms[form][s][metric] for s in seeds])
                    for metric in ("success", "turns")
                }
        table[prm] = entry
    return table


def hacking_markdown(table: Mapping[str, Any]) -> str:
    """The hacking table as Markdown, with a farming verdict per PRM and form."""
    if not table:
        return "No learned-PRM conditions were trained.\n"
    header = ["PRM", "form", "final success", "turns / episode", "turns over plan"]
    header += ["collapse rate", "PRM AUROC (held-out turns)"]
    lines = report.markdown_rows(
        header,
        [
            [prm, form] + [format_mean_ci(metrics[m], 3) for m in HACKING_METRICS]
            for prm, entry in table.items()
            for form, metrics in entry["forms"].items()
        ],
    )
    lines.append(
        "\nSum form minus the other forms (paired over seeds, mean ± 95% CI); farming = more "
        "turns per episode (CI above 0) and lower success (CI below 0):\n"
    )
    lines.append("| PRM | sum - form | Δ success | Δ turns / episode | farming? |")
    lines.append("|---|---|---|---|---|")
    for prm, entry in table.items():
        for form, delta in entry["vs_sum"].items():
            lines.append(
                f"| {prm} | {form} | {format_mean_ci(delta['success'], 3)} | "
                f"{format_mean_ci(delta['turns'], 3)} | {_farming(delta)} |"
            )
    lines.append(
        "\nFinal = mean over the last 10% of updates per seed; mean ± Student-t 95% CI over "
        "seeds.\n"
    )
    return "\n".join(lines) + "\n"


def _farming(delta: Mapping[str, Any]) -> str:
    success, turns = delta["success"], delta["turns"]
    if success is None or turns is None or min(success["n"], turns["n"]) < 2:
        return "n/a (fewer than 2 seeds)"
    more_turns = turns["mean"] - turns["ci95"] > 0
    less_success = success["mean"] + success["ci95"] < 0
    if more_turns and less_success:
        return "yes"
    if turns["mean"] + turns["ci95"] < 0:
        return "no: fewer turns (give-up)"
    if success["mean"] - success["ci95"] > 0:
        return "no: higher success"
    return "not significant"


def _mean_ci(values: Sequence[float]) -> dict[str, float] | None:
    """Mean ± 95% CI of the finite values and their number `n`; None when there is none."""
    return stats.finite_mean_ci(values, count=True)
