"""A history window in text mode (`TextConfig.history_window`): the cached engine evicts
the turns that leave the window from its caches, the scorer masks them out, and both
read the same context (tests/text_helpers.py: a tiny tokenizer and policy)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from text_helpers import play_staggered
from text_helpers import tiny_text_policy
from text_helpers import tiny_tokenizer

from rlagent.models.llama import Llama
from rlagent.models.llama import PolicyConfig
from rlagent.models.llama import TurnWindow
from rlagent.text import TextConfig
from rlagent.text import make_chat
from rlagent.text import make_text_loop
from rlagent.text import to_trajectory
from rlagent.text.guess import GUESS_TOOL
from rlagent.text.guess import GuessNumber
from rlagent.text.score import make_text_score

CONFIG = TextConfig(max_new_tokens=10, obs_len=256, max_prompt_len=600, sample_batch=2,
                    prefill_chunk=16)  # fmt: skip


@pytest.fixture(scope="module")
def setup():
    chat = make_chat(tiny_tokenizer(), tools=[GUESS_TOOL])
    policy_config, graphdef, params = tiny_text_policy(chat)
    return dict(chat=chat, config=policy_config, graphdef=graphdef, params=params)


def _play(setup, window, *, turns=8, split=2, seed=5):
    """Three episodes of `turns` turns (none solved, none truncated), played `split` turns
    and then to the end (the second call rebuilds the caches); the loop and episodes."""
    text = dataclasses.replace(CONFIG, history_window=window)
    loop = make_text_loop(setup["chat"], setup["graphdef"], setup["config"], text)
    episodes = [
        loop.start(GuessNumber(low=100, high=999, max_turns=turns, use_tools=True), s)
        for s in range(3)
    ]
    keys = jax.random.split(jax.random.key(seed), 3)
    if split:
        loop.play(setup["params"], episodes, keys, num_turns=split)
    loop.play(setup["params"], episodes, keys)
    assert [len(e.turns) for e in episodes] == [turns] * 3
    assert not any(e.truncated or e.done and e.turns[-1].signals["outcome"] for e in episodes)
    return loop, episodes


def _assert_same(played, other, atol):
    for a, b in zip(played, other, strict=True):
        assert a.tokens == b.tokens
        for x, y in zip(a.turns, b.turns, strict=True):
            np.testing.assert_allclose(x.logp, y.logp, atol=atol)


def test_a_window_as_long_as_the_episode_drops_nothing(setup):
    """W = 8 turns of 8-turn episodes: the tokens and log-probs (within 1e-6) of the whole
    transcript, though the second `play` call fills its caches read turn by read turn."""
    _, whole = _play(setup, 0)
    loop, windowed = _play(setup, 8)
    _assert_same(windowed, whole, 1e-6)
    assert loop.config.cache_len == CONFIG.cache_len


def test_behaviour_log_probs_are_the_scorers_with_a_short_window(setup):
    """W = 1: the window changes the samples; a play split over two calls samples as one
    call (a rebuilt cache holds the keys sampling computed), and the scorer's log-probs of
    the trajectory, with its turn-window mask, are the behaviour log-probs within 1e-5."""
    _, whole = _play(setup, 0)
    loop, split = _play(setup, 1)
    _, once = _play(setup, 1, split=0)
    _assert_same(split, once, 1e-6)
    assert any(a.tokens != b.tokens for a, b in zip(split, whole, strict=True))
    trajectory = to_trajectory(split, loop.config, setup["chat"].pad_id)
    score = make_text_score(setup["chat"], setup["graphdef"], setup["config"], loop.config)
    mask = np.asarray(trajectory.action_mask)
    scored = np.asarray(score(setup["params"], trajectory))
    np.testing.assert_allclose(scored[mask], np.asarray(trajectory.logp)[mask], atol=1e-5)
    # The same trajectory scored with the whole transcript gives other numbers.
    full = make_text_score(setup["chat"], setup["graphdef"], setup["config"], CONFIG)
    assert np.abs(np.asarray(full(setup["params"], trajectory))[mask] - scored[mask]).max() > 1e-3


def test_the_cache_slots_in_use_stay_bounded_as_turns_grow(setup):
    """The most cache slots an episode's context holds (`CachedSampler.counts`): with
    W = 1 the header and one turn (plus a turn's ids when a cache is refilled), the same
    for 4 and 8 turns; the whole transcript grows with the turns."""
    slots = {}
    for window in (0, 1):
        for turns in (4, 8):
            loop, episodes = _play(setup, window, turns=turns)
            slots[window, turns] = loop.cached.counts["context_slots"]
    header = max(len(e.turns[0].obs) for e in episodes)
    turn = max(len(t.obs) for e in episodes for t in e.turns[1:]) + CONFIG.max_new_tokens
    assert slots[1, 4] <= header + turn + CONFIG.max_new_tokens, slots
    assert slots[1, 8] == slots[1, 4], slots
    assert slots[0, 8] > slots[0, 4] + 3 * turn // 2 > slots[1, 8], slots
    windowed = dataclasses.replace(CONFIG, obs_len=240, max_prompt_len=2000, history_window=1)
    assert windowed.cache_len == 240 + (240 + 10) + 10 + 16 < 2000
    assert dataclasses.replace(CONFIG, history_window=1).cache_len < CONFIG.cache_len


def test_compaction_with_a_window_changes_no_sample(setup):
    """Six episodes of 1 to 4 turns in groups of 2, W = 1: the caches moved by compaction
    carry their evictions along (the samples of the engine that keeps every group)."""
    played = {}
    for compact in (True, False):
        text = dataclasses.replace(CONFIG, history_window=1, compact=compact)
        loop = make_text_loop(setup["chat"], setup["graphdef"], setup["config"], text)
        played[compact] = play_staggered(
            loop, setup["params"], jax.random.split(jax.random.key(7), 6)
        )
        assert loop.cached.counts["moved_rows"] == (3 if compact else 0)
    _assert_same(played[True], played[False], 1e-6)


def test_window_refusals_name_the_field():
    with pytest.raises(ValueError, match="TextConfig.history_window=2 needs engine='cached'"):
        TextConfig(history_window=2, engine="reprefill")
    with pytest.raises(ValueError, match="TextConfig.history_window must be an integer >= 0"):
        TextConfig(history_window=-1)


def test_the_turn_window_mask_is_the_same_in_blocks_and_with_remat():
    """A `TurnWindow` over 40 positions: blocks of 16 queries (and rematerialised blocks)
    give the one-block hidden states; a query sees exactly the header and its window
    (a change to a token outside it changes nothing there)."""
    config = PolicyConfig(vocab_size=50, d_model=32, num_layers=2, num_heads=2, num_kv_heads=1,
                          mlp_dim=64, attention_block=None)  # fmt: skip
    tokens = jax.random.randint(jax.random.key(0), (2, 40), 1, 50)
    valid = jnp.ones(tokens.shape, bool)
    turn = jnp.broadcast_to(jnp.r_[jnp.full(8, -1), jnp.repeat(jnp.arange(4), 8)], (2, 40))
    window = TurnWindow(floor=jnp.maximum(turn, 0) - 1, turn=turn)  # a window of 1 turn.

    def hidden(config, tokens):
        lm = Llama(config, rngs=nnx.Rngs(0))
        return lm(lm.embed(tokens), valid, window=window)[0]

    dense = hidden(config, tokens)
    for changes in (dict(attention_block=16), dict(attention_block=16, remat=True)):
        blocked = hidden(dataclasses.replace(config, **changes), tokens)
        np.testing.assert_allclose(blocked, dense, atol=1e-5)
    # Turn 3 (positions 32..39) reads the header and turns 2..3: turn 0 is out of it.
    changed = hidden(config, tokens.at[:, 10].set(tokens[:, 10] % 49 + 1))
    np.testing.assert_allclose(changed[:, 32:], dense[:, 32:], atol=1e-6)
    assert np.abs(changed[:, 16:24] - dense[:, 16:24]).max() > 1e-4
