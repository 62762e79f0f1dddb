"""What the experiment launchers share: their flags and how a refused run ends.

`define_flags(name)` defines `--config` (experiments/configs/<name>.py, overridable field
by field; a misspelled `--config.a.b` exits naming the fields `a` has), `--workdir`
(runs/<name>), `--resume` (with `--resume_across_commits` to go on under another commit),
`--overwrite`, `--compilation_cache_dir`, the multi-process flags of `rlagent.parallel`
(`--coordinator_address`, `--num_processes`, `--process_id`, `--distributed`) and, with
`distributed=True` (a study that takes a mesh), `--num_devices`.
`run_study(study, flags)` joins a multi-process run when those flags say so
(`parallel.maybe_initialize_distributed`, docs/distributed.md; a launcher whose study runs
in one process only refuses several), turns on JAX's persistent compilation cache
(`rlagent.host.compile_cache`: ~/.cache/rlagent/jax unless the flag or
JAX_COMPILATION_CACHE_DIR says otherwise, so a rerun does not compile again), then
calls `study(config, workdir, resume=..., overwrite=...)` (every study of
experiments/studies refuses a non-empty workdir without one of them,
`rlagent.host.workdir`) with Orbax's per-checkpoint INFO lines off; a refused or
diverged run, or a bad config value, exits with status 1 and a one-line error.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
from absl import flags
from absl import logging
from ml_collections import config_flags

from experiments.studies import common
from rlagent import parallel
from rlagent.host import compile_cache
from rlagent.host import loop
from rlagent.host import provenance

_CACHE_FLAG = "compilation_cache_dir"


class LauncherFlags(NamedTuple):
    config: Any  # config_flags' holder of the ml_collections.ConfigDict.
    workdir: flags.FlagHolder
    resume: flags.FlagHolder
    overwrite: flags.FlagHolder
    compilation_cache_dir: flags.FlagHolder
    distributed: bool  # --num_devices is defined: the study takes `mesh`.
    name: str = ""  # the launcher's, `experiments.<name>`.
    multi_process: bool = False  # the study runs over several processes.


def define_flags(
    name: str, *, distributed: bool = False, multi_process: bool = False
) -> LauncherFlags:
    """The shared flags of the launcher `experiments.<name>` (see the module docstring).
    `distributed`: the study takes a mesh of `--num_devices` (all devices of every process
    by default in a multi-process run); it, or `multi_process` (a study that builds its own
    mesh), lets the launcher run over several processes."""
    parallel.define_distributed_flags()
    if distributed:
        flags.DEFINE_integer("num_devices", None, "Shard episodes over this many devices.")
    path = os.path.join(os.path.dirname(__file__), "configs", f"{name}.py")
    try:
        config = config_flags.DEFINE_config_file("config", path)
    except (AttributeError, KeyError) as error:  # a --config.x override names no field.
        default = importlib.import_module(f"experiments.configs.{name}").get_config()
        sys.exit(f"error: {common.unknown_override(default, sys.argv) or error}")
    return LauncherFlags(
        config=config,
        workdir=flags.DEFINE_string("workdir", f"runs/{name}", "Output folder."),
        resume=flags.DEFINE_bool(
            "resume", False, "Continue from the newest checkpoints (the config must match)."
        ),
        overwrite=flags.DEFINE_bool(
            "overwrite", False, "Replace the results in a non-empty --workdir (refused otherwise)."
        ),
        compilation_cache_dir=define_cache_flag(),
        distributed=distributed,
        name=name,
        multi_process=distributed or multi_process,
    )


# With --resume: go on under another commit than the run's (refused otherwise); every
# segment's commit and updates are recorded in provenance_segments.jsonl.
_ACROSS_COMMITS = flags.DEFINE_bool(
    "resume_across_commits",
    False,
    "With --resume, continue a run that went on at another git commit (refused otherwise); "
    "each segment's commit and updates are recorded beside provenance.json.",
)


def define_cache_flag() -> flags.FlagHolder:
    """`--compilation_cache_dir`, for launchers that do not call `define_flags`; pass its
    value to `compile_cache.enable_compilation_cache` before anything compiles. Defined
    once per process, so two launchers imported together share it."""
    if _CACHE_FLAG in flags.FLAGS:
        return flags.FlagHolder(flags.FLAGS, flags.FLAGS[_CACHE_FLAG])
    return flags.DEFINE_string(
        _CACHE_FLAG,
        None,
        "Folder of JAX's persistent compilation cache (default: $JAX_COMPILATION_CACHE_DIR, "
        "else $XDG_CACHE_HOME/rlagent/jax, i.e. ~/.cache/rlagent/jax); '' turns it off.",
    )


def config_value(launcher: LauncherFlags) -> Any:
    """The launcher's config; a `--config` file that cannot be loaded (missing, or failing
    on import) exits with a one-line error instead of config_flags' traceback."""
    config = launcher.config.value
    if config is None:  # no config flag value (a caller that passes its own)
        return config
    try:
        config.keys()  # a config that failed to load raises on first use
    except OSError as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        sys.exit(f"error: --config: {lines[-1] if lines else error}")
    return config


def run_reported(work: Callable[[], Any]) -> Any:
    """`work()`; refused, diverged or badly configured runs exit with their error."""
    logging.set_verbosity(logging.WARNING)  # keep Orbax's per-checkpoint INFO lines out.
    try:
        return work()
    except (loop.RunError, ValueError) as error:  # refused, diverged or a bad config value.
        sys.exit(f"error: {error}")


def parse_flags(argv: list[str]) -> list[str]:
    """`app.run(main, flags_parser=parse_flags)`: absl's flag parsing with its error as one
    line (`error: flag --config.seeds=2.5: invalid literal for int() ...`), exit status 1."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        sys.exit(f"error: {error}")


def enable_cache(folder: str | None) -> None:
    """`compile_cache.enable_compilation_cache(folder)` for scripts that do not run through
    `run_reported` (the benchmarks): a bad folder exits with its one-line error."""
    try:
        compile_cache.enable_compilation_cache(folder)
    except ValueError as error:
        sys.exit(f"error: {error}")


def data_mesh() -> Any:
    """After `define_flags(..., distributed=True)` and `start_processes`: the data mesh
    over `--num_devices` devices; unset, over every process's devices in a multi-process
    run, None (the default device) in one process."""
    num_devices = flags.FLAGS.num_devices
    if num_devices or jax.process_count() > 1:
        return parallel.data_mesh(num_devices)
    return None


def start_processes(launcher: LauncherFlags) -> None:
    """Joins the multi-process run the flags name (`parallel.maybe_initialize_distributed`);
    refuses several processes for a launcher whose study runs in one."""
    parallel.maybe_initialize_distributed()
    if jax.process_count() > 1 and not launcher.multi_process:
        raise ValueError(
            f"experiments.{launcher.name} runs in one process; --num_processes / "
            "--coordinator_address / --distributed are for the launchers that "
            "docs/distributed.md lists as running over several processes."
        )


def run_study(study: Callable[..., Any], launcher: LauncherFlags, **kwargs: Any) -> None:
    """`study(config, workdir, resume=..., overwrite=..., **kwargs)` from the launcher's
    flags (and `mesh=data_mesh()` when distributed), through `run_reported`, with the
    persistent compilation cache of `--compilation_cache_dir` on."""

    def work():
        start_processes(launcher)
        compile_cache.enable_compilation_cache(launcher.compilation_cache_dir.value)
        if flags.FLAGS.is_parsed() and _ACROSS_COMMITS.value:
            os.environ[provenance.ACROSS_COMMITS_ENV] = "1"
        mesh = {"mesh": data_mesh()} if launcher.distributed else {}
        return study(
            config_value(launcher),
            launcher.workdir.value,
            resume=launcher.resume.value,
            overwrite=launcher.overwrite.value,
            **mesh,
            **kwargs,
        )

    run_reported(work)
