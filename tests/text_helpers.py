"""Helpers of the text-mode tests (tests/test_text*.py): a tiny byte-level BPE tokenizer
with a ChatML template that renders tools, built locally, and a tiny random policy whose
vocabulary (304 rows) pads the tokenizer's 300 tokens.

It needs transformers (with jinja2), which the test extra installs.
"""

import os

import numpy as np
from flax import nnx
from tokenizers import Tokenizer
from tokenizers import decoders
from tokenizers import models
from tokenizers import pre_tokenizers
from tokenizers import trainers
from transformers import PreTrainedTokenizerFast

from rlagent.models import Policy
from rlagent.models import PolicyConfig
from rlagent.models.sampler import Generation
from rlagent.text.chat import shipped_template
from rlagent.text.guess import GuessNumber

SPECIAL = ["<pad>", "<|im_start|>", "<|im_end|>"]
# The special tokens of the official templates' families (tests/fixtures/templates).
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA_SPECIAL = ["<|begin_of_text|>", "<|finetune_right_pad_id|>", "<|start_header_id|>",
                 "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]  # fmt: skip
TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "templates")


def official_template(name):
    """The official chat template text of `name` (qwen3, qwen2.5, llama3.1; README.md in
    tests/fixtures/templates says where each comes from). Qwen2.5's ships with rlagent
    (`rlagent/text/templates`, the pretrained model's template), so it is read there."""
    if os.path.exists(os.path.join(TEMPLATES, f"{name}.jinja")):
        with open(os.path.join(TEMPLATES, f"{name}.jinja")) as file:
            return file.read()
    return shipped_template(name)


def family_tokenizer(name, *, vocab_size=300, corpus=()):
    """A tiny tokenizer with the official template of `name` and its family's special
    tokens (Qwen: pad <|endoftext|>, end <|im_end|>; Llama: pad
    <|finetune_right_pad_id|>, end <|eot_id|>, bos <|begin_of_text|>)."""
    if name.startswith("llama"):
        return tiny_tokenizer(
            official_template(name), vocab_size=vocab_size, corpus=corpus, special=LLAMA_SPECIAL,
            eos="<|eot_id|>", pad="<|finetune_right_pad_id|>", bos="<|begin_of_text|>",
        )  # fmt: skip
    return tiny_tokenizer(
        official_template(name), vocab_size=vocab_size, corpus=corpus, special=QWEN_SPECIAL,
        pad="<|endoftext|>",
    )  # fmt: skip


CHATML = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{% for tool in tools %}{{ tool | tojson }}\n"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer(
    template=CHATML, *, vocab_size=300, corpus=(), special=SPECIAL, eos="<|im_end|>", pad="<pad>",
    bos=None,
):  # fmt: skip
    """A `vocab_size`-token byte-level BPE tokenizer with the chat template `template`,
    its merges learnt from a few words and the texts of `corpus` (e.g. an environment's
    tool schemas, so that its prompts take fewer tokens), and the `special` tokens (a
    family's own: `QWEN_SPECIAL`, `LLAMA_SPECIAL`)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(special), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    words = ["system user assistant tool guess number higher lower correct function"] * 4
    tokenizer.train_from_iterator(
        [*words, *corpus, "You guess numbers. Guess my number from 1 to 9."], trainer
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=pad, eos_token=eos, bos_token=bos
    )
    hf.chat_template = template
    return hf


def tiny_text_policy(chat):
    """`(policy_config, graphdef, params)` of a tiny random Policy for `chat`'s tokenizer."""
    policy_config = PolicyConfig(
        vocab_size=304, pad_id=chat.pad_id, d_model=32, num_layers=1, num_heads=2,
        num_kv_heads=1, mlp_dim=64, summary_dim=8, num_summary_slots=0,
    )  # fmt: skip
    graphdef, params = nnx.split(Policy(policy_config, rngs=nnx.Rngs(0)))
    return policy_config, graphdef, params


def scripted_generation(chat, texts, rows, length):
    """The `Generation` of one sampled turn of `rows` rows of `length` slots: row i writes
    `texts[i]` then END (nothing for None or past the texts), log-prob -0.5 a token."""
    tokens = np.full((rows, length), chat.pad_id, np.int32)
    mask = np.zeros(tokens.shape, bool)
    for row, text in enumerate(texts):
        if text is not None:
            ids = chat.encode(text) + [chat.end_id]
            tokens[row, : len(ids)], mask[row, : len(ids)] = ids, True
    return Generation(tokens, np.where(mask, -0.5, 0.0).astype(np.float32), mask)


def scripted_sampler(chat, texts, max_new_tokens):
    """A sampler that writes `texts[i]` (then END) in every row at its i-th call (the
    re-prefill engine's `sample`: a TextLoop without a model, `cached=None`)."""
    texts = iter(texts)

    def sample(params, prompts, valid, keys):
        return scripted_generation(chat, [next(texts)] * len(keys), len(keys), max_new_tokens)

    return sample


def play_staggered(loop, params, keys):
    """Six GuessNumber episodes of 1, 4, 1, 3, 1 and 2 turns (three-digit secrets: a
    random policy practically never solves one), played to the end in one call."""
    episodes = [
        loop.start(GuessNumber(low=100, high=999, max_turns=turns, use_tools=True), seed)
        for seed, turns in enumerate((1, 4, 1, 3, 1, 2))
    ]
    return loop.play(params, episodes, keys)


def assert_loss_mask_on_assistant_tokens(traj, episodes):
    """The loss mask is exactly the assistant spans' tokens, which are the generated ids,
    with finite negative behaviour log-probs there and 0 elsewhere."""
    mask, logp = np.asarray(traj.loss_mask), np.asarray(traj.logp)
    assert np.isfinite(logp[mask]).all() and (logp[mask] < 0).all() and (logp[~mask] == 0).all()
    for episode in episodes:
        tokens, loss_mask = np.asarray(episode.tokens), np.asarray(episode.loss_mask)
        assistant = np.zeros(len(tokens), bool)
        for span in episode.spans:
            assistant[span.start : span.stop] = span.role == "assistant"
        np.testing.assert_array_equal(loss_mask, assistant)
        assert tokens[loss_mask].tolist() == sum((t.action for t in episode.turns), [])
