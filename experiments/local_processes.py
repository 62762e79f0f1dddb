"""A launcher started as several local processes joined over gloo on localhost (no absl
flags of its own, so tests import it beside any launcher): `start_local`, `finish`,
`run_local`. experiments.bench_distributed and tests/test_distributed.py start their
runs with it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_local(
    argv: list[str], *, processes: int, devices: int, timeout: float = 600
) -> list[tuple[int, str, str]]:
    """`start_local`'s processes run to their end: each one's `(exit status, stdout,
    stderr)`."""
    return finish(start_local(argv, processes=processes, devices=devices), timeout)


def finish(children: list[subprocess.Popen], timeout: float = 600) -> list[tuple[int, str, str]]:
    """Waits for `children`: each one's `(exit status, stdout, stderr)`."""
    outputs = [child.communicate(timeout=timeout) for child in children]
    return [(child.returncode, *output) for child, output in zip(children, outputs, strict=True)]


def start_local(argv: list[str], *, processes: int, devices: int) -> list[subprocess.Popen]:
    """Starts `python <argv>` as `processes` processes of `devices` CPU devices each (XLA's
    host platform device count), joined over gloo on a free localhost port when there
    are several (`--coordinator_address`, `--num_processes`, `--process_id` appended)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    count = "--xla_force_host_platform_device_count"
    kept = [flag for flag in env.get("XLA_FLAGS", "").split() if not flag.startswith(count)]
    env["XLA_FLAGS"] = " ".join([*kept, f"{count}={devices}"])
    commands = [[sys.executable, *argv]]
    if processes > 1:
        with socket.socket() as s:
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
        joined = [f"--coordinator_address=localhost:{port}", f"--num_processes={processes}"]
        commands = [[*commands[0], *joined, f"--process_id={i}"] for i in range(processes)]
    return [
        subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for command in commands
    ]  # fmt: skip
