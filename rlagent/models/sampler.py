"""Token sampling: temperature, greedy, top-k, top-p, additive logits masks, cached decoding.

Convention for log-probabilities. The policy distribution is

    pi(a | context) = softmax(logits / tau + mask)_a,        tau = temperature (1 if greedy)

with `mask` an additive mask (0 allowed, very negative forbidden). The behaviour log-prob
stored by the sampler and the teacher-forced log-prob recomputed by `rollout.make_score` are
both log pi: top-k and top-p only truncate *where* samples are drawn from, they are not part
of pi (as in most RLHF code bases). With top_k = 0 and top_p = 1 (the defaults) the samples
follow pi exactly.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlagent.models.llama import NEG_INF
from rlagent.models.llama import KVCache
from rlagent.models.llama import Llama
from rlagent.models.llama import init_cache


def policy_log_probs(
    logits: jax.Array, *, temperature: float, mask: jax.Array | None = None
) -> jax.Array:
    """log pi = log_softmax(logits / tau + mask) over the last axis.

    Args:
      logits: [..., V] float32.
      temperature: tau > 0; 0 means greedy decoding, scored at tau = 1.
      mask: optional additive mask broadcastable to `logits` (0 allowed, <= NEG_INF banned).
    Returns:
      [..., V] float32 log-probabilities.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    tau = temperature if temperature > 0 else 1.0
    scaled = logits.astype(jnp.float32) / tau
    if mask is not None:
        # Clamp so that an additive -inf and a finite NEG_INF give the same numbers.
        scaled = scaled + jnp.maximum(mask.astype(jnp.float32), NEG_INF)
    return jax.nn.log_softmax(scaled, axis=-1)


def token_log_probs(
    hidden: jax.Array,
    head: jax.Array,
    tokens: jax.Array,
    *,
    temperature: float,
    mask: jax.Array | None = None,
    block: int | None = 8192,
) -> jax.Array:
    """log pi(token) of `policy_log_probs` (logits = hidden @ head) without [..., V] logits.

        log pi(a) = z_a - logsumexp_v z_v,        z = (hidden @ head) / tau + mask

    The log-sum-exp runs over tiles of `block` vocabulary columns (a `lax.scan` with a
    running maximum and sum, Milakov & Gimelshein 2018, "Online normalizer calculation for
    softmax"), each tile under `jax.checkpoint`: the forward and the backward pass hold one
    [N, block] float32 tile of logits, never [N, V]. The logits are rounded to the head's
    dtype as `Llama.logits` computes them (a bfloat16 matmul's output), so a bfloat16 model
    scores what it sampled.

    Args:
      hidden: [..., D] final hidden states.
      head: [D, V] the LM head (`Llama.head`).
      tokens: [...] int ids whose log-probs are taken.
      temperature: tau > 0; 0 (greedy) is scored at tau = 1.
      mask: optional [V] additive mask (0 allowed, <= NEG_INF banned).
      block: vocabulary columns per tile; None = all V at once.
    Returns:
      [...] float32 log pi(tokens).
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    chex.assert_equal_shape_prefix([hidden, tokens], tokens.ndim)
    dim, vocab = head.shape
    tau = temperature if temperature > 0 else 1.0
    block = vocab if block is None else min(block, vocab)
    count = -(-vocab // block)
    pad = count * block - vocab  # padded columns are banned (NEG_INF), so they add 0.
    bias = jnp.zeros((vocab,), jnp.float32) if mask is None else mask.astype(jnp.float32)
    bias = jnp.pad(jnp.maximum(bias, NEG_INF), (0, pad), constant_values=NEG_INF)
    flat = hidden.reshape(-1, dim).astype(head.dtype)
    ids = tokens.reshape(-1)

    def logits(columns, columns_bias):  # [D, n] -> [N, n] float32 z of those columns.
        raw = jnp.dot(flat, columns, preferred_element_type=jnp.float32)
        return raw.astype(head.dtype).astype(jnp.float32) / tau + columns_bias

    @jax.checkpoint
    def tile(carry, inputs):
        running_max, running_sum = carry
        z = logits(*inputs)
        # A maximum without gradient: logsumexp = m + log sum exp(z - m) for any m.
        new_max = jax.lax.stop_gradient(jnp.maximum(running_max, jnp.max(z, axis=-1)))
        running_sum = running_sum * jnp.exp(running_max - new_max) + jnp.sum(
            jnp.exp(z - new_max[:, None]), axis=-1
        )
        return (new_max, running_sum), None

    columns = jnp.pad(head, ((0, 0), (0, pad))).reshape(dim, count, block).transpose(1, 0, 2)
    start = (jnp.full(ids.shape, NEG_INF, jnp.float32), jnp.zeros(ids.shape, jnp.float32))
    (top, total), _ = jax.lax.scan(tile, start, (columns, bias.reshape(count, block)))
    chosen = jnp.einsum("nd,nd->n", flat, head.T[ids], preferred_element_type=jnp.float32)
    chosen = chosen.astype(head.dtype).astype(jnp.float32) / tau + bias[ids]
    return (chosen - top - jnp.log(total)).reshape(tokens.shape)


def entropy_from_log_probs(log_probs: jax.Array) -> jax.Array:
    """H = -sum_a p_a log p_a over the last axis ([..., V] -> [...])."""
    return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)


def allowed_to_mask(allowed: jax.Array) -> jax.Array:
    """[..., V] bool allowed tokens -> additive float32 mask (0 / NEG_INF)."""
    return jnp.where(allowed, 0.0, NEG_INF).astype(jnp.float32)


def sample_token(
    key: jax.Array,
    logits: jax.Array,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    mask: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Draws one token per row and returns it with its log pi.

    Same as `sample_with_noise` with Gumbel noise drawn from `key`.

    Args:
      key: PRNG key.
      logits: [..., V] float32.
      mask: optional additive mask broadcastable to `logits`.
    Returns:
      tokens [...] int32 and log pi(token) [...] float32 (see the module docstring).
    """
    noise = jax.random.gumbel(key, logits.shape, jnp.float32)
    return sample_with_noise(
        noise, logits, temperature=temperature, top_k=top_k, top_p=top_p, mask=mask
    )


def sample_with_noise(
    noise: jax.Array,
    logits: jax.Array,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    mask: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Samples by the Gumbel-max trick: argmax(scores + g), g ~ Gumbel(0, 1) i.i.d.

    scores = log pi truncated by top-k / top-p, so argmax(scores + g) ~ softmax(scores)
    (what `jax.random.categorical` does). Taking pre-drawn noise lets a decoding loop draw
    the noise of all its steps in one vectorised call instead of running the PRNG once
    per token. temperature 0 is greedy (argmax of logits + mask, noise unused); top_k > 0
    keeps the k largest logits; top_p < 1 keeps the smallest set of most likely tokens
    whose mass reaches top_p (nucleus sampling, Holtzman et al. 2020). Truncations are
    applied after the mask and temperature.

    Args:
      noise: [..., V] float32 standard Gumbel noise.
      logits: [..., V] float32.
      mask: optional additive mask broadcastable to `logits`.
    Returns:
      tokens [...] int32 and log pi(token) [...] float32 (see the module docstring).
    """
    chex.assert_rank(logits, {1, 2, 3})
    chex.assert_equal_shape([noise, logits])
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    log_pi = policy_log_probs(logits, temperature=temperature, mask=mask)
    if temperature == 0:
        tokens = jnp.argmax(log_pi, axis=-1)
    else:
        scores = log_pi
        if top_k and top_k < logits.shape[-1]:
            kth = jax.lax.top_k(scores, top_k)[0][..., -1:]
            scores = jnp.where(scores < kth, NEG_INF, scores)
        if top_p < 1.0:
            ordered = jnp.sort(scores, axis=-1)[..., ::-1]
            probs = jax.nn.softmax(ordered, axis=-1)
            mass_before = jnp.cumsum(probs, axis=-1) - probs
            # The most likely token is always kept (mass_before = 0 < top_p).
            cutoff = jnp.min(jnp.where(mass_before < top_p, ordered, jnp.inf), axis=-1)
            scores = jnp.where(scores < cutoff[..., None], NEG_INF, scores)
        tokens = jnp.argmax(scores + noise, axis=-1)
    tokens = tokens.astype(jnp.int32)
    logp = jnp.take_along_axis(log_pi, tokens[..., None], axis=-1)[..., 0]
    return tokens, logp


class Generation(NamedTuple):
    """Output of `generate`."""

    tokens: jax.Array  # [B, N] int32 generated tokens (pad_id after END).
    logp: jax.Array  # [B, N] float32 log pi of each generated token (0 after END).
    mask: jax.Array  # [B, N] bool tokens actually generated (END included).


_SETTINGS = ("max_new_tokens", "temperature", "top_k", "top_p", "end_id", "pad_id")


@functools.partial(jax.jit, static_argnames=("graphdef", *_SETTINGS))
def generate(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    prompt: jax.Array,
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    logits_mask: jax.Array | None = None,
    prompt_valid: jax.Array | None = None,
    end_id: int | None = None,
    pad_id: int = 0,
) -> Generation:
    """Samples continuations of token prompts with a KV cache (one compiled program).

    The prompt is prefilled in one pass, then `decode` samples: at most `max_new_tokens`
    tokens, stopping when every row has reached `end_id` (later positions hold `pad_id`).

    Args:
      graphdef, params: `nnx.split` of a `Llama`, a `ContextLM` or a `Policy` (its actor).
      prompt: [B, P] int32 tokens.
      key: PRNG key (step s draws its Gumbel noise from `fold_in(key, s)`).
      logits_mask: optional additive mask [V] or [B, V] applied at every step (e.g. a
        guardrail / DSL mask: 0 allowed, -inf banned).
      prompt_valid: optional [B, P] bool, False on prompt padding (never attended to).
    Returns:
      Generation(tokens [B, N], logp [B, N], mask [B, N]).
    """
    chex.assert_rank(prompt, 2)
    lm = as_llama(nnx.merge(graphdef, params))
    batch, prompt_len = prompt.shape
    if prompt_valid is None:
        prompt_valid = jnp.ones(prompt.shape, bool)
    chex.assert_equal_shape([prompt, prompt_valid])
    cache = init_cache(lm.config, batch, prompt_len + max_new_tokens)
    hidden, cache = lm(lm.embed(prompt), prompt_valid, cache, 0, read=np.asarray([prompt_len - 1]))
    out, _ = _decode(
        lm, cache, lm.logits(hidden[:, 0]), prompt_len, key, jnp.zeros((batch,), bool),
        max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        logits_mask=logits_mask, end_id=end_id, pad_id=pad_id,
    )  # fmt: skip
    return out


@functools.partial(jax.jit, static_argnames=("graphdef", "chunk"), donate_argnames=("cache",))
def prefill(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    cache: KVCache,
    tokens: jax.Array,
    count: jax.Array,
    start: jax.Array,
    *,
    chunk: int,
    offset: jax.Array | int = 0,
) -> tuple[jax.Array, KVCache]:
    """Appends `count` tokens to a cache holding `start` slots: the next-token logits.

    The tokens are written at slots `[start, start + count)` in pieces of `chunk` (a
    `lax.while_loop` of `ceil(count / chunk)` passes, so one program serves every count);
    the positions past `count` of the last piece are written as invalid keys, which the
    next write overwrites. The cache needs `start + count - 1 + chunk` slots at least.

    Args:
      graphdef, params: as `generate`'s.
      cache: the KVCache of B rows whose first `start` slots hold their context.
      tokens: [B, W] int32, W a multiple of `chunk`; positions past `count` are ignored.
      count: int32 scalar >= 0, the tokens to append (the same in every row; `vmap` a
        one-row call for rows of their own counts, as `rlagent.text.loop` does).
      start: int32 scalar, the first slot written.
      offset: int32 scalar, the RoPE position of a slot minus the slot (the tokens this
        cache evicted before them: `evict`); 0 when slots are positions.
    Returns:
      [B, V] float32 logits after the last appended token (undefined when count is 0)
      and the cache.
    """
    chex.assert_rank(tokens, 2)
    if tokens.shape[1] % chunk:
        raise ValueError(
            f"prefill: tokens width {tokens.shape[1]} is not a multiple of chunk={chunk}"
        )
    lm = as_llama(nnx.merge(graphdef, params))
    batch = tokens.shape[0]

    def piece(carry):
        index, cache, _ = carry
        base = index * chunk
        ids = jax.lax.dynamic_slice_in_dim(tokens, base, chunk, axis=1)
        valid = jnp.broadcast_to(base + jnp.arange(chunk) < count, ids.shape)
        read = jnp.clip(count - 1 - base, 0, chunk - 1)[None]
        hidden, cache = lm(lm.embed(ids), valid, cache, start + base, read=read, offset=offset)
        return index + 1, cache, hidden[:, 0]

    last = jnp.zeros((batch, lm.config.d_model), jnp.dtype(lm.config.dtype))
    carry = (jnp.int32(0), cache, last)
    _, cache, last = jax.lax.while_loop(lambda c: c[0] * chunk < count, piece, carry)
    return lm.logits(last), cache


@functools.partial(jax.jit, donate_argnames=("cache",))
def evict(cache: KVCache, header: jax.Array, count: jax.Array) -> KVCache:
    """Drops `count` slots of a cache from slot `header` on: the slots after them move down
    by `count` (order kept), the last `count` become free (invalid). Keys are stored
    rotated at their positions, so the kept entries still attend as at their positions;
    later tokens are written after them with `offset` = the slots evicted so far
    (`prefill`, `decode`). Slots keep the positions' order, so causality by slot holds.
    `header`, `count`: int32 scalars (the same in every row; `vmap` per-row calls)."""
    length = cache.valid.shape[-1]
    slots = jnp.arange(length)
    source = jnp.where(slots < header, slots, slots + count)
    kept = source < length
    source = jnp.minimum(source, length - 1)
    return KVCache(
        k=jnp.take(cache.k, source, axis=-1),
        v=jnp.take(cache.v, source, axis=-2),
        valid=jnp.take(cache.valid, source, axis=-1) & kept,
    )


@functools.partial(jax.jit, static_argnames=("graphdef", *_SETTINGS), donate_argnames=("cache",))
def decode(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    cache: KVCache,
    logits: jax.Array,
    start: jax.Array,
    key: jax.Array,
    *,
    done: jax.Array | None = None,
    offset: jax.Array | int = 0,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    logits_mask: jax.Array | None = None,
    end_id: int | None = None,
    pad_id: int = 0,
) -> tuple[Generation, KVCache]:
    """Samples from `logits` on, feeding each token to the cache: `generate`'s decoding.

    Args:
      cache: the KVCache whose first `start` slots hold the context; it needs
        `start + max_new_tokens - 1` slots.
      logits: [B, V] float32 next-token logits after the context (`prefill`'s).
      start: int32 scalar, the slot of the first sampled token.
      key: PRNG key; step s draws its Gumbel noise from `fold_in(key, s)`.
      done: optional [B] bool rows that sample nothing (their outputs are padding).
      offset: int32 scalar, a slot's RoPE position minus the slot (`prefill`'s).
    Returns:
      Generation(tokens [B, N], logp [B, N], mask [B, N]) and the cache (the last sampled
      token of a row is not in it).
    """
    lm = as_llama(nnx.merge(graphdef, params))
    if done is None:
        done = jnp.zeros(logits.shape[:1], bool)
    return _decode(
        lm, cache, logits, start, key, done, max_new_tokens=max_new_tokens,
        temperature=temperature, top_k=top_k, top_p=top_p, logits_mask=logits_mask,
        end_id=end_id, pad_id=pad_id, offset=offset,
    )  # fmt: skip


def _decode(
    lm, cache, logits, start, key, done, *, max_new_tokens, temperature, top_k, top_p,
    logits_mask, end_id, pad_id, offset=0,
) -> tuple[Generation, KVCache]:  # fmt: skip
    """`decode` on a merged LM: a `lax.while_loop` that ends when every row has sampled
    `end_id` (or after `max_new_tokens` steps); step s draws Gumbel noise [B, V] from
    `fold_in(key, s)`, so a row's tokens depend on its key and context only, not on how
    many steps the batch runs."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    vocab = lm.config.vocab_size
    if logits_mask is not None and logits_mask.shape[-1] != vocab:
        raise ValueError(f"logits_mask has {logits_mask.shape[-1]} entries, vocab_size is {vocab}")
    chex.assert_rank(logits, 2)
    batch = logits.shape[0]

    def emit(step, logits, done):
        noise = jax.random.gumbel(jax.random.fold_in(key, step), (batch, vocab), jnp.float32)
        token, logp = sample_with_noise(
            noise, logits, temperature=temperature, top_k=top_k, top_p=top_p, mask=logits_mask
        )
        live = ~done
        token = jnp.where(live, token, pad_id)
        finished = done | (token == end_id) if end_id is not None else done
        return token, jnp.where(live, logp, 0.0), live, finished

    def write(buffers, step, out):
        return tuple(
            jax.lax.dynamic_update_slice_in_dim(buffer, value[:, None], step, axis=1)
            for buffer, value in zip(buffers, out, strict=True)
        )

    buffers = (
        jnp.full((batch, max_new_tokens), pad_id, jnp.int32),
        jnp.zeros((batch, max_new_tokens), jnp.float32),
        jnp.zeros((batch, max_new_tokens), bool),
    )
    token, logp, live, done = emit(0, logits, done)
    buffers = write(buffers, 0, (token, logp, live))

    def step(carry):
        index, token, live, done, cache, buffers = carry
        slot = start + index - 1
        hidden, cache = lm(lm.embed(token[:, None]), live[:, None], cache, slot, offset=offset)
        token, logp, live, done = emit(index, lm.logits(hidden[:, 0]), done)
        return index + 1, token, live, done, cache, write(buffers, index, (token, logp, live))

    def going(carry):
        return (carry[0] < max_new_tokens) & ~jnp.all(carry[3])

    carry = (jnp.int32(1), token, live, done, cache, buffers)
    *_, cache, (tokens, logp, mask) = jax.lax.while_loop(going, step, carry)
    return Generation(tokens=tokens, logp=logp, mask=mask), cache


def as_llama(module: nnx.Module) -> Llama:
    """The LM inside a Policy / ContextLM, or the module itself."""
    if isinstance(module, Llama):
        return module
    if hasattr(module, "actor"):
        module = module.actor
    if hasattr(module, "lm") and isinstance(module.lm, Llama):
        return module.lm
    raise ValueError(f"expected a Llama, ContextLM or Policy, got {type(module).__name__}")
