r"""Benchmark: end-to-end PPO training throughput of the main experiment's configuration.

Times `jit(vmap(trainer.update))` of experiments/configs/sparse_vs_dense.py (by default
4 reward conditions x 5 seeds = 20 runs of 64 episodes each) at 1, 4 and 20 vmapped runs,
on compiled programs after warm-up (fastest of repeated updates, medians kept beside; the
CPU may be shared). Keys:

* `env_turns_per_sec`: environment turns of experience per second at the largest run
  count (20), the number `metrics.csv` reports as `turns_per_sec`.
* `update_ms`, `compile_s`: one update of all runs (fastest), and the first call minus it;
  `by_runs` adds `update_cpu_ms`, the process CPU time of that update (all threads), which
  other jobs on a shared CPU disturb less than the wall time.
* `breakdown_ms` of one update: `rollout` (sampling + environment, `trainer.rollout`
  vmapped), `reference` (the frozen policy's log-probs: update time with the configured
  KL minus update time with `kl_placement='none'`, the two timed alternately; 0 when the
  trainer skips the pass), `advantages` (the advantage estimator alone) and `ppo` (the
  rest: rewards, epochs of teacher-forced score, loss, backward and AdamW).
* `live_slot_fraction`: played turns / turn slots (B x S per run) of the timed rollouts.
* `by_runs`: the same per run count.
* `first_update_metrics`: every metric of the first update from `trainer.init` at the
  largest run count, one value per run (to compare two versions of the trainer).
* With `--live_chunks_ab`, `live_chunks_ab`: the rollout of every run (vmapped, from
  `trainer.init`) playing every row (`RolloutConfig.live_chunks=0`) against live rows
  only at each chunk count of `--live_chunks` (e.g. `1,8,16`; 1 = one chunk per run:
  the live-rows machinery without its saving), and the environment's steps alone (reset
  and one `env.step` per turn slot on every row, with the rollout's actions), all timed
  alternately in one process (`repeats` rounds): median ms of each, the median of the
  paired ratios, and the alive fraction by turn. The first chunk count's numbers are
  also the block's top-level `live_chunks`, `live_rows_ms`, `speedup_median_of_pairs`.

Compile times alone:

* `--compile_only`: seconds to trace + lower (`trace_lower_s`) and to XLA-compile
  (`compile_s`; `compile_cpu_s` its process CPU time, all threads) `jit(vmap(init))` and
  `jit(vmap(update))` at the largest run count, each program run once afterwards
  (`first_run_s`). No persistent cache unless
  `--compilation_cache_dir` names one.
* `--cache_check`: `--compile_only` in two fresh processes on one new, empty persistent
  compilation cache (the launchers' `rlagent.host.compile_cache`): `cold` compiles and
  writes it, `warm` reads it back; `compile_ratio` = cold / warm XLA seconds,
  `first_call_ratio` the same with tracing and lowering (which no cache saves) added.
  `--config.*` and `--runs` pass through to both.

It only uses public functions that have long existed (`make_train`, `trainer.update`,
`trainer.rollout`, `RunnerState`; the setup from `experiments.studies.common` or, in an
older checkout such as ebd0bf4, `rlagent.train.experiment`), so it can time an older
checkout side by side:

  python -m experiments.bench_train --json_out=/tmp/bench_train.json
  cd OTHER && PYTHONPATH=$PWD python /path/to/experiments/bench_train.py --json_out=... \
      --config=OTHER/experiments/configs/sparse_vs_dense.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags
from ml_collections import config_flags

from rlagent.rollout import make_rollout
from rlagent.train.ppo import make_train
from rlagent.train.ppo import policy_graphdef
from rlagent.train.rewards import reward_weights

try:  # the layout since e6da395
    from experiments.studies.common import build as build_setup
    from rlagent.host import compile_cache
    from rlagent.host.extras import trainer_extras
except ImportError:  # an older checkout (ebd0bf4): no studies, extras or compile cache.
    from rlagent.train.experiment import build as build_setup

    compile_cache = trainer_extras = None

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "configs", "sparse_vs_dense.py")
)
_JSON_OUT = flags.DEFINE_string("json_out", None, "Where to write the JSON results.")
_RUNS = flags.DEFINE_list("runs", ["1", "4", "20"], "Vmapped run counts to time.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed updates per compiled program.")
_COMPILE_ONLY = flags.DEFINE_bool(
    "compile_only",
    False,
    "Only time tracing + lowering and XLA compiling of the trainer's programs (init and "
    "update at the largest --runs), then run each once.",
)
_CACHE_CHECK = flags.DEFINE_bool(
    "cache_check",
    False,
    "Run --compile_only twice in fresh processes on one new, empty persistent compilation "
    "cache folder (cold, then warm) and report both compile times and their ratio.",
)
_CACHE_DIR = flags.DEFINE_string(
    "compilation_cache_dir",
    None,
    "JAX's persistent compilation cache folder for this process (default: none, so that "
    "compile times are measured; --cache_check sets it for its children).",
)
_LIVE_CHUNKS_AB = flags.DEFINE_bool(
    "live_chunks_ab", False, "Only time the rollout: every row against live rows only."
)
_LIVE_CHUNKS = flags.DEFINE_list(
    "live_chunks", ["8"], "RolloutConfig.live_chunks of the live-rows sides of --live_chunks_ab."
)


def main(argv):
    del argv
    if _CACHE_CHECK.value:
        return _write(cache_check(_CACHE_DIR.value))
    if _CACHE_DIR.value is not None:
        try:  # launch.enable_cache's one-line error (launch is not imported: old checkouts)
            compile_cache.enable_compilation_cache(_CACHE_DIR.value)
        except ValueError as error:
            sys.exit(f"error: {error}")
    config = _CONFIG.value
    setup = build_setup(config)
    seeds = range(config.first_seed, config.first_seed + config.seeds)
    conditions = [name.strip() for name in config.conditions.split(",") if name.strip()]
    runs = [(condition, seed) for condition in conditions for seed in seeds]
    counts = sorted(int(n) for n in _RUNS.value)
    if counts[-1] > len(runs):
        raise ValueError(f"--runs asks for {counts[-1]} runs, the config has {len(runs)}")
    trainer = make_train(
        setup.train_config,
        setup.env,
        setup.policy_config,
        setup.rollout_config,
        **_extras(setup, setup.train_config),
    )
    if _COMPILE_ONLY.value:
        return _write(compile_times(trainer, setup.train_config, runs[: counts[-1]]))
    results = {
        "device": str(jax.devices()[0]),
        "runs": len(runs),
        "episodes_per_run": setup.train_config.batch_size,
        "turn_slots_per_run": setup.train_config.batch_size * setup.env.max_turns,
        "by_runs": {},
    }
    if _LIVE_CHUNKS_AB.value:
        state = _init(trainer, setup.train_config, runs[: counts[-1]])
        results["live_chunks_ab"] = _live_chunks_ab(setup, state)
        print(json.dumps(results, indent=2))
        if _JSON_OUT.value:
            with open(_JSON_OUT.value, "w") as f:
                json.dump(results, f, indent=2)
        return
    for count in counts:
        state = _init(trainer, setup.train_config, runs[:count])
        row = _time_update(trainer, state)
        row["env_turns_per_sec"] = row["env_turns"] / row["update_ms"] * 1e3
        first_metrics = row.pop("first_update_metrics")
        results["by_runs"][count] = row
        print(
            f"runs={count:3d}: update {row['update_ms']:8.1f} ms, "
            f"{row['env_turns_per_sec']:8.1f} env turns/s, compile {row['compile_s']:.1f} s"
        )
    top = results["by_runs"][counts[-1]]
    state = _init(trainer, setup.train_config, runs[: counts[-1]])
    results.update(
        env_turns_per_sec=top["env_turns_per_sec"],
        update_ms=top["update_ms"],
        compile_s=top["compile_s"],
        live_slot_fraction=top["live_slot_fraction"],
        breakdown_ms=_breakdown(trainer, state, setup, top["update_ms"]),
        first_update_metrics=first_metrics,
    )
    print(json.dumps({k: v for k, v in results.items() if k != "first_update_metrics"}, indent=2))
    _write(results, echo=False)


def _write(results: dict, echo: bool = True) -> None:
    if echo:
        print(json.dumps(results, indent=2))
    if _JSON_OUT.value:
        with open(_JSON_OUT.value, "w") as f:
            json.dump(results, f, indent=2)


def compile_times(trainer, train_config, runs) -> dict:
    """Seconds to trace + lower and to XLA-compile (or read from the persistent cache)
    `jit(vmap(init))` and `jit(vmap(update))` for `runs`, each run once afterwards."""
    keys = jnp.stack([jax.random.PRNGKey(seed) for _, seed in runs])
    weights = jnp.stack([reward_weights(train_config, condition) for condition, _ in runs])
    results = {"runs": len(runs), "programs": {}}
    init = jax.jit(jax.vmap(trainer.init))
    update = jax.jit(jax.vmap(trainer.update))
    args = (keys, weights)
    for name, program in (("init", init), ("update", update)):
        start = time.perf_counter()
        lowered = program.lower(*args)
        traced, cpu_start = time.perf_counter(), time.process_time()
        compiled = lowered.compile()
        done, cpu_done = time.perf_counter(), time.process_time()
        out = jax.block_until_ready(compiled(*args))
        results["programs"][name] = dict(
            trace_lower_s=traced - start,
            compile_s=done - traced,
            compile_cpu_s=cpu_done - cpu_start,  # all threads; less disturbed by other jobs.
            first_run_s=time.perf_counter() - done,
        )
        args = (out,)  # update takes the state init made.
    results["compile_s"] = sum(p["compile_s"] for p in results["programs"].values())
    results["compile_cpu_s"] = sum(p["compile_cpu_s"] for p in results["programs"].values())
    results["trace_lower_s"] = sum(p["trace_lower_s"] for p in results["programs"].values())
    return results


def cache_check(folder: str | None) -> dict:
    """`--compile_only` in two fresh processes sharing one empty cache folder (`folder`,
    else a temporary one, removed afterwards): cold, then warm."""
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="rlagent-cache-check-") as scratch:
            return cache_check(scratch)
    if os.path.isdir(folder) and os.listdir(folder):
        raise ValueError(f"--cache_check needs an empty cache folder, {folder} is not")
    passed = [a for a in sys.argv[1:] if a.startswith(("--config", "--runs"))]
    results = {"cache_dir": folder}
    with tempfile.TemporaryDirectory() as scratch:
        for name in ("cold", "warm"):
            out = os.path.join(scratch, f"{name}.json")
            flags_ = ["--compile_only", f"--compilation_cache_dir={folder}", f"--json_out={out}"]
            command = [sys.executable, "-m", "experiments.bench_train", *flags_, *passed]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=_ROOT)
            with open(out) as f:
                results[name] = json.load(f)
    cold, warm = results["cold"], results["warm"]
    results["compile_ratio"] = cold["compile_s"] / warm["compile_s"]
    results["first_call_ratio"] = (cold["compile_s"] + cold["trace_lower_s"]) / (
        warm["compile_s"] + warm["trace_lower_s"]
    )
    return results


def _extras(setup, train_config) -> dict:
    """`trainer_extras` of the setup's PRM and probe configs (an older checkout's Setup,
    which has none, gets its own defaults)."""
    configs = {"prm": "prm_config", "probe": "probe_config"}
    extras = {k: getattr(setup, v) for k, v in configs.items() if hasattr(setup, v)}
    if trainer_extras is None:  # an older checkout: make_train takes no extras.
        return {}
    return trainer_extras(train_config, setup.env, setup.rollout_config, **extras)


def _init(trainer, train_config, runs):
    keys = jnp.stack([jax.random.PRNGKey(seed) for _, seed in runs])
    weights = jnp.stack([reward_weights(train_config, condition) for condition, _ in runs])
    return jax.jit(jax.vmap(trainer.init))(keys, weights)


def _time_update(trainer, state) -> dict:
    """Times one update of every run; the first call (compile + run) is not counted."""
    update = jax.jit(jax.vmap(trainer.update))
    start = time.perf_counter()
    state, metrics = jax.block_until_ready(update(state))
    first = time.perf_counter() - start
    first_metrics = {name: np.asarray(value).tolist() for name, value in metrics.items()}
    times, cpu_times, turns = [], [], []
    for _ in range(_REPEATS.value):
        start, cpu_start = time.perf_counter(), time.process_time()
        state, metrics = jax.block_until_ready(update(state))
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
        turns.append(float(np.sum(metrics["env_turns"])))
    fastest = int(np.argmin(times))
    trajectory = jax.jit(jax.vmap(trainer.rollout))(state.params, *_rollout_keys(state))
    return dict(
        update_ms=1e3 * times[fastest],
        update_ms_median=1e3 * statistics.median(times),
        update_cpu_ms=1e3 * cpu_times[fastest],
        compile_s=first - times[fastest],
        env_turns=turns[fastest],
        live_slot_fraction=float(jnp.mean(trajectory.turn_mask)),
        first_update_metrics=first_metrics,
    )


def _breakdown(trainer, state, setup, update_ms: float) -> dict:
    """Milliseconds of the parts of one update of every run (see the module docstring)."""
    config = setup.train_config
    rollout = jax.jit(jax.vmap(trainer.rollout))
    rollout_ms, trajectory = _best_ms(rollout, state.params, *_rollout_keys(state))
    if config.kl_placement == "none":
        reference_ms = 0.0
    else:
        no_kl = dataclasses.replace(config, kl_placement="none", kl_target=None)
        no_kl_trainer = make_train(
            no_kl,
            setup.env,
            setup.policy_config,
            setup.rollout_config,
            **_extras(setup, no_kl),
        )
        # Interleaved, so that a load change on a shared CPU hits both programs alike.
        with_kl_ms, no_kl_ms = _best_ms_interleaved(
            [jax.jit(jax.vmap(trainer.update)), jax.jit(jax.vmap(no_kl_trainer.update))], state
        )
        reference_ms = max(0.0, with_kl_ms - no_kl_ms)
    estimate = _estimator()

    def advantages(trajectory):
        rewards = jnp.zeros(trajectory.turn_mask.shape, jnp.float32)
        kl_reward = jnp.zeros(trajectory.logp.shape, jnp.float32)
        return estimate(trajectory, rewards, kl_reward, config)

    advantages_ms, _ = _best_ms(jax.jit(jax.vmap(advantages)), trajectory)
    return dict(
        rollout=rollout_ms,
        reference=reference_ms,
        advantages=advantages_ms,
        ppo=max(0.0, update_ms - rollout_ms - reference_ms - advantages_ms),
    )


def _live_chunks_ab(setup, state) -> dict:
    """The rollout playing every row against live chunks, and the env steps, alternately."""
    graphdef = policy_graphdef(setup.policy_config)
    try:
        chunk_counts = [int(count) for count in _LIVE_CHUNKS.value]
    except ValueError:
        chunk_counts = []
    if not chunk_counts or min(chunk_counts) < 1:
        sys.exit(f"error: --live_chunks must list integers >= 1, got {_LIVE_CHUNKS.value}")
    configs = {"every_row": dataclasses.replace(setup.rollout_config, live_chunks=0)}
    for count in chunk_counts:
        configs[f"live_{count}"] = dataclasses.replace(setup.rollout_config, live_chunks=count)
    programs = {
        name: jax.jit(jax.vmap(make_rollout(setup.env, graphdef, config)))
        for name, config in configs.items()
    }
    keys = _rollout_keys(state)
    args = {name: (state.params, *keys) for name in programs}
    trajectory = jax.block_until_ready(programs["every_row"](*args["every_row"]))
    env = setup.env

    def env_steps(env_keys, actions):  # one run: [B] keys, [B, S, L] actions.
        env_state, timestep = jax.vmap(env.reset)(env_keys)
        for s in range(actions.shape[1]):
            env_state, timestep = jax.vmap(env.step)(env_state, actions[:, s])
        return timestep

    programs["env_steps"] = jax.jit(jax.vmap(env_steps))
    args["env_steps"] = (keys[0], trajectory.action_tokens)
    times = {name: [] for name in programs}
    for name, program in programs.items():
        jax.block_until_ready(program(*args[name]))
    for _ in range(_REPEATS.value):
        for name, program in programs.items():
            start = time.perf_counter()
            jax.block_until_ready(program(*args[name]))
            times[name].append(time.perf_counter() - start)
    by_chunks = {}
    for count in chunk_counts:
        live = times[f"live_{count}"]
        ratios = [a / b for a, b in zip(times["every_row"], live, strict=True)]
        by_chunks[str(count)] = dict(
            live_rows_ms=1e3 * statistics.median(live),
            speedup_median_of_pairs=statistics.median(ratios),
            speedups=ratios,
        )
    first = by_chunks[str(chunk_counts[0])]
    return dict(
        live_chunks=chunk_counts[0],
        every_row_ms=1e3 * statistics.median(times["every_row"]),
        live_rows_ms=first["live_rows_ms"],
        speedup_median_of_pairs=first["speedup_median_of_pairs"],
        speedups=first["speedups"],
        env_steps_ms=1e3 * statistics.median(times["env_steps"]),
        by_chunks=by_chunks,
        alive_by_turn=np.asarray(jnp.mean(trajectory.turn_mask, axis=(0, 1))).tolist(),
    )


def _estimator():
    """`estimate_advantages(trajectory, rewards, kl_reward, config)` wherever it lives."""
    try:
        from rlagent.train.estimators import estimate_advantages
    except ImportError:
        from rlagent.train.ppo import estimate_advantages
    return estimate_advantages


def _rollout_keys(state):
    """The env / policy keys of an update's rollout (as `trainer.update` derives them)."""
    config = _CONFIG.value.train

    def keys(key):
        _, env_key, policy_key, _ = jax.random.split(key, 4)
        env_keys = jnp.repeat(jax.random.split(env_key, config.num_groups), config.group_size, 0)
        return env_keys, jax.random.split(policy_key, config.num_groups * config.group_size)

    return jax.vmap(keys)(state.key)


def _best_ms_interleaved(fns, *args) -> list[float]:
    """Fastest of `repeats` calls of each function (after a warm-up call), alternating."""
    times = [[] for _ in fns]
    for fn in fns:
        jax.block_until_ready(fn(*args))
    for _ in range(_REPEATS.value):
        for fn, fn_times in zip(fns, times, strict=True):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            fn_times.append(time.perf_counter() - start)
    return [1e3 * min(fn_times) for fn_times in times]


def _best_ms(fn, *args):
    """(fastest of `repeats` calls after a warm-up call, in ms; the last result)."""
    out = jax.block_until_ready(fn(*args))
    times = []
    for _ in range(_REPEATS.value):
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * min(times), out


if __name__ == "__main__":
    app.run(main)
