"""Text mode RLAIF: the LM judge (rlagent.text.judge) against the LM run on the transcript
and the question built by hand, and online DPO on text episodes (rlagent.text.preference):
the judge's best-against-worst pairs move the policy towards the chosen side; tied groups
give no pair and no change."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from text_helpers import tiny_text_policy
from text_helpers import tiny_tokenizer

from rlagent.models.sampler import as_llama
from rlagent.preference.dpo import DPOConfig
from rlagent.preference.judges import judge_weights
from rlagent.preference.judges import make_judge
from rlagent.text import ChatTemplateError
from rlagent.text import TextConfig
from rlagent.text import make_chat
from rlagent.text import make_text_loop
from rlagent.text.guess import GUESS_TOOL
from rlagent.text.guess import GuessNumber
from rlagent.text.judge import QUESTION
from rlagent.text.judge import make_lm_judge
from rlagent.text.judge import question_tokens
from rlagent.text.preference import make_text_dpo
from rlagent.text.score import make_text_score
from rlagent.train.config import TrainConfig
from rlagent.train.extras import PRMInputs

# Short turns, so that some end without END (cut at max_new_tokens).
CONFIG = TextConfig(max_new_tokens=6, obs_len=256, max_prompt_len=320)
GROUPS, SIZE = 2, 3


@pytest.fixture(scope="module")
def setup():
    chat = make_chat(tiny_tokenizer(corpus=["Yes No " * 8, QUESTION]), tools=[GUESS_TOOL])
    policy_config, graphdef, params = tiny_text_policy(chat)
    loop = make_text_loop(chat, graphdef, policy_config, CONFIG)
    episodes = [
        loop.start(GuessNumber(low=100, high=999, max_turns=2, use_tools=True), 7 + g)
        for g in range(GROUPS)
        for _ in range(SIZE)
    ]
    loop.play(params, episodes, jax.random.split(jax.random.key(11), len(episodes)))
    return dict(
        chat=chat, config=policy_config, graphdef=graphdef, params=params,
        episodes=episodes, trajectory=loop.trajectory(episodes),
    )  # fmt: skip


def _inputs(setup):
    return PRMInputs(setup["params"], setup["params"], setup["trajectory"], None, None)


def test_the_lm_judge_reads_the_transcript_then_the_question(setup):
    chat, graphdef = setup["chat"], setup["graphdef"]
    judge = make_lm_judge(chat, graphdef, setup["config"])
    state = judge.init(jax.random.key(0), setup["params"])
    scores, _, _ = jax.jit(judge.judge)(state, _inputs(setup), jnp.zeros(1), jax.random.key(1))
    suffix = question_tokens(chat, QUESTION)
    assert QUESTION in chat.decode(suffix) and chat.decode(suffix).endswith("assistant\n")
    yes, no = (chat.tokenizer.encode(w, add_special_tokens=False)[0] for w in ("Yes", "No"))
    lm = as_llama(nnx.merge(graphdef, setup["params"]))
    cut = 0
    for row, episode in enumerate(setup["episodes"]):
        closed = episode.tokens[-1] == chat.end_id
        cut += not closed
        ids = episode.tokens + ([] if closed else [chat.end_id]) + suffix
        tokens = jnp.asarray([ids], jnp.int32)
        hidden, _ = lm(lm.embed(tokens), jnp.ones(tokens.shape, bool))
        logits = lm.logits(hidden)[0, -1]
        np.testing.assert_allclose(scores[row], logits[yes] - logits[no], atol=1e-5)
    assert 0 < cut < len(setup["episodes"])  # both kinds of last turn are exercised.
    assert len(set(np.round(np.asarray(scores), 6))) == len(scores)  # the episodes differ.


def test_lm_judge_answers_must_be_single_distinct_tokens(setup):
    args = (setup["chat"], setup["graphdef"], setup["config"])
    with pytest.raises(ChatTemplateError, match="yes='Definitely not' is .* tokens"):
        make_lm_judge(*args, yes="Definitely not")
    with pytest.raises(ChatTemplateError, match="are the same token"):
        make_lm_judge(*args, yes="No")


def _sequence_logp(score, params, trajectory):
    return np.asarray(jnp.sum(score(params, trajectory) * trajectory.loss_mask, axis=(1, 2)))


def test_online_dpo_with_the_lm_judge_moves_towards_the_chosen_episodes(setup):
    chat, graphdef, params = setup["chat"], setup["graphdef"], setup["params"]
    score = make_text_score(chat, graphdef, setup["config"], CONFIG)
    judge = make_lm_judge(chat, graphdef, setup["config"])
    config = DPOConfig(num_groups=GROUPS, group_size=SIZE, num_epochs=3, learning_rate=1e-2)
    dpo = make_text_dpo(config, score, judge)
    trajectory = setup["trajectory"]
    judged, _, _ = judge.judge(params, _inputs(setup), jnp.zeros(1), jax.random.key(0))
    grouped = np.asarray(judged).reshape(GROUPS, SIZE)
    before = _sequence_logp(score, params, trajectory)
    state = dpo.init(jax.tree.map(jnp.copy, params), jax.random.key(0))
    state, metrics = dpo.update(state, trajectory, jax.random.key(1))
    after = _sequence_logp(score, state.params, trajectory)
    assert float(metrics["pairs"]) == GROUPS
    np.testing.assert_allclose(metrics["dpo_loss"], np.log(2.0), atol=1e-5)  # policy = ref.
    assert float(metrics["last_dpo_loss"]) < float(metrics["dpo_loss"])
    gain = (after - before).reshape(GROUPS, SIZE)
    for g in range(GROUPS):  # the judge's best episode gained on its worst.
        best, worst = np.argmax(grouped[g]), np.argmin(grouped[g])
        assert gain[g, best] > gain[g, worst]
    # The reference stays as it was.
    for a, b in zip(jax.tree.leaves(state.ref_params), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_tied_groups_give_no_pair_and_no_change(setup):
    """The outcome judge on a random policy: nobody guesses the number, every group ties."""
    params = setup["params"]
    score = make_text_score(setup["chat"], setup["graphdef"], setup["config"], CONFIG)
    train = TrainConfig()
    judge = make_judge(train)
    config = DPOConfig(num_groups=GROUPS, group_size=SIZE, num_epochs=1)
    dpo = make_text_dpo(config, score, judge, weights=judge_weights(train, "outcome"))
    state = dpo.init(jax.tree.map(jnp.copy, params), jax.random.key(0))
    state, metrics = dpo.update(state, setup["trajectory"], jax.random.key(1))
    assert float(metrics["pairs"]) == 0.0 and float(metrics["judge_spread"]) == 0.0
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)
    small = DPOConfig(num_groups=1, group_size=SIZE)
    with pytest.raises(ValueError, match="the trajectory has 6 episodes"):
        make_text_dpo(small, score, judge).update(
            dpo.init(params, jax.random.key(0)), setup["trajectory"], jax.random.key(1)
        )
