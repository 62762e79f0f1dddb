r"""The main experiment's turns per second on one machine's CPU: one process of one device,
one process of two host devices, two processes of one device each (joined over gloo on
localhost), side by side in one run (docs/distributed.md, "Measured").

    python -m experiments.bench_distributed --json_out=docs/results/speed/bench_distributed.json

Each setup runs `experiments.sparse_vs_dense` on a small config (`SETTINGS`; episodes
sharded over every device of the run) in a fresh folder; its speed is the median of the
`turns_per_sec` of the chunks after the first (which compiles). The JSON holds each
setup's chunk speeds, the machine's load average before and after it (`os.getloadavg`:
the CPU may be shared) and provenance (`rlagent.host.provenance`). The processes start
through `experiments.local_processes` (as tests/test_distributed.py's do).
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import tempfile
from typing import Any

from absl import app
from absl import flags

from experiments.local_processes import run_local
from rlagent.host import provenance

_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the results as JSON to this path.")
_UPDATES = flags.DEFINE_integer("num_updates", 8, "Updates per setup (the first chunk compiles).")

# (name, processes, devices per process)
SETUPS = (("1 process x 1 device", 1, 1), ("1 process x 2 devices", 1, 2),
          ("2 processes x 1 device", 2, 1))  # fmt: skip
SETTINGS = {
    "config.conditions": "outcome,potential", "config.seeds": 2, "config.chunk_size": 2,
    "config.env.level": 1, "config.train.num_groups": 4, "config.train.group_size": 4,
    "config.eval.every": 0,
}  # fmt: skip


def measure(processes: int, devices: int, num_updates: int) -> dict[str, Any]:
    """One setup's run of the main experiment: its chunks' turns per second and the load."""
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        argv = ["-m", "experiments.sparse_vs_dense", f"--workdir={folder}",
                f"--config.train.num_updates={num_updates}", "--compilation_cache_dir=",
                *(f"--{name}={value}" for name, value in SETTINGS.items())]  # fmt: skip
        if processes * devices > 1:
            argv.append(f"--num_devices={processes * devices}")
        results = run_local(argv, processes=processes, devices=devices)
        failed = [stderr[-2000:] for status, _, stderr in results if status]
        if failed:
            raise RuntimeError(f"{processes} x {devices}: {failed[0]}")
        with open(os.path.join(folder, "rewards", "metrics.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
    chunk = SETTINGS["config.chunk_size"]
    speeds = {int(row["update"]): float(row["turns_per_sec"]) for row in rows}
    timed = [speed for update, speed in sorted(speeds.items()) if update > chunk]
    timed = timed[chunk - 1 :: chunk]  # one value per chunk (its rows share it)
    return {
        "processes": processes, "devices_per_process": devices,
        "turns_per_sec": statistics.median(timed), "chunk_turns_per_sec": timed,
        "loadavg_before": load, "loadavg_after": os.getloadavg(),
    }  # fmt: skip


def main(argv):
    del argv
    settings = {**SETTINGS, "config.train.num_updates": _UPDATES.value}
    record = provenance.collect(settings, cpu_count=os.cpu_count())
    results = {name: measure(p, d, _UPDATES.value) for name, p, d in SETUPS}
    base = results[SETUPS[0][0]]["turns_per_sec"]
    print("| setup | turns/s | vs 1 x 1 | load average (1 min) before |\n|---|---|---|---|")
    for name, result in results.items():
        speed = result["turns_per_sec"]
        print(f"| {name} | {speed:.0f} | {speed / base:.2f} | {result['loadavg_before'][0]:.2f} |")
    if _JSON_OUT.value:
        out = {"settings": settings, "setups": results, "provenance": provenance.finish(record)}
        with open(_JSON_OUT.value, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    app.run(main)
