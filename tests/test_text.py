"""Text mode: the model's tokenizer and chat template, token in / token out, the host loop.

A tiny byte-level BPE tokenizer and a ChatML template with a tools section are built
locally (tests/text_helpers.py); the policy is a tiny random Policy whose vocabulary (304
rows) pads the tokenizer's 300 tokens, so the padded-vocabulary case is always exercised.
One loop (one compiled sampler) is shared by the module.
"""

import copy
import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from text_helpers import CHATML
from text_helpers import play_staggered
from text_helpers import scripted_generation
from text_helpers import tiny_text_policy
from text_helpers import tiny_tokenizer

from rlagent.models import PolicyConfig
from rlagent.models import ValueLM
from rlagent.text import ChatTemplateError
from rlagent.text import TextConfig
from rlagent.text import check_vocab
from rlagent.text import fork
from rlagent.text import make_chat
from rlagent.text import make_text_loop
from rlagent.text import to_trajectory
from rlagent.text.guess import GUESS_TOOL
from rlagent.text.guess import GuessNumber
from rlagent.text.score import make_text_score
from rlagent.text.score import make_text_values
from rlagent.train.config import TrainConfig
from rlagent.train.estimators import estimate_advantages
from rlagent.train.ppo import episode_metrics
from rlagent.train.rewards import turn_rewards
from rlagent.types import token_view

# Refuses the tool role, as templates of models without tool use do.
NO_TOOL_ROLE = CHATML.replace(
    "{%- for message in messages %}",
    "{%- for message in messages %}{% if message.role == 'tool' %}"
    "{{ raise_exception('roles must be system, user or assistant') }}{% endif %}",
)
# Drops past assistant turns' content (as reasoning templates drop past thinking).
REWRITES_PAST = CHATML.replace(
    "{{ message.content }}",
    "{% if message.role == 'assistant' and not loop.last %}...{% else %}{{ message.content }}"
    "{% endif %}",
)
# Wraps consecutive tool results in one user turn, as Qwen2.5's template does.
GROUPS_TOOLS = CHATML.replace(
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}",
    "{%- for message in messages %}{% if message.role == 'tool' %}"
    "{% if messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>{{ message.content }}</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}",
)
CONFIG = TextConfig(max_new_tokens=10, obs_len=256, max_prompt_len=352)
BATCH = 3


def _env():
    # Three-digit secrets: a random policy's text practically never names one.
    return GuessNumber(low=100, high=999, max_turns=3, use_tools=True)


@pytest.fixture(scope="module")
def setup():
    tokenizer = tiny_tokenizer()
    chat = make_chat(tokenizer, tools=[GUESS_TOOL])
    policy_config, graphdef, params = tiny_text_policy(chat)
    loop = make_text_loop(chat, graphdef, policy_config, CONFIG)
    keys = jax.random.split(jax.random.key(1), BATCH)
    episodes = [loop.start(_env(), seed) for seed in range(BATCH)]
    loop.play(params, episodes, keys)
    return dict(
        tokenizer=tokenizer, chat=chat, config=policy_config, graphdef=graphdef,
        params=params, loop=loop, keys=keys, episodes=episodes,
    )  # fmt: skip


def test_masked_tokens_are_the_generated_ids_and_decode_to_the_assistant_messages(setup):
    chat, episodes = setup["chat"], setup["episodes"]
    drifted = []
    for episode in episodes:
        tokens, mask = np.asarray(episode.tokens), np.asarray(episode.loss_mask)
        assert [s.start for s in episode.spans[1:]] == [s.stop for s in episode.spans[:-1]]
        assert episode.spans[0].start == 0 and episode.spans[-1].stop == len(tokens)
        assistant = [s for s in episode.spans if s.role == "assistant"]
        assert len(assistant) == len(episode.turns) == 3  # a random policy never guesses.
        assert tokens[mask].tolist() == sum((t.action for t in episode.turns), [])
        texts = [m["content"] for m in episode.messages if m["role"] == "assistant"]
        for span, turn, text in zip(assistant, episode.turns, texts, strict=True):
            assert (
                mask[span.start : span.stop].all()
                and tokens[span.start : span.stop].tolist() == turn.action
            )
            ended = turn.action[-1] == chat.end_id
            assert chat.decode(turn.action[:-1] if ended else turn.action) == text
        assert not (set(tokens[mask].tolist()) & {chat.pad_id, 300, 301, 302, 303})
        first = chat.render(episode.messages[:2], generation_prompt=True)
        assert episode.tokens[: len(first)] == first and not mask[: len(first)].any()
        # Rendering the text conversation and re-tokenizing it gives other ids (drift);
        # the episode never trains on those.
        rendered = chat.render(episode.messages[:-1], generation_prompt=False)
        drifted.append(rendered[: len(tokens)] != episode.tokens)
    assert any(drifted)


def test_tool_replies_are_template_tokens_between_turns(setup):
    chat, episode = setup["chat"], setup["episodes"][0]
    tool = [s for s in episode.spans if s.role == "tool"]
    assert len(tool) == 2  # after turns 0 and 1; the last reply is read by no turn.
    for span, turn in zip(tool, episode.turns[1:], strict=True):
        assert episode.tokens[span.start : span.stop] == turn.obs
        assert not any(episode.loss_mask[span.start : span.stop])
        assert "<|im_start|>tool\n" in chat.decode(turn.obs)
        assert chat.decode(turn.obs).endswith("<|im_start|>assistant\n")


def test_trajectory_lays_out_the_transcript_and_feeds_rewards_and_estimators(setup):
    chat, episodes = setup["chat"], setup["episodes"]
    traj = setup["loop"].trajectory(episodes)
    assert traj.obs_tokens.shape == (BATCH, 3, CONFIG.obs_len)
    assert traj.action_tokens.shape == traj.logp.shape == (BATCH, 3, CONFIG.max_new_tokens)
    view = token_view(traj)
    tokens = np.asarray(view.tokens)
    keep = (tokens != chat.pad_id) | np.asarray(view.loss_mask)
    for row, episode in enumerate(episodes):
        assert tokens[row][keep[row]].tolist() == episode.tokens
        assert np.asarray(view.loss_mask)[row][keep[row]].tolist() == episode.loss_mask
    np.testing.assert_allclose(
        np.asarray(traj.logp)[np.asarray(traj.loss_mask)],
        np.concatenate([t.logp for e in episodes for t in e.turns]), rtol=1e-6,
    )  # fmt: skip
    # An episode with a right guess on its second turn (signals set by hand).
    success = traj.success.at[0, 1].set(True)
    outcome = traj.signals["outcome"].at[0, 1].set(1.0)
    traj = traj._replace(
        success=success, signals={"outcome": outcome}, done=traj.done.at[0, 1].set(True),
        turn_mask=traj.turn_mask.at[0, 2].set(False),
    )  # fmt: skip
    config = TrainConfig(
        num_groups=1, group_size=BATCH, num_minibatches=1, reward="outcome", estimator="grpo"
    )
    # Jitted: one compile each instead of an eager dispatch per op.
    rewards = jax.jit(turn_rewards, static_argnums=1)(traj, config)
    np.testing.assert_array_equal(rewards, np.asarray(outcome) * np.asarray(traj.turn_mask))
    estimate = jax.jit(estimate_advantages, static_argnums=3)
    advantages, _ = estimate(traj, rewards, jnp.zeros(traj.logp.shape), config)
    advantages = np.asarray(advantages)
    assert np.all(advantages[~np.asarray(traj.loss_mask)] == 0)
    assert advantages[0][np.asarray(traj.loss_mask)[0]].min() > 0 > advantages[1].min()
    assert bool(traj.episode_success[0]) and not bool(traj.episode_success[1:].any())


def test_teacher_forced_scoring_gives_back_the_behaviour_log_probs(setup):
    score = make_text_score(setup["chat"], setup["graphdef"], setup["config"], CONFIG)
    traj = setup["loop"].trajectory(setup["episodes"])
    logp = np.asarray(score(setup["params"], traj))
    mask = np.asarray(traj.loss_mask)
    np.testing.assert_allclose(logp[mask], np.asarray(traj.logp)[mask], atol=2e-5)
    assert np.all(logp[~mask] == 0)


def test_scoring_reads_transcript_len_positions_and_a_longer_row_scores_nan(setup):
    """The scorer packs into P + L positions (the longest transcript the loop allows), far
    fewer than the trajectory's S * (O + L) slots; a row that does not fit (a trajectory the
    loop did not make) scores NaN at its generated ids, and `to_trajectory` refuses it."""
    traj = setup["loop"].trajectory(setup["episodes"])
    assert CONFIG.transcript_len == 362 < token_view(traj).tokens.shape[1] == 3 * (256 + 10)
    lengths = [len(e.tokens) for e in setup["episodes"]]
    narrow = dataclasses.replace(CONFIG, max_prompt_len=min(lengths) - 10)
    assert min(lengths) <= narrow.transcript_len < max(lengths), lengths  # both kinds of row.
    score = make_text_score(setup["chat"], setup["graphdef"], setup["config"], narrow)
    logp, mask = np.asarray(score(setup["params"], traj)), np.asarray(traj.loss_mask)
    for b, length in enumerate(lengths):
        fits = length <= narrow.transcript_len
        assert np.isnan(logp[b][mask[b]]).any() != fits, (b, length, narrow.transcript_len)
        if fits:
            np.testing.assert_allclose(logp[b][mask[b]], np.asarray(traj.logp)[b][mask[b]],
                                       atol=2e-5)  # fmt: skip
        assert np.all(logp[b][~mask[b]] == 0)
    with pytest.raises(ValueError, match="more than TextConfig.max_prompt_len \\+ max_new"):
        to_trajectory(setup["episodes"], narrow, setup["chat"].pad_id)


def test_critic_values_are_read_where_the_policy_read_each_generated_id(setup):
    """V of generated id j of a transcript is the critic's value of the hidden state at
    j - 1 (the state the id was sampled from): by hand on each unpadded transcript."""
    critic = ValueLM(setup["config"], rngs=nnx.Rngs(2))
    critic.value_head.kernel.set_value(jax.random.normal(jax.random.key(3), (32, 1)))
    graphdef, params = nnx.split(critic)
    traj = setup["loop"].trajectory(setup["episodes"])
    values = np.asarray(make_text_values(setup["chat"], graphdef, CONFIG)(params, traj))
    mask = np.asarray(traj.loss_mask)
    assert np.all(values[~mask] == 0)
    for b, episode in enumerate(setup["episodes"]):
        tokens = jnp.asarray(episode.tokens)[None]
        hidden, _ = critic.lm(critic.lm.embed(tokens), jnp.ones(tokens.shape, bool))
        by_position = np.asarray(critic.values(hidden))[0]
        generated = np.flatnonzero(np.asarray(episode.loss_mask))
        assert generated.min() > 0 and len(generated) == mask[b].sum()
        np.testing.assert_allclose(values[b][mask[b]], by_position[generated - 1], atol=2e-5)
    assert np.std(values[mask]) > 0


def test_a_fork_continues_identically_with_the_same_keys(setup):
    loop, params, keys = setup["loop"], setup["params"], setup["keys"]
    episodes = [loop.start(_env(), seed) for seed in range(BATCH)]
    loop.play(params, episodes, keys, num_turns=1)
    forks = [fork(e) for e in episodes]
    others = [fork(e) for e in episodes]
    assert forks[0].env is not episodes[0].env and forks[0].env.secret == episodes[0].env.secret
    loop.play(params, episodes, keys)
    loop.play(params, forks, keys)
    loop.play(params, others, jax.random.split(jax.random.key(7), BATCH))
    for episode, forked in zip(episodes, forks, strict=True):
        assert forked.tokens == episode.tokens and forked.messages == episode.messages
        assert [t.logp for t in forked.turns] == [t.logp for t in episode.turns]
    # The played-through episodes are those of the shared fixture (same keys from turn 0).
    assert [e.tokens for e in episodes] == [e.tokens for e in setup["episodes"]]
    assert any(o.tokens != e.tokens for o, e in zip(others, episodes, strict=True))


def test_sampling_in_calls_of_sample_batch_rows_changes_no_sample(setup):
    """5 episodes in calls of 2 rows (the last padded) play as in one call of 5."""
    chat, graphdef, config, params = (setup[k] for k in ("chat", "graphdef", "config", "params"))
    keys = jax.random.split(jax.random.key(3), 5)
    played = {}
    for sample_batch in (0, 2):
        text = dataclasses.replace(CONFIG, sample_batch=sample_batch)
        loop = make_text_loop(chat, graphdef, config, text)
        played[sample_batch] = loop.play(params, [loop.start(_env(), s) for s in range(5)], keys)
    for whole, split in zip(played[0], played[2], strict=True):
        assert split.tokens == whole.tokens
        for a, b in zip(split.turns, whole.turns, strict=True):
            np.testing.assert_allclose(a.logp, b.logp, atol=1e-6)
    with pytest.raises(ValueError, match="TextConfig.sample_batch must be an integer >= 0"):
        TextConfig(sample_batch=-1)


def test_the_cached_engine_samples_as_the_reprefill_engine(setup):
    """For the same keys, the engine that keeps each episode's KV cache across turns gives
    the tokens of the one that prefills every transcript again, log-probs within 1e-5:
    5 turns in two calls of `play` (the second rebuilds the caches), prefill pieces of 16
    tokens, calls of 2 rows (the last padded), episodes cut by max_prompt_len."""
    chat, graphdef, config, params = (setup[k] for k in ("chat", "graphdef", "config", "params"))
    keys = jax.random.split(jax.random.key(5), 3)
    played = {}
    for engine in ("cached", "reprefill"):
        text = dataclasses.replace(CONFIG, engine=engine, sample_batch=2, prefill_chunk=16)
        loop = make_text_loop(chat, graphdef, config, text)
        assert (loop.cached is None) == (engine == "reprefill")
        assert loop.play(params, [], keys[:0]) == []
        episodes = [
            loop.start(GuessNumber(low=100, high=999, max_turns=6, use_tools=True), seed)
            for seed in range(3)
        ]
        loop.play(params, episodes, keys, num_turns=1)
        played[engine] = loop.play(params, episodes, keys)
    turns = [len(e.turns) for e in played["cached"]]
    assert min(turns) >= 3 and any(e.truncated for e in played["cached"]), turns
    for cached, reprefill in zip(played["cached"], played["reprefill"], strict=True):
        assert cached.tokens == reprefill.tokens and cached.truncated == reprefill.truncated
        for a, b in zip(cached.turns, reprefill.turns, strict=True):
            np.testing.assert_allclose(a.logp, b.logp, atol=1e-5)
    with pytest.raises(ValueError, match="TextConfig.engine must be one of"):
        TextConfig(engine="paged")
    with pytest.raises(ValueError, match="TextConfig.prefill_chunk must be an integer >= 1"):
        TextConfig(prefill_chunk=0)


def test_compaction_packs_the_live_episodes_and_changes_no_sample(setup):
    """Six episodes of 1 to 4 turns in groups of 2 rows: packing the live ones into as
    few groups as hold them (their caches moved) gives the tokens and log-probs (within
    1e-6) of the engine that keeps every group, in fewer group-turns: 3 + 2 + 1 + 1
    instead of 3 + 3 + 2 + 1."""
    chat, graphdef, config, params = (setup[k] for k in ("chat", "graphdef", "config", "params"))
    keys = jax.random.split(jax.random.key(7), 6)
    played, counts = {}, {}
    for compact in (True, False):
        text = dataclasses.replace(CONFIG, sample_batch=2, prefill_chunk=16, compact=compact)
        loop = make_text_loop(chat, graphdef, config, text)
        played[compact] = play_staggered(loop, params, keys)
        counts[compact] = {k: loop.cached.counts[k] for k in ("group_turns", "moved_rows")}
    assert [len(e.turns) for e in played[True]] == [1, 4, 1, 3, 1, 2]
    for packed, kept in zip(played[True], played[False], strict=True):
        assert packed.tokens == kept.tokens
        for a, b in zip(packed.turns, kept.turns, strict=True):
            np.testing.assert_allclose(a.logp, b.logp, atol=1e-6)
    assert counts[False] == {"group_turns": 9, "moved_rows": 0}, counts
    # Turn 2 packs episodes 1, 3, 5 into 2 groups; at turn 3 the group of 1 and 3 is kept
    # as it is and the group of 5 (over) dropped.
    assert counts[True] == {"group_turns": 7, "moved_rows": 3}, counts
    with pytest.raises(ValueError, match="TextConfig.compact must be a bool"):
        TextConfig(compact=1)


MESH_SCRIPT = """
import os
flags = os.environ.get("XLA_FLAGS", "")  # the suite's (tests/conftest.py), and 2 devices:
os.environ["XLA_FLAGS"] = flags + " --xla_force_host_platform_device_count=2"
import dataclasses, json, sys
sys.path[:0] = [{root!r}, {tests!r}]
import jax, numpy as np
from text_helpers import play_staggered, tiny_text_policy, tiny_tokenizer
from rlagent.models import sharding
from rlagent.text import TextConfig, make_chat, make_text_loop
from rlagent.text.guess import GUESS_TOOL
chat = make_chat(tiny_tokenizer(), tools=[GUESS_TOOL])
policy_config, graphdef, params = tiny_text_policy(chat)
keys = jax.random.split(jax.random.key(7), 6)
out = {{}}
for name, mesh, compact in (("mesh", sharding.fsdp_mesh(data=2), True), ("one", None, False)):
    text = TextConfig(max_new_tokens=10, max_prompt_len=352, sample_batch=3, prefill_chunk=16,
                      compact=compact)
    loop = make_text_loop(chat, graphdef, policy_config, text, mesh=mesh)
    given = params if mesh is None else sharding.shard_params(params, mesh)
    episodes = play_staggered(loop, given, keys)
    counts = {{k: loop.cached.counts[k] for k in ("group_turns", "moved_rows")}}
    out[name] = dict(tokens=[e.tokens for e in episodes], counts=counts,
                     logp=[sum((t.logp for t in e.turns), []) for e in episodes])
print(json.dumps(out))
"""


def test_compaction_on_a_mesh_samples_as_one_device():
    """Rows split over the data axis of 2 host devices, groups of 3 episodes rounded up
    to 4 rows: the live episodes of two groups are packed into one, with the samples of
    one device without compaction."""
    tests = os.path.dirname(os.path.abspath(__file__))
    script = MESH_SCRIPT.format(root=os.path.dirname(tests), tests=tests)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=600, cwd=os.path.dirname(tests))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["mesh"]["tokens"] == out["one"]["tokens"]
    for a, b in zip(out["mesh"]["logp"], out["one"]["logp"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert out["mesh"]["counts"] == {"group_turns": 5, "moved_rows": 3}, out


def _scripted(chat, calls):
    """A sampler that writes `calls[i][row]` (then END) at its i-th call (the re-prefill
    engine's `sample`: the loops that use it set `cached=None`)."""
    calls = iter(calls)

    def sample(params, prompts, valid, keys):
        return scripted_generation(chat, next(calls), len(keys), CONFIG.max_new_tokens)

    return sample


def test_turns_ended_by_the_policy_and_a_solved_episode(setup):
    chat = make_chat(setup["tokenizer"])
    loop = setup["loop"]._replace(
        chat=chat, sample=_scripted(chat, [["3", "5"], ["5", "-"]]), cached=None
    )
    episodes = [loop.start(GuessNumber(low=5, high=5), seed) for seed in range(2)]
    loop.play(None, episodes, setup["keys"][:2])
    first, second = episodes
    assert [t.action for t in first.turns] == [
        chat.tokenizer.encode(x) + [chat.end_id] for x in "35"
    ]
    assert first.messages[2] == {"role": "assistant", "content": "3"}
    # No forced END: the next turn reads the template's "\n" after <|im_end|>, the reply
    # and the generation prompt.
    assert chat.decode(first.turns[1].obs) == (
        "\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"
    )
    # Canonical ids (no drift): the transcript is the template's rendering, token for token.
    assert first.tokens == chat.render(first.messages[:-1], generation_prompt=False)[:-1]
    assert first.messages[-1]["content"] == "correct" and len(second.turns) == 1
    traj = loop.trajectory(episodes)
    np.testing.assert_array_equal(traj.turn_mask, [[1, 1, 0], [1, 0, 0]])
    np.testing.assert_array_equal(traj.done, [[0, 1, 0], [1, 0, 0]])
    np.testing.assert_array_equal(traj.success, traj.done)
    np.testing.assert_array_equal(traj.signals["outcome"], traj.done)
    np.testing.assert_array_equal(traj.action_mask.sum(-1), [[2, 2, 0], [2, 0, 0]])
    metrics = episode_metrics(first.env, traj)
    assert float(metrics["success"]) == 1.0 and float(metrics["turns"]) == 1.5
    assert float(metrics["guesses_when_solved"]) == 1.5 and float(metrics["tokens"]) == 3.0


def test_an_episode_past_the_sizes_ends_truncated_and_the_loop_goes_on(setup):
    chat = make_chat(setup["tokenizer"])
    script = [["3", "3"]] * 3
    loop = setup["loop"]._replace(chat=chat, sample=_scripted(chat, [["3"]] * 3), cached=None)
    env = lambda: GuessNumber(low=5, high=5, max_turns=3)  # noqa: E731
    (full,) = loop.play(None, [loop.start(env(), 0)], setup["keys"][:1])
    before_second = len(full.turns[0].obs) + len(full.turns[0].action) + len(full.turns[1].obs)
    tight = dataclasses.replace(CONFIG, max_prompt_len=before_second - 1)
    loop = loop._replace(config=tight, sample=_scripted(chat, script), cached=None)
    cut, whole = loop.play(None, [loop.start(env(), 0), loop.start(env(), 0)], setup["keys"][:2])
    for episode in (cut, whole):  # the same episode twice: both cut after one turn.
        assert len(episode.turns) == 1 and episode.over and not episode.done
        assert f"more than TextConfig.max_prompt_len={before_second - 1}" in episode.truncated
        assert len(episode.tokens) <= tight.max_prompt_len and episode.pending == []
        assert episode.messages[-1] == {"role": "user", "content": "higher"}  # read by none.
    traj = loop.trajectory([cut])
    np.testing.assert_array_equal(traj.turn_mask[0], [True, False, False])
    assert not traj.done.any()  # as a time limit: not terminated, masked after.
    # A first prompt past obs_len: an episode of no turns, nothing sampled for it.
    small = loop._replace(config=dataclasses.replace(CONFIG, obs_len=8), sample=None)
    empty = small.start(env(), 0)
    assert empty.over and empty.turns == [] and empty.tokens == []
    assert "more than TextConfig.obs_len=8" in empty.truncated
    assert small.play(None, [empty], setup["keys"][:1]) == [empty]
    assert not np.asarray(small.trajectory([empty]).turn_mask).any()


def test_a_generation_prompt_other_than_the_assistant_header_is_kept_as_read(setup):
    # As thinking templates that open an empty reasoning block only in the generation prompt.
    template = CHATML.replace(
        "<|im_start|>assistant\n{% endif %}", "<|im_start|>assistant\n- {% endif %}"
    )
    chat = make_chat(tiny_tokenizer(template))
    loop = setup["loop"]._replace(chat=chat, sample=_scripted(chat, [["3"], ["4"]]), cached=None)
    env = GuessNumber(low=5, high=5, max_turns=2)
    (episode,) = loop.play(None, [loop.start(env, 0)], setup["keys"][:1])
    text = chat.decode(episode.tokens)
    assert text.count("<|im_start|>assistant\n- ") == 2 and text.endswith("- 4<|im_end|>")
    assert "assistant\n3<|im_end|>" in chat.tokenizer.decode(
        chat.render(episode.messages[:3], generation_prompt=False)
    )


def test_spans_follow_the_messages_or_the_groups_the_template_renders(setup):
    conversation = [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "4"},
        {"role": "tool", "content": "a"}, {"role": "tool", "content": "b"},
    ]  # fmt: skip
    for template, roles in ((CHATML, ["tool", "tool"]), (GROUPS_TOOLS, ["tool"])):
        chat = make_chat(tiny_tokenizer(template), tools=[GUESS_TOOL])
        base = chat.rendering(conversation[:2], generation_prompt=False)
        tokens, spans, rendered = chat.extend(conversation, 2, base, [])
        assert [s.role for s in spans] == roles
        assert spans[0].start == 0 and spans[-1].stop == len(tokens)
        assert base.ids + tokens == chat.render(conversation, generation_prompt=True)
        assert rendered.ids == chat.render(conversation, generation_prompt=False)
    assert chat.decode(tokens).startswith(
        "<|im_start|>user<tool_response>a</tool_response><tool_response>b</tool_response>"
    )


def test_guess_number_plays_by_its_rules():
    env = GuessNumber(low=1, high=9, max_turns=3)
    messages = env.reset(4)
    assert [m["role"] for m in messages] == ["system", "user"]
    secret = env.secret
    reply, signals, done = env.step(f"I guess {secret - 1}")
    assert reply == [{"role": "user", "content": "higher"}] and not done
    assert signals == {"outcome": 0.0, "success": 0.0}
    clone = copy.deepcopy(env)
    reply, signals, done = env.step(str(secret))
    assert reply[0]["content"] == "correct" and done and signals["outcome"] == 1.0
    assert clone.step("no number")[0][0]["content"] == "say a number"
    assert clone.step("0")[2]  # the third guess ends the episode


def test_chat_refusals_name_the_fault(setup):
    tokenizer = setup["tokenizer"]
    bare = tiny_tokenizer(template=None)
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        make_chat(bare)
    with pytest.raises(ChatTemplateError, match="cannot render tool messages"):
        make_chat(tiny_tokenizer(NO_TOOL_ROLE), tools=[GUESS_TOOL])
    make_chat(tiny_tokenizer(NO_TOOL_ROLE))  # fine without tools.
    with pytest.raises(ChatTemplateError, match="ignores tools"):
        make_chat(
            tiny_tokenizer(CHATML.replace("{{ tool | tojson }}", "a tool")), tools=[GUESS_TOOL]
        )
    with pytest.raises(ChatTemplateError, match="does not end assistant turns"):
        make_chat(tokenizer, end_token="<|im_start|>")
    with pytest.raises(ChatTemplateError, match="not a token of the tokenizer"):
        make_chat(tokenizer, end_token="<|eot_id|>")
    with pytest.raises(ChatTemplateError, match="prefix-stably in the probe case 'a reply, then"):
        make_chat(tiny_tokenizer(REWRITES_PAST))
    with pytest.raises(ChatTemplateError, match="prefix-stably"):  # the loop's own check.
        conversation = [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "4"},
            {"role": "user", "content": "higher"},
        ]  # fmt: skip
        rewrites = dataclasses.replace(setup["chat"], template=REWRITES_PAST)
        rewrites.extend(
            conversation, 2, rewrites.rendering(conversation[:2], generation_prompt=False), []
        )


def test_policy_and_environment_refusals(setup):
    chat, config, loop = setup["chat"], setup["config"], setup["loop"]
    small = PolicyConfig(vocab_size=299, pad_id=chat.pad_id)
    with pytest.raises(ChatTemplateError, match="vocab_size=299 is smaller"):
        check_vocab(chat, small)
    with pytest.raises(ChatTemplateError, match="pad_id=5 is not the tokenizer's padding"):
        check_vocab(chat, PolicyConfig(vocab_size=config.vocab_size, pad_id=5))
    # A loop renders each environment's own tools, whatever tools its chat was probed with.
    no_tools = loop._replace(chat=make_chat(setup["tokenizer"]))
    episode = no_tools.start(GuessNumber(use_tools=True), 0)
    assert episode.tools == (GUESS_TOOL,) and '"guess"' in no_tools.chat.decode(episode.tokens)
    assert no_tools.start(GuessNumber(use_tools=False), 0).tools is None
    with pytest.raises(ChatTemplateError, match="ignores tools"):
        ignores = make_chat(tiny_tokenizer(CHATML.replace("{{ tool | tojson }}", "a tool")))
        loop._replace(chat=ignores).start(GuessNumber(use_tools=True), 0)
