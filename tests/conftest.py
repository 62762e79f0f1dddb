"""Shared pytest fixtures, and one compilation cache for the whole session.

Most of the suite's time is XLA compiling the same tiny programs again: every test that
builds a trainer or a rollout traces a fresh closure, and the launcher, notebook and
killed-run tests compile in subprocesses. A persistent compilation cache in a temporary
folder, shared by the xdist workers and every subprocess they start (through the
environment), compiles each distinct program once per session. The cache keys on the
program, the compile options, the backend and the jax version, so a hit is the same
executable. A cache folder the user set (JAX_COMPILATION_CACHE_DIR) is used and kept.

The tests' programs are tiny and run for milliseconds, so optimising the compiled code
costs far more than it saves: the suite compiles at --xla_backend_optimization_level=0
(LLVM, 2-3x faster compiles) and with --xla_cpu_use_fusion_emitters=false (XLA CPU's
older loop emitters: the smoke trainer's update compiles in 8.9 s of CPU instead of 20.5 s
and runs in 0.44 s instead of 0.33 s; same semantics), each unless XLA_FLAGS already sets
it.
"""

import functools
import os
import shutil
import tempfile

import jax
import pytest

from rlagent.host import compile_cache

_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
_OWNED = "RLAGENT_TEST_OWNS_JAX_CACHE"  # set by the process that made the folder.
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": "false"}


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep HEAVY_FIRST's order.
        config.option.loadscopereorder = False
    flags = os.environ.get("XLA_FLAGS", "")
    for flag, value in _FAST_COMPILE.items():  # before any backend starts.
        if flag not in flags:
            flags = f"{flags} --{flag}={value}".strip()
    os.environ["XLA_FLAGS"] = flags
    # Bootstrap resamples of every summary and profile plot (stats.bootstrap_reps): the
    # suite's runs have two seeds, and 2000 resamples were most of their report time (200
    # were still a few seconds of each study test's report).
    os.environ.setdefault("RLAGENT_BOOTSTRAP_REPS", "50")
    if _CACHE_ENV not in os.environ:  # the controller (or a lone process) makes it.
        os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix="rlagent-jax-cache-")
        os.environ[_OWNED] = str(os.getpid())
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    # No size limit (jax's default): the launchers' 4 GiB bound turns on jax's LRU
    # bookkeeping, whose evictions raced between the workers ("Error writing persistent
    # compilation cache entry ... -atime: No such file") and cost recompiles; the
    # folder is the session's and is deleted at its end.
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", "-1")
    compile_cache.enable_compilation_cache(os.environ[_CACHE_ENV])  # as the launchers do


# The heaviest test files (seconds of their tests' calls and setups, `--durations=60` of
# the suite at 81dd6d1, re-measured when test_hf_agent.py and test_tree.py, the two
# heaviest, had grown unlisted), heaviest first. Under `-n 2 --dist loadfile` a worker
# takes the next file when it is almost done with its own; xdist's default order (most
# tests first) left the few-test, end-to-end files for last, and the run ended on one of
# them with the other core idle. Heaviest first (with xdist's reordering off) packs the
# two cores evenly. Files not listed follow in collection order.
HEAVY_FIRST = (
    "test_hf_agent.py", "test_tree.py", "test_distributed.py", "test_pipeline_rs_sft.py",
    "test_train.py",
    "studies/test_study_strategies.py", "test_credit_lm.py",
    "studies/test_study_generalization.py", "test_preference.py", "test_curriculum.py",
    "studies/test_study_dialogue.py", "test_reliability.py",
    "studies/test_study_process_rewards.py", "test_notebook.py", "test_bench_accel.py",
    "test_pretrain.py", "test_prm.py",
    "test_text_update.py", "studies/test_study_credit_accuracy.py",
    "studies/test_study_sparse_vs_dense.py", "test_warm_start.py", "test_train_parts.py",
    "test_bench_peers.py", "studies/test_study_horizon_sweep.py",
    "test_text_preference.py", "test_rollout.py", "test_models.py", "test_shadow.py",
    "test_text_toolworld.py", "test_envs_mastermind.py", "test_envs_base.py",
    "test_envs_dialogue.py", "test_credit_mc.py", "test_prm_implicit.py",
)  # fmt: skip


def pytest_collection_modifyitems(config, items):
    """Heaviest files first (HEAVY_FIRST); each file's tests keep their order."""
    tests = os.path.dirname(os.path.abspath(__file__))
    rank = {os.path.join(tests, name): i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))


def pytest_unconfigure(config):
    if os.environ.get(_OWNED) == str(os.getpid()):
        shutil.rmtree(os.environ.pop(_CACHE_ENV), ignore_errors=True)


@pytest.fixture(params=[True, False], ids=["jit", "nojit"])
def variant(request):
    """Wraps a kernel with its keyword arguments bound, jitted or run eagerly."""

    def wrap(fn, **static_kwargs):
        bound = functools.partial(fn, **static_kwargs)
        return jax.jit(bound) if request.param else bound

    return wrap


@pytest.fixture(scope="session")
def tiny_policy_config():
    """`make(**overrides) -> PolicyConfig`: the tiny policy the model and rollout tests share.

    One layer, d = 32, ToolWorld's vocabulary, a 2-slot summary: small enough to compile in
    seconds, with every part (GQA, summary recurrence, value head) present.
    """
    from rlagent.envs.toolworld import dsl
    from rlagent.models import PolicyConfig

    def make(**overrides):
        base = dict(
            vocab_size=dsl.VOCAB_SIZE,
            d_model=32,
            num_layers=1,
            num_heads=2,
            num_kv_heads=1,
            mlp_dim=32,
            num_summary_slots=2,
            summary_dim=16,
        )
        return PolicyConfig(**{**base, **overrides})

    return make
