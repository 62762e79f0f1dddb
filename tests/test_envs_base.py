"""The environment protocol with an environment that is not ToolWorld: a guessing game.

Rollout, trainer, Monte-Carlo credit and reward checks read only `rlagent.envs.base`, so
a second environment plugs in without touching them (docs/architecture.md, "Adding an
environment").
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlagent.credit import mc
from rlagent.envs import StepType
from rlagent.envs import TokenSpec
from rlagent.envs import check_environment
from rlagent.models import Policy
from rlagent.models import PolicyConfig
from rlagent.prm import PRMConfig
from rlagent.prm import prm_factory
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_rollout
from rlagent.train import TrainConfig
from rlagent.train import make_train
from rlagent.train.ppo import policy_graphdef
from rlagent.train.rewards import reward_weights

PAD, END, DIGIT, HIGHER, LOWER = 0, 1, 2, 6, 7  # digits 0..3 are tokens 2..5
DIGITS = 4


class GuessState(NamedTuple):
    secret: jax.Array  # [] int32 in [0, DIGITS)
    turn: jax.Array  # [] int32
    over: jax.Array  # [] bool
    obs: jax.Array  # [2] int32: the last guess and the hint


class GuessSignals(NamedTuple):
    outcome: jax.Array  # [] float32: 1 on the turn that guesses the secret.
    success: jax.Array  # [] bool


class GuessTimeStep(NamedTuple):
    step_type: jax.Array
    reward: jax.Array
    discount: jax.Array
    observation: "GuessObservation"
    signals: GuessSignals


class GuessObservation(NamedTuple):
    tokens: jax.Array  # [2] int32
    progress: jax.Array  # [1] int32: 1 pending, 2 solved


class GuessEnv:
    """Guess a secret digit in `max_turns` turns; a wrong guess is told higher or lower."""

    max_turns, obs_len, turn_len, num_markers = 4, 2, 2, 1
    token_spec = TokenSpec(vocab_size=8, pad=PAD, end=END)
    signal_names = ("outcome",)
    reward_components = ("outcome", "learned_sum", "learned_min", "learned_potential")

    def reset(self, key):
        secret = jax.random.randint(key, (), 0, DIGITS)
        state = GuessState(secret, jnp.int32(0), jnp.bool_(False), jnp.zeros((2,), jnp.int32))
        return state, self._timestep(state, StepType.FIRST, jnp.float32(0.0))

    def step(self, state, action):
        guess = action[0] - DIGIT
        right = (guess == state.secret) & ~state.over
        hint = jnp.where(guess < state.secret, HIGHER, LOWER)
        turn = state.turn + jnp.where(state.over, 0, 1)
        over = state.over | right | (turn >= self.max_turns)
        new = GuessState(state.secret, turn, over, jnp.stack([action[0], hint]).astype(jnp.int32))
        new = jax.tree.map(lambda a, b: jnp.where(state.over, a, b), state, new)
        return new, self._timestep(new, jnp.where(over, StepType.LAST, StepType.MID), right)

    def _timestep(self, state, step_type, right):
        right = jnp.asarray(right, bool)
        return GuessTimeStep(
            step_type=jnp.asarray(step_type, jnp.int8),
            reward=right.astype(jnp.float32),
            discount=jnp.where(right, 0.0, 1.0).astype(jnp.float32),
            observation=self.observe(state),
            signals=GuessSignals(outcome=right.astype(jnp.float32), success=right),
        )

    def observe(self, state):
        return GuessObservation(state.obs, jnp.ones((1,), jnp.int32))

    def allowed_tokens(self, state, prefix, position):
        vocab = jnp.arange(self.token_spec.vocab_size)
        digit = (vocab >= DIGIT) & (vocab < DIGIT + DIGITS)
        return jnp.where(position == 0, digit, vocab == END)

    def episode_over(self, state):
        return state.over

    def episode_turn(self, state):
        return state.turn

    def episode_metrics(self, signals, turn_mask, action_tokens):
        return {"outcome": jnp.mean(jnp.sum(signals["outcome"] * turn_mask, axis=1))}


ENV = GuessEnv()
POLICY = PolicyConfig(
    vocab_size=8, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, mlp_dim=16,
    num_summary_slots=0, summary_dim=8,
)  # fmt: skip
ROLLOUT = RolloutConfig(window=1, constrained=True)
CONFIG = TrainConfig(num_updates=2, num_groups=2, group_size=2, reward="outcome")


def test_the_guessing_game_meets_the_protocol():
    check_environment(ENV)
    with pytest.raises(TypeError, match="lacks"):
        check_environment(object())


def test_rollout_records_the_environments_signals_and_success():
    graphdef = policy_graphdef(POLICY)
    _, params = nnx.split(Policy(POLICY, rngs=nnx.Rngs(0)))
    keys = jax.random.split(jax.random.key(0), 16)
    traj = jax.jit(make_rollout(ENV, graphdef, ROLLOUT))(params, keys[:8], keys[8:])
    assert set(traj.signals) == {"outcome"}
    outcome = np.asarray(traj.signals["outcome"])
    np.testing.assert_array_equal(np.asarray(traj.success), outcome > 0)
    # Every played turn writes a digit then END; an episode ends on its first right guess.
    played = np.asarray(traj.turn_mask)
    tokens = np.asarray(traj.action_tokens)
    assert ((tokens[..., 0] >= DIGIT) & (tokens[..., 0] < DIGIT + DIGITS))[played].all()
    assert (tokens[..., 1] == END)[played].all()
    assert (outcome.sum(axis=1) <= 1).all()


def test_the_trainer_runs_on_it_and_refuses_components_it_lacks():
    trainer = make_train(CONFIG, ENV, POLICY, ROLLOUT)
    _, metrics = jax.jit(trainer.train)(jax.random.key(0))
    assert {"success", "outcome", "turns", "env_turns"} <= set(metrics)
    assert "collapse_rate" not in metrics  # ToolWorld's own metric
    assert all(np.isfinite(np.asarray(v)).all() for v in metrics.values())
    with pytest.raises(ValueError, match=r"\['process'\], which environment GuessEnv"):
        make_train(TrainConfig(num_groups=2, group_size=2, reward="process"), ENV, POLICY, ROLLOUT)


def test_monte_carlo_credit_and_prms_work_or_refuse_by_name():
    """Uniform random guesses from the start: P(success) = 1 - (3/4)^4 (with replacement)."""
    episodes = mc.sample_env_episodes(ENV, mc.uniform_random(ENV), jax.random.key(1), 64)
    forks = jax.tree.map(lambda x: x[:, :1], episodes.states)
    prefix = jax.tree.map(lambda x: x[:, :1], mc.TurnSignals(*episodes.signals))
    prefix = prefix._replace(turn_mask=jnp.ones_like(prefix.turn_mask))
    values = mc.mc_values(
        mc.play_env_policy(ENV, mc.uniform_random(ENV)),
        jax.tree.map(lambda x: jnp.broadcast_to(x, (64, ENV.max_turns, *x.shape[2:])), forks),
        jax.tree.map(lambda x: jnp.pad(x, [(0, 0), (0, ENV.max_turns - 1)]), prefix),
        jax.random.key(2),
        num_samples=64,
        reward_weights=reward_weights(CONFIG),
        config=CONFIG,
    )
    assert float(jnp.mean(values.success[:, 0])) == pytest.approx(1 - 0.75**4, abs=0.03)
    with pytest.raises(ValueError, match="GuessEnv has no oracle_action"):
        mc.oracle(ENV)
    noisy = TrainConfig(num_groups=2, group_size=2, reward="learned_sum")
    with pytest.raises(ValueError, match="verdict"):
        prm_factory(PRMConfig(kind="noisy_oracle"), noisy, ENV, ROLLOUT)(policy_graphdef(POLICY))
