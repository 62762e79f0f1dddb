"""The environments a study config can name, as data: `config.env.kind` picks one.

`env_section(kind, **fields)` is the config section of an environment (`kind` plus every
field of its config dataclass; the dialogue user's persona is a nested section), and
`make_env(section)` builds the environment from it (a section without `kind` is
ToolWorld, as every config before the registry was). `horizon_env(kind, h)` is the
environment whose shortest episode is `h` turns, for the studies that sweep horizons.
Only experiments import the environment subpackages (tests/test_layout.py).
"""

from __future__ import annotations

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
    horizon: Callable[[int], Any] | None  # shortest episode in turns -> config dataclass.
    nested: Mapping[str, type] = {}  # fields that are dataclasses themselves.


KINDS: dict[str, EnvKind] = {
    "toolworld": EnvKind(toolworld.ToolWorld, toolworld.ToolWorldConfig, toolworld.horizon_config),
    "dialogue": EnvKind(
        dialogue.DialogueEnv,
        dialogue.DialogueConfig,
        dialogue.horizon_config,
        nested={"persona": dialogue.Persona},
    ),
    "mastermind": EnvKind(mastermind.Mastermind, mastermind.MastermindConfig, None),
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


def make_env(values: Mapping[str, Any]):
    """The environment of an `env` section (errors name the section's fields)."""
    values = dict(values)
    spec = kind_of(values.pop("kind", "toolworld"))
    for name, cls in spec.nested.items():
        inner = values.get(name)
        if isinstance(inner, (Mapping, ml_collections.ConfigDict)):
            values[name] = make(cls, dict(inner.items()), f"env.{name}")
    return spec.make(make(spec.config, values, "env"))


def horizon_env(kind: str, horizon: int):
    """The environment of `kind` whose shortest episode is `horizon` turns."""
    spec = kind_of(kind)
    if spec.horizon is None:
        raise ValueError(f"config.env.kind: {kind!r} has no horizon knob (horizon_config).")
    return spec.make(spec.horizon(horizon))
