"""What the studies share: configs as data, runs, their training and report.

An ml_collections config (experiments/configs/*.py, sections made by `section`) becomes
typed configs (`build`: env, model, rollout, train, and the extras' prm, probe, eval); a
study is a list of `Run`s (`prm_runs`: one per process reward model) trained and
reported by `run_and_report` into one workdir (`rlagent.host.workdir` refuses, clears
or resumes it). The policies and checkpoints the Monte-Carlo studies
share (`env_policy`, `lm_setup`, `checkpoint`) and `estimator_config` live here too.
Launchers in experiments/ only parse flags and call a study, so a notebook can run the
same study.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import os
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import jax
import ml_collections
from flax import nnx

from experiments.studies.envs import KINDS as ENV_KINDS
from experiments.studies.envs import make_env
from experiments.studies.sections import make
from experiments.studies.sections import section
from rlagent import parallel
from rlagent.analysis import report
from rlagent.credit import mc
from rlagent.credit.probe import ProbeConfig
from rlagent.envs.base import Environment
from rlagent.host import loop
from rlagent.host import provenance
from rlagent.host.extras import check_extras
from rlagent.host.extras import trainer_extras
from rlagent.host.workdir import prepare_workdir
from rlagent.host.workdir import resumable_fields
from rlagent.host.writers import MetricWriter
from rlagent.models import Policy
from rlagent.models import PolicyConfig
from rlagent.prm.config import PRMConfig
from rlagent.rollout import RolloutConfig
from rlagent.train.config import LEARNED_REWARDS
from rlagent.train.config import REWARDS
from rlagent.train.config import TrainConfig
from rlagent.train.evaluation import EvalConfig
from rlagent.train.ppo import make_train

# The counts of a training study's config: seeds per condition, the first seed, updates per
# jitted call.
RUN_COUNTS = {"seeds": 1, "first_seed": None, "chunk_size": 1}


class Setup(NamedTuple):
    env: Environment
    policy_config: PolicyConfig
    rollout_config: RolloutConfig
    train_config: TrainConfig
    prm_config: PRMConfig = PRMConfig()  # the `prm` section: a process reward model.
    probe_config: ProbeConfig = ProbeConfig()  # `probe`: credit accuracy in training.
    eval_config: EvalConfig = EvalConfig()  # `eval`: held-out evaluation.

    def extras(self) -> dict[str, Any]:
        """`make_train(**setup.extras())`: the PRM and credit probe of this setup."""
        return trainer_extras(
            self.train_config, self.env, self.rollout_config, prm=self.prm_config,
            probe=self.probe_config,
        )  # fmt: skip


class Run(NamedTuple):
    name: str  # folder under the workdir.
    conditions: tuple[str, ...]  # labels in tables and plots, one per reward form trained.
    config: ml_collections.ConfigDict  # the full experiment config of this run.


def build(config: ml_collections.ConfigDict) -> Setup:
    """Typed configs from the `env`, `model`, `rollout` and `train` sections, and the
    extras' `prm`, `probe` and `eval` sections (defaults where a section is absent)."""
    env = make_env(config.env)
    setup = Setup(
        env=env,
        policy_config=policy_config(env, config.model),
        rollout_config=make(RolloutConfig, config.rollout, "rollout"),
        train_config=TrainConfig.from_mapping(config.train),
        prm_config=PRMConfig.from_mapping(config.get("prm", {})),
        probe_config=ProbeConfig.from_mapping(config.get("probe", {})),
        eval_config=EvalConfig.from_mapping(config.get("eval", {})),
    )
    check_extras(setup.train_config, setup.prm_config, setup.probe_config)  # across sections
    return setup


def policy_config(env: Environment, model: Mapping[str, Any]) -> PolicyConfig:
    """The `model` section as a PolicyConfig over `env`'s vocabulary (absent or None:
    the env's; another size is refused naming the field)."""
    model = dict(model)
    vocab_size = env.token_spec.vocab_size
    if model.get("vocab_size") is None:
        model["vocab_size"] = vocab_size
    elif model["vocab_size"] != vocab_size:
        raise ValueError(
            f"config.model.vocab_size={model['vocab_size']}, but {type(env).__name__} has a "
            f"vocabulary of {vocab_size} tokens; leave it unset to use the env's."
        )
    return make(PolicyConfig, model, "model")


class PRMGroup(NamedTuple):
    """Conditions that share one process reward model (and so one compiled program)."""

    kind: str  # rlagent.prm.PRMS ('none': no PRM).
    noise: float  # flip probability of the noisy oracle (0 otherwise).
    labels: tuple[str, ...]  # the conditions as given: `form` or `form/prm=<kind>[@<eps>]`.

    @property
    def name(self) -> str:
        """`prm_<kind>[_<eps>]` (`prm_none` without a PRM)."""
        return f"prm_{self.kind}" + (f"_{self.noise:g}" if self.noise else "")

    def prm_fields(self) -> dict[str, Any]:
        """The `prm` section's fields that select this group's PRM (`PRMConfig`)."""
        return {"kind": self.kind, "noise": self.noise}

    def with_prm(self, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
        """A copy of experiment `config` whose `prm` section (defaults if absent) selects
        this group's PRM."""
        out = ml_collections.ConfigDict(config.to_dict())
        if "prm" not in out:
            out.prm = section(PRMConfig)
        out.prm.update(self.prm_fields())
        return out


def prm_groups(text: str, field: str = "conditions") -> list[PRMGroup]:
    """Groups the comma-separated conditions of `config.<field>` by process reward model.

    A condition is `form` (a reward form of `rlagent.train.config.REWARDS`, no PRM),
    `form/prm=<kind>` or `form/prm=noisy_oracle@<eps>` (flip probability eps). The reward
    forms of one PRM kind (and noise) differ only in their weights and share a program.
    """
    grouped: dict[tuple[str, float], list[str]] = {}
    for label in names(text, field):
        form, _, spec = label.partition("/")
        if form not in REWARDS:
            raise ValueError(f"config.{field}: unknown reward form {form!r}; known: {REWARDS}.")
        kind, noise = "none", 0.0
        if spec:
            key, _, value = spec.partition("=")
            kind, _, eps = value.partition("@")
            if key != "prm" or not kind:
                raise ValueError(
                    f"config.{field}: {label!r} must be 'form', 'form/prm=<kind>' or "
                    "'form/prm=noisy_oracle@<eps>'."
                )
            if eps and kind != "noisy_oracle":
                raise ValueError(f"config.{field}: {label!r}: only noisy_oracle takes @<eps>.")
            try:
                noise = float(eps or 0.0)
            except ValueError:
                message = f"config.{field}: {label!r}: eps {eps!r} is no number."
                raise ValueError(message) from None
            try:  # an unknown kind or a noise out of range, before anything is written
                PRMConfig(kind=kind, noise=noise)
            except ValueError as error:
                raise ValueError(f"config.{field}: {label!r}: {error}") from None
        if form in LEARNED_REWARDS and kind == "none":
            raise ValueError(
                f"config.{field}: {label!r} reads a PRM's scores; name one as '{form}/prm=<kind>'."
            )
        group = grouped.setdefault((kind, noise), [])
        twin = [other for other in group if other.partition("/")[0] == form]
        if twin:  # e.g. noisy_oracle@0.1 and @0.10: one PRM, the same form trained twice
            raise ValueError(f"config.{field}: {twin[0]!r} and {label!r} are one condition.")
        group.append(label)
    return [PRMGroup(kind, noise, tuple(labels)) for (kind, noise), labels in grouped.items()]


def prm_runs(config: ml_collections.ConfigDict) -> list[Run]:
    """Runs of `config.conditions` (see `prm_groups`), one per process reward model.

    Each PRM kind is a run `prm_<kind>[_<eps>]` whose config sets `prm.kind` (and
    `prm.noise`). Labels are the condition names as given.
    """
    return [
        Run(group.name, group.labels, group.with_prm(config))
        for group in prm_groups(config.conditions)
    ]


def run_and_report(
    runs: Sequence[Run],
    config: ml_collections.ConfigDict,
    *,
    workdir: str,
    resume: bool = False,
    overwrite: bool = False,
    title: str = "",
    mesh: jax.sharding.Mesh | None = None,
    progress: bool = True,
    experience: str = "env_turns_total",
    initial_params: Any = None,
    initial_params_config: Any = None,
    write_report: Callable[[list[dict[str, Any]], str], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Trains every run (seeds in parallel), then writes metrics.csv, curves.png, summary.*.

    A workdir that holds anything is refused unless `resume` (continue every run with the
    stored config, see `rlagent.host.loop`) or `overwrite` (start clean): `prepare`. A
    run that diverges is reported (marked in the summary) and `loop.Diverged` is raised
    after the report. `experience` is the x-axis of curves and budgets
    (`report.summarize`); with `report.TOTAL_TURNS` the rows gain it
    (`report.with_total_turns`: labels' turns count). `initial_params` /
    `initial_params_config`: each seed's starting policy, see `loop.run`.
    `write_report(rows, workdir) -> summary` replaces `write_training_report` (a study's
    own report; metrics.csv is written either way).
    """
    setups = check_runs(runs, config)  # config errors before anything is written.
    seeds = list(range(config.first_seed, config.first_seed + config.seeds))
    resuming = prepare(workdir, config, resume=resume, overwrite=overwrite)
    start = time.time()
    record = start_record(workdir, resuming, config.to_dict(), runs=[run.name for run in runs])
    rows, diverged = [], []
    for run, setup in zip(runs, setups, strict=True):
        conditions = [label.split("/")[0] for label in run.conditions]
        try:
            run_rows = loop.run(
                setup.train_config, setup.env, setup.policy_config, setup.rollout_config,
                prm=setup.prm_config, probe=setup.probe_config, evaluation=setup.eval_config,
                seeds=seeds, conditions=conditions, workdir=os.path.join(workdir, run.name),
                chunk_size=config.chunk_size, resume=resume, overwrite=overwrite, mesh=mesh,
                progress=progress, initial_params=initial_params,
                initial_params_config=initial_params_config,
            )  # fmt: skip
        except loop.Diverged as error:
            run_rows = error.rows
            diverged.append(f"{run.name}: {error}")
        labels = dict(zip(conditions, run.conditions, strict=True))
        rows += [{**row, "condition": labels[row["condition"]]} for row in run_rows]

    def write() -> dict[str, Any]:
        if write_report is None:
            return write_training_report(rows, workdir, title=title, experience=experience)
        write_metrics(rows, workdir)
        return write_report(rows, workdir)

    # One writer: process 0 of a multi-process run writes the report, every process
    # returns its summary.
    summary = parallel.primary_decides(write)
    provenance.write(
        workdir, provenance.finish({**record, "wall_s": round(time.time() - start, 1)})
    )
    if diverged:
        raise loop.Diverged(" ".join(diverged), rows)
    return summary


def check_runs(runs: Sequence[Run], config: ml_collections.ConfigDict) -> list[Setup]:
    """The setups of `runs` (`build`), after refusing what `loop.run` would refuse only
    once the study's folder is written: counts (`RUN_COUNTS`) that are no integers or
    too small, an unknown or unpayable reward form, a learned form without a PRM, extras
    that do not fit the run (errors name the field)."""
    check_counts(config, RUN_COUNTS)
    setups = [build(run.config) for run in runs]
    seeds = list(range(config.first_seed, config.first_seed + config.seeds))
    for run, setup in zip(runs, setups, strict=True):
        conditions = [label.split("/")[0] for label in run.conditions]
        loop.check_arguments(
            setup.train_config, setup.env, setup.rollout_config, seeds, conditions,
            prm=setup.prm_config, probe=setup.probe_config, chunk_size=config.chunk_size,
            field="config.conditions",
        )  # fmt: skip
    return setups


def check_counts(
    config: Mapping[str, Any], minimums: Mapping[str, int | None], where: str = "config"
) -> None:
    """Refuses a field of `config` named in `minimums` that is not an integer at least its
    minimum (None: any integer): `config.seeds must be >= 1, got 0.` (2.5 seeds would
    truncate, and a flag parser does not guard a notebook's ConfigDict)."""
    for name, minimum in minimums.items():
        value = config[name]
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise ValueError(f"{where}.{name} must be an integer, got {value!r}.")
        if minimum is not None and value < minimum:
            raise ValueError(f"{where}.{name} must be >= {minimum}, got {value}.")


def write_training_report(
    rows: Sequence[Mapping[str, Any]],
    workdir: str,
    *,
    title: str = "",
    experience: str = "env_turns_total",
) -> dict[str, Any]:
    """metrics.csv (every run's rows), curves.png, profiles.png, summary.md and
    summary.json of training rows (`report.summarize`); prints the table."""
    if experience == report.TOTAL_TURNS:
        rows = report.with_total_turns(rows)
    write_metrics(rows, workdir)
    report.plot_curves(
        rows, os.path.join(workdir, "curves.png"), title=title, experience=experience
    )
    summary = report.summarize(rows, experience=experience)
    report.plot_profiles(summary, os.path.join(workdir, "profiles.png"))
    preface = f"# {title}\n\n" if title else ""
    report.write_summary(
        summary,
        os.path.join(workdir, "summary.md"),
        os.path.join(workdir, "summary.json"),
        preface=preface,
    )
    print(preface + report.markdown_table(summary))
    return summary


def write_metrics(rows: Sequence[Mapping[str, Any]], workdir: str) -> None:
    """metrics.csv of the workdir: every run's rows (replacing an earlier file)."""
    merged = MetricWriter(workdir, tensorboard=False)
    merged.clear()
    merged.write(rows)


def prepare(
    workdir: str, config: ml_collections.ConfigDict, *, resume: bool = False,
    overwrite: bool = False,
) -> bool:  # fmt: skip
    """`rlagent.host.workdir.prepare_workdir` for a study's workdir: a resumed one must
    hold the same `config` (`provenance.json`), except `chunk_size` (how often the host
    writes, no result) and `RESUMABLE_FIELDS` with a constant learning rate."""
    schedule = config.get("train", {}).get("lr_schedule", "constant")
    may_change, note = resumable_fields(schedule, extra=("chunk_size",))
    return prepare_workdir(
        workdir, resume=resume, overwrite=overwrite,
        config=provenance.resolved(**config.to_dict()), may_change=may_change, note=note,
    )  # fmt: skip


def start_record(workdir: str, resuming: bool, config: Mapping[str, Any], **extra: Any) -> dict:
    """The provenance of this process (`provenance.collect(config, **extra)`), written to
    `workdir` now unless `resuming`: a resumed run keeps the record of the run it continues
    until it finishes (when `provenance.finish` of this record replaces it), so a resume
    that a later check refuses (a damaged run folder, say) changes nothing on disk."""
    record = provenance.collect(config, **extra)
    if not resuming:
        provenance.write(workdir, record)
    return record


def unknown_override(config: ml_collections.ConfigDict, argv: Sequence[str]) -> str | None:
    """Names the first `--config.a.b=...` of `argv` that is no field of `config`, if any."""
    for arg in argv:
        if not arg.startswith("--config."):
            continue
        path = arg.removeprefix("--config.").split("=", 1)[0].split(".")
        node = config
        for depth, name in enumerate(path):
            if not isinstance(node, ml_collections.ConfigDict) or name not in node:
                where = ".".join(["config", *path[:depth]])
                known = (
                    ", ".join(sorted(node)) if isinstance(node, ml_collections.ConfigDict) else ""
                )
                hint = ""
                if where == "config.env" and name == "kind":  # ToolWorld's section has none
                    hint = (
                        " The environment is the config file's: name it after the file "
                        "where the config takes one (--config=experiments/configs/"
                        "sparse_vs_dense.py:<kind>), or pass a --config whose env section "
                        "is experiments.studies.envs.env_section('<kind>') (kinds: "
                        f"{', '.join(ENV_KINDS)})."
                    )
                return f"Unknown config field {where}.{name}; {where} has: {known}.{hint}"
            node = node[name]
    return None


def names(text: str, field: str = "conditions", what: str = "reward form") -> list[str]:
    """The comma-separated names of config field `field` (e.g. `conditions`, `horizons`)."""
    parsed = [name.strip() for name in str(text).split(",") if name.strip()]
    if not parsed:
        raise ValueError(f"config.{field} names no {what}.")
    refuse_repeats(parsed, field, what)
    return parsed


def refuse_repeats(values: Sequence[Any], field: str, what: str) -> None:
    """Refuses a value that `config.<field>` gives more than once (values compared as
    parsed: '3,03' or '1,1.0' are repeats too); a repeat would train and count the same
    runs twice."""
    repeated = sorted({value for value in values if values.count(value) > 1})
    if repeated:
        raise ValueError(f"config.{field} names {what} {repeated} more than once.")


def distinct(entries: Sequence[tuple[str, Any]], field: str, what: str) -> None:
    """Refuses two entries of `config.<field>` that mean the same: `(given, meaning)`
    pairs, e.g. `gae_token@0.9` and `gae_token@0.90`, or `h3` and `h03` (a repeat spelt
    differently would train and count the same runs twice)."""
    seen: dict[str, str] = {}
    for given, meaning in entries:
        key = repr(meaning)
        if key in seen:
            raise ValueError(
                f"config.{field}: {seen[key]!r} and {given!r} name the same {what}; give it once."
            )
        seen[key] = given


def ints(text: str, field: str, what: str, minimum: int | None = None) -> list[int]:
    """The comma-separated integers of config field `field`, each at least `minimum` when
    given (errors name the field)."""
    values = _numbers(text, field, what, int, "an integer")
    if minimum is not None and min(values) < minimum:
        raise ValueError(f"config.{field}: {what} {min(values)} is below {minimum}.")
    return values


def floats(text: str, field: str, what: str) -> list[float]:
    """The comma-separated numbers of config field `field` (errors name the field)."""
    return _numbers(text, field, what, float, "a number")


def _numbers(text: str, field: str, what: str, cast: type, kind: str) -> list:
    out = []
    for name in names(text, field, what):
        try:
            out.append(cast(name))
        except ValueError:
            raise ValueError(f"config.{field}: {name!r} is not {kind} {what}.") from None
    refuse_repeats(out, field, what)
    return out


def estimator_fields(spec: str) -> dict[str, Any]:
    """The TrainConfig fields of estimator spec `name[@lam][+field=value]...`, e.g.
    `gae_token@0.9` or `tree_grpo+tree_branches=4+tree_branch_at=surprisal` (a field's
    value is read as the type of its TrainConfig default; fields whose default is no bool,
    int, float or str, such as tuples of weights, are refused)."""
    head, *options = spec.split("+")
    name, _, lam = head.partition("@")
    fields: dict[str, Any] = {"estimator": name}
    if lam:
        try:
            fields["lam"] = float(lam)
        except ValueError:
            raise ValueError(f"lam {lam!r} (after @) is no number.") from None
    defaults = {field.name: field.default for field in dataclasses.fields(TrainConfig)}
    for option in options:
        field, equals, value = option.partition("=")
        if not equals or field not in defaults or field in fields:
            raise ValueError(
                f"{option!r} (after +) is no 'field=value' of another TrainConfig field."
            )
        kind = type(defaults[field])
        if kind not in (bool, int, float, str):  # a tuple or an optional field
            raise ValueError(
                f"{option!r}: {field} takes no value after +; set config.train.{field}."
            )
        if kind is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{option!r}: {value!r} is no bool (true / false).")
            fields[field] = value.lower() in ("true", "1")
            continue
        try:
            fields[field] = kind(value)
        except ValueError:
            raise ValueError(f"{option!r}: {value!r} is no {kind.__name__}.") from None
    return fields


def estimator_config(base: TrainConfig, spec: str) -> TrainConfig:
    """`name[@lam][+field=value]...` (`estimator_fields`) -> the TrainConfig of that
    estimator."""
    return dataclasses.replace(base, **estimator_fields(spec))


def plain_forms(text: str, field: str = "conditions") -> list[str]:
    """The reward forms of `config.<field>` for a study that trains one PRM (`config.prm`)
    for every condition: a `form/prm=<kind>` label is refused, since its PRM would be
    silently dropped (`prm_groups` reads such labels, for the studies that train them)."""
    labels = names(text, field)
    specs = [label for label in labels if "/" in label]
    if specs:
        raise ValueError(
            f"config.{field}: {specs[0]!r}: this study trains the one PRM of config.prm "
            "(e.g. --config.prm.kind=completion); 'form/prm=<kind>' conditions are "
            "experiments.process_rewards'."
        )
    return labels


# Policies of the Monte-Carlo studies (credit accuracy, label quality) ---------------------


def env_policy(env: Environment, name: str) -> mc.EnvPolicy:
    """The environment-level policy called `name`: `random` (uniform over the grammar),
    `prover_<eps>` (per turn the oracle with probability eps, else random) or `oracle`."""
    if name == "random":
        return mc.uniform_random(env)
    if name == "oracle":
        return mc.oracle(env)
    if name.startswith("prover_"):
        epsilon = float(name.removeprefix("prover_"))
        return mc.mixture(mc.uniform_random(env), mc.oracle(env), epsilon)
    raise ValueError(
        f"Unknown policy {name!r}: 'random', 'prover_<eps>', 'oracle' or 'ppo_<updates>'."
    )


class LMSetup(NamedTuple):
    """The policy LM of the `ppo_<k>` policies: its configs and graph."""

    policy_config: PolicyConfig
    rollout_config: RolloutConfig
    graphdef: Any


@functools.cache
def _lm_setup_cached(policy_config: PolicyConfig, rollout: tuple) -> LMSetup:
    rollout_config = RolloutConfig(**dict(rollout))
    abstract = nnx.eval_shape(lambda: Policy(policy_config, rngs=nnx.Rngs(0)))
    return LMSetup(policy_config, rollout_config, nnx.split(abstract)[0])


def lm_setup(config, env: Environment) -> LMSetup:
    """Policy and rollout configs of the LM policies over `env`'s vocabulary (one graph
    for every horizon)."""
    return _lm_setup_cached(policy_config(env, config.model), tuple(sorted(config.rollout.items())))


def check_lm(config, env: Environment, where: str = "config") -> None:
    """Refuses, naming the section under `where`, a `model`, `rollout` or `ppo` section of
    the `ppo_<k>` policies (`lm_setup`, `checkpoint`) that would fail once they are built,
    i.e. after the study has started writing."""
    checks = (
        ("rollout", lambda: make(RolloutConfig, config.rollout, "rollout")),
        ("model", lambda: lm_setup(config, env)),
        ("ppo", lambda: TrainConfig.from_mapping({**config.ppo, "num_updates": 1})),
    )
    for name, check in checks:
        try:
            check()
        except ValueError as error:
            raise ValueError(f"{where}.{name}: {error}") from None


def checkpoint(env: Environment, setup: LMSetup, config, num_updates: int):
    """Parameters after `num_updates` PPO updates on `env` (0: the initial policy).

    `config.ppo` holds the TrainConfig fields of the run (no PRM, no probe),
    `config.first_seed` its seed.
    """
    train_config = TrainConfig.from_mapping({**config.ppo, "num_updates": max(num_updates, 1)})
    trainer = make_train(
        train_config,
        env,
        setup.policy_config,
        setup.rollout_config,
        **trainer_extras(train_config, env, setup.rollout_config),
    )
    state = trainer.init(jax.random.key(config.first_seed))
    if num_updates:
        state, _ = jax.jit(trainer.train)(jax.random.key(config.first_seed))
    return state.params
