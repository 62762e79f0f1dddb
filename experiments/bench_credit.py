"""Benchmark: Monte-Carlo credit with LM continuations (rlagent.credit).

The tiny main-experiment policy (experiments/configs/sparse_vs_dense.py: model and
rollout), untrained, plays B episodes of ToolWorld exchange tasks with a turn limit of
S = horizon turns (`horizon_config(16, max_turns=S)`); `mc_values` then forks every
played turn and continues it N times for V and N times for Q with the same policy, from
the rollout's carries. Each setting is one compiled program, timed after warm-up (best
of `repeats`, medians kept beside; the CPU may be shared).

Keys: `continuations_per_sec` (forked continuations, V and Q, per second at the base
setting), `policy_turns_per_sec` (LM turns played by those continuations per second),
`cost_ratio_horizon_32_vs_16` and `cost_ratio_n_32_vs_16` (time ratios; linear in the
horizon or in N means about 2). Every continuation plays S turns, so the cost per fork
grows with S, and the number of forks with the turns played: up to quadratic in S.

Run:
  python -m experiments.bench_credit --json_out=/tmp/bench_credit.json
"""

from __future__ import annotations

import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags
from flax import nnx
from ml_collections import config_flags

from experiments.studies import common
from rlagent.credit import lm
from rlagent.credit import mc
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import horizon_config
from rlagent.models import Policy
from rlagent.rollout import make_rollout
from rlagent.train.config import TrainConfig
from rlagent.train.rewards import reward_weights

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "configs", "sparse_vs_dense.py")
)
_JSON_OUT = flags.DEFINE_string("json_out", None, "Where to write the JSON results.")
_BATCH = flags.DEFINE_integer("batch", 64, "Episodes whose every turn is estimated.")
_HORIZON = flags.DEFINE_integer("horizon", 16, "Base turn limit S.")
_SAMPLES = flags.DEFINE_integer("num_samples", 16, "Base N continuations per value.")
_CHUNK = flags.DEFINE_integer("chunk_size", 4096, "Continuations played at once.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per compiled program.")


def main(argv):
    del argv
    setup = common.build(_CONFIG.value)
    graphdef, params = nnx.split(Policy(setup.policy_config, rngs=nnx.Rngs(0)))
    base_s, base_n = _HORIZON.value, _SAMPLES.value
    results = {
        "device": str(jax.devices()[0]),
        "batch": _BATCH.value,
        "model": dict(_CONFIG.value.model),
        "settings": {},
    }
    for horizon, samples in ((base_s, base_n), (2 * base_s, base_n), (base_s, 2 * base_n)):
        row = bench(setup, graphdef, params, horizon, samples)
        results["settings"][f"S={horizon},N={samples}"] = row
        print(f"S={horizon} N={samples}: " + ", ".join(f"{k}={v:.4g}" for k, v in row.items()))
    settings = results["settings"]
    base = settings[f"S={base_s},N={base_n}"]
    results["continuations_per_sec"] = base["continuations_per_sec"]
    results["policy_turns_per_sec"] = base["policy_turns_per_sec"]
    results[f"cost_ratio_horizon_{2 * base_s}_vs_{base_s}"] = (
        settings[f"S={2 * base_s},N={base_n}"]["seconds"] / base["seconds"]
    )
    results[f"cost_ratio_n_{2 * base_n}_vs_{base_n}"] = (
        settings[f"S={base_s},N={2 * base_n}"]["seconds"] / base["seconds"]
    )
    print(json.dumps(results, indent=2))
    if _JSON_OUT.value:
        with open(_JSON_OUT.value, "w") as f:
            json.dump(results, f, indent=2)


def bench(setup, graphdef, params, horizon: int, samples: int) -> dict[str, float]:
    """Seconds of one `mc_values` over every played turn of a batch, and throughputs."""
    env = ToolWorld(horizon_config(16, max_turns=horizon))
    config = TrainConfig()
    weights = jnp.asarray(reward_weights(config, "outcome"))
    rollout = jax.jit(make_rollout(env, graphdef, setup.rollout_config, with_carries=True))
    keys = jax.random.split(jax.random.key(0), 2 * _BATCH.value)
    trajectory, carries = rollout(params, keys[: _BATCH.value], keys[_BATCH.value :])
    play = lm.play_policy(env, graphdef, setup.rollout_config, params)
    estimate = jax.jit(
        lambda forks, prefix, key: mc.mc_values(
            play,
            forks,
            prefix,
            key,
            num_samples=samples,
            reward_weights=weights,
            config=config,
            chunk_size=_CHUNK.value,
        )
    )
    forks = lm.forks_from_carries(carries)
    prefix = mc.trajectory_signals(trajectory)
    start = time.perf_counter()
    jax.block_until_ready(estimate(forks, prefix, jax.random.key(1)))
    compile_s = time.perf_counter() - start
    times = []
    for repeat in range(_REPEATS.value):
        start = time.perf_counter()
        jax.block_until_ready(estimate(forks, prefix, jax.random.key(2 + repeat)))
        times.append(time.perf_counter() - start)
    seconds = min(times)
    played = int(np.asarray(trajectory.turn_mask).sum())
    continuations = 2 * samples * played  # V and Q of every played turn
    return dict(
        seconds=seconds,
        seconds_median=statistics.median(times),
        compile_seconds=compile_s,
        played_turns=played,
        continuations=continuations,
        continuations_per_sec=continuations / seconds,
        policy_turns_per_sec=continuations * horizon / seconds,
    )


if __name__ == "__main__":
    app.run(main)
