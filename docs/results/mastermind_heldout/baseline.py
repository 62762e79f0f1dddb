"""Random and oracle play on the training and held-out codes of mastermind_heldout's game.

    cd docs/results/mastermind_heldout && python baseline.py > baseline.json

The game of experiments/configs/mastermind_heldout.py (a code of 3 numbers of 1..4
without repeats, 6 guesses): 4,096 games per side and policy, uniform random play over
the grammar (`rlagent.envs.base.random_action`) and the environment's oracle; prints the
fraction of games won.
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


def main():
    train = Mastermind(horizon_config(6, code_length=3, num_numbers=4, task_split="train"))
    out = {}
    for side, env in (("train", train), ("heldout", train.heldout_env())):
        out[f"{side}_random"] = win_rate(env, functools.partial(random_action, env))
        out[f"{side}_oracle"] = win_rate(env, lambda state, key, env=env: env.oracle_action(state))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
