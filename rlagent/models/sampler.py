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
from flax import nnx

from rlagent.models.llama import NEG_INF
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


@functools.partial(
    jax.jit,
    static_argnames=(
        "graphdef",
        "max_new_tokens",
        "temperature",
        "top_k",
        "top_p",
        "end_id",
        "pad_id",
    ),
)
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

    The prompt is prefilled in one pass; then each step samples a token and feeds it
    (`max_new_tokens - 1` cached single-token passes). Rows stop at `end_id`; later
    positions hold `pad_id`.

    Args:
      graphdef, params: `nnx.split` of a `Llama`, a `ContextLM` or a `Policy` (its actor).
      prompt: [B, P] int32 tokens.
      key: PRNG key (the Gumbel noise of every step is drawn from it up front).
      logits_mask: optional additive mask [V] or [B, V] applied at every step (e.g. a
        guardrail / DSL mask: 0 allowed, -inf banned).
      prompt_valid: optional [B, P] bool, False on prompt padding (never attended to).
    Returns:
      Generation(tokens [B, N], logp [B, N], mask [B, N]).
    """
    chex.assert_rank(prompt, 2)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    lm = as_llama(nnx.merge(graphdef, params))
    batch, prompt_len = prompt.shape
    if prompt_valid is None:
        prompt_valid = jnp.ones(prompt.shape, bool)
    chex.assert_equal_shape([prompt, prompt_valid])
    if logits_mask is not None and logits_mask.shape[-1] != lm.config.vocab_size:
        raise ValueError(
            f"logits_mask has {logits_mask.shape[-1]} entries, vocab_size is {lm.config.vocab_size}"
        )
    cache = init_cache(lm.config, batch, prompt_len + max_new_tokens)
    hidden, cache = lm(lm.embed(prompt), prompt_valid, cache, 0)
    sample = functools.partial(
        sample_with_noise, temperature=temperature, top_k=top_k, top_p=top_p, mask=logits_mask
    )
    vocab = lm.config.vocab_size
    noise = jax.random.gumbel(key, (max_new_tokens, batch, vocab), jnp.float32)

    def emit(logits, done, step_noise):
        token, logp = sample(step_noise, logits)
        live = ~done
        token = jnp.where(live, token, pad_id)
        finished = done | (token == end_id) if end_id is not None else done
        return token, jnp.where(live, logp, 0.0), live, finished

    first = emit(lm.logits(hidden[:, -1]), jnp.zeros((batch,), bool), noise[0])

    def step(carry, inputs):
        index, step_noise = inputs
        token, _, live, done, cache = carry
        hidden, cache = lm(lm.embed(token[:, None]), live[:, None], cache, prompt_len + index - 1)
        out = emit(lm.logits(hidden[:, 0]), done, step_noise)
        return (*out, cache), out[:3]

    steps = jnp.arange(1, max_new_tokens, dtype=jnp.int32)
    _, (tokens, logp, live) = jax.lax.scan(step, (*first, cache), (steps, noise[1:]))
    stack = lambda head, rest: jnp.concatenate([head[:, None], rest.T], axis=1)  # noqa: E731
    return Generation(
        tokens=stack(first[0], tokens), logp=stack(first[1], logp), mask=stack(first[2], live)
    )


def as_llama(module: nnx.Module) -> Llama:
    """The LM inside a Policy / ContextLM, or the module itself."""
    if isinstance(module, Llama):
        return module
    if hasattr(module, "actor"):
        module = module.actor
    if hasattr(module, "lm") and isinstance(module.lm, Llama):
        return module.lm
    raise ValueError(f"expected a Llama, ContextLM or Policy, got {type(module).__name__}")
