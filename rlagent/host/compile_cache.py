"""JAX's persistent compilation cache, as every launcher turns it on.

Most of a short run's wall time is XLA compiling the trainer's programs, and a second run
of the same config compiles the same programs again. `enable_compilation_cache` points
JAX's persistent cache at a folder under the user's cache, so a rerun (or another seed
count with the same shapes, or a resumed run) reads the executables back instead. The
cache keys on the program, the compile options, the backend and the jax version, so a hit
is the executable a compile would have produced: results do not change.

Precedence of the folder: an explicit argument (the launchers' `--compilation_cache_dir`;
"" turns the cache off); else `JAX_COMPILATION_CACHE_DIR` from the environment (the test
suite sets one for itself and the launchers it spawns); else
`$XDG_CACHE_HOME/rlagent/jax` (`~/.cache/rlagent/jax`). Thresholds set in the environment
(`JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`, `..._MIN_ENTRY_SIZE_BYTES`,
`JAX_COMPILATION_CACHE_MAX_SIZE`) are kept as well.
"""

from __future__ import annotations

import os

import jax

CACHE_DIR_ENV = "JAX_COMPILATION_CACHE_DIR"

# jax option -> (its environment variable, the value launchers use when that is unset).
THRESHOLDS = {
    # A program that compiles in under 0.1 s costs about as much to read back as to
    # compile; the trainer's programs take seconds. jax's default (1 s) would leave the
    # evaluation and rollout programs of a small run (0.1-1 s each) out of the cache.
    "jax_persistent_cache_min_compile_time_secs": (
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
        0.1,
    ),
    # Any size: the cache is a local folder, where small files are cheap (jax's default).
    "jax_persistent_cache_min_entry_size_bytes": ("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", 0),
    # A folder under ~/.cache should not grow without bound: beyond 4 GiB the least
    # recently used executables are deleted.
    "jax_compilation_cache_max_size": ("JAX_COMPILATION_CACHE_MAX_SIZE", 4 * 2**30),
}


def default_cache_dir() -> str:
    """`$JAX_COMPILATION_CACHE_DIR` when set, else `$XDG_CACHE_HOME/rlagent/jax` (an
    unset or empty XDG_CACHE_HOME means `~/.cache`, as the XDG spec says)."""
    if os.environ.get(CACHE_DIR_ENV):
        return os.environ[CACHE_DIR_ENV]
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return os.path.join(os.path.expanduser(cache_home), "rlagent", "jax")


def enable_compilation_cache(folder: str | None = None) -> str | None:
    """Turns JAX's persistent compilation cache on in `folder`, before anything compiles.

    Args:
      folder: the cache folder (`~` expanded, created by jax on the first write); None for
        `default_cache_dir()`; "" turns the persistent cache off.

    Returns:
      The folder in use, or None when the cache is off.
    """
    if folder is None:
        folder = default_cache_dir()
    if not folder:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    folder = os.path.abspath(os.path.expanduser(folder))
    if os.path.exists(folder) and not os.path.isdir(folder):  # jax would only warn per compile
        raise ValueError(
            f"--compilation_cache_dir (or $JAX_COMPILATION_CACHE_DIR): {folder} is a file, "
            "not a folder."
        )
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", folder)
    for option, (env, value) in THRESHOLDS.items():
        # The environment's value wins; it is set here too, since jax reads its variables
        # at import only (a process may set them after importing jax).
        jax.config.update(option, type(value)(os.environ.get(env, value)))
    return folder
