"""The environments a study config can name, as data: `config.env.kind` picks one.

`env_section(kind, **fields)` is the config section of an environment (`kind` plus every
field of its config dataclass; the dialogue user's persona is a nested section), and
`make_env(section)` builds the environment from it (a section without `kind` is
ToolWorld, as every config before the registry was). `horizon_env(kind, h)` is the
environment of horizon `h` turns (ToolWorld and dialogue: the shortest episode;
Mastermind: the guess limit), for the studies that sweep horizons; `title` names an
environment in reports. Only experiments import the environment subpackages
(tests/test_layout.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import NamedTuple

import ml_collections

from experiments.studies.sections import make
from experiments.studies.sections import section
from rlagent.envs import dialogue
from rlagent.envs import mastermind
from rlagent.envs import toolworld


class EnvKind(NamedTuple):
    make: Callable[[Any], Any]  # config dataclass -> environment.
    config: type  # its config dataclass.
    horizon: Callable[[int], Any] | None  # horizon in turns -> config dataclass.
    title: Callable[[Any], str]  # config dataclass -> its name in reports.
    nested: Mapping[str, type] = {}  # fields that are dataclasses themselves.
    # The field that `slack` turns beyond the horizon set (`horizon_env`); None: no slack.
    slack_field: str | None = None
    # True: the horizon keeps the other fields of the study's env section (Mastermind: the
    # code is the section's, the horizon its turn limit); False: it sets the whole config.
    horizon_keeps_section: bool = False
    # Fields of the study's section a horizon keeps even when it sets the whole config
    # (ToolWorld's and the dialogue's task split, so that held-out evaluation works at every
    # horizon; Mastermind keeps its whole section).
    horizon_keeps: tuple[str, ...] = ()
    horizon_field: str | None = None  # the field the horizon sets (when it keeps the rest).


def _mastermind_title(config: mastermind.MastermindConfig) -> str:
    repeats = "with" if config.duplicate_numbers else "no"
    return (
        f"Mastermind (code of {config.code_length} numbers 1..{config.num_numbers}, "
        f"{repeats} repeats, {config.guess_limit} guesses)"
    )


KINDS: dict[str, EnvKind] = {
    "toolworld": EnvKind(
        toolworld.ToolWorld,
        toolworld.ToolWorldConfig,
        toolworld.horizon_config,
        title=lambda config: f"ToolWorld level {config.level}",
        slack_field="max_turns",  # max_turns = shortest plan + slack.
        horizon_keeps=("task_split",),
    ),
    "dialogue": EnvKind(
        dialogue.DialogueEnv,
        dialogue.DialogueConfig,
        dialogue.horizon_config,
        title=lambda config: f"dialogue level {config.level}",
        nested={"persona": dialogue.Persona},
        horizon_keeps=("task_split",),
    ),
    # The horizon is the guess limit (its turn limit) of the section's code (default v0's).
    "mastermind": EnvKind(
        mastermind.Mastermind,
        mastermind.MastermindConfig,
        mastermind.horizon_config,
        title=_mastermind_title,
        horizon_keeps_section=True,
        horizon_field="max_turns",
    ),
}


def kind_of(name: str) -> EnvKind:
    if name not in KINDS:
        raise ValueError(f"config.env.kind: unknown environment {name!r}; known: {sorted(KINDS)}.")
    return KINDS[name]


def env_section(kind: str, **values: Any) -> ml_collections.ConfigDict:
    """The `env` section of environment `kind`: `kind` and every field of its config."""
    spec = kind_of(kind)
    nested = {name: values.pop(name, {}) for name in spec.nested}
    fields = section(spec.config, **values)
    out = ml_collections.ConfigDict({"kind": kind})
    for name in fields:
        # The reference keeps a None default's typed placeholder (overridable by flag).
        out[name] = (
            section(spec.nested[name], **nested[name]) if name in nested else fields.get_ref(name)
        )
    return out


def study_kind(config: Mapping[str, Any]) -> str:
    """The environment a study config names (`config.env.kind`; ToolWorld without it)."""
    kind = dict(config.get("env", None) or {}).get("kind", "toolworld")
    kind_of(kind)
    return kind


def make_env(values: Mapping[str, Any]):
    """The environment of an `env` section (errors name the section's fields)."""
    return kind_of(dict(values).get("kind", "toolworld")).make(env_config(values))


def env_config(values: Mapping[str, Any]):
    """The config dataclass of an `env` section (errors name the section's fields)."""
    values = dict(values)
    spec = kind_of(values.pop("kind", "toolworld"))
    for name, cls in spec.nested.items():
        inner = values.get(name)
        if isinstance(inner, (Mapping, ml_collections.ConfigDict)):
            values[name] = make(cls, dict(inner.items()), f"env.{name}")
    return make(spec.config, values, "env")


def title(values: Mapping[str, Any]) -> str:
    """The environment of an `env` section as reports name it (e.g. 'ToolWorld level 2')."""
    return kind_of(dict(values).get("kind", "toolworld")).title(env_config(values))


def horizon_env(kind: str, horizon: int, slack: int = 0, section: Mapping[str, Any] | None = None):
    """The environment of `kind` at `horizon` turns (`horizon_section`)."""
    return make_env(horizon_section(kind, horizon, slack, section))


def horizon_section(
    kind: str, horizon: int, slack: int = 0, section: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The `env` section (a dict with `kind`) of `kind` at `horizon` turns: ToolWorld and
    dialogue, the shortest episode; Mastermind, the guess limit of the code of `section`
    (the study's env section, when it names this kind; else v0's code); the kind's
    `horizon_keeps` fields come from `section` too (the task split). `slack` > 0 sets
    the kind's `slack_field` to horizon + slack (ToolWorld's max_turns), refused for the
    others; errors name the field."""
    spec = kind_of(kind)
    if spec.horizon is None:
        raise ValueError(f"config.env.kind: {kind!r} has no horizon knob (horizon_config).")
    if slack and spec.slack_field is None:
        raise ValueError(
            f"config.slack={slack}: {kind!r} has no turns to spare beyond its horizon; set 0."
        )
    overrides = {spec.slack_field: horizon + slack} if slack else {}
    section = dict(section or {})
    if spec.horizon_keeps_section and section.get("kind") == kind:
        dropped = ("kind", spec.horizon_field)
        overrides.update({k: v for k, v in section.items() if k not in dropped})
    elif section.get("kind", "toolworld") == kind:
        overrides.update({k: section[k] for k in spec.horizon_keeps if k in section})
    return {"kind": kind, **dataclasses.asdict(spec.horizon(horizon, **overrides))}
