"""A small Qwen2-shaped model pretrained on the environments' text, as a stand-in for a
downloaded checkpoint (`experiments.pretrain`; docs/pretrain.md).

    pretrain(PretrainConfig(), "runs/pretrain")

1. Scripts: ToolWorld text episodes (`rlagent.text.toolworld`) of the training tasks
   (`task_split='train'`) at each of `levels`, played by the oracle and by noisy
   players that replace each oracle turn with a random well-formed call with probability
   `noise` (`ToolWorldText.slip_text`); the oracle goes on from wherever a slip left it.
2. Tokenizer: a byte-level BPE (`tokenizers`) trained on the scripts' messages, the tool
   schemas, the chat template's text and (when bfcl-eval is installed) the opening
   messages, tools and ground-truth calls of BFCL multi-turn training-split tasks, with
   Qwen2.5's special tokens (`<|endoftext|>` pads, `<|im_end|>` ends a turn) and its tool
   tags as added tokens; the official Qwen2.5 chat template
   (`templates/qwen2.5.jinja`, byte for byte), which the text loop's probe accepts.
3. Transcripts: each script replayed through the text loop (`TextLoop.start`,
   `TextLoop.advance` with the scripted turn's ids and the end-of-turn token), so the
   tokens are exactly the loop's, and the loss mask its assistant tokens.
4. Training: next-token prediction on every token (`loss='all'`) or on the assistant
   tokens (`'assistant'`), optax AdamW, warm-up then constant rate, jit; batches of
   `batch_size` transcripts drawn at random.
5. Stop rule: every `eval_every` steps the text loop plays `eval_episodes` held-out tasks
   of ToolWorld text level `eval_level` sampled at temperature 1; training stops at the
   first evaluation whose success lies in [band_low, band_high] (or above the band:
   it was passed between two evaluations; or at `steps`).
6. Output in the workdir: `model/` (config.json, model.safetensors, the tokenizer files
   and the chat template: `rlagent.text.export.write_hf`), `eval_curve.csv` /
   `eval_curve.json`, `provenance.json` (the config, the stop, the size, the parity of
   transformers' logits with ours).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tokenizers import AddedToken
from tokenizers import Regex
from tokenizers import Tokenizer
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers
from tokenizers import pre_tokenizers
from tokenizers import trainers

from rlagent.envs.toolworld.config import ToolWorldConfig
from rlagent.host import provenance
from rlagent.losses import weighted_log_likelihood
from rlagent.models.llama import Llama
from rlagent.models.llama import PolicyConfig
from rlagent.models.llama import parameter_count
from rlagent.text import bfcl
from rlagent.text.chat import ChatFormat
from rlagent.text.chat import make_chat
from rlagent.text.chat import shipped_template
from rlagent.text.export import write_hf
from rlagent.text.loop import TextConfig
from rlagent.text.loop import TextLoop
from rlagent.text.loop import make_text_loop
from rlagent.text.toolworld import ToolWorldText
from rlagent.text.toolworld import tool_schemas
from rlagent.text.train import eval_task_list
from rlagent.text.train import toolworld_tasks
from rlagent.train.evaluation import EvalConfig
from rlagent.train.ppo import episode_metrics

TEMPLATE = "qwen2.5"  # templates/qwen2.5.jinja: the official Qwen2.5 template, verbatim.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen2.5's, its ids 0-2.
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
               "<tools>", "</tools>")  # fmt: skip
MODEL_DIR = "model"
CURVE = "eval_curve"
CURVE_FIELDS = ("step", "train_loss", "success", "malformed_rate", "turns", "eval_s", "elapsed_s")
PARITY_TOLERANCE = 1e-4
LOSSES = ("assistant", "all")


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    """Sizes, data, schedule and stop rule of `pretrain`; each field is a flag of
    `experiments.pretrain` of the same name, and a bad value is refused naming it."""

    vocab_size: int = 1024  # BPE tokens (specials and tool tags included).
    d_model: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    mlp_dim: int = 384
    steps: int = 3000  # at most this many updates.
    batch_size: int = 8  # transcripts per update.
    learning_rate: float = 2e-3
    warmup_steps: int = 50
    eval_every: int = 100  # updates between held-out evaluations.
    eval_episodes: int = 32
    eval_level: int = 2  # the ToolWorld text level of the stop rule.
    band_low: float = 0.1  # stop at the first evaluation with band_low <= success <= band_high.
    band_high: float = 0.5
    seed: int = 0
    episodes: int = 64  # scripted episodes per level and noise value.
    levels: tuple[int, ...] = (1, 2, 3, 4)
    noise: tuple[float, ...] = (0.0, 0.2)  # per-turn slip probability of each player.
    bfcl_tasks: int = 16  # BFCL training tasks whose text joins the tokenizer's corpus.
    max_new_tokens: int = 48  # tokens of one sampled turn.
    max_len: int = 2048  # transcript tokens (the loop's prompt limit plus max_new_tokens).
    # The tokens the loss reads: 'all' (every token of the transcript: tool results and
    # user turns too, where ids are copied as in the calls) or 'assistant' (the turns'
    # tokens, the loop's loss mask: at the default size it learnt no id copying in 400
    # updates, docs/pretrain.md).
    loss: str = "all"

    def __post_init__(self):
        object.__setattr__(self, "levels", tuple(self.levels))
        object.__setattr__(self, "noise", tuple(float(p) for p in self.noise))
        positive = ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads",
                    "mlp_dim", "steps", "batch_size", "eval_every", "eval_episodes", "episodes",
                    "max_new_tokens", "max_len")  # fmt: skip
        for name in positive:
            _require(name, getattr(self, name), isinstance(getattr(self, name), int)
                     and getattr(self, name) >= 1, "an integer >= 1")  # fmt: skip
        for name in ("warmup_steps", "bfcl_tasks", "seed"):
            _require(name, getattr(self, name), getattr(self, name) >= 0, "an integer >= 0")
        least = len(SPECIAL_TOKENS) + len(TOOL_TOKENS) + 256 + 64
        _require("vocab_size", self.vocab_size, self.vocab_size >= least, f">= {least}")
        _require("learning_rate", self.learning_rate, self.learning_rate > 0, "> 0")
        _require("eval_level", self.eval_level, self.eval_level in (1, 2, 3, 4), "1, 2, 3 or 4")
        _require("levels", self.levels, self.levels and set(self.levels) <= {1, 2, 3, 4},
                 "levels of 1, 2, 3, 4")  # fmt: skip
        _require("noise", self.noise, self.noise and all(0 <= p <= 1 for p in self.noise),
                 "probabilities in [0, 1]")  # fmt: skip
        _require("band_low", self.band_low, 0 <= self.band_low <= self.band_high <= 1,
                 "0 <= band_low <= band_high <= 1")  # fmt: skip
        _require("loss", self.loss, self.loss in LOSSES, f"one of {LOSSES}")
        _require("max_len", self.max_len, self.max_len > self.max_new_tokens, "> max_new_tokens")
        _require("num_heads", self.num_heads, self.d_model % self.num_heads == 0
                 and (self.d_model // self.num_heads) % 2 == 0,
                 "a divisor of d_model leaving an even head width")  # fmt: skip
        _require("num_kv_heads", self.num_kv_heads, self.num_heads % self.num_kv_heads == 0,
                 "a divisor of num_heads")  # fmt: skip

    @property
    def text(self) -> TextConfig:
        """The text loop's sizes (scripts' replay and evaluation), sampled at temperature 1."""
        prompt = self.max_len - self.max_new_tokens
        return TextConfig(max_new_tokens=self.max_new_tokens, obs_len=prompt,
                          max_prompt_len=prompt, temperature=1.0)  # fmt: skip


def _require(name: str, value: Any, ok: Any, what: str) -> None:
    if not ok:
        raise ValueError(f"--{name} must be {what}, got {value!r}")


class Script(NamedTuple):
    """One scripted episode."""

    make: Callable[[], ToolWorldText]  # a fresh environment of its level.
    seed: int  # its reset seed (a training task).
    texts: list[str]  # its turns' texts.


def scripts(config: PretrainConfig) -> tuple[list[Script], list[str]]:
    """The scripted ToolWorld text episodes of every level and noise value (training tasks
    only) and the texts they hold (messages, tool schemas): the tokenizer's corpus."""
    rng = np.random.default_rng([config.seed, 1])
    out, corpus = [], []
    for level in config.levels:
        world = ToolWorldConfig(level=level, task_split="train")
        schemas = [json.dumps(tool) for tool in tool_schemas(world)]  # as the prompt has them.
        for noise in config.noise:
            for _ in range(config.episodes):
                seed = int(rng.integers(2**31 - 1))
                env = ToolWorldText(world)
                corpus += [m["content"] for m in env.reset(seed)] + schemas
                texts, done = [], False
                while not done and len(texts) < env.max_turns:
                    texts.append(env.slip_text(rng) if rng.random() < noise else env.oracle_text())
                    reply, _, done = env.step(texts[-1])
                    corpus += [texts[-1], *(m["content"] for m in reply)]
                out.append(Script(functools.partial(ToolWorldText, world), seed, texts))
    return out, corpus


def bfcl_corpus(count: int) -> list[str]:
    """Texts of the first `count` BFCL multi-turn training-split tasks (opening messages,
    tool schemas, the ground truth's call strings); [] without bfcl-eval."""
    try:
        ids = bfcl.bfcl_task_ids("multi_turn_base", "train")[:count]
    except (ImportError, ValueError):
        return []
    corpus = []
    for task_id in ids:
        env = bfcl.make_bfcl_text(task_id)
        corpus += [m["content"] for m in env.reset(0)] + [json.dumps(t) for t in env.tools]
        corpus += [call for turn in env.task.ground_truth for call in turn]
    return corpus


def train_tokenizer(corpus: list[str], vocab_size: int) -> Any:
    """A byte-level BPE tokenizer of `vocab_size` tokens learnt from `corpus`, with Qwen2.5's
    special tokens, its tool tags and its chat template (a transformers fast tokenizer)."""
    from transformers import PreTrainedTokenizerFast

    # Qwen2's normaliser and pre-tokenizer, as transformers rebuilds them when it loads the
    # tokenizer of a folder whose config.json says qwen2: every digit its own token.
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    template = shipped_template(TEMPLATE)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS), special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    tokenizer.train_from_iterator([template, *corpus], trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False, model_max_length=32768,
    )  # fmt: skip
    hf.chat_template = template
    return hf


def model_config(config: PretrainConfig, chat: ChatFormat) -> PolicyConfig:
    """The Qwen2-shaped model (q/k/v biases, tied embeddings) of the sizes, its vocabulary
    the tokenizer's rounded up to a multiple of 64 (as HF checkpoints pad it)."""
    return PolicyConfig(
        vocab_size=-(-chat.vocab_size // 64) * 64, pad_id=chat.pad_id, d_model=config.d_model,
        num_layers=config.num_layers, num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads, mlp_dim=config.mlp_dim, qkv_bias=True,
        tie_embeddings=True, norm_eps=1e-6, rope_theta=10000.0, num_summary_slots=0,
    )  # fmt: skip


def transcripts(loop: TextLoop, plays: list[Script]) -> list[tuple[np.ndarray, np.ndarray]]:
    """`(tokens, loss_mask)` of each script replayed through the text loop: each scripted
    turn appended as its ids and the end-of-turn token (`TextLoop.advance`); refuses
    sizes that no script's first prompt fits."""
    out = []
    for script in plays:
        episode = loop.start(script.make(), script.seed)
        for text in script.texts:
            if episode.over:
                break
            ids = [*loop.chat.encode(text), loop.chat.end_id]
            loop.advance(episode, ids, [0.0] * len(ids))
        if any(episode.loss_mask):  # a first prompt longer than the sizes gives none.
            out.append((np.asarray(episode.tokens, np.int32), np.asarray(episode.loss_mask)))
    if not out:
        raise ValueError(
            f"--max_len={loop.config.transcript_len}: no scripted episode's first prompt fits "
            "(the system message and the tool schemas); raise --max_len or --vocab_size"
        )
    return out


def loss_fn(graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array, mask: jax.Array):
    """Mean next-token cross-entropy over the `mask`ed targets of `[B, T]` tokens."""
    llama = nnx.merge(graphdef, params)
    inputs = tokens[:, :-1]
    hidden, _ = llama(llama.embed(inputs), inputs != llama.config.pad_id)
    logits = llama.logits(hidden)
    logp = -optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
    return -weighted_log_likelihood(logp, mask[:, 1:], jnp.ones(tokens.shape[0], jnp.float32))


def make_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation):
    """The jitted update `(params, opt_state, tokens, mask) -> (params, opt_state, loss)`."""

    @jax.jit
    def step(params, opt_state, tokens, mask):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(graphdef, p, tokens, mask))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def optimizer_of(config: PretrainConfig) -> optax.GradientTransformation:
    """AdamW (weight decay 0.01, clipped at norm 1) with a linear warm-up."""
    schedule = optax.linear_schedule(
        config.learning_rate / 10, config.learning_rate, max(config.warmup_steps, 1)
    )
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))


def batch(data: list, rows: np.ndarray, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """`[B, T]` tokens and loss mask of the transcripts `rows`, right-padded with PAD to
    the longest rounded up to a multiple of 256 (a few shapes, a few compilations)."""
    width = -(-max(len(data[r][0]) for r in rows) // 256) * 256
    tokens = np.full((len(rows), width), pad_id, np.int32)
    mask = np.zeros((len(rows), width), bool)
    for i, r in enumerate(rows):
        tokens[i, : len(data[r][0])], mask[i, : len(data[r][1])] = data[r]
    return tokens, mask


def evaluate(loop: TextLoop, params: nnx.State, tasks: list, seed: int) -> dict[str, float]:
    """Success, malformed rate and turns of the held-out tasks played by the text loop
    (the same keys at every evaluation)."""
    episodes = [loop.start(make_env(), env_seed) for make_env, env_seed in tasks]
    loop.play(params, episodes, jax.random.split(jax.random.key(seed), len(tasks)))
    metrics = episode_metrics(episodes[0].env, loop.trajectory(episodes))
    return {name: float(metrics[name]) for name in ("success", "malformed_rate", "turns")}


def heldout_tasks(config: PretrainConfig) -> list:
    """The `eval_episodes` held-out tasks of level `eval_level` (`eval_task_list`)."""
    tasks = toolworld_tasks(ToolWorldConfig(level=config.eval_level, task_split="train"))
    return eval_task_list(tasks, EvalConfig(every=1, episodes=config.eval_episodes,
                                            tasks="heldout"))  # fmt: skip


def check_workdir(workdir: str) -> None:
    """Refuses a workdir that exists and is not an empty folder."""
    if os.path.exists(workdir) and (not os.path.isdir(workdir) or os.listdir(workdir)):
        raise ValueError(f"--workdir={workdir!r} exists and is not an empty folder")


def pretrain(config: PretrainConfig, workdir: str, *, log=print) -> dict[str, Any]:
    """Scripts, tokenizer, model, training to the band, export (module docstring); returns
    the provenance's `result` section."""
    check_workdir(workdir)
    began = time.perf_counter()
    plays, corpus = scripts(config)
    tokenizer = train_tokenizer(corpus + bfcl_corpus(config.bfcl_tasks), config.vocab_size)
    chat = make_chat(tokenizer, tools=tool_schemas(ToolWorldConfig(level=config.eval_level)))
    policy = model_config(config, chat)
    graphdef, params = nnx.split(Llama(policy, lm_head=True, rngs=nnx.Rngs(config.seed)))
    loop = make_text_loop(chat, graphdef, policy, config.text)
    data = transcripts(loop, plays)
    if config.loss == "all":
        data = [(tokens, np.ones(len(tokens), bool)) for tokens, _ in data]
    tokens = sum(int(mask.sum()) for _, mask in data)
    log(f"{len(data)} transcripts, {tokens} loss tokens, {parameter_count(policy)} "
        f"parameters; data {time.perf_counter() - began:.0f} s")  # fmt: skip
    params, curve, stop = train(config, loop, graphdef, params, data, log=log)
    os.makedirs(workdir, exist_ok=True)
    out = os.path.join(workdir, MODEL_DIR)
    os.makedirs(out)
    write_hf(out, nnx.merge(graphdef, params), policy, tokenizer, _hf_fields(chat))
    write_curve(workdir, curve)
    result = {
        "stop": stop, "steps": curve[-1]["step"] if curve else 0, "parameters":
        parameter_count(policy), "transcripts": len(data), "seconds": time.perf_counter() - began,
        "logits_max_abs_diff": parity(out, graphdef, params, data[0][0][:512]),
    }  # fmt: skip
    record = provenance.collect(provenance.resolved(pretrain=config, policy=policy), result=result)
    provenance.write(workdir, provenance.finish(record))
    return result


def train(config: PretrainConfig, loop: TextLoop, graphdef, params, data, *, log=print):
    """Updates until the stop rule (module docstring): `(params, curve rows, stop)`, stop
    'band', 'above band' or 'steps'."""
    optimizer = optimizer_of(config)
    opt_state, step_fn = optimizer.init(params), make_step(graphdef, optimizer)
    rng, tasks = np.random.default_rng([config.seed, 2]), heldout_tasks(config)
    curve, losses, began = [], [], time.perf_counter()
    for step in range(1, config.steps + 1):
        rows = rng.choice(len(data), size=config.batch_size, replace=len(data) < config.batch_size)
        params, opt_state, loss = step_fn(params, opt_state, *batch(data, rows, loop.chat.pad_id))
        losses.append(float(loss))
        if step % config.eval_every and step != config.steps:
            continue
        evaluated = time.perf_counter()
        row = {"step": step, "train_loss": float(np.mean(losses)),
               **evaluate(loop, params, tasks, config.seed)}  # fmt: skip
        row.update(eval_s=time.perf_counter() - evaluated, elapsed_s=time.perf_counter() - began)
        curve.append(row)
        losses = []
        log(f"step {step}: loss {row['train_loss']:.4f}, held-out level {config.eval_level} "
            f"success {row['success']:.3f}, malformed {row['malformed_rate']:.3f} "
            f"({row['elapsed_s']:.0f} s)")  # fmt: skip
        if config.band_low <= row["success"] <= config.band_high:
            return params, curve, "band"
        if row["success"] > config.band_high:
            return params, curve, "above band"
    return params, curve, "steps"


def _hf_fields(chat: ChatFormat) -> dict[str, Any]:
    """config.json fields beside `hf_config`'s: the architecture and the token ids."""
    return {"architectures": ["Qwen2ForCausalLM"], "eos_token_id": chat.end_id,
            "bos_token_id": None, "pad_token_id": chat.pad_id}  # fmt: skip


def write_curve(workdir: str, curve: list[dict[str, Any]]) -> None:
    """`eval_curve.csv` and `eval_curve.json`: one row per evaluation."""
    with open(os.path.join(workdir, f"{CURVE}.json"), "w") as f:
        json.dump(curve, f, indent=2)
    with open(os.path.join(workdir, f"{CURVE}.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CURVE_FIELDS)
        writer.writeheader()
        writer.writerows(curve)


def parity(folder: str, graphdef: nnx.GraphDef, params: nnx.State, ids: np.ndarray) -> float:
    """The largest |logit difference| between transformers' reading of the written folder
    and our model on `ids`; refuses (ValueError) more than `PARITY_TOLERANCE`."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        theirs = hf(torch.from_numpy(ids[None].astype(np.int64))).logits.numpy()
    llama = nnx.merge(graphdef, params)
    hidden, _ = llama(llama.embed(ids[None]), np.ones((1, len(ids)), bool))
    diff = float(np.abs(np.asarray(llama.logits(hidden)) - theirs).max())
    if diff > PARITY_TOLERANCE:
        raise ValueError(f"{folder}: transformers' logits differ from ours by {diff:.2e}")
    return diff
