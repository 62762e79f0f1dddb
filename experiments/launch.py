"""What the experiment launchers share: their flags and how a refused run ends.

`define_flags(name)` defines `--config` (experiments/configs/<name>.py, overridable field
by field; a misspelled `--config.a.b` exits naming the fields `a` has), `--workdir`
(runs/<name>), `--resume` and `--overwrite`. `run_reported(fn)` calls the launcher's
work with Orbax's per-checkpoint INFO lines off; a refused or diverged run, or a bad
config value, exits with status 1 and a one-line error.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

from absl import flags
from absl import logging
from ml_collections import config_flags

from rlagent.host import loop
from rlagent.train import experiment


class LauncherFlags(NamedTuple):
    config: Any  # config_flags' holder of the ml_collections.ConfigDict.
    workdir: flags.FlagHolder
    resume: flags.FlagHolder
    overwrite: flags.FlagHolder


def define_flags(name: str) -> LauncherFlags:
    """The shared flags of the launcher `experiments.<name>` (see the module docstring)."""
    path = os.path.join(os.path.dirname(__file__), "configs", f"{name}.py")
    try:
        config = config_flags.DEFINE_config_file("config", path)
    except (AttributeError, KeyError) as error:  # a --config.x override names no field.
        default = importlib.import_module(f"experiments.configs.{name}").get_config()
        sys.exit(f"error: {experiment.unknown_override(default, sys.argv) or error}")
    return LauncherFlags(
        config=config,
        workdir=flags.DEFINE_string("workdir", f"runs/{name}", "Output folder."),
        resume=flags.DEFINE_bool(
            "resume", False, "Continue from the newest checkpoints (the config must match)."
        ),
        overwrite=flags.DEFINE_bool(
            "overwrite", False, "Replace the results in a non-empty --workdir (refused otherwise)."
        ),
    )


def run_reported(work: Callable[[], Any]) -> None:
    """Calls `work()`; refused, diverged or badly configured runs exit with their error."""
    logging.set_verbosity(logging.WARNING)  # keep Orbax's per-checkpoint INFO lines out.
    try:
        work()
    except (loop.RunError, ValueError) as error:  # refused, diverged or a bad config value.
        sys.exit(f"error: {error}")
