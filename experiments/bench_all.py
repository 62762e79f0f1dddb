r"""Every CPU benchmark of docs/benchmarks.md at one commit, one after another, in one go.

    python -m experiments.bench_all --out=docs/results/speed/run_amd

runs each benchmark in `BENCHES` as its own process (`python -m experiments.<bench>
--json_out=OUT/<name>.json` plus the flags listed there), one at a time so that none
shares the CPU with another, and writes `OUT/bench_all.json`: the provenance of the
run (commit, CPU model, packages), and for each benchmark its command, wall seconds,
exit status and the 1-minute load average before and after it. A figure is only
comparable with the others of its run: same commit, same machine, same hour.

A dirty checkout is refused (`--allow_dirty` runs anyway and records the changed files):
the tables name one commit. A benchmark that fails does not stop the others; its
entry keeps the exit status and the tail of its output, and the run exits non-zero.
A load average above `--max_load` at the start is refused: a loaded machine's numbers
are notes, not results (`--max_load=inf` measures anyway and says so in bench_all.json).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from collections.abc import Sequence

from absl import app
from absl import flags

from rlagent.host import provenance

# name -> (module, extra flags). The defaults are docs/benchmarks.md's settings.
BENCHES: dict[str, tuple[str, tuple[str, ...]]] = {
    "kernels": ("experiments.bench_kernels", ()),
    "env": ("experiments.bench_env", ()),
    "rollout": ("experiments.bench_rollout", ()),
    "train": ("experiments.bench_train", ()),
    "credit": ("experiments.bench_credit", ()),
    # The main experiment compiled cold, then warm from the persistent cache.
    "cache": ("experiments.bench_train", ("--cache_check",)),
    # Compiled programs' memory at real model sizes (abstract shapes, no weights).
    "memory": ("experiments.bench_memory", ()),
    # The text engines on 16 BFCL-like turns (Tunix's sampler: its own run, docs/benchmarks.md).
    "text_rollout": ("experiments.bench_text_rollout", ()),
    # TRL and Tunix beside rlagent (`.[bench]`; Tunix from `--tunix_path`).
    "peers": ("experiments.bench_peers", ("--repeats=7",)),
}


def define_flags() -> None:
    """The command's flags, defined when it runs (not on import: tests import this module
    beside launchers whose flags share these names)."""
    flags.DEFINE_string("out", None, "A new or empty folder for the JSON files.")
    flags.DEFINE_list("only", list(BENCHES), f"Benchmarks to run, of {sorted(BENCHES)}.")
    flags.DEFINE_bool("allow_dirty", False, "Run on a checkout with changes.")
    flags.DEFINE_string(
        "tunix_path", "", "Passed to bench_peers: a folder holding Tunix (benchmarks_history.md)."
    )
    flags.DEFINE_float(
        "max_load", 1.5, "Refuse to start above this 1-minute load average (inf: never refuse)."
    )


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def check(
    out: str,
    only: Sequence[str],
    *,
    allow_dirty: bool,
    max_load: float,
    benches: Mapping[str, tuple[str, Sequence[str]]] = BENCHES,
) -> None:
    """Raises ValueError naming the flag before anything is written."""
    unknown = sorted(set(only) - set(benches))
    if unknown or not only:
        raise ValueError(f"--only: {unknown or 'empty'}; choose from {sorted(benches)}")
    if not out:
        raise ValueError("--out: a folder is required")
    if os.path.isfile(out) or (os.path.isdir(out) and os.listdir(out)):
        raise ValueError(f"--out: {out} exists and is not an empty folder")
    git = provenance.git_state()
    if git["dirty"] and not allow_dirty:
        changed = git["modified"] + [record["path"] for record in git["untracked"]]
        raise ValueError(
            f"the checkout has changes ({', '.join(changed[:5])}): a bench_all run names one "
            "commit; commit them or pass --allow_dirty"
        )
    load = _load()
    if load > max_load:
        raise ValueError(
            f"--max_load: the load average is {load} > {max_load}; wait for a quiet "
            "machine or pass --max_load=inf (the numbers are then a note)"
        )


def run(
    out: str,
    only: Sequence[str],
    *,
    benches: Mapping[str, tuple[str, Sequence[str]]] = BENCHES,
    allow_dirty: bool = False,
    max_load: float = 1.5,
) -> dict:
    """Runs `only` of `benches` one at a time into `out`; returns bench_all.json's record."""
    check(out, only, allow_dirty=allow_dirty, max_load=max_load, benches=benches)
    os.makedirs(out, exist_ok=True)
    record = provenance.collect({"only": list(only), "max_load": max_load})
    entries = {}
    for name in only:
        module, extra = benches[name]
        json_out = os.path.join(out, f"{name}.json")
        command = [sys.executable, "-m", module, f"--json_out={json_out}", *extra]
        before, start = _load(), time.perf_counter()
        print(f"[bench_all] {name}: {' '.join(command[1:])} (load {before})", flush=True)
        done = subprocess.run(command, capture_output=True, text=True)
        entries[name] = {
            "command": command[1:],
            "seconds": round(time.perf_counter() - start, 1),
            "returncode": done.returncode,
            "load_before": before,
            "load_after": _load(),
            "json": os.path.basename(json_out) if os.path.exists(json_out) else None,
        }
        if done.returncode:
            entries[name]["output_tail"] = (done.stdout + done.stderr)[-4000:]
        print(f"[bench_all] {name}: {json.dumps(entries[name])[:300]}", flush=True)
    result = {"benches": entries, "provenance": provenance.finish(record)}
    with open(os.path.join(out, "bench_all.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


def main(argv):
    del argv
    values = flags.FLAGS
    benches = dict(BENCHES)
    if values.tunix_path:
        module, extra = benches["peers"]
        benches["peers"] = (module, (*extra, f"--tunix_path={values.tunix_path}"))
    try:
        result = run(
            values.out,
            values.only,
            benches=benches,
            allow_dirty=values.allow_dirty,
            max_load=values.max_load,
        )
    except ValueError as error:
        sys.exit(f"bench_all: {error}")
    failed = [name for name, entry in result["benches"].items() if entry["returncode"]]
    if failed:
        sys.exit(f"bench_all: failed: {', '.join(failed)} (see bench_all.json)")


if __name__ == "__main__":
    define_flags()
    app.run(main)
