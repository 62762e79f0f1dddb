"""What produced a run: `provenance.json` in every run folder, and the resume check.

The file holds the resolved `config` (every field of the typed configs, seeds and reward
conditions: what a resumed run must share with the stored one) next to facts that may
differ between the calls of one run: command line, git commit and dirty flag, package
versions, devices, wall time. `config_mismatch` compares two resolved configs.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

import jax

FILENAME = "provenance.json"
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "chex", "numpy", "ml_collections")


def resolved(**sections: Any) -> dict[str, Any]:
    """A JSON-ready dict of config sections: dataclasses become dicts of every field."""
    out = {}
    for name, value in sections.items():
        if dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        out[name] = value
    return json.loads(json.dumps(out, default=repr))  # tuples -> lists, as read back.


def collect(config: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """Provenance of this process: `config` (from `resolved`) plus the environment."""
    commit, dirty = _git_state()
    return {
        "config": dict(config),
        **extra,
        "command": [sys.executable, *sys.argv],
        "git": {"commit": commit, "dirty": dirty},
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "devices": [str(device) for device in jax.devices()],
    }


def read(folder: str) -> dict[str, Any] | None:
    path = os.path.join(folder, FILENAME)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def write(folder: str, provenance: Mapping[str, Any]) -> None:
    """Writes `<folder>/provenance.json` atomically (a kill never leaves half a file)."""
    path = os.path.join(folder, FILENAME)
    with open(path + ".tmp", "w") as f:
        json.dump(provenance, f, indent=2)
    os.replace(path + ".tmp", path)


def config_mismatch(
    stored: Mapping[str, Any], current: Mapping[str, Any], may_change: Iterable[str] = ()
) -> list[str]:
    """`field: stored -> current` for every dotted field that differs, except `may_change`."""
    old, new = _flatten(stored), _flatten(current)
    allowed = set(may_change)
    return [
        f"{key}: {old.get(key, '<absent>')!r} -> {new.get(key, '<absent>')!r}"
        for key in sorted(set(old) | set(new))
        if key not in allowed and old.get(key, "<absent>") != new.get(key, "<absent>")
    ]


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _git_state() -> tuple[str | None, bool | None]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None  # not a git checkout (an installed package).
    return commit, bool(status.strip())


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
