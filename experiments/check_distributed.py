r"""Each multi-process launcher on a tiny config as two processes of one device against one
process of two host devices, every CSV value of the two workdirs compared
(docs/distributed.md, "Tested here"):

    python -m experiments.check_distributed --json_out=docs/results/distributed/check.json

The tests compare the main experiment, hf_agent, ab_test and the dialogue's credit part
this way; this command covers the other studies, whose references cost a launch each.
Per launcher the JSON holds the two runs' wall times and exit statuses, the number of
values compared, the largest relative difference |a - b| / max(1, |a|) overall and per
field (fields over `--report_above` listed), and provenance (`rlagent.host.provenance`).
Timing columns are not compared. `--only=a,b` runs some launchers.
"""

from __future__ import annotations

import csv
import glob
import json
import math
import os
import tempfile
import time
from typing import Any

from absl import app
from absl import flags

from experiments.local_processes import run_local
from rlagent.host import provenance

_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the results as JSON to this path.")
_ONLY = flags.DEFINE_list("only", None, "Launchers to check (default: all of LAUNCHERS).")
_ABOVE = flags.DEFINE_float("report_above", 1e-5, "List the fields that differ by more.")

_TRAIN = ["--config.train.num_groups=2", "--config.train.group_size=2",
          "--config.train.num_minibatches=1"]  # fmt: skip
_SWEEP = [*_TRAIN, "--config.horizons=3", "--config.seeds=1", "--config.chunk_size=1",
          "--config.warm_start.steps=1", "--config.train.num_updates=2",
          "--config.train.num_epochs=1", "--config.eval.every=2", "--config.eval.episodes=2",
          "--config.probe.every=0", "--config.estimators="]  # fmt: skip
# launcher -> flags of its tiny config (1-2 updates of 4-8 episodes).
LAUNCHERS = {
    "dialogue": [*_TRAIN, "--config.seeds=1", "--config.chunk_size=2",
                 "--config.conditions=dialogue", "--config.train.num_updates=2",
                 "--config.feedback.rates=0.3", "--config.feedback.noises=0.2",
                 "--config.credit.horizons=3", "--config.credit.policies=prover_0.5",
                 "--config.credit.estimators=gae_turn", "--config.credit.rewards=outcome",
                 "--config.credit.seeds=2", "--config.credit.num_groups=1",
                 "--config.credit.group_size=2", "--config.credit.num_samples=2"],
    "horizon_sweep": [*_SWEEP, "--config.conditions=outcome,potential"],
    "critic_factorial": [*_SWEEP, "--config.critics=shared,separate",
                         "--config.conditions=outcome,potential"],
    "curriculum": [*_TRAIN, "--config.stages=l1,l2", "--config.seeds=1",
                   "--config.schedules=success,fixed", "--config.train.num_updates=4",
                   "--config.curriculum.every=2", "--config.eval.every=2",
                   "--config.eval.episodes=4"],
    "credit_accuracy": ["--config.policies=prover_0.5,ppo_1", "--config.horizons=2",
                        "--config.estimators=gae_turn,rloo", "--config.rewards=process",
                        "--config.seeds=3", "--config.num_groups=2", "--config.group_size=2",
                        "--config.num_samples=4"],
    "pipeline": ["--config.envs=l1", "--config.samples=2", "--config.thresholds=outcome@1",
                 "--config.seeds=2", "--config.base_steps=1", "--config.sft.steps=2",
                 "--config.train.num_updates=2", "--config.eval.every=2",
                 "--config.eval.episodes=8", "--config.chunk_size=2",
                 "--config.train.num_groups=2", "--config.train.group_size=4",
                 "--config.train.num_minibatches=1"],
}  # fmt: skip
TIMING = ("time", "per_sec", "wall")  # columns whose names hold these are not compared.


def check(name: str, folder: str, above: float) -> dict[str, Any]:
    """Runs `experiments.<name>` as 1 x 2 and 2 x 1 into `folder`/p1, p2; compares."""
    out: dict[str, Any] = {"flags": LAUNCHERS[name]}
    for processes in (1, 2):
        start = time.time()
        argv = ["-m", f"experiments.{name}", f"--workdir={folder}/p{processes}",
                "--compilation_cache_dir=", *LAUNCHERS[name]]  # fmt: skip
        results = run_local(argv, processes=processes, devices=2 if processes == 1 else 1)
        out[f"{processes}_processes"] = {"wall_s": round(time.time() - start, 1),
                                         "exits": [status for status, _, _ in results]}  # fmt: skip
        failed = [stderr[-2000:] for status, _, stderr in results if status]
        if failed:
            raise RuntimeError(f"experiments.{name}, {processes} processes: {failed[0]}")
    return {**out, **compare(f"{folder}/p1", f"{folder}/p2", above)}


def compare(one: str, two: str, above: float) -> dict[str, Any]:
    """Every value of every CSV under `one` against the same file under `two`."""
    worst: dict[str, float] = {}
    count = 0
    files = sorted(glob.glob(os.path.join(one, "**", "*.csv"), recursive=True))
    for path in files:
        a, b = _rows(path), _rows(os.path.join(two, os.path.relpath(path, one)))
        if len(a) != len(b):
            raise RuntimeError(f"{path}: {len(a)} rows against {len(b)}")
        for row_a, row_b in zip(a, b, strict=True):
            for field, value in row_a.items():
                worst[field] = max(worst.get(field, 0.0), _difference(value, row_b[field]))
                count += 1
    return {
        "files": [os.path.relpath(path, one) for path in files],
        "values_compared": count,
        "max_relative_difference": max(worst.values(), default=0.0),
        "fields_above": {f: d for f, d in sorted(worst.items()) if d > above},
    }


def _rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if not any(t in k for t in TIMING)}
                for row in csv.DictReader(f)]  # fmt: skip


def _difference(a: str, b: str) -> float:
    """|a - b| / max(1, |a|) of two numbers (0 for two NaNs), inf for other texts that
    differ."""
    try:
        x, y = float(a), float(b)
    except ValueError:
        return 0.0 if a == b else math.inf
    if math.isnan(x) and math.isnan(y):
        return 0.0
    return abs(x - y) / max(1.0, abs(x))


def main(argv):
    del argv
    names = _ONLY.value or list(LAUNCHERS)
    unknown = [name for name in names if name not in LAUNCHERS]
    if unknown:
        raise app.UsageError(f"--only: unknown {unknown}; known: {list(LAUNCHERS)}")
    result = {"report_above": _ABOVE.value, "launchers": {}}
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            result["launchers"][name] = entry = check(name, f"{folder}/{name}", _ABOVE.value)
            shown = {k: entry[k] for k in ("max_relative_difference", "fields_above")}
            print(name, json.dumps(shown), flush=True)
    result["provenance"] = provenance.collect({"only": names, "report_above": _ABOVE.value})
    if _JSON_OUT.value:
        os.makedirs(os.path.dirname(os.path.abspath(_JSON_OUT.value)), exist_ok=True)
        with open(_JSON_OUT.value, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    app.run(main)
