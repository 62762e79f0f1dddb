r"""The JAX Mastermind against the textarena package, and its oracle's and random play.

Plays `--games` generated games per configuration (TextArena's three registered ones and
the duplicate-allowing 'classic') through textarena's `MastermindEnv` and the JAX port
(`rlagent.envs.mastermind.differential.compare`), digit_tokens = num_numbers + 2 so that
out-of-range guesses occur; then `--oracle_games` games of the oracle and of the uniform
policy (grammars well_formed / novel) per level.

    pip install textarena==0.7.4
    python experiments/mastermind_differential.py --games=10000 \
        --json_out=docs/results/mastermind_differential/result.json

Prints one line per configuration and policy; `--json_out` writes the numbers.
"""

from __future__ import annotations

import json
import os
import time

import jax
import numpy as np
from absl import app
from absl import flags

from experiments import launch
from rlagent.credit import mc
from rlagent.envs.mastermind import TEXTARENA_IDS
from rlagent.envs.mastermind import Mastermind
from rlagent.envs.mastermind import level_config
from rlagent.envs.mastermind.differential import compare
from rlagent.host import compile_cache
from rlagent.host import provenance

_GAMES = flags.DEFINE_integer(
    "games", 10000, "Differential games per configuration.", allow_override=True
)
_ORACLE_GAMES = flags.DEFINE_integer(
    "oracle_games", 2000, "Oracle / random games per level.", allow_override=True
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the generated games.", allow_override=True)
# allow_override: tests import this module's checks beside other launchers with a json_out.
_JSON_OUT = flags.DEFINE_string(
    "json_out", None, "Write the results as JSON to this path.", allow_override=True
)
_CACHE_DIR = launch.define_cache_flag()
LEVELS = ("v0", "hard", "extreme", "classic")


def main(_):
    launch.run_reported(_differential)


def check_flags(games: int, oracle_games: int) -> None:
    """Zero games would report a differential without a mismatch, and rates of no game."""
    for name, value in (("games", games), ("oracle_games", oracle_games)):
        if value < 1:
            raise ValueError(f"--{name} must be >= 1, got {value}.")


def _differential():
    check_flags(_GAMES.value, _ORACLE_GAMES.value)
    compile_cache.enable_compilation_cache(_CACHE_DIR.value)
    try:
        import textarena
    except ImportError:
        raise ValueError("textarena is not installed: pip install textarena==0.7.4") from None

    results = {"textarena": textarena.__version__, "differential": {}, "policies": {}}
    for level in LEVELS:
        config = level_config(level, digit_tokens=level_config(level).num_numbers + 2)
        start = time.time()
        result = compare(config, _GAMES.value, _SEED.value)
        result["seconds"] = round(time.time() - start, 1)
        result["textarena_id"] = TEXTARENA_IDS.get(level, "MastermindEnv(4, 6, 10, True)")
        results["differential"][level] = result
        print(level, json.dumps({k: v for k, v in result.items() if k != "mismatched_games"}))
    for level in ("tiny", *LEVELS):
        for policy in ("oracle", "random_well_formed", "random_novel"):
            stats = policy_stats(level, policy, _ORACLE_GAMES.value, _SEED.value)
            results["policies"][f"{level}/{policy}"] = stats
            print(level, policy, json.dumps(stats))
    if _JSON_OUT.value:
        with open(_JSON_OUT.value, "w") as out:
            json.dump(results, out, indent=1)
        # provenance.json beside it: command, commit and dirty state, versions, CPU.
        settings = {"games": _GAMES.value, "oracle_games": _ORACLE_GAMES.value, "seed": _SEED.value}
        provenance.write(os.path.dirname(os.path.abspath(_JSON_OUT.value)),
                         provenance.collect(settings))  # fmt: skip


def policy_stats(level: str, policy: str, games: int, seed: int) -> dict[str, float]:
    """Success, guesses (of the solved games, mean and max) and reward of a policy."""
    grammar = "novel" if policy == "random_novel" else "well_formed"
    env = Mastermind(level_config(level, grammar=grammar))
    play = mc.oracle(env) if policy == "oracle" else mc.uniform_random(env)
    episodes = jax.jit(lambda key: mc.sample_env_episodes(env, play, key, games))(
        jax.random.key(seed)
    )
    signals = episodes.signals
    solved = np.asarray(signals.success.any(axis=1))
    played = np.asarray(signals.turn_mask)
    guesses = np.sum(played & (np.asarray(signals.signals["violations"]) == 0), axis=1)
    return {
        "games": games,
        "success": float(solved.mean()),
        "mean_guesses_solved": float(guesses[solved].mean()) if solved.any() else float("nan"),
        "max_guesses_solved": int(guesses[solved].max()) if solved.any() else 0,
        "mean_reward": float(np.asarray(signals.signals["outcome"]).sum(axis=1).mean()),
        "invalid_per_move": float(np.asarray(signals.signals["violations"])[played].mean()),
    }


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
