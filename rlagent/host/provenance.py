"""What produced a run: `provenance.json` in every run folder, and the resume check.

The file holds the resolved `config` (every field of the typed configs, seeds and reward
conditions: what a resumed run must share with the stored one) next to facts that may
differ between the calls of one run: command line, git commit, dirty flag and the changed
and untracked files (hashed when small), the same at the end of the run when the
checkout moved (`finish`), package versions, devices, wall time. `config_mismatch`
compares two resolved configs.

`provenance.json` is the record of the process that started the run, and no later process
rewrites it: each process's records carry its `segment` id (`SEGMENT`), and `write` puts
the record of any other process (a `--resume`, a `--report_only` rebuild) in
`provenance_segments.jsonl` beside it, one line per process with its commit, command, wall
time and, for a training segment, the updates it ran (`segments` reads them all, the
first included). `check_commit` refuses to resume a run under another commit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

import jax
from absl import logging

from rlagent import parallel

FILENAME = "provenance.json"
# This process's id in the records it writes: the one process that may rewrite a record.
SEGMENT = uuid.uuid4().hex
# Set to 1 (the launchers' --resume_across_commits) to resume a run under another commit.
ACROSS_COMMITS_ENV = "RLAGENT_RESUME_ACROSS_COMMITS"
# The records of the processes after the first (resumes, rebuilds): one JSON object a line.
SEGMENTS = "provenance_segments.jsonl"
# Untracked files up to this size are hashed in the provenance (configs, small scripts).
HASH_LIMIT = 1 << 16
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
    return {
        "config": dict(config),
        **extra,
        "segment": SEGMENT,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": [sys.executable, *sys.argv],
        "git": git_state(),
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "devices": [str(device) for device in jax.devices()],  # every process's
        "processes": jax.process_count(),
        "cpu": cpu_model(),
    }


def cpu_model() -> dict[str, Any]:
    """The CPU's model name and a hash of its feature flags (`/proc/cpuinfo`; None where
    absent): XLA compiles for the host's instruction set, so two machines of one kind can
    round differently, and results that match only within intervals across machines can
    then be told apart from a code change (docs/development.md: the main experiment's
    defaults give one table on an Intel Xeon and another on an AMD EPYC). `simd` lists
    the vector extensions XLA can target (`avx*`, `fma*`, `amx*`)."""
    try:
        with open("/proc/cpuinfo") as f:
            info = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    except OSError:
        return {"model": platform.processor() or None, "flags_sha256": None, "simd": None}
    info = {key.strip(): value.strip() for key, value in info.items()}
    flags = info.get("flags")
    digest = hashlib.sha256(flags.encode()).hexdigest()[:16] if flags else None
    simd = sorted(f for f in (flags or "").split() if f.startswith(SIMD_PREFIXES))
    return {
        "model": info.get("model name"),
        "flags_sha256": digest,
        "simd": simd,
        "cores": os.cpu_count(),
    }


SIMD_PREFIXES = ("avx", "fma", "amx")


def read(folder: str) -> dict[str, Any] | None:
    """`<folder>/provenance.json` (None when absent); a file that is no JSON object is
    refused naming it (ValueError)."""
    path = os.path.join(folder, FILENAME)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        try:
            record = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON ({error}); the folder is damaged") from None
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        raise ValueError(f"{path} holds no resolved config; the folder is damaged")
    return record


def write(folder: str, provenance: Mapping[str, Any]) -> None:
    """Writes this process's record: `<folder>/provenance.json` when the folder has none or
    holds this process's own (the same `segment`), else its line of `SEGMENTS` (replaced
    when this segment wrote one before), so a resume or a rebuild never rewrites the
    record of the process that started the run. Atomic: a kill never leaves half a file.
    In a multi-process run only process 0 writes (`parallel.is_primary`)."""
    if not parallel.is_primary():
        return
    stored = read(folder)
    if stored is None or stored.get("segment") == SEGMENT:
        _atomic_write(os.path.join(folder, FILENAME), json.dumps(provenance, indent=2))
        return
    path = os.path.join(folder, SEGMENTS)
    lines = [record for record in _read_lines(path) if record.get("segment") != SEGMENT]
    lines.append({**provenance, "segment": SEGMENT})
    _atomic_write(path, "".join(json.dumps(record) + "\n" for record in lines))


def segments(folder: str) -> list[dict[str, Any]]:
    """Every process's record of the run in `folder`, in order: `provenance.json` first,
    then the lines of `SEGMENTS` ([] when the folder has no provenance)."""
    first = read(folder)
    return [] if first is None else [first, *_read_lines(os.path.join(folder, SEGMENTS))]


def own(folder: str, config: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """This process's record of the run in `folder`: the stored one when this process
    wrote it, else a new one (`collect(config, **extra)`) for `write` to add beside."""
    stored = read(folder)
    if stored is not None and stored.get("segment") == SEGMENT:
        return stored
    return collect(config, **extra)


def check_commit(folder: str) -> str | None:
    """Why `folder`'s run cannot be resumed by this checkout (None when it can): its
    newest segment ran at another commit, so its rows and the new ones would come from
    different code. Allowed when `ACROSS_COMMITS_ENV` is 1; every segment is then recorded
    with its own commit (`write`)."""
    records = segments(folder)
    if not records or os.environ.get(ACROSS_COMMITS_ENV) == "1":
        return None
    before = (records[-1].get("git_end") or records[-1].get("git") or {}).get("commit")
    now = git_state().get("commit")
    if before is None or now is None or before == now:
        return None
    return (
        f"its run went on at commit {before[:12]} and this checkout is at {now[:12]}, so its "
        f"rows would mix the code of two commits; check out {before[:12]}, pass --overwrite, "
        f"or pass --resume_across_commits to go on and record each segment's commit in "
        f"{SEGMENTS}"
    )


def _read_lines(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        try:
            return [json.loads(line) for line in f if line.strip()]
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path} is not valid JSON lines ({error}); the folder is damaged"
            ) from None


def _atomic_write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
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


def _git(root: str, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
    ).stdout


def git_state(root: str | None = None) -> dict[str, Any]:
    """`{commit, dirty, modified, untracked}` of the checkout this package runs from.

    Untracked files that git does not ignore make the tree dirty too (a config written
    after the last commit changes what the commit reproduces); they are listed with the
    sha256 of their bytes when at most `HASH_LIMIT` bytes (configs, small scripts). Outside
    a git checkout (an installed package) every field is None. `root`: the checkout
    (default: the one holding this package).
    """
    if root is None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        commit = _git(root, "rev-parse", "HEAD").strip()
        status = _git(root, "status", "--porcelain", "--untracked-files=all")
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None, "modified": None, "untracked": None}
    lines = [line for line in status.splitlines() if line.strip()]
    modified = sorted(line[3:] for line in lines if not line.startswith("??"))
    untracked = [_file_record(root, line[3:]) for line in lines if line.startswith("??")]
    return {
        "commit": commit,
        "dirty": bool(lines),
        "modified": modified,
        "untracked": sorted(untracked, key=lambda record: record["path"]),
    }


def finish(record: Mapping[str, Any], root: str | None = None) -> dict[str, Any]:
    """`record` (from `collect`) with the checkout's state at the end of the run.

    When the commit or the changed files moved while the run was going, the end state is
    kept as `git_end` beside the start's `git` and a warning names both commits: the
    results then mix code of two states.
    """
    start, end = record.get("git", {}), git_state(root)
    out = dict(record)
    if any(start.get(key) != end.get(key) for key in ("commit", "modified", "untracked")):
        out["git_end"] = end
        logging.warning(
            "the checkout changed while this run was going: commit %s (dirty=%s) at the "
            "start, %s (dirty=%s) at the end; provenance.json records both",
            start.get("commit"), start.get("dirty"), end.get("commit"), end.get("dirty"),
        )  # fmt: skip
    return out


def file_sha256(path: str) -> str:
    """The sha256 of a file's bytes (hex): how a record names the exact file it read."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _file_record(root: str, path: str) -> dict[str, Any]:
    full = os.path.join(root, path)
    record: dict[str, Any] = {"path": path}
    try:
        if os.path.isfile(full) and os.path.getsize(full) <= HASH_LIMIT:
            record["sha256"] = file_sha256(full)
    except OSError:
        pass  # removed while listing
    return record


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
