"""The launchers' persistent compilation cache (`rlagent.host.compile_cache`)."""

import os

import jax
import pytest

from experiments import launch
from rlagent.host import compile_cache

_OPTIONS = ("jax_enable_compilation_cache", "jax_compilation_cache_dir", *compile_cache.THRESHOLDS)


class _Holder:  # stands in for an absl FlagHolder.
    def __init__(self, value):
        self.value = value


@pytest.fixture
def jax_cache_config(monkeypatch):
    """Restores the suite's cache options (conftest.py's folder) after the test."""
    saved = {name: getattr(jax.config, name) for name in _OPTIONS}
    yield monkeypatch
    for name, value in saved.items():
        jax.config.update(name, value)


def _launch(folder):
    """The cache options a study sees when started by `launch.run_study`."""
    seen = {}

    def study(config, workdir, **kwargs):
        seen.update({name: getattr(jax.config, name) for name in _OPTIONS})

    holders = dict(config=_Holder(None), workdir=_Holder("w"), resume=_Holder(False))
    flags = launch.LauncherFlags(
        **holders, overwrite=_Holder(False), compilation_cache_dir=_Holder(folder),
        distributed=False,
    )  # fmt: skip
    launch.run_study(study, flags)
    return seen


def test_the_flag_sets_jax_config_and_empty_turns_the_cache_off(jax_cache_config, tmp_path):
    for env in ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "JAX_COMPILATION_CACHE_MAX_SIZE"):
        jax_cache_config.delenv(env, raising=False)
    seen = _launch(str(tmp_path / "cache"))
    assert seen["jax_enable_compilation_cache"]
    assert seen["jax_compilation_cache_dir"] == str(tmp_path / "cache")
    assert seen["jax_persistent_cache_min_compile_time_secs"] == 0.1
    assert seen["jax_compilation_cache_max_size"] == 4 * 2**30
    assert not _launch("")["jax_enable_compilation_cache"]


def test_the_default_folder_is_the_environments_else_under_xdg_cache_home(
    jax_cache_config, tmp_path
):
    jax_cache_config.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "suite"))
    jax_cache_config.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)  # as jax read it
    seen = _launch(None)
    assert seen["jax_compilation_cache_dir"] == str(tmp_path / "suite")
    assert seen["jax_persistent_cache_min_compile_time_secs"] == 0.2  # the environment's
    jax_cache_config.delenv("JAX_COMPILATION_CACHE_DIR")
    jax_cache_config.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.default_cache_dir() == os.path.join(str(tmp_path), "rlagent", "jax")
    jax_cache_config.setenv("XDG_CACHE_HOME", "")
    assert compile_cache.default_cache_dir() == os.path.expanduser("~/.cache/rlagent/jax")


def test_a_file_as_the_cache_folder_is_one_line_for_the_benchmarks_too(tmp_path):
    path = tmp_path / "cache"
    path.write_text("")
    with pytest.raises(SystemExit, match=r"^error: .*is a file, not a folder"):
        launch.enable_cache(str(path))
