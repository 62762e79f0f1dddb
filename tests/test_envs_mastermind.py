"""Mastermind (rlagent.envs.mastermind): TextArena's rules in JAX, through every layer.

The reference is the textarena package itself (the differential test, skipped without
it; experiments/mastermind_differential.py plays 10,000 games per configuration) and
plain-Python twins of the peg count and the consistent set here.
"""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlagent.credit import mc
from rlagent.envs import StepType
from rlagent.envs import check_environment
from rlagent.envs.base import random_action
from rlagent.envs.mastermind import LEVELS
from rlagent.envs.mastermind import TEXTARENA_IDS
from rlagent.envs.mastermind import Mastermind
from rlagent.envs.mastermind import MastermindConfig
from rlagent.envs.mastermind import level_config
from rlagent.envs.mastermind import rules
from rlagent.envs.mastermind.config import all_codes
from rlagent.envs.mastermind.config import heldout_codes
from rlagent.envs.splits import MAX_SPLIT_ATTEMPTS
from rlagent.envs.splits import heldout_index_int
from rlagent.models import Policy
from rlagent.models import PolicyConfig
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_rollout
from rlagent.train import TrainConfig
from rlagent.train import make_train
from rlagent.train.ppo import policy_graphdef
from rlagent.train.rewards import reward_weights

TINY = Mastermind(level_config("tiny"))  # 2 digits of 1..4, distinct: 12 codes, 7 guesses.
V0 = Mastermind(level_config("v0"))
SMALL = Mastermind(level_config("tiny", max_turns=2))  # 3 guesses, S = 6 moves.


def _play(env, secret, guesses):
    """Plays tokens `[T, L + 1]` from `secret`; returns the stacked timesteps."""
    state, _ = env.reset(jax.random.key(0))
    state = state._replace(secret=jnp.asarray(secret, jnp.int32))

    def move(state, action):
        state, timestep = env.step(state, action)
        return state, timestep

    return jax.lax.scan(move, state, jnp.asarray(guesses, jnp.int32))


def _moves(env, *guesses):
    """Tokens of guesses given as number lists, or as raw token rows (np.ndarray)."""
    rows = [g if isinstance(g, np.ndarray) else env.vocab.guess_tokens(g) for g in guesses]
    return np.stack(rows)


def _textarena_pegs(secret, guess):
    """TextArena's `_evaluate_guess`, verbatim in logic: two passes striking matches."""
    secret, guess = list(secret), list(guess)
    black = 0
    for i in range(len(secret)):
        if guess[i] == secret[i]:
            black, secret[i], guess[i] = black + 1, None, None
    white = 0
    for i in range(len(secret)):
        if guess[i] is not None and guess[i] in secret:
            white += 1
            secret[secret.index(guess[i])] = None
    return black, white


# -- configuration -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, name",
    [
        (dict(code_length=7, num_numbers=6), "code_length"),  # no code of distinct digits
        (dict(code_length=0), "code_length"),
        (dict(num_numbers=0), "num_numbers"),
        (dict(max_turns=2.5), "max_turns"),
        (dict(max_turns=-1), "max_turns"),
        (dict(duplicate_numbers=1), "duplicate_numbers"),
        (dict(error_allowance=-1), "error_allowance"),
        (dict(digit_tokens=5), "digit_tokens"),
        (dict(grammar="loose"), "grammar"),
        (dict(verdict="exact", code_length=6, num_numbers=12, duplicate_numbers=True), "verdict"),
        (dict(verdict_invalid=0.5), "verdict_invalid"),
        (dict(oracle_candidates=0), "oracle_candidates"),
        (dict(task_split="test"), "task_split"),
        (dict(code_length=1, num_numbers=4, task_split="train"), "task_split"),  # none out
    ],
)
def test_config_refuses_a_bad_field_by_name(fields, name):
    with pytest.raises(ValueError, match=rf"MastermindConfig\.{name}:"):
        MastermindConfig(**fields)


def test_levels_and_sizes():
    assert MastermindConfig(code_length=7, num_numbers=6, duplicate_numbers=True).num_codes == 6**7
    sizes = {level: level_config(level).num_codes for level in LEVELS}
    assert sizes == {"tiny": 12, "v0": 360, "classic": 1296, "hard": 1680, "extreme": 12**6}
    assert not level_config("extreme").enumerated and level_config("hard").enumerated
    assert V0.max_turns == 2 * 21 and V0.turn_len == 5 and V0.obs_len == 7
    with pytest.raises(ValueError, match="Unknown Mastermind level"):
        level_config("easy")


# -- held-out codes ----------------------------------------------------------------------


def _old_secrets(config, keys):
    """`[B, L]` the secrets of `reset` before task_split existed, computed directly."""

    def draw(key):
        secret_key, _ = jax.random.split(key)
        if config.duplicate_numbers:
            shape = (config.code_length,)
            return jax.random.randint(secret_key, shape, 1, config.num_numbers + 1)
        return jax.random.permutation(secret_key, config.num_numbers)[: config.code_length] + 1

    return np.asarray(jax.vmap(draw)(keys))


def _split_resets(config, keys):
    """(secrets [B, L], oracle keys [B, 2]) of one jitted, vmapped reset of all the keys."""
    state, _ = jax.jit(jax.vmap(Mastermind(config).reset))(keys)
    return np.asarray(state.secret), np.asarray(state.key)


def test_heldout_codes_are_a_fixed_hashed_quarter_of_the_code_space():
    """A code's cell is its mixed-radix index (digit i weighs N**i); held out iff
    fmix32(index + salt) % 4 == 0, checked against ToolWorld's plain-Python hash."""
    fractions = {}
    for level in ("tiny", "v0", "classic", "hard"):
        config = level_config(level)
        codes = all_codes(config)
        held = np.asarray(heldout_codes(config, codes))
        n = config.num_numbers
        index = [sum(int(d - 1) * n**i for i, d in enumerate(code)) for code in codes]
        twin = [heldout_index_int(i) for i in index]
        assert held.tolist() == twin
        fractions[level] = held.mean()
    assert fractions["v0"] == 95 / 360 and 0.15 <= fractions["v0"] <= 0.35
    assert fractions == pytest.approx({"tiny": 3 / 12, "v0": 95 / 360, "classic": 301 / 1296,
                                       "hard": 403 / 1680})  # fmt: skip
    assert heldout_codes(V0.config, codes[:7][None]).shape == (1, 7)  # broadcasts
    assert MAX_SPLIT_ATTEMPTS == 256


def test_a_one_sided_split_is_refused_with_the_counts_of_both_sides():
    with pytest.raises(ValueError, match=r"task_split: .* the 4 codes hold out 0 and leave 4"):
        MastermindConfig(code_length=1, num_numbers=4, task_split="heldout")
    # Built under a trace, the check still runs on concrete values.
    assert jax.jit(lambda: level_config("tiny", task_split="train").num_codes)() == 12
    # Too large to enumerate: no check (a quarter is certain in practice).
    assert level_config("extreme", task_split="heldout").task_split == "heldout"


@pytest.mark.parametrize("level", ["tiny", "v0"])
def test_split_resets_draw_only_their_side_and_cover_it(level):
    """4,096 vmapped resets a split: 'train' draws no held-out code, 'heldout' only
    held-out ones, each side's codes all drawn about equally often (no bias from the
    redraw); the first draw and the oracle's key are those of 'all'."""
    base = level_config(level)
    codes = all_codes(base)
    held = np.asarray(heldout_codes(base, codes))
    keys = jax.random.split(jax.random.key(11), 4096)
    old = _old_secrets(base, keys)
    everything, all_keys = _split_resets(base, keys)
    np.testing.assert_array_equal(everything, old)  # 'all' draws as before
    cell = {tuple(code): c for c, code in enumerate(codes.tolist())}
    for split, side in (("train", ~held), ("heldout", held)):
        secrets, oracle_keys = _split_resets(dataclasses.replace(base, task_split=split), keys)
        drawn = np.asarray([cell[tuple(code)] for code in secrets.tolist()])
        assert side[drawn].all()
        counts = np.bincount(drawn, minlength=len(codes))[side]
        assert (counts > 0).all()  # every code of the side is drawn
        expected = len(keys) / side.sum()
        chi2 = ((counts - expected) ** 2 / expected).sum()
        assert chi2 < side.sum() + 6 * np.sqrt(2 * side.sum())
        np.testing.assert_array_equal(oracle_keys, all_keys)  # unaffected by redraws
        fits = np.asarray(heldout_codes(base, old)) == (split == "heldout")
        np.testing.assert_array_equal(secrets[fits], old[fits])  # first draw is 'all's


def test_split_resets_are_deterministic_and_meet_the_protocol():
    keys = jax.random.split(jax.random.key(5), 64)
    classic = level_config("classic")  # duplicates: 'all' draws as before there too
    np.testing.assert_array_equal(_split_resets(classic, keys)[0], _old_secrets(classic, keys))
    train = Mastermind(dataclasses.replace(classic, task_split="train"))
    check_environment(train)
    reset = jax.jit(train.reset)
    first = [np.asarray(reset(jax.random.key(k))[0].secret) for k in range(8)]
    again = [np.asarray(reset(jax.random.key(k))[0].secret) for k in range(8)]
    np.testing.assert_array_equal(first, again)
    assert not np.asarray(heldout_codes(train.config, np.stack(first))).any()
    assert len({tuple(code) for code in np.stack(first).tolist()}) > 1


def test_heldout_env_is_the_heldout_split_of_a_training_env():
    train = Mastermind(level_config("v0", task_split="train"))
    heldout = train.heldout_env()
    assert isinstance(heldout, Mastermind)
    assert heldout.config == dataclasses.replace(train.config, task_split="heldout")
    for split in ("all", "heldout"):
        env = Mastermind(level_config("v0", task_split=split))
        with pytest.raises(ValueError, match=r"MastermindConfig\.task_split='train'"):
            env.heldout_env()


# -- rules -------------------------------------------------------------------------------


def test_pegs_are_textarenas_two_pass_count():
    rng = np.random.default_rng(0)
    secrets, guesses = rng.integers(1, 5, (2, 500, 5))  # duplicates: the hard cases
    black, white = rules.pegs(jnp.asarray(secrets), jnp.asarray(guesses), 4)
    expected = np.asarray([_textarena_pegs(s, g) for s, g in zip(secrets, guesses, strict=True)])
    np.testing.assert_array_equal(np.stack([black, white], axis=1), expected)


def test_invalid_moves_are_warned_once_then_end_the_game_with_its_completion():
    vocab = V0.vocab
    short = vocab.guess_tokens([1, 2, 3, 4])
    short[3:] = [rules.END, rules.PAD]
    moves = _moves(V0, [1, 2, 5, 6], [1, 1, 2, 3], [4, 3, 2, 1], [1, 2, 5, 6], short)
    moves = np.concatenate([moves, _moves(V0, [2, 1, 3, 4], [1, 2, 3, 4])])
    _, ts = _play(V0, [1, 2, 3, 4], moves)
    reasons = np.asarray(ts.signals.reason)
    # A valid guess forgives the warned duplicate; the repeat then the short turn, two
    # invalid moves in a row, end the game (absorbing after).
    assert reasons.tolist() == [0, rules.DUPLICATE, 0, rules.REPEAT, rules.LENGTH, 0, 0]
    over = np.asarray(ts.step_type) == StepType.LAST
    assert over.tolist() == [False, False, False, False, True, True, True]
    # TextArena pays the latest guess's completion: [4 3 2 1] has 0 black, 4 white.
    np.testing.assert_allclose(np.asarray(ts.signals.outcome), [0, 0, 0, 0, 0.5, 0, 0])
    np.testing.assert_array_equal(np.asarray(ts.discount)[4:], 0.0)
    np.testing.assert_array_equal(np.asarray(ts.signals.violations), [0, 1, 0, 1, 1, 0, 0])
    np.testing.assert_array_equal(np.asarray(ts.observation.progress[:, 1]), [1, 3, 1, 3, 3, 3, 3])


def test_the_turn_limit_allows_max_turns_plus_one_guesses():
    env = Mastermind(level_config("tiny", max_turns=2))
    _, ts = _play(env, [4, 3], _moves(env, [1, 2], [2, 1], [3, 4], [4, 3]))
    assert (np.asarray(ts.step_type) == StepType.LAST).tolist() == [False, False, True, True]
    # The third guess [3 4] (0 black, 2 white) ends it: completion (0 + 2 / 2) / 2.
    np.testing.assert_allclose(np.asarray(ts.signals.outcome), [0, 0, 0.5, 0])
    assert not np.asarray(ts.signals.success).any()
    assert env.vocab.name(int(ts.observation.tokens[2, 0])) == "LIMIT"


def test_a_win_pays_one_and_the_game_is_absorbing():
    state, ts = _play(TINY, [2, 3], _moves(TINY, [1, 2], [2, 3], [3, 4]))
    np.testing.assert_array_equal(np.asarray(ts.signals.success), [False, True, False])
    np.testing.assert_allclose(np.asarray(ts.reward), [0, 1, 0])
    assert int(state.turn) == 2 and int(state.num_guesses) == 2
    assert TINY.vocab.name(int(ts.observation.tokens[1, 0])) == "WON"
    np.testing.assert_array_equal(np.asarray(ts.observation.progress[-1]), [2, 1])
    np.testing.assert_array_equal(np.asarray(ts.observation.tokens[1]), ts.observation.tokens[2])


def test_format_errors_and_the_text_of_a_turn():
    vocab = V0.vocab
    assert vocab.turn_text(vocab.guess_tokens([2, 1, 4, 5])) == "[2 1 4 5]"
    peg = vocab.guess_tokens([2, 1, 4, 5])
    peg[1] = vocab.first_black + 2
    empty = np.asarray([rules.END, 0, 0, 0, 0], np.int32)
    long = vocab.guess_tokens([2, 1, 4, 5])
    long[4] = vocab.first_digit
    assert vocab.turn_text(peg) == "[2 B2 4 5]" and vocab.turn_text(empty) == "[]"
    _, ts = _play(V0, [1, 2, 3, 4], _moves(V0, peg, [1, 2, 3, 5], empty, [1, 2, 5, 3], long))
    assert np.asarray(ts.signals.reason).tolist() == [1, 0, 1, 0, rules.LENGTH]
    wide = Mastermind(level_config("v0", digit_tokens=9))
    _, ts = _play(wide, [1, 2, 3, 4], _moves(wide, [1, 2, 3, 9]))
    assert int(ts.signals.reason[0]) == rules.RANGE


# -- tokens and grammar ------------------------------------------------------------------


def _well_formed_turns(env, state):
    """Every turn the allowed_tokens tree permits (a depth-first walk)."""
    turns, stack = [], [()]
    allowed = jax.jit(env.allowed_tokens)
    while stack:
        prefix = stack.pop()
        if len(prefix) == env.turn_len:
            turns.append(prefix)
            continue
        padded = jnp.asarray(list(prefix) + [0] * (env.turn_len - len(prefix)), jnp.int32)
        mask = np.asarray(allowed(state, padded, jnp.int32(len(prefix))))
        stack.extend(prefix + (int(t),) for t in np.flatnonzero(mask))
    return turns


@pytest.mark.parametrize("level", ["tiny", "classic"])
def test_allowed_tokens_are_exactly_the_well_formed_guesses(level):
    env = Mastermind(level_config(level, max_enumerated_codes=10 if level == "classic" else 64))
    state, _ = env.reset(jax.random.key(0))
    turns = _well_formed_turns(env, state) if level == "tiny" else None
    if turns is not None:
        codes = {tuple(env.vocab.guess_tokens(c)) for c in all_codes(env.config)}
        assert set(turns) == codes and len(turns) == len(codes)
    keys = jax.random.split(jax.random.key(1), 512)
    sampled = np.asarray(jax.vmap(lambda k: random_action(env, state, k))(keys))
    assert (sampled[:, -1] == rules.END).all()
    digits = sampled[:, :-1] - env.vocab.first_digit + 1
    assert ((digits >= 1) & (digits <= env.config.num_numbers)).all()
    if not env.config.duplicate_numbers:
        assert all(len(set(row)) == len(row) for row in digits.tolist())


def test_novel_and_free_grammars():
    novel = Mastermind(level_config("tiny", grammar="novel"))
    state, _ = _play(novel, [4, 3], _moves(novel, [1, 2], [1, 3]))
    prefix = jnp.asarray(novel.vocab.guess_tokens([1, 0]), jnp.int32)
    allowed = np.flatnonzero(novel.allowed_tokens(state, prefix, jnp.int32(1)))
    assert [novel.vocab.name(t) for t in allowed] == ["4"]  # 2 and 3 repeat a guess
    free = Mastermind(level_config("tiny", grammar="free"))
    mask = np.asarray(free.allowed_tokens(state, prefix, jnp.int32(0)))
    assert mask.sum() == free.token_spec.vocab_size - 1 and not mask[rules.PAD]


# -- protocol, determinism, compile-once -------------------------------------------------


def test_meets_the_protocol_and_steps_deterministically_with_one_compile():
    for level in LEVELS:
        check_environment(Mastermind(level_config(level)))
    reset = jax.jit(chex.assert_max_traces(V0.reset, n=1))
    step = jax.jit(chex.assert_max_traces(V0.step, n=1))
    act = jax.jit(lambda state, key: random_action(V0, state, key))
    keys = jax.random.split(jax.random.key(3), 6)
    runs = []
    for _ in range(2):
        state, ts = reset(keys[0])
        trace = [ts]
        for key in keys[1:]:
            state, ts = step(state, act(state, key))
            trace.append(ts)
        runs.append(trace)
    chex.assert_trees_all_equal(*runs)
    assert ts.observation.tokens.shape == (V0.obs_len,) and ts.observation.progress.shape == (2,)


# -- verdict -----------------------------------------------------------------------------


def test_the_verdict_is_the_shrinking_of_the_consistent_set():
    """Checked against a brute-force consistent set over random well-formed play."""
    episodes = mc.sample_env_episodes(V0, mc.uniform_random(V0), jax.random.key(4), 16)
    codes = all_codes(V0.config)
    secrets = np.asarray(episodes.states.secret[:, 0])
    actions = np.asarray(episodes.actions)
    signals = episodes.signals
    for game in range(16):
        alive = np.ones(len(codes), bool)
        for move in np.flatnonzero(np.asarray(signals.turn_mask[game])):
            verdict = float(signals.signals["verdict"][game, move])
            if float(signals.signals["violations"][game, move]):
                assert verdict == -1.0
                continue
            guess = actions[game, move, :-1] - V0.vocab.first_digit + 1
            feedback = _textarena_pegs(secrets[game], guess)
            after = alive & np.asarray([_textarena_pegs(code, guess) == feedback for code in codes])
            won = feedback[0] == 4
            assert verdict == (1.0 if won or after.sum() < alive.sum() else 0.0)
            alive = after


def test_the_consistent_verdict_labels_consistent_guesses():
    env = Mastermind(level_config("v0", verdict="consistent"))
    # Secret 1234. [5 6 1 2] (0 black, 2 white); [1 2 5 6] is consistent with it, [5 6 3 4]
    # is not (it would have scored 0 black, 2 white only with 3 and 4 misplaced... it
    # scores 0 black 2 white against 5612? pegs(5634, 5612) = 2 black).
    _, ts = _play(env, [1, 2, 3, 4], _moves(env, [5, 6, 1, 2], [5, 6, 3, 4], [2, 1, 3, 4]))
    np.testing.assert_array_equal(np.asarray(ts.signals.verdict), [1.0, 0.0, 1.0])
    _, exact = _play(V0, [1, 2, 3, 4], _moves(V0, [5, 6, 1, 2], [5, 6, 3, 4], [2, 1, 3, 4]))
    np.testing.assert_array_equal(np.asarray(exact.signals.verdict), [1.0, 1.0, 1.0])


# -- oracle and random play ---------------------------------------------------------------


def _solved(env, policy, games, seed=0):
    episodes = mc.sample_env_episodes(env, policy, jax.random.key(seed), games)
    signals = episodes.signals
    played = np.asarray(signals.turn_mask)
    guesses = np.sum(played & (np.asarray(signals.signals["violations"]) == 0), axis=1)
    return np.asarray(signals.success.any(axis=1)), guesses, played


@pytest.mark.parametrize(
    "level, games, mean_guesses",
    [("v0", 256, 4.17), ("extreme", 12, 15.5)],
)
def test_the_oracle_solves_every_game_within_the_limit(level, games, mean_guesses):
    env = Mastermind(level_config(level))
    solved, guesses, _ = _solved(env, mc.oracle(env), games)
    assert solved.all() and guesses.max() <= env.config.guess_limit
    assert guesses.mean() == pytest.approx(mean_guesses, abs=0.35 if level != "extreme" else 2.0)


def test_free_sampling_breaks_rules():
    """(Uniform well-formed play: docs/mastermind.md, e.g. 6% on v0.)"""
    free = Mastermind(level_config("tiny", grammar="free"))
    solved, guesses, played = _solved(free, mc.uniform_random(free), 64)
    assert solved.mean() < 0.1 and (played.sum(axis=1) - guesses >= 1).all()


# -- rollout, trainer, Monte-Carlo credit --------------------------------------------------

POLICY = PolicyConfig(
    vocab_size=SMALL.token_spec.vocab_size, d_model=16, num_layers=1, num_heads=2,
    num_kv_heads=1, mlp_dim=16, num_summary_slots=0, summary_dim=8,
)  # fmt: skip
CONFIG = TrainConfig(num_updates=2, num_groups=2, group_size=2, reward="composed")


def test_a_free_rollout_records_mastermind_signals_and_invalid_moves():
    """Free sampling (constrained=False) breaks rules; the trainer's test samples constrained."""
    graphdef = policy_graphdef(POLICY)
    _, params = nnx.split(Policy(POLICY, rngs=nnx.Rngs(0)))
    rollout = RolloutConfig(window=2, constrained=False)
    keys = jax.random.split(jax.random.key(0), 16)
    traj = jax.jit(make_rollout(SMALL, graphdef, rollout))(params, keys[:8], keys[8:])
    assert set(traj.signals) == set(SMALL.signal_names)
    violations = np.asarray(traj.signals["violations"])
    verdict = np.asarray(traj.signals["verdict"])
    assert violations.sum() > 0 and (verdict[violations > 0] == -1.0).all()
    assert (np.asarray(traj.signals["outcome"]).sum(axis=1) <= 1.0 + 1e-6).all()
    np.testing.assert_array_equal(
        np.asarray(traj.success).any(axis=1), np.isclose(traj.signals["outcome"], 1.0).any(axis=1)
    )


def test_the_trainer_runs_two_updates_on_it():
    trainer = make_train(CONFIG, SMALL, POLICY, RolloutConfig(window=2, constrained=True))
    _, metrics = jax.jit(trainer.train)(jax.random.key(0))
    assert {"success", "guesses", "invalid_rate", "solve_guesses", "outcome"} <= set(metrics)
    assert all(np.isfinite(np.asarray(v)).all() for v in metrics.values())


@pytest.mark.parametrize("continuation", ["oracle", "uniform_random"])
def test_monte_carlo_forks_continue_with_env_policies(continuation):
    """From the first turn: the oracle always solves it, uniform play as often as it does
    in whole episodes."""
    env, games = SMALL, 32
    policy = getattr(mc, continuation)(env)
    episodes = mc.sample_env_episodes(env, mc.uniform_random(env), jax.random.key(1), 512)
    direct = np.asarray(episodes.signals.success.any(axis=1)).mean()
    episodes = jax.tree.map(lambda x: x[:games], episodes)
    forks = jax.tree.map(lambda x: x[:, :1], episodes.states)
    prefix = jax.tree.map(lambda x: x[:, :1], mc.TurnSignals(*episodes.signals))
    prefix = prefix._replace(turn_mask=jnp.ones_like(prefix.turn_mask))
    values = mc.mc_values(
        mc.play_env_policy(env, policy),
        jax.tree.map(lambda x: jnp.broadcast_to(x, (games, env.max_turns, *x.shape[2:])), forks),
        jax.tree.map(lambda x: jnp.pad(x, [(0, 0), (0, env.max_turns - 1)]), prefix),
        jax.random.key(2),
        num_samples=64,
        reward_weights=reward_weights(CONFIG),
        config=CONFIG,
    )
    expected = 1.0 if continuation == "oracle" else direct
    assert float(jnp.mean(values.success[:, 0])) == pytest.approx(expected, abs=0.05)


# -- against the textarena package ----------------------------------------------------------


def test_levels_are_textarenas_registered_configurations():
    from textarena.envs.registration import ENV_REGISTRY

    for level, env_id in TEXTARENA_IDS.items():
        assert ENV_REGISTRY[env_id].kwargs == LEVELS[level]


@pytest.mark.parametrize("level", ["v0", "hard", "extreme", "classic"])
def test_differential_against_textarena(level):
    """Same secrets and moves through textarena and the port: identical pegs, validity,
    ending and reward (125 games each here; 10,000 each in docs/results/)."""
    from rlagent.envs.mastermind.differential import compare

    wide = level != "classic"  # out-of-range digits expressible
    config = level_config(level, digit_tokens=level_config(level).num_numbers + 2 * wide)
    result = compare(config, num_games=125, seed=7)
    assert result["mismatched_games"] == [], result["first_mismatch"]
    assert min(result["endings"][e] for e in ("won", "turn_limit", "invalid_moves")) > 0
    assert result["endings"]["unfinished"] == 0
