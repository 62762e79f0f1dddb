"""The Tunix side of experiments/bench_text_rollout.py: Tunix's `Sampler` on the same random
Qwen2-shaped weights (its own `Qwen2` class, loaded from a safetensors file of the rlagent
weights as experiments/bench_peers_tunix.py loads its Llama), driven turn by turn.

Tunix's sampler has no multi-turn state: each call left-pads its prompts to
`max_prompt_length`, prefills them into a fresh KV cache of `cache_size` slots and decodes
up to `max_generation_steps` tokens, stopping when every row has sampled an END. Its agentic
loop calls it once per turn on each episode's whole transcript; so does this side, on the
transcripts the cached engine played (see `turn_prompts`), with fixed shapes as Tunix's
`RolloutConfig` sets them (max_prompt_length = the loop's max_prompt_len, max_generation_steps
= max_new_tokens, cache = both; one compile), the same temperature, top-p / top-k and END,
its own RNG.

Kept apart because Tunix is not a package dependency: it is imported from a folder put on
`sys.path` (docs/benchmarks_history.md, 'Installing Tunix').
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import jax
import numpy as np

from experiments.bench_peers_tunix import WordTokenizer
from experiments.bench_peers_tunix import add_path
from experiments.bench_peers_tunix import tunix_model


def status(path: str) -> str | None:
    """Why Tunix's sampler cannot run here (None when `tunix` imports from `path`)."""
    add_path(path)
    if importlib.util.find_spec("tunix") is None:
        return "not run: google-tunix is not installed (docs/benchmarks_history.md)"
    return None


def version() -> str:
    """The installed google-tunix's version."""
    return importlib.metadata.version("google-tunix")


def make_sampler(llama, text, rows: int, pad_id: int, end_id: int) -> dict:
    """Tunix's sampler of `llama`, its shapes fixed by `text` (a TextConfig), compiled by
    one untimed call on `rows` prompts."""
    from tunix.generate import sampler as sampler_lib

    # Auto axes: Tunix 0.1.7's sharding constraints predate JAX's explicit-sharding default.
    auto = (jax.sharding.AxisType.Auto,) * 2
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=auto)
    model = tunix_model(llama, mesh, "qwen2")
    cache = sampler_lib.CacheConfig(
        cache_size=text.max_prompt_len + text.max_new_tokens,
        num_layers=llama.config.num_layers, num_kv_heads=llama.config.num_kv_heads,
        head_dim=llama.config.dim_per_head,
    )  # fmt: skip
    sampler = sampler_lib.Sampler(model, WordTokenizer(pad_id, end_id), cache)
    prepared = dict(sampler=sampler, mesh=mesh, text=text, end_id=end_id)
    sample_turn(prepared, [[end_id]] * rows, seed=-1)
    return prepared


def sample_turn(prepared: dict, prompts: list[list[int]], seed: int) -> list[int]:
    """One turn of the batch: Tunix's sampler on each prompt (token ids, shown to it as the
    words its tokenizer reads); the number of tokens each row generated, END included."""
    text, end_id = prepared["text"], prepared["end_id"]
    words = [" ".join(f"t{i}" for i in prompt) for prompt in prompts]
    # Tunix samples only in top-p mode (top_p None: greedy, whatever the temperature).
    top_p = None if text.temperature == 0 else text.top_p
    with jax.set_mesh(prepared["mesh"]):
        out = prepared["sampler"](
            words, max_generation_steps=text.max_new_tokens,
            max_prompt_length=text.max_prompt_len, temperature=text.temperature,
            top_p=top_p, top_k=text.top_k or None, eos_tokens=[end_id], seed=seed,
        )  # fmt: skip
    # `tokens` stop before END; a row shorter than the limit ended with one.
    return [len(t) + (len(t) < text.max_new_tokens) for t in out.tokens]


def turn_prompts(episode) -> list[list[int]]:
    """The transcript before each of an episode's turns: its tokens up to that turn's
    generated ids (the t-th run of `loss_mask`)."""
    mask = np.asarray(episode.loss_mask, bool)
    starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
    if len(starts) != len(episode.turns):
        raise ValueError(f"{len(starts)} generated spans for {len(episode.turns)} turns")
    return [list(episode.tokens[:start]) for start in starts]


def play(prepared: dict, episodes, seed: int) -> list[list[int]]:
    """Every turn of the batch, in order, on the played `episodes`' transcripts; per turn
    the tokens each row generated."""
    prompts = [turn_prompts(episode) for episode in episodes]
    return [
        sample_turn(prepared, [rows[turn] for rows in prompts], seed=seed + turn)
        for turn in range(len(prompts[0]))
    ]
