"""experiments.pretrain / rlagent.text.pretrain: the tokenizer and template, the refusals,
a loss that falls, and the command's HF folder read by transformers with our logits."""

import json
import os
import subprocess
import sys

import numpy as np
import optax
import pytest
import torch
from absl import flags as flags_module
from flax import nnx
from text_helpers import official_template
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM
from transformers import AutoTokenizer

from rlagent.envs.toolworld.config import ToolWorldConfig
from rlagent.models.checkpoint import load_pretrained
from rlagent.models.llama import Llama
from rlagent.text import pretrain
from rlagent.text.chat import make_chat
from rlagent.text.loop import make_text_loop
from rlagent.text.toolworld import tool_schemas

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(vocab_size=768, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, mlp_dim=64,
            episodes=3, levels=(2,), noise=(0.0, 0.3), bfcl_tasks=2, max_new_tokens=32,
            max_len=3072)  # fmt: skip
FLAGS = [f"--{k}={','.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in TINY.items()]


@pytest.fixture(scope="module")
def tiny():
    """`(config, scripts, corpus, tokenizer, chat, policy config, graphdef, params, loop)`."""
    config = pretrain.PretrainConfig(**TINY)
    plays, corpus = pretrain.scripts(config)
    tokenizer = pretrain.train_tokenizer(corpus, config.vocab_size)
    chat = make_chat(tokenizer, tools=tool_schemas(ToolWorldConfig(level=2)))
    policy = pretrain.model_config(config, chat)
    graphdef, params = nnx.split(Llama(policy, lm_head=True, rngs=nnx.Rngs(0)))
    loop = make_text_loop(chat, graphdef, policy, config.text)
    return dict(config=config, plays=plays, corpus=corpus, tokenizer=tokenizer, chat=chat,
                graphdef=graphdef, params=params, loop=loop)  # fmt: skip


def test_the_tokenizer_round_trips_the_environments_text_and_the_template_passes_the_probe(
    tiny, tmp_path
):
    tokenizer, chat = tiny["tokenizer"], tiny["chat"]
    # Saved beside a qwen2 config.json, transformers reads it back as a Qwen2Tokenizer (its
    # own normaliser and pre-tokenizer): the same ids.
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    again = AutoTokenizer.from_pretrained(tmp_path)
    for text in tiny["corpus"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text and again.encode(text, add_special_tokens=False) == ids
    # The official Qwen2.5 template byte for byte (make_chat ran the loop's probe on it).
    assert tokenizer.chat_template == official_template("qwen2.5") == chat.template
    assert tokenizer.convert_ids_to_tokens([chat.pad_id, chat.end_id]) == [
        "<|endoftext|>", "<|im_end|>"
    ]  # fmt: skip
    for tag in pretrain.TOOL_TOKENS:  # one token each, as in Qwen2.5's vocabulary.
        assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1
    # An id is its digits' tokens: "12" is never one token.
    ids = tokenizer.encode('{"order_id": 12}', add_special_tokens=False)
    assert [tokenizer.decode([i]) for i in ids][-3:] == ["1", "2", "}"]


def test_transcripts_are_the_loops_tokens_with_the_assistant_turns_as_loss(tiny):
    data = pretrain.transcripts(tiny["loop"], tiny["plays"])
    tokenizer = tiny["tokenizer"]
    for (tokens, mask), script in zip(data, tiny["plays"], strict=True):
        said = tokenizer.decode(tokens[mask])
        assert said == "".join(f"{text}<|im_end|>" for text in script.texts)
        assert tokenizer.decode(tokens).count("<|im_start|>assistant\n") == len(script.texts)


def test_training_loss_falls_over_a_few_dozen_steps(tiny):
    data = pretrain.transcripts(tiny["loop"], tiny["plays"])
    config, graphdef, params = tiny["config"], tiny["graphdef"], tiny["params"]
    optimizer = optax.adamw(5e-3)
    step, state = pretrain.make_step(graphdef, optimizer), optimizer.init(params)
    tokens, mask = pretrain.batch(data, np.arange(2), tiny["chat"].pad_id)
    first = float(pretrain.loss_fn(graphdef, params, tokens, mask))
    for _ in range(25):
        params, state, loss = step(params, state, tokens, mask)
    assert np.isfinite(first) and float(loss) < 0.6 * first, (first, float(loss))
    del config


@pytest.mark.parametrize(
    "flags, named",
    [(["--num_heads=3"], "--num_heads"), (["--band_low=0.6"], "--band_low"),
     (["--levels=2,5"], "--levels"), (["--noise=0.1,x"], "--noise"),
     (["--loss=prompt"], "--loss")],
)  # fmt: skip
def test_a_bad_flag_is_refused_before_anything_is_written(flags, named, tmp_path):
    from experiments import pretrain as command

    values = flags_module.FlagValues()
    command.define_flags(values)
    values(["pretrain", f"--workdir={tmp_path / 'w'}", *flags])
    with pytest.raises(ValueError, match=named) as refused:
        command.config_from_flags(values)
    assert len(str(refused.value).splitlines()) == 1 and not (tmp_path / "w").exists()


def test_a_non_empty_workdir_and_a_bad_flag_are_refused_by_the_command(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    for flags, named in (([f"--workdir={tmp_path / 'new'}", "--num_kv_heads=3"], "--num_kv_heads"),
                         ([f"--workdir={tmp_path / 'full'}"], "--workdir")):  # fmt: skip
        done = _command(flags)
        assert done.returncode == 1 and named in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "new").exists() and os.listdir(tmp_path / "full") == ["x"]


def test_the_command_writes_a_folder_transformers_reads_with_our_logits(tmp_path):
    workdir = tmp_path / "run"
    done = _command([f"--workdir={workdir}", *FLAGS, "--steps=2", "--eval_every=2",
                     "--eval_episodes=2"])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    model = workdir / "model"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(
        os.listdir(model)
    )
    assert {"eval_curve.csv", "eval_curve.json", "provenance.json"} <= set(os.listdir(workdir))
    curve = json.loads((workdir / "eval_curve.json").read_text())
    assert [row["step"] for row in curve] == [2] and 0 <= curve[0]["success"] <= 1
    record = json.loads((workdir / "provenance.json").read_text())
    assert record["config"]["pretrain"]["d_model"] == 32 and record["result"]["stop"] == "steps"
    tokenizer = AutoTokenizer.from_pretrained(model)
    assert tokenizer.chat_template == official_template("qwen2.5")
    call = '<tool_call>\n{"name": "refund"}\n</tool_call>'
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "order 3"},
                {"role": "assistant", "content": call}]  # fmt: skip
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    trained = Tokenizer.from_file(str(model / "tokenizer.json"))  # the ids it trained on.
    assert tokenizer.encode(text, add_special_tokens=False) == trained.encode(text).ids
    ids = np.asarray([trained.encode(text).ids])
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    with torch.no_grad():
        theirs = hf(torch.from_numpy(ids)).logits.numpy()
    llama, _ = load_pretrained(model)  # our loader, as experiments.hf_agent reads the folder.
    hidden, _ = llama(llama.embed(ids), np.ones(ids.shape, bool))
    ours = np.asarray(llama.logits(hidden))
    assert np.abs(ours - theirs).max() <= 1e-4, np.abs(ours - theirs).max()


def _command(flags):
    command = [sys.executable, "-m", "experiments.pretrain", *flags]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
