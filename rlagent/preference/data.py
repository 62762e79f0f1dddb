"""On-disk multi-turn preference data: one JSON record per line (JSONL), validated.

Why JSONL and not Parquet: pairs arrive one at a time (an online pipeline appends each
as its judge ranks it, a crash loses at most the line being written), a record is a
small nested object (turns of variable count and length) that JSON holds without a
schema of list columns, an error can name the line a person opens in any editor, and the
format needs no dependency beyond the standard library. Parquet's column compression
would matter at millions of pairs; at that size convert, the loader's checks stay.

A record (format `FORMAT`), every field required unless marked optional:

    {"format": "rlagent.preference/1",
     "id": "run3/update17/group2",                        # unique within a file
     "env": {"name": "ToolWorld", "config": {...},        # the environment and its config
             "task_key": [k0, k1]},                       # reset key (uint32 x 2): the task
     "dims": {"turns": S, "obs_len": O, "turn_len": L, "markers": K,
              "vocab": V, "pad": PAD, "end": END},        # the token conventions
     "policy": {"name": "prover_0.5", "version": "..."},  # what produced the turns
     "judge": {"name": "outcome", "chosen_score": 1.0, "rejected_score": 0.0},
     "prefix": [turn, ...],                                # turns both sides share
     "chosen":   {"turns": [turn, ...], "success": true},   # the continuation after it
     "rejected": {"turns": [turn, ...], "success": false}}

    turn = {"obs": [O ints], "progress": [K ints], "action": [1..L ints]}

Which tokens belong to the policy: exactly the `action` lists (each ends with END and
holds no PAD); `obs` (a user message or tool return) and `progress` are the
environment's and never enter a loss. A side's episode is `prefix + side.turns` (at
most S turns; at least one turn after the prefix). The judge's scores must order the
sides (`chosen_score > rejected_score`; a tie is no preference and is refused).

`write_records` validates every record before writing it; `load_records` reads a file
and raises `PreferenceDataError` naming the file, the line and the field of the first
malformed record: nothing is dropped, padded or cut. A record that is well formed but
does not fit an environment (other dims, or observations the environment's replay does
not show) is refused by `rlagent.preference.pairs.records_to_pairs`, also by line.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

FORMAT = "rlagent.preference/1"
DIMS = ("turns", "obs_len", "turn_len", "markers", "vocab", "pad", "end")
_UINT32 = 2**32


class PreferenceDataError(ValueError):
    """A malformed preference record: `path:line: field: what is wrong`."""


@dataclasses.dataclass(frozen=True)
class Turn:
    obs: tuple[int, ...]  # [O] the environment's tokens read before the turn.
    progress: tuple[int, ...]  # [K] task-progress markers shown with them.
    action: tuple[int, ...]  # the policy's tokens, END last, no PAD.


@dataclasses.dataclass(frozen=True)
class Side:
    turns: tuple[Turn, ...]  # the continuation after the shared prefix (>= 1 turn).
    success: bool  # the environment's episode success.


@dataclasses.dataclass(frozen=True)
class PreferenceRecord:
    """One validated record; `source` is `(path, line)` when loaded from a file."""

    id: str
    env: dict[str, Any]  # name, config, task_key.
    dims: dict[str, int]
    policy: dict[str, Any]  # name, version.
    judge: dict[str, Any]  # name, chosen_score, rejected_score.
    prefix: tuple[Turn, ...]
    chosen: Side
    rejected: Side
    source: tuple[str, int] | None = None

    @property
    def where(self) -> str:
        return f"{self.source[0]}:{self.source[1]}" if self.source else f"record {self.id!r}"


def write_records(path: str, records: Iterable[PreferenceRecord], *, append: bool = False) -> int:
    """Writes `records` as JSONL (`append`: after the lines already there); returns the
    number written. Each is validated first, so a file this writes always loads."""
    lines = []
    for record in records:
        line = json.dumps(record_to_json(record), separators=(",", ":"))
        parse_record(json.loads(line), (path, len(lines) + 1))  # the loader's own checks
        lines.append(line)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a" if append else "w") as handle:
        handle.writelines(line + "\n" for line in lines)
    return len(lines)


def load_records(path: str) -> list[PreferenceRecord]:
    """Every record of a JSONL file, validated; the first malformed line raises
    `PreferenceDataError` naming the file, the line and the field. A blank line is an
    error (except the file's final newline); ids must be unique within the file."""
    records, seen = [], {}
    with open(path) as handle:
        for number, line in enumerate(handle, start=1):
            where = (path, number)
            if not line.strip():
                raise PreferenceDataError(f"{path}:{number}: blank line (no record)")
            try:
                value = json.loads(line)
            except json.JSONDecodeError as error:
                raise PreferenceDataError(f"{path}:{number}: not JSON ({error.msg})") from None
            record = parse_record(value, where)
            if record.id in seen:
                raise PreferenceDataError(
                    f"{path}:{number}: id: {record.id!r} repeats line {seen[record.id]}"
                )
            seen[record.id] = number
            records.append(record)
    return records


def record_to_json(record: PreferenceRecord) -> dict[str, Any]:
    """The JSON object of a record (the inverse of `parse_record`)."""

    def turns(items: Sequence[Turn]) -> list[dict[str, list[int]]]:
        return [
            {"obs": list(t.obs), "progress": list(t.progress), "action": list(t.action)}
            for t in items
        ]

    return {
        "format": FORMAT,
        "id": record.id,
        "env": record.env,
        "dims": record.dims,
        "policy": record.policy,
        "judge": record.judge,
        "prefix": turns(record.prefix),
        "chosen": {"turns": turns(record.chosen.turns), "success": record.chosen.success},
        "rejected": {"turns": turns(record.rejected.turns), "success": record.rejected.success},
    }


def parse_record(value: Any, where: tuple[str, int] | None = None) -> PreferenceRecord:
    """A `PreferenceRecord` of a decoded JSON object, or `PreferenceDataError` naming
    `where` (`(path, line)`) and the offending field."""
    check = _Checker(f"{where[0]}:{where[1]}" if where else "record")
    check.object(value, "", ("format", "id", "env", "dims", "policy", "judge", "prefix",
                             "chosen", "rejected"))  # fmt: skip
    if value["format"] != FORMAT:
        check.fail("format", f"must be {FORMAT!r}, got {value['format']!r}")
    check.string(value["id"], "id")
    env = check.object(value["env"], "env", ("name", "config", "task_key"))
    check.string(env["name"], "env.name")
    check.object(env["config"], "env.config", ())
    key = check.ints(env["task_key"], "env.task_key", 0, _UINT32 - 1)
    if len(key) != 2:
        check.fail("env.task_key", f"must hold 2 uint32 words, got {len(key)}")
    dims = check.object(value["dims"], "dims", DIMS)
    for name in DIMS:
        check.ints([dims[name]], f"dims.{name}", 0 if name in ("markers", "pad", "end") else 1)
    policy = check.object(value["policy"], "policy", ("name", "version"))
    check.string(policy["name"], "policy.name")
    check.string(policy["version"], "policy.version")
    judge = check.object(value["judge"], "judge", ("name", "chosen_score", "rejected_score"))
    check.string(judge["name"], "judge.name")
    scores = [check.number(judge[f"{s}_score"], f"judge.{s}_score") for s in ("chosen", "rejected")]
    if not scores[0] > scores[1]:
        check.fail("judge", f"chosen_score {scores[0]} must exceed rejected_score {scores[1]}")
    prefix = check.turns(value["prefix"], "prefix", dims, minimum=0)
    sides = []
    for name in ("chosen", "rejected"):
        side = check.object(value[name], name, ("turns", "success"))
        turns = check.turns(side["turns"], f"{name}.turns", dims, minimum=1)
        if len(prefix) + len(turns) > dims["turns"]:
            check.fail(f"{name}.turns", f"prefix + turns = {len(prefix) + len(turns)} turns, "
                       f"more than dims.turns = {dims['turns']}")  # fmt: skip
        if not isinstance(side["success"], bool):
            check.fail(f"{name}.success", f"must be true or false, got {side['success']!r}")
        sides.append(Side(turns, side["success"]))
    return PreferenceRecord(
        id=value["id"], env=env, dims={n: dims[n] for n in DIMS}, policy=policy, judge=judge,
        prefix=prefix, chosen=sides[0], rejected=sides[1], source=where,
    )  # fmt: skip


class _Checker:
    """Field checks that raise `PreferenceDataError` naming the location and field."""

    def __init__(self, location: str):
        self.location = location

    def fail(self, field: str, message: str):
        raise PreferenceDataError(f"{self.location}: {field or 'record'}: {message}")

    def object(self, value: Any, field: str, required: Sequence[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(field, f"must be an object, got {type(value).__name__}")
        for name in required:
            if name not in value:
                self.fail(f"{field}.{name}".lstrip("."), "missing")
        if required:
            extra = sorted(set(value) - set(required))
            if extra:
                self.fail(f"{field}.{extra[0]}".lstrip("."), "unknown field")
        return value

    def string(self, value: Any, field: str) -> str:
        if not isinstance(value, str) or not value:
            self.fail(field, f"must be a non-empty string, got {value!r}")
        return value

    def number(self, value: Any, field: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            self.fail(field, f"must be a finite number, got {value!r}")
        if value in (float("inf"), float("-inf")):
            self.fail(field, f"must be a finite number, got {value!r}")
        return float(value)

    def ints(self, value: Any, field: str, low: int, high: int | None = None) -> list[int]:
        if not isinstance(value, list):
            self.fail(field, f"must be a list of integers, got {type(value).__name__}")
        for index, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int):
                self.fail(f"{field}[{index}]", f"must be an integer, got {item!r}")
            if item < low or (high is not None and item > high):
                self.fail(f"{field}[{index}]", f"{item} is outside [{low}, {high}]")
        return value

    def turns(self, value: Any, field: str, dims: dict[str, int], *, minimum: int):
        if not isinstance(value, list) or len(value) < minimum:
            self.fail(field, f"must be a list of at least {minimum} turn(s)")
        out = []
        vocab = dims["vocab"] - 1
        for index, turn in enumerate(value):
            at = f"{field}[{index}]"
            turn = self.object(turn, at, ("obs", "progress", "action"))
            obs = self.ints(turn["obs"], f"{at}.obs", 0, vocab)
            progress = self.ints(turn["progress"], f"{at}.progress", 0)
            action = self.ints(turn["action"], f"{at}.action", 0, vocab)
            for name, tokens, size in (("obs", obs, "obs_len"), ("progress", progress, "markers")):
                if len(tokens) != dims[size]:
                    self.fail(
                        f"{at}.{name}", f"has {len(tokens)} tokens, dims.{size} = {dims[size]}"
                    )
            self._action(action, f"{at}.action", dims)
            out.append(Turn(tuple(obs), tuple(progress), tuple(action)))
        return tuple(out)

    def _action(self, action: list[int], field: str, dims: dict[str, int]) -> None:
        if not 1 <= len(action) <= dims["turn_len"]:
            self.fail(field, f"has {len(action)} tokens, must be 1..dims.turn_len = "
                      f"{dims['turn_len']}")  # fmt: skip
        if action[-1] != dims["end"]:
            self.fail(field, f"must end with END = {dims['end']}, ends with {action[-1]}")
        if dims["end"] in action[:-1]:
            self.fail(field, f"END = {dims['end']} before the last token")
        if dims["pad"] in action:
            self.fail(field, f"holds PAD = {dims['pad']} (the policy never writes it)")
