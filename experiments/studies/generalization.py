"""Which findings hold: the project's three studies on every environment of `config.envs`.

For each environment kind (`config.kinds.<kind>`: its `env` section and the horizons of
its two horizon studies), the existing studies run on it unchanged, each into
`<workdir>/<kind>/<part>` with its own outputs (metrics, figures, summary, provenance):

  rewards     `process_rewards` (section `config.rewards`): PPO with the sparse outcome,
              the env's process verdict, potential shaping from it and a learned PRM on
              Monte-Carlo labels, against total environment turns; the label-quality
              study and the reward-hacking table;
  credit      `credit_accuracy` (`config.credit`): each estimator's credit against
              Monte-Carlo truth at the kind's `credit_horizons`;
  estimators  `horizon_sweep` (`config.estimators`): reward forms and the estimator
              comparison in training at the kind's `sweep_horizons`, from a
              behaviour-cloned start.

Every study config is the part's section with the kind's env section (and horizons) put
in, so the comparison is like for like: the same budget, seeds, model and statistics on
every environment. Then `findings` reads each finding of the ToolWorld studies
(docs/generalization.md) off the part summaries, with its interval and a verdict from
the interval alone ("holds", "does not hold", "cannot tell apart at n seeds"), and the
workdir gets summary.md, summary.json, findings.png and provenance.json.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import NamedTuple

import jax
import ml_collections
import numpy as np

from experiments.studies import common
from experiments.studies import credit_accuracy
from experiments.studies import horizon_sweep
from experiments.studies import process_rewards
from experiments.studies.common import names
from experiments.studies.envs import kind_of
from experiments.studies.envs import title
from rlagent import parallel
from rlagent.analysis import report
from rlagent.analysis import stats
from rlagent.host import provenance
from rlagent.host.workdir import prepare_workdir

PARTS = ("rewards", "credit", "estimators")
# Fields a resumed run may change: which environments run and are reported (and the
# references, `_may_change`).
RESUMABLE = ("envs",)
# Relative paths of `config.references` start here (the repository root).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CANNOT_TELL = "cannot tell apart"


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
    mesh: jax.sharding.Mesh | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Runs every part on every environment (module docstring); returns the summary.
    `mesh`: the training parts split their batches' episodes over it, the credit part its
    seeds over the processes (`credit_accuracy.run`); process 0 writes the report.

    A non-empty `workdir` is refused unless `resume` or `overwrite` (start clean). A
    resumed run must have the same config except `envs` (each part is a study of its own,
    with its provenance) and `references`: finished parts, those with a summary.json, are
    kept, the others continue or restart, and the report covers the environments of
    `envs` and the references.
    """
    plans = plan(config)  # config errors before anything is written
    resuming = prepare_workdir(
        workdir, resume=resume, overwrite=overwrite,
        config=provenance.resolved(**config.to_dict()), may_change=_may_change(workdir, config),
        note=f"only {', '.join(RESUMABLE)} and references may change on resume",
    )  # fmt: skip
    start = time.time()
    parts = [f"{k}/{p}" for k, p, _ in plans]
    record = common.start_record(workdir, resuming, config.to_dict(), parts=parts)
    summaries: dict[str, dict[str, Any]] = {}
    for kind, part, part_config in plans:
        folder = os.path.join(workdir, kind, part)
        print(f"[generalization {time.time() - start:6.0f}s] {kind} / {part}", flush=True)
        summaries.setdefault(kind, {})[part] = _run_part(part, part_config, folder, resume, mesh)
    summary = parallel.primary_decides(
        lambda: write_report(workdir, summaries, config, load_references(config))
    )
    provenance.write(
        workdir, provenance.finish({**record, "wall_s": round(time.time() - start, 1)})
    )
    return summary


def _may_change(workdir: str, config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """RESUMABLE and every field under `references` (finished studies read beside the
    run: no result of the run depends on them), stored or given."""
    stored = (provenance.read(workdir) or {}).get("config", {})
    fields = set()
    for tree in (stored.get("references") or {}, config.to_dict().get("references", {})):
        for name, files in tree.items():
            fields.update(f"references.{name}.{field}" for field in files)
    return RESUMABLE + tuple(sorted(fields))


def plan(config: ml_collections.ConfigDict) -> list[tuple[str, str, ml_collections.ConfigDict]]:
    """`[(kind, part, study config)]` of `config`; every config error is raised here,
    naming its field."""
    common.check_counts(config, {"seeds": 1, "first_seed": None})
    kinds = names(config.envs, "envs", "environment")
    for kind in kinds:
        try:
            kind_of(kind)
        except ValueError as error:
            message = str(error).removeprefix("config.env.kind: ")
            raise ValueError(f"config.envs: {message}") from None
        if kind not in config.kinds:
            raise ValueError(f"config.envs names {kind!r}, but config.kinds has no {kind!r}.")
    plans = []
    for kind in kinds:
        for part in PARTS:
            part_config = part_config_of(config, kind, part)
            try:
                _check(part, part_config)
            except ValueError as error:
                raise ValueError(f"config.kinds.{kind} / config.{part}: {error}") from None
            plans.append((kind, part, part_config))
    _check_credit_finding(config)
    for name, files in config.get("references", {}).items():
        for part in (p for p in PARTS if p in files):
            if not os.path.isfile(_path(files[part])):
                raise ValueError(f"config.references.{name}.{part}: no file {files[part]!r}.")
    return plans


def _check_credit_finding(config: ml_collections.ConfigDict) -> None:
    """The credit finding reads one reward form and policy of the credit part: a pair it
    does not measure would leave the finding empty."""
    for field, listed in (("credit_reward", "rewards"), ("credit_policy", "policies")):
        measured = names(config.credit[listed], f"credit.{listed}")
        if config[field] not in measured:
            raise ValueError(
                f"config.{field} {config[field]!r} must be one of config.credit.{listed} "
                f"({', '.join(measured)})."
            )


def load_references(config: ml_collections.ConfigDict) -> dict[str, dict[str, Any]]:
    """`config.references`: finished studies read like parts, {name: {part: summary}}
    (e.g. the ToolWorld studies' committed summaries, at their own budgets; a reference
    names a title and any of PARTS)."""
    out = {}
    for name, files in config.get("references", {}).items():
        out[name] = {}
        for part in (p for p in PARTS if p in files):
            with open(_path(files[part])) as f:
                out[name][part] = json.load(f)
    return out


def _path(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(ROOT, path)


def part_config_of(
    config: ml_collections.ConfigDict, kind: str, part: str
) -> ml_collections.ConfigDict:
    """The study config of `part` on `kind`: section `config.<part>` with the kind's env
    section, its horizons and the shared seeds put in."""
    out = ml_collections.ConfigDict(config[part].to_dict())
    spec = config.kinds[kind]
    out.env = ml_collections.ConfigDict(spec.env.to_dict())
    out.seeds, out.first_seed = int(config.seeds), int(config.first_seed)
    if part == "rewards":
        out.labels.seeds, out.labels.first_seed = int(config.seeds), int(config.first_seed)
    elif part == "credit":
        out.horizons = spec.credit_horizons
    else:
        out.horizons = spec.sweep_horizons
        out.estimator_horizons = spec.estimator_horizons
        out.slack = int(spec.slack)
    return out


def _check(part: str, part_config: ml_collections.ConfigDict) -> None:
    """The part's own checks, before anything runs."""
    if part == "rewards":
        process_rewards.plan(part_config)
    elif part == "credit":
        credit_accuracy.plan(part_config)
    else:
        horizon_sweep.plan(part_config)


def _run_part(part: str, part_config, folder: str, resume: bool, mesh) -> dict[str, Any]:
    """Runs one part into `folder` (kept when a resumed one finished); its summary."""
    path = os.path.join(folder, "summary.json")
    if resume and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    if part == "rewards":
        return process_rewards.run(part_config, folder, resume=resume, progress=False, mesh=mesh)
    if part == "credit":  # keeps no checkpoints: an unfinished one starts again.
        return credit_accuracy.run(part_config, folder, overwrite=resume)
    return horizon_sweep.run(part_config, folder, resume=resume, progress=False, mesh=mesh)


# Findings ---------------------------------------------------------------------------------


class Finding(NamedTuple):
    """One ToolWorld finding and how to read it off a kind's part summaries."""

    name: str  # short id (rows of summary.json).
    part: str  # the part whose summary holds it (PARTS).
    claim: str  # the finding as the ToolWorld docs state it.
    # measure(part summary, config) -> (measurement text, verdict, numbers); the verdict
    # reads only the measurement's interval or test.
    measure: Callable[[Mapping[str, Any], ml_collections.ConfigDict], tuple[str, str, dict]]


def _verdict_of_difference(low: float, high: float, n: int | None, expected: str) -> str:
    """'holds' when the interval of a difference lies on the `expected` side of 0
    ('>' or '<'), 'does not hold' when it lies on the other, else cannot tell (at `n`
    seeds, when known). An interval of no width (one measured seed, or every seed alike)
    tells nothing."""
    if not high > low:
        return f"{CANNOT_TELL} (no spread over seeds: one measured, or all alike)"
    if expected == ">" and low > 0 or expected == "<" and high < 0:
        return "holds"
    if expected == ">" and high < 0 or expected == "<" and low > 0:
        return "does not hold (reversed)"
    return f"{CANNOT_TELL} at {n} seeds" if n else f"{CANNOT_TELL} (the interval spans 0)"


def _comparison(summary: Mapping[str, Any], x: str, y: str) -> dict[str, Any] | None:
    """The Holm-corrected comparison of conditions x and y, oriented as x vs y."""
    for c in summary["comparisons"]:
        if (c["x"], c["y"]) == (x, y):
            return dict(c)
        if (c["x"], c["y"]) == (y, x):
            return {**c, "x": x, "y": y, "prob_improvement": 1.0 - c["prob_improvement"]}
    return None


def _training_comparison(x: str, y: str, expected: str) -> Callable:
    """A finding 'x trains better than y' ('>'), 'no better' ('='), from a training
    summary (`report.summarize`): final success of both, P(x > y), Holm's p."""

    def measure(summary, config):
        conditions = summary["conditions"]
        if x not in conditions or y not in conditions:
            return "not trained", "not measured", {}
        c = _comparison(summary, x, y)
        n = min(conditions[x]["num_seeds"], conditions[y]["num_seeds"])
        text = (
            f"{x} {_final(conditions[x])} vs {y} {_final(conditions[y])}; "
            f"P({x} > {y}) = {c['prob_improvement']:.2f}, p_holm = {c['p_holm']:.3g}"
        )
        significant = c["p_holm"] < 0.05
        better = c["prob_improvement"] > 0.5
        if expected == "=":
            verdict = (
                f"holds (no difference at {n} seeds)"
                if not significant
                else f"does not hold ({x} {'better' if better else 'worse'})"
            )
        elif significant:
            verdict = "holds" if better == (expected == ">") else "does not hold (reversed)"
        else:
            verdict = f"{CANNOT_TELL} at {n} seeds"
        return text, verdict, c

    return measure


def _final(entry: Mapping[str, Any]) -> str:
    """Final success IQM [CI] and take-off k/n of a training summary's condition."""
    return (
        f"{stats.format_interval(entry['final_success']['iqm'])} "
        f"(take-off {entry['takeoff']['k']}/{entry['takeoff']['n']})"
    )


def _label_auroc(summary, config) -> tuple[str, str, dict]:
    """Completion labels of the behaviour policy: soft-label AUROC vs the verdict at the
    largest N <= 4 (above chance: holds)."""
    labels = summary.get("label_quality", {})
    key = next((k for k in labels if k.startswith("completion/soft")), None)
    if key is None or "policy" not in labels[key]:
        return "not measured", "not measured", {}
    by_n = labels[key]["policy"]
    n = max((int(k) for k in by_n if int(k) <= 4), default=min(int(k) for k in by_n))
    auroc = by_n[str(n)]["auroc"]
    if auroc is None or not np.isfinite(auroc.get("mean", np.nan)):
        return "undefined (one class of verdicts)", "not measured", {}
    low, high = auroc["mean"] - auroc["ci95"], auroc["mean"] + auroc["ci95"]
    verdict = _verdict_of_difference(low - 0.5, high - 0.5, by_n[str(n)]["seeds"], ">")
    return f"AUROC {stats.format_mean_ci(auroc)} at N = {n}", verdict, {"n": n, **auroc}


def _credit_cells(summary, config):
    """estimator -> {horizon: cell} of `config.credit_reward` and `config.credit_policy`."""
    return summary.get(config.credit_reward, {}).get(config.credit_policy, {})


def _credit_falls(summary, config) -> tuple[str, str, dict]:
    """Every estimator's AUROC vs the verdict lower at the longest horizon than at the
    shortest (difference of means, CI from the two t-intervals in quadrature)."""
    cells = _credit_cells(summary, config)
    if not cells:
        return "not measured", "not measured", {}
    falls, rises, changes = 0, 0, {}
    for estimator, by_h in cells.items():
        horizons = sorted(by_h, key=int)
        first, last = by_h[horizons[0]]["auroc_verdict"], by_h[horizons[-1]]["auroc_verdict"]
        if not first or not last:
            continue
        diff = last["mean"] - first["mean"]
        half = float(np.hypot(first["ci95"], last["ci95"]))
        changes[estimator] = {"diff": diff, "ci95": half}
        falls += half > 0 and diff + half < 0
        rises += half > 0 and diff - half > 0
    n = len(changes)
    if not n:
        return "undefined (no AUROC: one class of verdicts)", "not measured", {}
    shown = ", ".join(f"{e} {d['diff']:+.2f} ± {d['ci95']:.2f}" for e, d in changes.items())
    h = sorted(next(iter(cells.values())), key=int)
    text = f"AUROC change h={h[0]} -> h={h[-1]}: {shown}; {falls}/{n} fall, {rises}/{n} rise"
    if n and falls == n:
        verdict = "holds"
    elif rises and not falls:
        verdict = "does not hold (rises)"
    elif falls:
        verdict = f"partly ({falls} of {n} estimators)"
    else:
        verdict = f"{CANNOT_TELL} (every interval spans 0)"
    return text, verdict, changes


GROUP_ESTIMATORS = ("grpo", "rloo", "gigpo")
CRITIC_ESTIMATORS = ("gae_turn", "hierarchical")


def _group_sign(summary, config) -> tuple[str, str, dict]:
    """At the longest horizon, sign agreement of turn GAE / hierarchical minus that of
    the group baselines (mean of each family; CI from the t-intervals in quadrature)."""
    cells = _credit_cells(summary, config)
    families = {}
    for name, members in (("critic", CRITIC_ESTIMATORS), ("group", GROUP_ESTIMATORS)):
        found = [cells[e] for e in members if e in cells]
        if not found:
            return "not measured", "not measured", {}
        last = str(max(int(h) for h in found[0]))
        entries = [f[last]["sign_agreement"] for f in found if f[last]["sign_agreement"]]
        if not entries:
            return "undefined (no clearly non-zero advantage)", "not measured", {}
        mean = float(np.mean([e["mean"] for e in entries]))
        half = float(np.sqrt(np.sum([e["ci95"] ** 2 for e in entries])) / len(entries))
        families[name] = {"mean": mean, "ci95": half, "horizon": int(last)}
    diff = families["critic"]["mean"] - families["group"]["mean"]
    half = float(np.hypot(families["critic"]["ci95"], families["group"]["ci95"]))
    text = (
        f"h={families['critic']['horizon']}: turn GAE / hierarchical "
        f"{stats.format_mean_ci(families['critic'])} vs GRPO / RLOO / GiGPO "
        f"{stats.format_mean_ci(families['group'])}; difference {diff:+.2f} ± {half:.2f}"
    )
    verdict = _verdict_of_difference(diff - half, diff + half, None, ">")
    return text, verdict, {**families, "diff": diff, "ci95": half}


def _sweep_gap(condition: str, reference: str, expected: str) -> Callable:
    """Held-out (or final) success of `condition` minus `reference` at the longest
    horizon where both trained (the estimator comparison's, for estimator conditions),
    with its bootstrap CI over seeds (the verdict) and the sweep's Holm-corrected test of
    the pair (a verdict the test does not support says so)."""

    def measure(summary, config):
        horizons = summary["horizons"]
        with_both = [
            h for h, cell in horizons.items()
            if condition in cell["conditions"] and reference in cell["conditions"]
        ]  # fmt: skip
        if not with_both:
            return "not trained", "not measured", {}
        h = max(with_both, key=int)
        cells = horizons[h]["conditions"]
        a, b = cells[condition]["per_seed"]["success"], cells[reference]["per_seed"]["success"]
        gap = stats.bootstrap_mean_difference(a, b)
        text = (
            f"h={h}: {condition} {stats.format_interval(cells[condition]['success']['iqm'])} "
            f"vs {reference} {stats.format_interval(cells[reference]['success']['iqm'])} "
            f"(IQM); mean gap {stats.format_interval(gap)}"
        )
        verdict = _verdict_of_difference(gap["low"], gap["high"], len(a), expected)
        test = _comparison(horizons[h], condition, reference)
        if test is not None:
            text += f"; P({condition} > {reference}) = {test['prob_improvement']:.2f}, "
            text += f"p_holm = {test['p_holm']:.3g}"
            if not verdict.startswith(CANNOT_TELL) and not test["significant"]:
                # The bootstrap interval is per pair; Holm corrects over the horizon's pairs.
                verdict += f" by the gap's CI; not after Holm (p = {test['p_holm']:.2g})"
        return text, verdict, {"horizon": int(h), "gap": gap, "test": test}

    return measure


FINDINGS = (
    Finding(
        "potential_beats_outcome", "rewards",
        "potential shaping from the process verdict trains better than the sparse outcome",
        _training_comparison("potential", "outcome", ">"),
    ),
    Finding(
        "verdict_no_better_than_outcome", "rewards",
        "the dense process verdict as reward is not better than the sparse outcome",
        _training_comparison("process", "outcome", "="),
    ),
    Finding(
        "learned_prm_potential_vs_outcome", "rewards",
        "a learned PRM on Monte-Carlo completion labels, in potential form, is not "
        "distinguishable from the sparse outcome",
        _training_comparison("learned_potential/prm=completion", "outcome", "="),
    ),
    Finding(
        "mc_labels_rank_steps", "rewards",
        "Monte-Carlo completion labels (the behaviour's own continuations) rank the "
        "verdict's good steps above its bad ones",
        _label_auroc,
    ),
    Finding(
        "credit_degrades_with_horizon", "credit",
        "every estimator's credit (AUROC vs the verdict) degrades as the horizon grows",
        _credit_falls,
    ),
    Finding(
        "group_baselines_lose_sign", "credit",
        "at the longest horizon the group baselines get fewer signs right than turn GAE "
        "and the hierarchical estimator",
        _group_sign,
    ),
    Finding(
        "verdict_critic_loses_start", "estimators",
        "from a competent start, the process verdict through turn GAE ends below the sparse "
        "outcome at the longest horizon",
        _sweep_gap("process/gae_turn", "outcome/gae_turn", "<"),
    ),
    Finding(
        "potential_critic_loses_start", "estimators",
        "from a competent start, potential shaping through turn GAE ends below the sparse "
        "outcome at the longest horizon",
        _sweep_gap("potential/gae_turn", "outcome/gae_turn", "<"),
    ),
    Finding(
        "grpo_keeps_start_under_verdict", "estimators",
        "under the process verdict GRPO ends above turn GAE (estimator comparison)",
        _sweep_gap("process/grpo", "process/gae_turn", ">"),
    ),
    Finding(
        "gigpo_keeps_start_under_verdict", "estimators",
        "under the process verdict GiGPO ends above turn GAE (estimator comparison)",
        _sweep_gap("process/gigpo", "process/gae_turn", ">"),
    ),
)  # fmt: skip


def findings(
    summaries: Mapping[str, Mapping[str, Any]], config: ml_collections.ConfigDict
) -> list[dict[str, Any]]:
    """One row per finding and environment kind: its measurement and verdict."""
    rows = []
    for finding in FINDINGS:
        for kind, parts in summaries.items():
            if finding.part not in parts:  # a reference without this study
                continue
            text, verdict, numbers = finding.measure(parts[finding.part], config)
            rows.append(
                dict(
                    finding=finding.name, part=finding.part, claim=finding.claim, env=kind,
                    measured=text, verdict=verdict, numbers=numbers,
                )
            )  # fmt: skip
    return rows


def write_report(
    workdir: str,
    summaries: Mapping[str, Mapping[str, Any]],
    config: ml_collections.ConfigDict,
    references: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """summary.json (findings rows, the sources' titles and files), summary.md (one
    table: finding x source: the kinds run, then `references`) and findings.png (the
    kinds run)."""
    references = dict(references or {})
    rows = findings({**summaries, **references}, config)
    kinds = list(summaries)
    envs = {kind: f"{title(config.kinds[kind].env)}, this run" for kind in kinds}
    parts = {kind: {part: os.path.join(kind, part) for part in PARTS} for kind in kinds}
    for name in references:
        envs[name] = config.references[name].title
        parts[name] = {part: config.references[name][part] for part in references[name]}
    summary = {
        "findings": rows,
        "envs": envs,
        "parts": parts,
        "settings": {"seeds": int(config.seeds), "credit_reward": config.credit_reward,
                     "credit_policy": config.credit_policy},
    }  # fmt: skip
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=float)
    text = markdown(summary)
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write(text)
    plot(summaries, os.path.join(workdir, "findings.png"), envs, config)
    print(text, flush=True)
    return summary


def markdown(summary: Mapping[str, Any]) -> str:
    """The findings table: per finding, one row per source (environment run, or
    reference) with its measurement and verdict."""
    lines = ["# Which findings hold: ToolWorld's findings on every environment\n"]
    lines += [
        f"- {kind}: {name}; "
        + ", ".join(f"{p} `{path}`" for p, path in summary["parts"][kind].items())
        for kind, name in summary["envs"].items()
    ]
    claims = {row["finding"]: row["claim"] for row in summary["findings"]}
    header = ["finding (ToolWorld)", "source", "measured", "verdict"]
    table = []
    for finding, claim in claims.items():  # the claim on the first row of its sources
        rows = [r for r in summary["findings"] if r["finding"] == finding]
        for i, row in enumerate(rows):
            shown = "" if i else claim
            table.append([shown, row["env"], row["measured"], f"**{row['verdict']}**"])
    lines += [""] + report.markdown_rows(header, table)
    lines.append(
        f"\n{summary['settings']['seeds']} seeds per condition. Training: final success "
        "IQM [stratified bootstrap 95% CI] and take-off, Holm-corrected Mann-Whitney tests "
        "over each study's pairs; sweep gaps: difference of mean held-out success with a "
        "percentile bootstrap 95% CI over seeds; credit: mean ± Student-t 95% CI over seeds "
        f"(reward {summary['settings']['credit_reward']}, policy "
        f"{summary['settings']['credit_policy']}). A verdict reads only the interval or "
        "test: 'holds' when it excludes the other side, 'cannot tell apart' when it "
        "spans it. Each part's own summary.md is in `<env>/<part>/`; references keep their "
        "own seeds and budgets.\n"
    )
    return "\n".join(lines)


def plot(
    summaries: Mapping[str, Mapping[str, Any]], path: str, envs: Mapping[str, str], config
) -> None:
    """Per environment (rows): final success of the reward forms (IQM, 95% CI), credit
    AUROC vs horizon per estimator (mean ± 95% CI), sweep success vs horizon per
    condition (IQM, 95% CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(summaries)
    if not kinds:  # references only: their own studies hold their figures
        return
    fig, axes = plt.subplots(len(kinds), 3, figsize=(16, 3.8 * len(kinds)), squeeze=False)
    for row, kind in zip(axes, kinds, strict=True):
        parts = summaries[kind]
        _bars(row[0], parts["rewards"]["conditions"])
        row[0].set_title(f"{envs[kind]}\nreward forms: final success (IQM, 95% CI)", fontsize=8)
        _lines(row[1], _credit_series(_credit_cells(parts["credit"], config)))
        row[1].set_title(
            f"credit ({config.credit_reward}, {config.credit_policy}): AUROC vs the verdict "
            "(mean ± 95% CI)",
            fontsize=8,
        )
        row[1].set_xlabel("horizon (turns)")
        _lines(row[2], _sweep_series(parts["estimators"]))
        row[2].set_title("training from a warm start: success (IQM, 95% CI)", fontsize=8)
        row[2].set_xlabel("horizon (turns)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bars(ax, conditions: Mapping[str, Any]) -> None:
    labels = list(conditions)
    iqm = [conditions[c]["final_success"]["iqm"] for c in labels]
    value = np.array([e["value"] for e in iqm])
    err = np.array([[e["value"] - e["low"] for e in iqm], [e["high"] - e["value"] for e in iqm]])
    ax.bar(range(len(labels)), value, yerr=err, capsize=3, color="C0", alpha=0.7)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([c.replace("/prm=", "\n") for c in labels], fontsize=6, rotation=30)
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3, axis="y")


def _lines(ax, series: Mapping[str, list[tuple[int, float, float, float]]]) -> None:
    for label, points in series.items():
        if not points:
            continue
        x, y, low, high = (np.array(v) for v in zip(*sorted(points), strict=True))
        (line,) = ax.plot(x, y, marker="o", markersize=3, label=label)
        ax.fill_between(x, low, high, alpha=0.15, color=line.get_color())
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=6)


def _credit_series(cells: Mapping[str, Any]) -> dict[str, list]:
    """estimator -> [(h, mean, low, high)] of the AUROC vs the verdict."""
    out = {}
    for estimator, by_h in cells.items():
        entries = [(int(h), e["auroc_verdict"]) for h, e in by_h.items() if e["auroc_verdict"]]
        out[estimator] = [(h, m["mean"], m["mean"] - m["ci95"], m["mean"] + m["ci95"])
                          for h, m in entries]  # fmt: skip
    return out


def _sweep_series(summary: Mapping[str, Any]) -> dict[str, list]:
    """condition -> [(h, IQM, low, high)] of the sweep's success."""
    out: dict[str, list] = {}
    for h, cell in summary["horizons"].items():
        for condition, entry in cell["conditions"].items():
            iqm = entry["success"]["iqm"]
            out.setdefault(condition, []).append((int(h), iqm["value"], iqm["low"], iqm["high"]))
    return out
