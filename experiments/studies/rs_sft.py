"""Rejection sampling -> SFT -> RL: the head start of best-of-N SFT from the current policy.

For every task family of `config.envs` (`l2`..`l4`: ToolWorld curriculum levels, `h<H>`:
the exact-horizon tasks of `horizon_config(H)`) every seed trains PPO (`rlagent.host.loop`)
from one of these starting policies:

* `scratch`: the random initial policy (`base` when `config.base_steps` > 0: see below);
* `oracle`: behaviour cloning of oracle demonstrations (`warm_start.oracle_demonstrations`);
* `rs_n<N>_<judge><T>`: `config.sft.steps` SFT steps, each on the best-of-N samples of the
  policy being fine-tuned (`rlagent.pipeline.rejection.best_of_n`: N per task for
  `config.rejection.tasks` tasks, accepted when the judge `config.rejection.judge` scores
  them >= T), for every N of `config.samples` and `judge@T` of `config.thresholds`.

With `config.base_steps` > 0 every condition of a family starts from one *base* policy
instead of the random one: that many steps of oracle cloning (its own key stream, the same
base for every condition), a weak policy that solves some tasks sometimes, the setting
best-of-N is meant for. The base's turns are counted in every condition's `sft_turns`
(`base_turns` names them) and its held-out success is the `base` condition's head start.

Every condition of a family shares one compiled RL program (and one SFT program per N: the
threshold is data). Cost is counted in environment turns: the SFT episodes (sampled,
accepted or not; the oracle's demonstrations) come before the RL experience on the x-axis
(`total_turns`, success 0 while fine-tuning), and conditions are compared at the budget
that every run reached (`report.summarize`'s AUC and turns-to-threshold; the success at
that budget). Per family and condition: held-out success right after SFT (the head start,
`rlagent.train.evaluation`, sampled and greedy) and at the end of RL.
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
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.studies import common
from experiments.studies.sections import make
from experiments.studies.sections import section
from rlagent import parallel
from rlagent.analysis import paired
from rlagent.analysis import report
from rlagent.analysis import stats
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.envs.toolworld import horizon_config
from rlagent.host import loop
from rlagent.host import provenance
from rlagent.host.writers import MetricWriter
from rlagent.pipeline.rejection import RejectionConfig
from rlagent.pipeline.rejection import best_of_n
from rlagent.pipeline.warm_start import WarmStartConfig
from rlagent.pipeline.warm_start import make_sft
from rlagent.pipeline.warm_start import oracle_demonstrations
from rlagent.train.ppo import make_train

SFT_STREAM = 0x5F7  # folded into a seed's key for its SFT phase (the RL keys stay as they are).
BASE_STREAM = 0xBA5  # folded into a seed's key for the base policy's oracle cloning.
SFT_TURNS = "sft_turns"
BASE_TURNS = "base_turns"  # of SFT_TURNS: the base policy's oracle cloning (config.base_steps)


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
    """Trains every (family, condition, seed) and writes the report into `workdir`;
    `report_only` only rewrites the report of a finished study from its metrics.csv and
    summary.json's head starts (provenance.json is left as the run wrote it). `mesh`: the
    RL stage splits its batches' episodes over it; the SFT stages and the head starts'
    evaluation (one program each) run whole in every process; process 0 writes."""
    common.check_counts(config, common.RUN_COUNTS)
    families = common.names(config.envs, "envs", "task family")
    env_configs = {name: family_config(config, name) for name in families}  # errors first
    conditions(config)
    sft_config = make(WarmStartConfig, config.sft, "sft")
    rejection = make(RejectionConfig, config.rejection, "rejection")
    if report_only:
        return parallel.primary_decides(
            lambda: write_report(*finished_study(workdir), workdir, title=config.get("title", ""))
        )
    resuming = common.prepare(workdir, config, resume=resume, overwrite=overwrite)
    start = time.time()
    record = common.start_record(workdir, resuming, config.to_dict(), families=families)
    rows, heads = [], {}
    for name, family in env_configs.items():
        family_rows, heads[name] = _train_family(
            family, name, sft_config, rejection, workdir=os.path.join(workdir, name),
            resume=resume, overwrite=overwrite, progress=progress, mesh=mesh,
        )  # fmt: skip
        rows += family_rows
        loop.clear_compiled()
    summary = parallel.primary_decides(
        lambda: write_report(rows, heads, workdir, title=config.get("title", ""))
    )
    wall = round(time.time() - start, 1)
    provenance.write(workdir, provenance.finish({**record, "wall_s": wall}))
    return summary


def finished_study(workdir: str) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """`(rows, heads)` of the finished study in `workdir` (`write_report`'s inputs), read
    from its metrics.csv and summary.json; refused naming the folder when either is absent."""
    rows = MetricWriter(workdir, tensorboard=False).read()
    path = os.path.join(workdir, "summary.json")
    if not rows or not os.path.exists(path):
        raise ValueError(f"--report_only: {workdir} holds no finished study to report")
    with open(path) as f:
        families = json.load(f)["families"]
    heads = {
        family: {label.partition("/")[2]: v for label, v in entry["heads"].items()}
        for family, entry in families.items()
    }
    return rows, heads


def family_config(
    config: ml_collections.ConfigDict, name: str, field: str = "envs"
) -> ml_collections.ConfigDict:
    """The experiment config of task family `name` (an entry of `config.<field>`): `l<k>`
    sets `env.level`, `h<H>` the `HORIZON_FIELDS` to those of `horizon_config(H)`.

    An env field the user set (not the section's default) is kept; one the family would
    replace with another value is refused naming it, never silently overridden."""
    out = ml_collections.ConfigDict(config.to_dict())
    kind, number = name[:1], name[1:]
    if kind not in ("l", "h") or not number.isdigit():
        raise ValueError(f"config.{field}: {name!r} is neither 'l<level>' nor 'h<horizon>'.")
    given = _set_fields(config.env)
    try:
        if kind == "l":
            if given.get("level", int(number)) != int(number):
                raise ValueError(
                    f"config.env.level={given['level']} is set, but the family sets the "
                    f"level to {number}; leave config.env.level at its default or choose "
                    f"the family l{given['level']}"
                )
            out.env.level = int(number)
        else:
            # The user's own horizon fields are kept; horizon_config refuses those that
            # would change the shortest plan.
            overrides = {k: given[k] for k in HORIZON_FIELDS if k in given}
            fields = dataclasses.asdict(horizon_config(int(number), **overrides))
            out.env.update({k: _plain(fields[k]) for k in HORIZON_FIELDS})
        common.build(out)  # a bad field is named now, before anything is trained.
    except ValueError as error:
        raise ValueError(f"config.{field}: {name!r}: {error}") from None
    return out


# The env fields a task family sets: `l<k>` the level, `h<H>` these (`horizon_config`).
HORIZON_FIELDS = ("level", "kinds", "num_intents", "num_distractors", "max_turns")


def _plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _set_fields(env: ml_collections.ConfigDict) -> dict[str, Any]:
    """The `env` fields whose value differs from the section's default (`section`)."""
    default = section(ToolWorldConfig)
    return {k: _plain(v) for k, v in env.items() if k in default and _plain(v) != default[k]}


def conditions(config: ml_collections.ConfigDict) -> list[tuple[str, int, str, float]]:
    """`(label, N, judge, threshold)` of every condition; N = 0: scratch, N = -1: oracle.

    `config.thresholds` entries are `judge@threshold` (a judge of
    `rlagent.preference.judges`, e.g. `outcome@1`, `process@2`)."""
    if not isinstance(config.base_steps, int) or config.base_steps < 0:
        raise ValueError(
            f"config.base_steps: {config.base_steps!r}; need an int >= 0 (oracle-cloning "
            "steps of the base policy every condition starts from; 0: the random policy)."
        )
    out = [("base" if config.base_steps else "scratch", 0, "", 0.0), ("oracle", -1, "", 0.0)]
    bars = []
    for spec in common.names(config.thresholds, "thresholds", "judge@threshold"):
        judge, _, value = spec.partition("@")
        try:
            RejectionConfig(judge=judge)
            bars.append((judge, float(value)))
        except ValueError as error:
            raise ValueError(
                f"config.thresholds: {spec!r} must be judge@threshold ({error})."
            ) from None
    # 'outcome@1,outcome@1.0': the same condition spelt twice.
    common.refuse_repeats([f"{j}@{t:g}" for j, t in bars], "thresholds", "judge@threshold")
    for n in common.ints(config.samples, "samples", "sample count"):
        if n < 1:
            raise ValueError(f"config.samples: {n} samples per task; need >= 1.")
        for judge, t in bars:
            out.append((f"rs_n{n}_{judge}{t:g}", n, judge, t))
    return out


def _train_family(
    config, name, sft_config, rejection, *, workdir, resume, overwrite, progress, mesh=None
):
    """Rows of every condition of one family (labelled `<family>/<condition>`, with
    `sft_turns` and `total_turns`) and each condition's post-SFT held-out success."""
    setup = common.build(config)
    trainer = make_train(
        setup.train_config, setup.env, setup.policy_config, setup.rollout_config, **setup.extras()
    )
    seeds = list(range(config.first_seed, config.first_seed + config.seeds))
    keys = jnp.stack([jax.random.PRNGKey(s) for s in seeds])
    # The program loop.run evaluates with (its held-out tasks, `config.eval.tasks`).
    evaluate = loop.held_out_evaluator(
        setup.train_config, setup.env, setup.policy_config, setup.rollout_config,
        setup.eval_config,
    )  # fmt: skip
    start, base_turns = _base_policy(config, setup, trainer, sft_config, keys)
    rows, heads, programs = [], {}, {}
    for label, n, judge, threshold in conditions(config):
        params, sft_turns, trace = start, base_turns, {}
        if n:  # oracle (-1) or best-of-N (n > 0)
            if (n, judge) not in programs:  # one program per N and judge: thresholds are data
                rs = dataclasses.replace(
                    rejection, samples=max(n, 1), judge=judge or rejection.judge
                )
                programs[n, judge] = _sft_program(setup, trainer, sft_config, rs, oracle=n < 0)
            params, sft = programs[n, judge](params, keys, threshold)
            sft_turns = base_turns + np.asarray(jnp.sum(sft.env_turns, axis=1))
            trace = {
                "accept_rate": np.asarray(jnp.sum(sft.accepted, 1) / jnp.sum(sft.episodes, 1)),
                "nll_first": np.asarray(sft.loss[:, 0]),
                "nll_last": np.asarray(sft.loss[:, -1]),
            }
        heads[label] = {
            **{k: np.asarray(v).tolist() for k, v in jax.device_get(evaluate(params)).items()},
            SFT_TURNS: sft_turns.tolist(),
            BASE_TURNS: base_turns.tolist(),
            **{k: v.tolist() for k, v in trace.items()},
        }
        run_rows = loop.run(
            setup.train_config, setup.env, setup.policy_config, setup.rollout_config,
            evaluation=setup.eval_config, seeds=seeds, workdir=os.path.join(workdir, label),
            chunk_size=config.chunk_size, resume=resume, overwrite=overwrite,
            progress=progress, initial_params=params, mesh=mesh,
            initial_params_config={"condition": label, "sft": dataclasses.asdict(sft_config),
                                   "rejection": dataclasses.asdict(rejection),
                                   "base_steps": config.base_steps},
        )  # fmt: skip
        offset = dict(zip(seeds, sft_turns, strict=True))
        for row in run_rows:
            spent = float(offset[int(row["seed"])])
            rows.append({**row, "condition": f"{name}/{label}", SFT_TURNS: spent,
                         report.TOTAL_TURNS: row["env_turns_total"] + spent})  # fmt: skip
    return rows, heads


def _base_policy(config, setup, trainer, sft_config, keys):
    """`(params [seeds], turns [seeds])` every condition starts from: the random initial
    policy, or `config.base_steps` oracle-cloning steps from it (its own key stream)."""
    params = jax.vmap(trainer.init)(keys).params
    if not config.base_steps:
        return params, np.zeros(keys.shape[0])
    base_config = dataclasses.replace(sft_config, steps=config.base_steps)
    clone = _sft_program(setup, trainer, base_config, None, oracle=True, stream=BASE_STREAM)
    params, trace = clone(params, keys, 0.0)
    return params, np.asarray(jnp.sum(trace.env_turns, axis=1))


def _sft_program(setup, trainer, sft_config, rejection, *, oracle: bool, stream=SFT_STREAM):
    """`jit(vmap(sft))(params [seeds], keys [seeds], threshold)`: oracle cloning or
    best-of-N rejection sampling (`rejection`), from each seed's own key stream `stream`."""
    if oracle:
        source = oracle_demonstrations(setup.env, sft_config.batch_size)
    else:
        source = best_of_n(
            setup.env, trainer.graphdef, setup.rollout_config, setup.train_config, rejection
        )
    sft = make_sft(sft_config, [setup.env], [source], trainer.graphdef, setup.rollout_config)

    def seed_sft(params, key, threshold):
        return sft(params, jax.random.fold_in(key, stream), threshold)

    return jax.jit(jax.vmap(seed_sft, in_axes=(0, 0, None)))


# Report ---------------------------------------------------------------------------------


def write_report(
    rows: Sequence[Mapping[str, Any]],
    heads: Mapping[str, Mapping[str, Any]],
    workdir: str,
    *,
    title: str = "",
) -> dict[str, Any]:
    """metrics.csv, per family a curves png and a summary table; summary.md / .json and
    sweep.png (AUC and head start over N, a line per threshold)."""
    common.write_metrics(rows, workdir)
    families = list(dict.fromkeys(str(r["condition"]).split("/")[0] for r in rows))
    out: dict[str, Any] = {"families": {}}
    lines = [f"# {title or 'Rejection sampling -> SFT -> RL'}", ""]
    for family in families:
        family_rows = [r for r in rows if str(r["condition"]).startswith(family + "/")]
        summary = report.summarize(family_rows, experience=report.TOTAL_TURNS)
        at_budget = success_at_budget(family_rows, summary["settings"]["budget_env_turns"])
        report.plot_curves(
            family_rows, os.path.join(workdir, f"curves_{family}.png"),
            title=f"{family}: success vs total environment turns (SFT + RL)",
            experience=report.TOTAL_TURNS,
        )  # fmt: skip
        head = {f"{family}/{k}": v for k, v in heads[family].items()}
        family_paired = paired_table(summary, head)
        out["families"][family] = {
            "summary": summary, "heads": head, "at_budget": at_budget, "paired": family_paired
        }  # fmt: skip
        lines += [f"## {family}", "", head_table(head, at_budget), ""]
        lines += [report.markdown_table(summary), paired.families_markdown(family_paired, PAIRED)]
    plot_sweep(out["families"], os.path.join(workdir, "sweep.png"))
    lines.append(
        "Head start: held-out success (eval keys) right after SFT, before RL; IQM with "
        "stratified bootstrap 95% CIs over seeds. SFT turns: environment turns the SFT "
        "data cost (every sampled episode, accepted or not). Success at budget: training "
        "success over the last 10% of updates each run had by the common budget of total "
        "turns (the least any run reached)."
    )
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(out, f, indent=1, default=float)
    print("\n".join(lines))
    return out


# The paired family's metrics: the head start (held-out sampled success right after SFT),
# held-out sampled success after RL, and AUC at equal total turns.
HEAD_METRIC = "head_sampled_success"
PAIRED = {
    HEAD_METRIC: "head start (held-out sampled)",
    "eval_sampled_success": "held-out sampled success after RL",
    "auc": "AUC at equal total turns",
}


def paired_table(
    summary: Mapping[str, Any], heads: Mapping[str, Mapping[str, Any]], *, reps: int = 10_000
) -> dict[str, list[dict[str, Any]]]:
    """The family paired over seeds (a seed's conditions share its initial policy, and its
    base policy with `base_steps`): every condition against the first (scratch or base),
    every best-of-N condition against oracle cloning; per metric of PAIRED, Holm within
    the metric (`paired.summary_families`)."""
    conditions = {
        name: {
            "seeds": entry["seeds"],
            "per_seed": {**entry["per_seed"], HEAD_METRIC: heads[name]["eval_sampled_success"]},
        }
        for name, entry in summary["conditions"].items()
    }
    names = list(conditions)
    pairs = [(names[0], name) for name in names[1:]]
    oracle = next((n for n in names if n.endswith("/oracle")), None)
    pairs += [(oracle, n) for n in names if oracle and n.split("/")[-1].startswith("rs_")]
    return paired.summary_families(conditions, pairs, list(PAIRED), reps=reps)


def success_at_budget(
    rows: Sequence[Mapping[str, Any]],
    budget: float,
    *,
    experience: str = report.TOTAL_TURNS,
    metric: str = "success",
) -> dict[str, Any]:
    """Per condition: each seed's mean `metric` over the last 10% of its rows at or below
    `budget` of `experience` (0 for a seed with none), IQM / mean with CIs, and
    Holm-corrected comparisons."""
    per_seed: dict[str, list[float]] = {}
    for (condition, _), curve in report.seed_curves(rows).items():
        within = [r for r in curve if r[experience] <= budget]
        value = report.final_mean(within, metric, 0.1) if within else 0.0
        per_seed.setdefault(condition, []).append(value)
    return {
        "budget": budget,
        "per_seed": per_seed,
        "estimates": stats.interval_estimates(per_seed),
        "comparisons": stats.pairwise_comparisons(per_seed),
    }


def head_table(head: Mapping[str, Mapping[str, Any]], at_budget: Mapping[str, Any]) -> str:
    rows = []
    for condition, values in head.items():
        greedy = stats.interval_estimates({"g": values["eval_greedy_success"]})["g"]["iqm"]
        sampled = stats.interval_estimates({"s": values["eval_sampled_success"]})["s"]["iqm"]
        accept = values.get("accept_rate")
        rows.append([
            condition, stats.format_interval(sampled), stats.format_interval(greedy),
            f"{np.mean(values[SFT_TURNS]):,.0f}",
            "n/a" if accept is None else f"{np.mean(accept):.3f}",
            stats.format_interval(at_budget["estimates"][condition]["iqm"]),
        ])  # fmt: skip
    header = ["condition", "head start: held-out sampled success", "greedy", "SFT turns (mean)",
              "accepted fraction", "success at budget: IQM [95% CI]"]  # fmt: skip
    return "\n".join(report.markdown_rows(header, rows))


def plot_sweep(families: Mapping[str, Any], path: str) -> None:
    """Per family: AUC (IQM, 95% CI) and head start (greedy held-out success) over N, one
    line per threshold; scratch and oracle as horizontal bands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(families), figsize=(4 * len(families), 6), squeeze=False)
    for col, (family, entry) in enumerate(families.items()):
        conditions = entry["summary"]["conditions"]
        aucs = {c.split("/", 1)[1]: e["auc"]["iqm"] for c, e in conditions.items()}
        heads = {
            c.split("/", 1)[1]: stats.interval_estimates({"h": v["eval_greedy_success"]})["h"]
            for c, v in entry["heads"].items()
        }
        heads = {c: estimate["iqm"] for c, estimate in heads.items()}
        panels = (("AUC (SFT + RL turns)", aucs), ("head start (greedy held-out)", heads))
        for row, (what, values) in enumerate(panels):
            ax = axes[row][col]
            _draw_sweep(ax, values)
            ax.set_title(f"{family}: {what}")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("N (samples per task)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _draw_sweep(ax, values: Mapping[str, Mapping[str, float]]) -> None:
    lines: dict[str, list[tuple[int, Mapping[str, float]]]] = {}
    for label, estimate in values.items():
        if label in ("scratch", "base", "oracle"):
            ax.axhspan(estimate["low"], estimate["high"], alpha=0.15,
                       color="green" if label == "oracle" else "grey", label=label)  # fmt: skip
            ax.axhline(estimate["value"], color="green" if label == "oracle" else "grey", lw=1)
            continue
        n, bar = label.removeprefix("rs_n").split("_", 1)
        lines.setdefault(bar, []).append((int(n), estimate))
    for threshold, points in lines.items():
        points.sort()
        xs = [n for n, _ in points]
        values = [e["value"] for _, e in points]
        below = [e["value"] - e["low"] for _, e in points]
        above = [e["high"] - e["value"] for _, e in points]
        ax.errorbar(
            xs, values, yerr=[below, above], marker="o", capsize=3,
            label=f"best-of-N, accept {threshold}",
        )  # fmt: skip
