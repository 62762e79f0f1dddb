"""Random and oracle play on the training and held-out codes of mastermind_heldout's game.

    python -m experiments.analyses.mastermind_baseline \
        > docs/results/mastermind_heldout/baseline.json

The games of experiments/configs/mastermind_heldout.py (a code of 3 numbers of 1..4
without repeats, 6 guesses; `:v0`, 4 numbers of 1..6 and 8 guesses, keys prefixed `v0_`):
4,096 games per side and policy, uniform random play over the grammar
(`rlagent.envs.base.random_action`) and the environment's oracle; prints the fraction
of games won.
"""

import functools
import json

import jax
import jax.numpy as jnp

from rlagent.envs.base import random_action
from rlagent.envs.base import unroll
from rlagent.envs.mastermind import Mastermind
from rlagent.envs.mastermind import horizon_config


def win_rate(env, policy, games=4096):
    run = jax.jit(jax.vmap(functools.partial(unroll, env, policy)))
    result = run(jax.random.split(jax.random.key(7), games))
    return float(jnp.mean(jnp.max(result.timesteps.signals.success, axis=-1) > 0))


GAMES = {
    "": (6, dict(code_length=3, num_numbers=4)),
    "v0_": (8, dict(code_length=4, num_numbers=6)),
}


def main():
    out = {}
    for prefix, (guesses, code) in GAMES.items():
        train = Mastermind(horizon_config(guesses, **code, task_split="train"))
        for side, env in (("train", train), ("heldout", train.heldout_env())):
            out[f"{prefix}{side}_random"] = win_rate(env, functools.partial(random_action, env))
            oracle = lambda state, key, env=env: env.oracle_action(state)  # noqa: E731
            out[f"{prefix}{side}_oracle"] = win_rate(env, oracle)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
