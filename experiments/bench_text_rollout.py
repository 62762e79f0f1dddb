r"""Benchmark: the text loop's two sampling engines side by side on multi-turn episodes.

  python -m experiments.bench_text_rollout --json_out=/tmp/bench_text_rollout.json
  python -m experiments.bench_text_rollout --model=Qwen2.5-0.5B --episodes=2 --json_out=...

A batch of `--episodes` BFCL-like episodes (`_ToolReplies`: a system prompt and a task of
`--first_len` words, then `--turns` turns, each answered by a tool reply of `--reply_min`
to `--reply_max` words; replies of at most `--max_new_tokens` tokens) is played by
`rlagent.text.loop` on a random model, once with each engine of `TextConfig.engine` on the
same keys: 'cached' (each episode's KV cache kept across turns, a turn prefills only its
new tokens, decoding stops when every row has ended its turn) and 'reprefill' (every
transcript left-padded to max_prompt_len and prefilled again at every turn).

The tokenizer is a byte-level BPE whose merges make each of `--words` words ('waa', 'wab',
...) one token, so a tool reply of n words is n tokens; the random model samples among its
few hundred ids, END one of them, so a reply runs to max_new_tokens or ends before.
`--model=small` (default): a Qwen2-shaped random model of 2 layers, d = 64 (4 heads, 2
key/value heads, MLP 128, the tokenizer's vocabulary); `--model=Qwen2.5-0.5B`: that
model's shape (`experiments.model_shapes.MODELS`; its 151,936-row head, the ids past the
tokenizer's banned). max_prompt_len is the longest transcript the sizes allow (nothing is
truncated), obs_len the first prompt.

Each engine first plays `--warmup_turns` turns of another batch (compiles), then the timed
batch in one `play` call, `--repeats` times, the engines alternated so that both see the
same load (the same keys, the same tokens; per turn the median of each time). Per turn:
wall seconds (from one turn's first device call to the next's), device seconds in prefill
and in decode (each program timed to its result), host seconds (the rest: rendering,
tokenising, environment steps, batching). The re-prefill engine prefills and decodes in
one program; its prefill share is timed by a probe beside it (the same program with one
new token, not counted in the wall time), so its decode share is device minus probe, noisy
turn by turn on a shared CPU. Tokens per second are generated tokens over the summed
(median) wall time. JSON keys: `engines.<name>` (turns, rates, splits),
`speedup_vs_reprefill`, `turn16_over_turn2` (the cached engine's wall time of turn 16 over
turn 2; null unless --turns=16; `turn_last_over_turn2`: of the last turn),
`identical_tokens` (every transcript equal) and `max_abs_logp_diff`, `tunix` (that Tunix's
sampler ran, or why not), `speedup_vs_tunix` (when it ran), `load_avg` (before and after),
`provenance` (`rlagent.host.provenance`); with `--staggered_groups` > 0, `staggered`
(compaction, `staggered`).

Tunix's sampler (`--tunix_path`: a folder holding google-tunix, docs/benchmarks_history.md;
`experiments.bench_text_rollout_tunix`) is a third side, `engines.tunix`, on the same
weights (its Qwen2 class loaded from a safetensors file of them). It keeps no state across
turns, so it is driven turn by turn as Tunix's agentic loop drives it: at turn t each
episode's whole transcript before the cached engine's turn t (the same prompts, token for
token, the transcripts forced to follow the cached engine's episodes) is left-padded to
max_prompt_len, prefilled into a fresh cache of max_prompt_len + max_new_tokens slots, and
up to max_new_tokens tokens are decoded at the same temperature and top-p (Tunix samples
only in top-p mode, greedily without it), stopping when every row
has sampled END (as the cached engine's decoding does). It samples with its own RNG, so its
replies differ and it counts its own generated tokens (END included, as the engines count
theirs; their totals are in the JSON). Its plays alternate with the engines', each after
the cached engine's play it follows, and are timed the same way (its prefill and decode
programs timed to their results; host: the rest, including Tunix's tokenizing of the
transcripts, given to it as 't<id>' words).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import numpy as np
from absl import app
from absl import flags
from flax import nnx

from experiments import bench_text_rollout_tunix
from experiments.model_shapes import MODELS
from rlagent.host import provenance
from rlagent.models.llama import Llama
from rlagent.models.llama import PolicyConfig
from rlagent.models.sampler import generate
from rlagent.text.chat import make_chat
from rlagent.text.loop import ENGINES
from rlagent.text.loop import TextConfig
from rlagent.text.loop import make_text_loop

SMALL = dict(d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=128, qkv_bias=True)
CHATML = (
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<pad>", "<|im_start|>", "<|im_end|>"]
ROLES = ["system", "user", "assistant", "tool"]

_MODEL = flags.DEFINE_enum("model", "small", ["small", *MODELS], "Random model shape.")
_EPISODES = flags.DEFINE_integer("episodes", 4, "Episodes played at once.")
_TURNS = flags.DEFINE_integer("turns", 16, "Turns of an episode.")
_FIRST = flags.DEFINE_integer("first_len", 400, "Words of the system prompt and task.")
_REPLY_MIN = flags.DEFINE_integer("reply_min", 50, "Fewest words of a tool reply.")
_REPLY_MAX = flags.DEFINE_integer("reply_max", 300, "Most words of a tool reply.")
_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Tokens of an assistant reply, at most.")
_WORDS = flags.DEFINE_integer("words", 48, "Words of the texts (at most 676).")
_CHUNK = flags.DEFINE_integer("prefill_chunk", 64, "TextConfig.prefill_chunk.")
_WARMUP = flags.DEFINE_integer("warmup_turns", 2, "Untimed turns per engine (compiles).")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed plays of each engine, alternated.")
_SEED = flags.DEFINE_integer("seed", 0, "Model, task and sampling seed.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the results here.")
_STAGGERED = flags.DEFINE_integer(
    "staggered_groups", 0, "> 0: also play this many groups of --episodes episodes ending "
    "at different turns, the cached engine with and without compaction (JSON 'staggered')."
)  # fmt: skip
_TUNIX_PATH = flags.DEFINE_string(
    "tunix_path", "", "A folder holding tunix and its --no-deps dependencies ('': none)."
)


class _ToolReplies:
    """A BFCL-like text environment: reset gives a system prompt and a task, every step a
    tool reply of a random length; it never terminates (`max_turns` ends it)."""

    signal_names = ()

    def __init__(self, max_turns: int, first: int, reply: tuple[int, int], words: int):
        self.max_turns, self.first, self.reply, self.words = max_turns, first, reply, words
        self.rng = None

    def _text(self, count: int) -> str:
        return " ".join(map(word, self.rng.integers(0, self.words, count)))

    def reset(self, seed: int) -> list[dict]:
        self.rng = np.random.default_rng(seed)
        half = self.first // 2
        return [
            {"role": "system", "content": self._text(self.first - half)},
            {"role": "user", "content": self._text(half)},
        ]

    def step(self, text: str) -> tuple[list[dict], dict, bool]:
        del text
        count = int(self.rng.integers(self.reply[0], self.reply[1] + 1))
        return [{"role": "tool", "content": self._text(count)}], {}, False


def word(index: int) -> str:
    """The word of an index: 'w' and two letters (letters only: the byte-level
    pre-tokenizer splits digits off)."""
    return "w" + chr(97 + index // 26 % 26) + chr(97 + index % 26)


def word_chat(words: int):
    """A ChatFormat of a byte-level BPE tokenizer whose merges make each of the first
    `words` words (`word`, after a space) one token, with the ChatML specials and
    template."""
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from tokenizers import trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    corpus = [" " + " ".join(map(word, range(words)))] * 4 + [" ".join(ROLES)] * 4
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + len(SPECIAL) + 3 * words + 16, special_tokens=SPECIAL,
        show_progress=False, initial_alphabet=alphabet,
    )  # fmt: skip
    tokenizer.train_from_iterator(corpus, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<|im_end|>"
    )
    hf.chat_template = CHATML
    return make_chat(hf)


def sizes() -> TextConfig:
    """The loop's sizes: the longest transcript of the episodes (every turn's tool reply
    at its longest, every reply at max_new_tokens) fits, the first prompt is obs_len."""
    glue = 12  # tokens around a message: <|im_end|>, newlines, the role, its first word.
    first = _FIRST.value + 2 * glue
    later = _REPLY_MAX.value + 2 * glue
    longest = first + (_TURNS.value - 1) * (later + _NEW.value) + _NEW.value
    return TextConfig(
        max_new_tokens=_NEW.value, obs_len=max(first, later), max_prompt_len=longest,
        sample_batch=0, prefill_chunk=_CHUNK.value,
    )  # fmt: skip


class _Timer:
    """Wraps a loop's device programs: each call timed to its result, by kind."""

    def __init__(self):
        self.calls = []  # (kind, began, seconds)
        self.probe_s = 0.0

    def wrap(self, kind, program, probe=None):
        def timed(*args, **kwargs):
            began = time.perf_counter()
            out = jax.block_until_ready(program(*args, **kwargs))
            self.calls.append((kind, began, time.perf_counter() - began))
            if probe is not None:  # the re-prefill engine's prefill share.
                probe_began = time.perf_counter()
                jax.block_until_ready(probe(*args))
                seconds = time.perf_counter() - probe_began
                self.calls.append(("probe", began, seconds))
                self.probe_s += seconds
            return out

        return timed


def timed_loop(loop, timer: _Timer, probe):
    """The loop with its programs timed by `timer`."""
    if loop.cached is None:
        return loop._replace(sample=timer.wrap("sample", loop.sample, probe))
    cached = loop.cached._replace(
        prefill=timer.wrap("prefill", loop.cached.prefill),
        decode=timer.wrap("decode", loop.cached.decode),
    )
    return loop._replace(cached=cached)


def prepare(engine, chat, model, text, make_env) -> dict:
    """One engine's loop, compiled by its warm-up turns (and the re-prefill engine's probe);
    `model` is `(graphdef, params, policy_config)`."""
    graphdef, params, policy_config = model
    loop = make_text_loop(chat, graphdef, policy_config, dataclasses.replace(text, engine=engine))
    count = _EPISODES.value
    keys = jax.random.split(jax.random.key(_SEED.value), count)
    warm = [loop.start(make_env(), 10**6 + i) for i in range(count)]
    loop.play(params, warm, keys, num_turns=_WARMUP.value)
    probe = None
    if engine == "reprefill":
        settings = dict(end_id=chat.end_id, pad_id=chat.pad_id, temperature=text.temperature)

        def probe_row(params, prompt, valid, key):
            return generate(
                graphdef, params, prompt[None], key, max_new_tokens=1,
                prompt_valid=valid[None], **settings,
            )  # fmt: skip

        probe = jax.jit(jax.vmap(probe_row, in_axes=(None, 0, 0, 0)))
        jax.block_until_ready(probe(params, *_probe_args(text, count, chat.pad_id), keys))
    return dict(loop=loop, params=params, keys=keys, probe=probe)


def timed_play(prepared: dict, make_env) -> tuple[list, list[dict]]:
    """`(episodes, per-turn timings)` of one timed play of the batch."""
    timer, loop = _Timer(), prepared["loop"]
    timed = timed_loop(loop, timer, prepared["probe"])
    episodes = [loop.start(make_env(), i) for i in range(_EPISODES.value)]
    began = time.perf_counter()
    timed.play(prepared["params"], episodes, prepared["keys"])
    return episodes, _turns(timer, began, time.perf_counter() - began)


def median_play(plays: list) -> dict:
    """Per turn and field the median over the plays (the same keys: the same tokens)."""
    episodes, first = plays[-1][0], plays[0][1]
    turns = [{key: float(np.median([play[1][t][key] for play in plays])) for key in first[t]}
             for t in range(len(first))]  # fmt: skip
    return dict(episodes=episodes, timings=turns, wall=sum(t["wall_s"] for t in turns))


def _probe_args(text: TextConfig, rows: int, pad_id: int):
    prompts = np.full((rows, text.max_prompt_len), pad_id, np.int32)
    return prompts, np.ones(prompts.shape, bool)


def _turns(timer: _Timer, began: float, elapsed: float) -> list[dict]:
    """Per turn (from its first device call to the next turn's): wall, prefill, decode and
    host seconds; the re-prefill engine's probe is its prefill, out of its wall time."""
    starts = sorted(t for kind, t, _ in timer.calls if kind in ("prefill", "sample"))
    bounds = [*starts, began + elapsed]
    turns = []
    for index, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        spent = dict.fromkeys(("prefill", "decode", "sample", "probe"), 0.0)
        for kind, t, seconds in timer.calls:
            if start <= t < stop:
                spent[kind] += seconds
        device = spent["prefill"] + spent["decode"] + spent["sample"]
        # The re-prefill engine's split is estimated: its probe (a one-token call on the
        # same shapes) times the prefill apart. Under load the estimate can exceed the
        # sampling call it splits; then the whole call counts as prefill.
        prefill = min(spent["prefill"] + spent["probe"], device)
        wall = stop - start - spent["probe"]
        turns.append(dict(
            turn=index + 1, wall_s=wall, device_s=device, prefill_s=prefill,
            decode_s=device - prefill, host_s=wall - device,
        ))  # fmt: skip
    if turns:  # the host work before the first device call (batching) joins turn 1.
        turns[0]["wall_s"] += starts[0] - began
        turns[0]["host_s"] += starts[0] - began
    return turns


def summary(played: dict) -> dict:
    """Rates and splits of one engine's timed batch."""
    episodes, turns = played["episodes"], played["timings"]
    generated = sum(len(t.action) for e in episodes for t in e.turns)
    return dict(
        generated_tokens=generated,
        transcript_tokens=[len(e.tokens) for e in episodes],
        mean_reply_tokens=generated / max(sum(len(e.turns) for e in episodes), 1),
        wall_s=played["wall"],
        tokens_per_s=generated / played["wall"],
        tokens_per_turn=[
            sum(len(e.turns[t].action) for e in episodes if t < len(e.turns))
            for t in range(len(turns))
        ],  # fmt: skip
        prefill_s=sum(t["prefill_s"] for t in turns),
        decode_s=sum(t["decode_s"] for t in turns),
        host_s=sum(t["host_s"] for t in turns),
        turns=turns,
    )


def tunix_play(prepared: dict, episodes) -> tuple[list[list[int]], list[dict]]:
    """`(per turn the tokens of each row, per-turn timings)` of Tunix's sampler on the
    played `episodes`' transcripts, its prefill and decode programs timed as the engines'."""
    timer, sampler = _Timer(), prepared["sampler"]
    programs = sampler._compiled_prefill_fn, sampler._compiled_decode_fn
    sampler._compiled_prefill_fn = timer.wrap("prefill", programs[0])
    sampler._compiled_decode_fn = timer.wrap("decode", programs[1])
    try:
        began = time.perf_counter()
        counts = bench_text_rollout_tunix.play(prepared, episodes, _SEED.value)
        elapsed = time.perf_counter() - began
    finally:
        sampler._compiled_prefill_fn, sampler._compiled_decode_fn = programs
    return counts, _turns(timer, began, elapsed)


def tunix_summary(plays: list, cached: dict) -> dict:
    """Tunix's rates and splits, as `summary`'s, from its plays (per turn the medians)."""
    counts = plays[-1][0]
    played = median_play([(cached["episodes"], timings) for _, timings in plays])
    out = summary(played)
    generated = sum(map(sum, counts))
    out.update(
        generated_tokens=generated, mean_reply_tokens=generated / sum(map(len, counts)),
        tokens_per_s=generated / played["wall"],
        tokens_per_turn=[sum(row) for row in counts],
    )  # fmt: skip
    return out


def staggered(chat, model, text: TextConfig) -> dict:
    """The cached engine with and without compaction (`TextConfig.compact`) on episodes
    that end at different turns: `--staggered_groups` groups of R = `--episodes` rows,
    the episode at row i of its group ending after 1 + i (turns - 1) / (R - 1) turns, so
    every group loses rows as the turns go. Each side plays once untimed (compiles), then
    `--repeats` times, the sides alternated: the median wall seconds of a play, the
    group-turns and rows moved of one play (`CachedSampler.counts`), the same tokens."""
    graphdef, params, policy_config = model
    rows, turns = _EPISODES.value, _TURNS.value
    count = rows * _STAGGERED.value
    lengths = [1 + i % rows * (turns - 1) // max(rows - 1, 1) for i in range(count)]
    keys = jax.random.split(jax.random.key(_SEED.value), count)
    reply = (_REPLY_MIN.value, _REPLY_MAX.value)

    def play(loop):
        envs = [_ToolReplies(n, _FIRST.value, reply, _WORDS.value) for n in lengths]
        episodes = [loop.start(env, i) for i, env in enumerate(envs)]
        before = dict(loop.cached.counts)
        began = time.perf_counter()
        loop.play(params, episodes, keys)
        seconds = time.perf_counter() - began
        counts = loop.cached.counts
        return episodes, seconds, {k: counts[k] - before[k] for k in ("group_turns", "moved_rows")}

    sides = {}
    for name, compact in (("compact", True), ("kept", False)):
        config = dataclasses.replace(text, sample_batch=rows, compact=compact)
        sides[name] = dict(loop=make_text_loop(chat, graphdef, policy_config, config), walls=[])
        play(sides[name]["loop"])
    for _ in range(_REPEATS.value):
        for side in sides.values():
            side["episodes"], seconds, side["counts"] = play(side["loop"])
            side["walls"].append(seconds)
    both = list(zip(sides["compact"]["episodes"], sides["kept"]["episodes"], strict=True))
    pairs = [pair for a, b in both for pair in zip(a.turns, b.turns, strict=True)]
    out = dict(groups=_STAGGERED.value, sample_batch=rows, episode_turns=lengths)
    for name, side in sides.items():
        out[name] = dict(wall_s=float(np.median(side["walls"])), **side["counts"])
    out["speedup"] = out["kept"]["wall_s"] / out["compact"]["wall_s"]
    out["identical_tokens"] = all(a.tokens == b.tokens for a, b in both)
    out["max_abs_logp_diff"] = float(
        max((np.abs(np.subtract(a.logp, b.logp)).max(initial=0.0) for a, b in pairs), default=0)
    )
    return out


def play_all(prepared: dict, make_env) -> dict:
    """Per side its `--repeats` timed plays, alternated: every side sees the same load;
    Tunix's (when prepared) on the transcripts the cached engine just played."""
    plays = {engine: [] for engine in prepared}
    for repeat in range(_REPEATS.value):
        for engine in ENGINES:
            plays[engine].append(timed_play(prepared[engine], make_env))
            print(repeat, engine, f"{plays[engine][-1][1][-1]}", flush=True)
        if "tunix" in prepared:
            episodes = plays["cached"][-1][0]
            plays["tunix"].append(tunix_play(prepared["tunix"], episodes))
            print(repeat, "tunix", f"{plays['tunix'][-1][1][-1]}", flush=True)
    return plays


def main(argv):
    del argv
    for name in ("episodes", "turns", "first_len", "reply_min", "max_new_tokens", "words",
                 "repeats"):  # fmt: skip
        if flags.FLAGS[name].value < 1:
            raise app.UsageError(f"--{name} must be >= 1, got {flags.FLAGS[name].value}")
    if _WORDS.value > 26 * 26:
        raise app.UsageError(f"--words must be at most 676, got {_WORDS.value}")
    if _REPLY_MAX.value < _REPLY_MIN.value:
        raise app.UsageError(f"--reply_max must be >= --reply_min={_REPLY_MIN.value}")
    settings = {name: flags.FLAGS[name].value for name in (
        "model", "episodes", "turns", "first_len", "reply_min", "reply_max", "max_new_tokens",
        "words", "prefill_chunk", "warmup_turns", "repeats", "seed", "tunix_path",
        "staggered_groups",
    )}  # fmt: skip
    record = provenance.collect(settings)
    load_before = os.getloadavg()
    chat = word_chat(_WORDS.value)
    shape = SMALL | {"vocab_size": chat.vocab_size}
    if _MODEL.value != "small":
        shape = MODELS[_MODEL.value]
    policy_config = PolicyConfig(pad_id=chat.pad_id, **shape)
    model = (*nnx.split(Llama(policy_config, rngs=nnx.Rngs(_SEED.value))), policy_config)
    text = sizes()

    def make_env():
        reply = (_REPLY_MIN.value, _REPLY_MAX.value)
        return _ToolReplies(_TURNS.value, _FIRST.value, reply, _WORDS.value)

    prepared = {engine: prepare(engine, chat, model, text, make_env) for engine in ENGINES}
    tunix = bench_text_rollout_tunix.status(_TUNIX_PATH.value)
    if tunix is None:
        llama = nnx.merge(*model[:2])
        prepared["tunix"] = bench_text_rollout_tunix.make_sampler(
            llama, text, _EPISODES.value, chat.pad_id, chat.end_id
        )
    plays = play_all(prepared, make_env)
    played = {engine: median_play(plays[engine]) for engine in ENGINES}
    new, old = (played[name]["episodes"] for name in ENGINES)
    pairs = [
        pair for x, y in zip(new, old, strict=True) for pair in zip(x.turns, y.turns, strict=False)
    ]
    diffs = [np.abs(np.subtract(a.logp, b.logp)).max(initial=0.0) for a, b in pairs]
    engines = {name: summary(played[name]) for name in ENGINES}
    if tunix is None:
        engines["tunix"] = tunix_summary(plays["tunix"], played["cached"])
        tunix = (
            f"ran: Tunix {bench_text_rollout_tunix.version()}'s Sampler, turn by turn on the"
            " cached engine's transcripts"
        )
    cached_turns = engines["cached"]["turns"]
    last = cached_turns[-1]["wall_s"] / cached_turns[1]["wall_s"] if len(cached_turns) > 1 else None
    results = {
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0]),
        "cpu": provenance.cpu_model(),
        "model": _MODEL.value,
        "policy_config": dataclasses.asdict(policy_config),
        "text_config": dataclasses.asdict(text),
        "engines": engines,
        "speedup_vs_reprefill": engines["cached"]["tokens_per_s"]
        / engines["reprefill"]["tokens_per_s"],
        "turn_last_over_turn2": last,
        "turn16_over_turn2": last if _TURNS.value == 16 else None,
        "identical_tokens": all(a.tokens == b.tokens for a, b in zip(new, old, strict=True)),
        "max_abs_logp_diff": float(max(diffs, default=0.0)),
        "tunix": tunix,
        "load_avg": {"before": load_before, "after": os.getloadavg()},
    }
    if _STAGGERED.value > 0:
        results["staggered"] = staggered(chat, model, text)
    if "tunix" in engines:
        results["speedup_vs_tunix"] = (
            engines["cached"]["tokens_per_s"] / engines["tunix"]["tokens_per_s"]
        )
    results["provenance"] = provenance.finish(record)
    print(json.dumps({k: v for k, v in results.items() if k not in ("engines", "provenance")}))
    if _JSON_OUT.value:
        with open(_JSON_OUT.value, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    app.run(main)
