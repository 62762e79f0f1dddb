"""An LM judge of text episodes (RLAIF) on the preference judges' protocol.

`make_lm_judge(chat, graphdef, policy_config, question=...)` is a
`rlagent.preference.judges.Judge`: it reads each episode of a text-mode `Trajectory`
(`rlagent.text.loop.to_trajectory`) as the policy read and wrote it, PAD dropped (the
packing of `rlagent.text.score`), then a user message asking `question` and the
generation prompt, rendered by the same chat template, and scores the episode by the
judge LM's log-odds of its next token being `yes` rather than `no`:

    score_b = log p(yes | transcript_b, question) - log p(no | transcript_b, question)

so a judge that answers "yes" to a solved task ranks it above an unsolved one. The judge
is any LM of the tokenizer's vocabulary: its parameters are the judge's state
(`init(key, policy_params)` returns `params`, or the policy's own initial parameters when
None: the model judging itself, as RLAIF with the starting model as the AI labeller), held
fixed. A last turn cut at `max_new_tokens` has no end-of-turn token; the judge reads one
there, as the template would close it. `pairs.group_pairs` then turns the scores into
best-against-worst pairs, as for every other judge.

Refused (`ChatTemplateError`): `yes` or `no` that are not one token each, or the same
token; a template that cannot render the question after an assistant turn.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rlagent.models.llama import PolicyConfig
from rlagent.models.sampler import as_llama
from rlagent.preference.judges import Judge
from rlagent.text.chat import ChatFormat
from rlagent.text.chat import ChatTemplateError
from rlagent.text.chat import check_vocab
from rlagent.text.score import pack_transcripts
from rlagent.train.extras import PRMInputs
from rlagent.types import token_view

QUESTION = "Did the assistant complete the user's request correctly? Answer Yes or No."


def make_lm_judge(
    chat: ChatFormat,
    graphdef: nnx.GraphDef,
    policy_config: PolicyConfig,
    *,
    question: str = QUESTION,
    yes: str = "Yes",
    no: str = "No",
    params: Any = None,
) -> Judge:
    """The LM judge (module docstring) of a judge LM (`graphdef`, `policy_config`: a
    Llama, ContextLM or Policy of the chat's vocabulary); `params` its weights (None: the
    policy's initial ones)."""
    check_vocab(chat, policy_config)
    yes_id, no_id = answer_ids(chat, yes, no)
    suffix = jnp.asarray(question_tokens(chat, question), jnp.int32)

    def init(key: jax.Array, policy_params: Any) -> Any:
        del key
        return jax.tree.map(jnp.copy, policy_params if params is None else params)

    def judge(state, inputs: PRMInputs, weights: jax.Array, key: jax.Array):
        del weights, key  # the judge reads the episodes, not a reward form.
        tokens, valid, last = judge_inputs(inputs.trajectory, suffix, chat.end_id, chat.pad_id)
        lm = as_llama(nnx.merge(graphdef, state))
        hidden, _ = lm(lm.embed(tokens), valid)
        rows = jnp.arange(tokens.shape[0])
        logits = lm.logits(hidden[rows, last])  # [B, V] at the answer position.
        scores = logits[:, yes_id] - logits[:, no_id]
        return scores, state, {"label_turns": jnp.zeros((), jnp.float32)}

    return Judge(init, judge, needs_carries=False)


def judge_inputs(trajectory, suffix: jax.Array, end_id: int, pad_id: int):
    """`(tokens [B, T + 1 + Q], valid, last [B])`: each row's transcript packed to the
    front (template tokens and generated ids, PAD dropped), an end-of-turn token where its
    last turn has none, the question's tokens, PAD after; `last` is the position whose
    next-token logits answer."""
    _, packed, packed_valid = pack_transcripts(token_view(trajectory), pad_id)
    count = jnp.sum(packed_valid, axis=1)  # [B] transcript tokens.
    rows = jnp.arange(packed.shape[0])
    closed = packed[rows, jnp.maximum(count - 1, 0)] == end_id
    width = packed.shape[1] + 1 + suffix.shape[0]
    tokens = jnp.full((packed.shape[0], width), pad_id, jnp.int32)
    tokens = tokens.at[:, : packed.shape[1]].set(jnp.where(packed_valid, packed, pad_id))
    tokens = tokens.at[rows, count].set(jnp.where(closed, pad_id, end_id))
    start = count + (~closed).astype(jnp.int32)  # [B] first question token.
    positions = start[:, None] + jnp.arange(suffix.shape[0])[None, :]
    tokens = tokens.at[rows[:, None], positions].set(suffix[None, :])
    valid = jnp.arange(width)[None, :] < (start + suffix.shape[0])[:, None]
    return tokens, valid, start + suffix.shape[0] - 1


def question_tokens(chat: ChatFormat, question: str) -> list[int]:
    """The template's tokens after an assistant turn's end-of-turn token up to the
    generation prompt after a user message `question`."""
    probe = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi."}]
    before = chat.rendering(probe[:1], generation_prompt=False)
    closed = chat.rendering(probe, generation_prompt=False, after=before)
    glue = chat.after_assistant(before.ids, closed.ids)
    asked = [*probe, {"role": "user", "content": question}]
    tokens, _, _ = chat.extend(asked, len(probe), closed, glue)
    return tokens


def answer_ids(chat: ChatFormat, yes: str, no: str) -> tuple[int, int]:
    """The token ids of the two answers; each must be one token, and they must differ."""
    ids = []
    for name, word in (("yes", yes), ("no", no)):
        encoded = chat.encode(word)
        if len(encoded) != 1:
            raise ChatTemplateError(
                f"the LM judge's {name}={word!r} is {len(encoded)} tokens of this tokenizer; "
                "it must be exactly one"
            )
        ids.append(encoded[0])
    if ids[0] == ids[1]:
        raise ChatTemplateError(f"the LM judge's yes={yes!r} and no={no!r} are the same token")
    return ids[0], ids[1]
