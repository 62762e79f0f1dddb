"""Config sections as data: a section holds every field of a typed config dataclass.

`section(cls, **values)` makes one (any field can be overridden from the command line);
`make(cls, values, name)` builds the dataclass back, naming the section of an unknown field
or of a value the dataclass refuses.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

import ml_collections
from ml_collections import config_dict


def section(cls: type, **values: Any) -> ml_collections.ConfigDict:
    """A config section holding every field of dataclass `cls`: its default, or `values`.

    Every field exists, so any of them can be overridden from the command line; a field
    whose default is None is a typed placeholder (`--config.train.kl_target=0.02` works).
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"Unknown {cls.__name__} fields {unknown}; known: {sorted(fields)}.")
    hints = typing.get_type_hints(cls)
    out = ml_collections.ConfigDict()
    for name, field in fields.items():
        value = values.get(name, field.default)
        if value is None:
            types = [t for t in typing.get_args(hints[name]) if t is not type(None)]
            value = config_dict.placeholder(typing.get_origin(types[0]) or types[0])
        out[name] = value
    return out


def make(cls, values: Mapping[str, Any], section: str):
    """`cls(**values)`; an unknown field, or a value the dataclass refuses, is an error
    that names the section (`config.<section>: ...`)."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"Unknown {section} config fields {unknown}; known: {sorted(known)}.")
    try:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
    except ValueError as error:
        if f"config.{section}" in str(error):
            raise
        raise ValueError(f"config.{section}: {error}") from None
