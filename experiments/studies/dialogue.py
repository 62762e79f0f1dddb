"""The dialogue experiment (experiments/dialogue.py): PPO against a simulated user.

Three parts, each named in `config.parts`:

1. `rewards`: every reward form of `config.conditions` (the brief's dialogue mix
   fluency + factuality + user feedback, the rating alone, feedback alone, the outcome
   alone, potential shaping from the verdict) trained side by side in one compiled
   program on the dialogue environment of `config.env` (its persona's feedback habit).
2. `feedback`: feedback-only training against users of every `config.feedback.rates` x
   `config.feedback.noises` (the persona's `feedback_rate` / `feedback_noise`); each
   user is its own environment, so its own compiled program (`feedback_runs`).
3. `credit`: the credit-accuracy study (`experiments.studies.credit_accuracy`) of the
   section `config.credit` (`env.kind = "dialogue"`: estimators' credit against
   Monte-Carlo truth over dialogue length), written to `<workdir>/credit/`.

Training goes through `common.run_and_report` (workdir refused / resumed / overwritten
there); `summary.md` / `summary.json` then hold one summary per part
(`report.summarize` with the dialogue metrics of `DIALOGUE_METRICS`) and `curves.png`
one row of panels per training part. Every config error is raised before anything is
written.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections

from experiments.studies import common
from experiments.studies import credit_accuracy
from experiments.studies.common import Run
from experiments.studies.common import floats
from experiments.studies.common import names
from rlagent import parallel
from rlagent.analysis import report
from rlagent.host import provenance

PARTS = ("rewards", "feedback", "credit")
# Per-seed means over the final updates (`report.summarize(extra=)`), with their titles.
DIALOGUE_METRICS = {
    "goal_success": "goal success",
    "satisfaction": "satisfaction (stars 1-5)",
    "factuality_errors": "factuality errors / dialogue",
    "coherence_errors": "coherence errors / dialogue",
    "format_errors": "format errors / dialogue",
    "dialogue_turns": "turns / dialogue",
    "feedback_rate": "thumbs / turn",
}
TITLE = "Dialogue: PPO against a simulated user"
# Panels of curves.png: per training part, these metrics against experience.
CURVES = ("goal_success", "satisfaction", "coherence_errors")


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
    mesh: jax.sharding.Mesh | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Runs the parts of `config.parts` into `workdir`; returns the summary of each part.
    `mesh`: the training parts split every batch's episodes over its devices, which may
    span processes (docs/distributed.md); the credit part splits its seeds over the
    processes (`credit_accuracy.run`); process 0 writes."""
    start = time.time()
    parts = _parts(config)
    runs = training_runs(config, parts)
    if "credit" in parts:
        check_credit(config.credit)
    summary = common.run_and_report(
        runs, config, workdir=workdir, resume=resume, overwrite=overwrite, title=TITLE,
        progress=progress, write_report=functools.partial(write_report, config=config),
        mesh=mesh,
    )  # fmt: skip
    if "credit" in parts:
        summary["credit"] = _credit(config.credit, os.path.join(workdir, "credit"), resume)
        parallel.primary_decides(lambda: _write_summary(summary, workdir))
    record = provenance.own(workdir, config.to_dict())
    provenance.write(
        workdir, provenance.finish({**record, "wall_s": round(time.time() - start, 1)})
    )
    return summary


def write_report(
    rows: Sequence[Mapping[str, Any]], workdir: str, *, config: ml_collections.ConfigDict
) -> dict[str, Any]:
    """curves.png, summary.md and summary.json of the training parts (`split_rows`): per
    part `report.summarize` of goal success with the `DIALOGUE_METRICS`."""
    parts_rows = split_rows(rows, config, _parts(config))
    summary = {
        part: report.summarize(part_rows, metric="goal_success", extra=tuple(DIALOGUE_METRICS))
        for part, part_rows in parts_rows.items()
    }
    plot_curves(parts_rows, os.path.join(workdir, "curves.png"))
    _write_summary(summary, workdir)
    return summary


def training_runs(config: ml_collections.ConfigDict, parts: Sequence[str]) -> list[Run]:
    """The training runs of `parts`, one per simulated user (persona), so one compiled
    program each: `rewards` trains every form of `config.conditions` against the user of
    `config.env`; `feedback` trains the `feedback` form against every user of
    `config.feedback.rates` x `noises` (`feedback_users`), as a condition
    `feedback/rate=<rate>,noise=<noise>` of the run of that user: the `rewards` run when
    it is `config.env`'s (whose own `feedback` condition is that training, if it has one:
    `shared_feedback`), else a run `feedback_r<rate>_n<noise>` of its own."""
    if config.env.get("kind") != "dialogue":
        raise ValueError(f"config.env.kind must be 'dialogue', got {config.env.get('kind')!r}.")
    main = _user(config)
    labels: dict[tuple[float, float], list[str]] = {}
    if "rewards" in parts:
        labels[main] = common.plain_forms(config.conditions)
    if "feedback" in parts:
        for user in feedback_users(config):
            if feedback_label(*user) != shared_feedback(config, parts):
                labels.setdefault(user, []).append(feedback_label(*user))
    runs = []
    for (rate, noise), conditions in labels.items():
        if (rate, noise) == main and "rewards" in parts:
            runs.append(Run("rewards", tuple(conditions), config))
            continue
        run_config = ml_collections.ConfigDict(config.to_dict())
        run_config.env.persona.feedback_rate = rate
        run_config.env.persona.feedback_noise = noise
        runs.append(Run(f"feedback_r{rate:g}_n{noise:g}", tuple(conditions), run_config))
    return runs


def shared_feedback(config: ml_collections.ConfigDict, parts: Sequence[str]) -> str | None:
    """The feedback condition that the `rewards` run's `feedback` form already trains (its
    user is `config.env`'s, a user of the sweep), None when there is none."""
    if not {"rewards", "feedback"} <= set(parts) or "feedback" not in names(config.conditions):
        return None
    main = _user(config)
    return feedback_label(*main) if main in feedback_users(config) else None


def feedback_users(config: ml_collections.ConfigDict) -> list[tuple[float, float]]:
    """`(rate, noise)` of every user of `config.feedback.rates` x `noises`: thumbs after a
    turn with probability rate, flipped with probability noise (both in [0, 1]; errors
    name the field)."""
    grid = {}
    for field in ("rates", "noises"):
        values = floats(config.feedback[field], f"feedback.{field}", "probability")
        bad = [v for v in values if not 0.0 <= v <= 1.0]  # NaN fails too
        if bad:
            raise ValueError(f"config.feedback.{field}: {bad} outside [0, 1].")
        grid[field] = values
    return [(rate, noise) for rate in grid["rates"] for noise in grid["noises"]]


def feedback_label(rate: float, noise: float) -> str:
    """The condition of feedback-only training against the user (rate, noise)."""
    return f"feedback/rate={rate:g},noise={noise:g}"


def split_rows(
    rows: Sequence[Mapping[str, Any]], config: ml_collections.ConfigDict, parts: Sequence[str]
) -> dict[str, list[Mapping[str, Any]]]:
    """The training rows of each part: `rewards`, and `feedback` (conditions
    `feedback/...` in the order of the sweep, the `rewards` part's `feedback` rows under
    their sweep label when shared, `shared_feedback`)."""
    shared = shared_feedback(config, parts)
    out: dict[str, list[Mapping[str, Any]]] = {part: [] for part in parts if part != "credit"}
    for row in rows:
        part = "feedback" if str(row["condition"]).startswith("feedback/") else "rewards"
        out[part].append(row)
        if shared and row["condition"] == "feedback":
            out["feedback"].append({**row, "condition": shared})
    if "feedback" in out:
        order = [feedback_label(*user) for user in feedback_users(config)]
        out["feedback"].sort(key=lambda row: order.index(row["condition"]))
    return out


def markdown(summary: Mapping[str, Any]) -> str:
    """summary.md: per training part the dialogue metrics and the success table (with its
    Holm-corrected comparisons); the credit tables (sign agreement, AUROC)."""
    text = f"# {TITLE}\n"
    titles = {
        "rewards": "Reward forms",
        "feedback": "Feedback-only training: sparsity (rate) and noise of the user's thumbs",
    }
    for part, title in titles.items():
        if part in summary:
            text += f"\n## {title}\n\nFinal values (mean over the last 10% of updates per seed), "
            text += "IQM [95% stratified bootstrap CI] over seeds:\n\n"
            text += report.extra_table(summary[part], DIALOGUE_METRICS)
            text += "\n" + report.markdown_table(summary[part])
    if "credit" in summary:
        text += "\n## Credit accuracy on dialogues (files in credit/)\n\n"
        for metric in ("sign_agreement", "auroc_verdict"):
            table = credit_accuracy.markdown(summary["credit"], metric)
            text += table.replace("\n## ", "\n#### ").replace("# ", "### ", 1)
    return text


def plot_curves(parts: Mapping[str, Sequence[Mapping[str, Any]]], path: str) -> None:
    """A row of panels per training part: `CURVES` against environment turns, mean over
    seeds and Student-t 95% band (`report.draw_curves`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(parts), len(CURVES), figsize=(5 * len(CURVES), 3.8 * len(parts)), squeeze=False
    )
    for i, (part, rows) in enumerate(parts.items()):
        for j, metric in enumerate(CURVES):
            ax = axes[i, j]
            report.draw_curves(ax, rows, metric=metric, band="ci95")
            ax.set_title(f"{part}: {DIALOGUE_METRICS[metric]}", fontsize=10)
            ax.legend(fontsize=7)
    fig.suptitle(f"{TITLE} (bands: 95% CI of the mean over seeds)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _user(config: ml_collections.ConfigDict) -> tuple[float, float]:
    persona = config.env.persona
    return float(persona.feedback_rate), float(persona.feedback_noise)


def _parts(config: ml_collections.ConfigDict) -> list[str]:
    parts = names(config.parts, "parts", "part")
    unknown = [part for part in parts if part not in PARTS]
    if unknown:
        raise ValueError(f"config.parts: unknown parts {unknown}; known: {PARTS}.")
    if not {"rewards", "feedback"} & set(parts):
        raise ValueError("config.parts: name 'rewards' or 'feedback' (a training part).")
    return parts


def check_credit(config: ml_collections.ConfigDict) -> None:
    """The credit section's errors (`credit_accuracy.plan`), naming `config.credit.<field>`."""
    try:
        credit_accuracy.plan(config)
    except ValueError as error:
        message = str(error)
        if message.startswith("config."):
            raise ValueError("config.credit." + message.removeprefix("config.")) from None
        raise ValueError(f"config.credit: {message}") from None


def _write_summary(summary: Mapping[str, Any], workdir: str) -> None:
    text = markdown(summary)
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(text)


def _credit(config: ml_collections.ConfigDict, folder: str, resume: bool) -> dict[str, Any]:
    """The credit study into `folder`; a resumed run keeps a finished one."""
    done = os.path.join(folder, "summary.json")
    if resume and os.path.exists(done):
        with open(done) as f:
            return json.load(f)
    return credit_accuracy.run(config, folder, overwrite=True)
