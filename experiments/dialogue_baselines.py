"""Oracle and uniform-random play of the dialogue environment, per curriculum level.

Usage:
  python -m experiments.dialogue_baselines --episodes=512 --out=docs/results/dialogue_baselines

Prints (and writes `baselines.md` / `baselines.json` under `--out`) per level: the
shortest dialogue, success and mean turns of the oracle and of uniform random play over
the grammar, and the observed feedback rate and flip rate of the simulated user
(feedback shown on a turn / shown feedback that disagrees with the user's opinion).
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags

from experiments import launch
from rlagent.envs.dialogue import DialogueEnv
from rlagent.envs.dialogue import level_config
from rlagent.envs.dialogue import oracle_policy
from rlagent.envs.dialogue import random_policy
from rlagent.envs.dialogue import shortest_dialogue
from rlagent.envs.dialogue import unroll
from rlagent.host import compile_cache
from rlagent.host import provenance

# allow_override: tests import this module beside other launchers with these names.
_EPISODES = flags.DEFINE_integer(
    "episodes", 512, "dialogues per level and policy", allow_override=True
)
_LEVELS = flags.DEFINE_string("levels", "1,2,3,4,5", "curriculum levels", allow_override=True)
_OUT = flags.DEFINE_string(
    "out", None, "folder for baselines.md / baselines.json", allow_override=True
)
_CACHE_DIR = launch.define_cache_flag()


def play(env: DialogueEnv, policy, key: jax.Array, episodes: int) -> dict[str, float]:
    """Success, turns and feedback statistics of `episodes` dialogues of `policy`."""
    run = jax.jit(jax.vmap(lambda k: unroll(env, policy, k)))
    out = run(jax.random.split(key, episodes))
    signals = out.timesteps.signals
    played = np.asarray(jnp.cumsum(out.timesteps.step_type == 2, axis=1) <= 1)
    last = np.asarray(out.timesteps.step_type == 2) & played
    turns = played.sum(axis=1)  # turns up to and including the last
    shown = np.asarray(signals.feedback != 0) & played
    opinion = np.asarray(signals.opinion)
    flipped = shown & (np.sign(np.asarray(signals.feedback)) != np.sign(opinion))
    return {
        "success": float(np.mean(np.any(np.asarray(signals.success) & last, axis=1))),
        "turns": float(np.mean(turns)),
        "feedback_rate": float(shown.sum() / max(played.sum(), 1)),
        "flip_rate": float(flipped.sum() / max(shown.sum(), 1)),
    }


def levels(text: str, episodes: int) -> list[int]:
    """The levels of `--levels` (comma-separated, each a level of `level_config`), after
    refusing bad flags naming them (`--episodes=0` would average over no dialogue)."""
    if episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {episodes}.")
    parsed = [item.strip() for item in text.split(",") if item.strip()]
    if not parsed:
        raise ValueError("--levels names no level.")
    out = []
    for item in parsed:
        try:
            level_config(int(item))
        except ValueError as error:
            raise ValueError(f"--levels: {item!r}: {error}") from None
        out.append(int(item))
    if len(set(out)) < len(out):
        raise ValueError(f"--levels names a level more than once: {text!r}.")
    return out


def main(argv):
    del argv
    launch.run_reported(_baselines)


def _baselines():
    chosen = levels(_LEVELS.value, _EPISODES.value)
    compile_cache.enable_compilation_cache(_CACHE_DIR.value)
    rows = []
    for level in chosen:
        config = level_config(level)
        env = DialogueEnv(config)
        key = jax.random.key(level)
        oracle = play(env, lambda s, k, env=env: oracle_policy(env, s), key, _EPISODES.value)
        rand = play(env, lambda s, k, env=env: random_policy(env, s, k), key, _EPISODES.value)
        rows.append({"level": level, "shortest": int(shortest_dialogue(config)),
                     "oracle": oracle, "random": rand})  # fmt: skip
    lines = [
        f"Dialogue baselines, {_EPISODES.value} dialogues per level and policy.",
        "",
        "| level | shortest | oracle success | oracle turns | random success | random turns "
        "| feedback rate (random) | flip rate (random) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        o, q = r["oracle"], r["random"]
        lines.append(
            f"| {r['level']} | {r['shortest']} | {o['success']:.3f} | {o['turns']:.2f} | "
            f"{q['success']:.3f} | {q['turns']:.2f} | {q['feedback_rate']:.3f} | "
            f"{q['flip_rate']:.3f} |"
        )
    text = "\n".join(lines)
    print(text)
    if _OUT.value:
        os.makedirs(_OUT.value, exist_ok=True)
        with open(os.path.join(_OUT.value, "baselines.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(_OUT.value, "baselines.json"), "w") as f:
            json.dump(rows, f, indent=2)
        provenance.write(_OUT.value, provenance.collect({"episodes": _EPISODES.value,
                                                         "levels": _LEVELS.value}))  # fmt: skip


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
