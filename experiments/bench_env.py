r"""Benchmark of ToolWorld: vmapped JAX turns per second against the Python reference.

The work measured is the same on both sides: whole episodes of the oracle policy,
reset included, counting the turns played. JAX plays `--rounds` rounds of a batch of
episodes in one jitted call (reset, then max_turns vmapped turns, the fixed-length pattern
of the rollout; turns after an episode's end are absorbing and not counted); the
plain-Python reference (`rlagent.envs.toolworld.reference`) plays episodes one turn at a time.
Also reports the success rate of the oracle and of the uniform grammatical random policy
at every level.

    python experiments/bench_env.py --json_out=/tmp/bench_env.json

Prints a markdown table; `--json_out` writes the numbers (keys `turns_per_sec_b{B}`,
`speedup_vs_python_b{B}`, `python_turns_per_sec`, `oracle_success_by_level`,
`random_success_by_level`, ...).
"""

from __future__ import annotations

import json
import random
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags

from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.envs.toolworld import oracle_policy
from rlagent.envs.toolworld import random_policy
from rlagent.envs.toolworld import unroll
from rlagent.envs.toolworld.reference import ReferenceToolWorld

_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the results as JSON to this path.")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "64", "1024", "4096"], "Batch sizes.")
_ROUNDS = flags.DEFINE_integer("rounds", 16, "Rounds of `batch` episodes per jitted call.")
_LEVEL = flags.DEFINE_integer("level", 4, "Curriculum level of the throughput benchmark.")
_PYTHON_EPISODES = flags.DEFINE_integer("python_episodes", 5000, "Episodes timed in Python.")
_EPISODES = flags.DEFINE_integer("episodes", 1024, "Episodes per level for success rates.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repetitions (best is reported).")


def jax_turns_per_sec(config: ToolWorldConfig, batch: int, rounds: int, repeats: int):
    """Best played turns/s of `rounds` x `batch` oracle episodes, all in one jitted call.

    Each round resets `batch` environments and plays max_turns turns (`policies.unroll`,
    the fixed-length pattern of the rollout); turns after an episode's end are absorbing
    no-ops and are not counted as played.
    """
    env = ToolWorld(config)

    def oracle(state, key):
        del key
        return oracle_policy(env, state)

    @jax.jit
    def run(keys):  # keys [rounds, batch]
        def one_round(total, round_keys):
            episodes = jax.vmap(lambda key: unroll(env, oracle, key))(round_keys)
            played = episodes.timesteps.step_type != 2
            played = played.sum() + (episodes.timesteps.step_type == 2).any(axis=1).sum()
            solved = episodes.timesteps.signals.success.sum()
            return (total[0] + played, total[1] + solved), None

        return jax.lax.scan(one_round, (jnp.int32(0), jnp.int32(0)), keys)[0]

    best = float("inf")
    for repeat in range(repeats + 1):  # the first call compiles
        keys = jax.random.split(jax.random.PRNGKey(repeat), rounds * batch)
        keys = keys.reshape(rounds, batch, *keys.shape[1:])
        start = time.perf_counter()
        turns, solved = jax.block_until_ready(run(keys))
        if repeat:
            best = min(best, time.perf_counter() - start)
    return int(turns) / best, int(turns), int(solved) / (rounds * batch)


def python_turns_per_sec(config: ToolWorldConfig, episodes: int, repeats: int):
    """Best played turns/s of the reference on `episodes` oracle episodes (reset included)."""
    reference = ReferenceToolWorld(config)
    best = float("inf")
    for repeat in range(repeats):
        rng = random.Random(repeat)
        turns = 0
        start = time.perf_counter()
        for _ in range(episodes):
            state = reference.reset(rng)
            for _ in range(config.max_turns):
                state, timestep = reference.step(state, reference.oracle(state))
                turns += 1
                if timestep.step_type == 2:
                    break
        best = min(best, time.perf_counter() - start)
    return turns / best


def success_by_level(policy_name: str, episodes: int) -> tuple[list, list]:
    """Success rate and mean turns to the end of `episodes` episodes per level 1..4."""
    rates, turns = [], []
    for level in (1, 2, 3, 4):
        env = ToolWorld(ToolWorldConfig(level=level))
        if policy_name == "oracle":

            def policy(state, key, env=env):
                del key
                return oracle_policy(env, state)
        else:

            def policy(state, key, env=env):
                return random_policy(env, state, key)

        play = jax.jit(jax.vmap(lambda key, env=env, policy=policy: unroll(env, policy, key)))
        out = play(jax.random.split(jax.random.PRNGKey(level), episodes))
        success = np.asarray(out.timesteps.signals.success).any(axis=1)
        last = np.asarray(out.timesteps.step_type) == 2
        rates.append(float(success.mean()))
        turns.append(float((last.argmax(axis=1) + 1).mean()))
    return rates, turns


def main(argv):
    del argv
    config = ToolWorldConfig(level=_LEVEL.value)
    results = {
        "level": _LEVEL.value,
        "rounds": _ROUNDS.value,
        "backend": jax.default_backend(),
    }
    start = time.perf_counter()
    python_rate = python_turns_per_sec(config, _PYTHON_EPISODES.value, _REPEATS.value)
    results["python_turns_per_sec"] = python_rate
    rows = []
    for batch in [int(b) for b in _BATCH_SIZES.value]:
        rate, turns, solved = jax_turns_per_sec(config, batch, _ROUNDS.value, _REPEATS.value)
        results[f"turns_per_sec_b{batch}"] = rate
        results[f"speedup_vs_python_b{batch}"] = rate / python_rate
        rows.append((batch, rate, rate / python_rate, turns, solved))
    oracle, oracle_turns = success_by_level("oracle", _EPISODES.value)
    rand, rand_turns = success_by_level("random", _EPISODES.value)
    results.update(
        oracle_success_by_level=oracle,
        oracle_turns_by_level=oracle_turns,
        random_success_by_level=rand,
        random_turns_by_level=rand_turns,
        bench_seconds=time.perf_counter() - start,
    )

    print(
        f"\nToolWorld level {_LEVEL.value}: oracle episodes, reset included, {results['backend']}"
    )
    print("\n| batch | played turns/s | x Python | turns timed | oracle success |")
    print("|---:|---:|---:|---:|---:|")
    for batch, rate, speedup, turns, solved in rows:
        print(f"| {batch} | {rate:,.0f} | {speedup:,.1f} | {turns} | {solved:.3f} |")
    print(f"| Python reference | {python_rate:,.0f} | 1.0 | | |")
    print("\n| level | oracle success | oracle turns | random success | random turns |")
    print("|---:|---:|---:|---:|---:|")
    for level in range(4):
        print(
            f"| {level + 1} | {oracle[level]:.3f} | {oracle_turns[level]:.2f} | "
            f"{rand[level]:.3f} | {rand_turns[level]:.2f} |"
        )
    print(f"\ntotal {results['bench_seconds']:.1f} s")
    if _JSON_OUT.value:
        with open(_JSON_OUT.value, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    jnp.zeros(())  # initialise the backend before timing
    app.run(main)
