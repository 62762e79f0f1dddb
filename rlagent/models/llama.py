"""Llama-style decoder-only language model in Flax NNX, with a functional KV cache.

Architecture (Touvron et al., 2023, "LLaMA"): token embedding, `num_layers` pre-norm blocks

    h = x + Attn(RMSNorm(x)),        y = h + W_down(silu(W_gate RMSNorm(h)) * W_up RMSNorm(h))

with rotary position embeddings (RoPE, Su et al. 2021, "rotate-half" layout as in HF
`transformers`), grouped-query attention (`num_kv_heads` key/value heads shared by groups of
`num_heads // num_kv_heads` query heads), a final RMSNorm and an untied (or tied) LM head.
Options of pretrained families: q/k/v biases (Qwen2), a per-head RMSNorm of queries and
keys before RoPE (Qwen3), a head width other than d_model / num_heads, and RoPE frequency
scaling ('linear', 'llama3'). The parameter layout maps one-to-one onto transformers'
`LlamaForCausalLM`, `Qwen2ForCausalLM` and `Qwen3ForCausalLM` (see `rlagent.models.hf`;
`rlagent.models.checkpoint` loads their safetensors).

The trunk takes *embeddings* rather than token ids, so that the state encoder can place
learned vectors (summary slots, progress markers) in the context beside embedded tokens.
Every position has a *slot* index: without a cache the slots are `0..T-1`; with a cache a
chunk of `T` inputs is written at slots `[write_index, write_index + T)`. The slot is the
RoPE position and defines causality (a query at slot `i` sees keys at slots `<= i`). Keys
can be switched off individually (`key_valid`), which is how padding is kept out of the
context in both rollout and teacher-forced scoring.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# Finite "minus infinity" for masked attention scores / logits: keeps every softmax well
# defined (a fully masked row becomes uniform instead of NaN) and keeps gradients finite.
NEG_INF = -1e30


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """Sizes of the policy LM, its value head and its state encoder (hashable, static)."""

    vocab_size: int = 128  # V: token vocabulary (ToolWorld's `dsl.VOCAB_SIZE`).
    pad_id: int = 0  # PAD token: padding in observations/actions, never attended to.
    d_model: int = 64  # D: residual width.
    num_layers: int = 2  # decoder blocks.
    num_heads: int = 4  # query heads.
    num_kv_heads: int = 2  # key/value heads (grouped-query attention); divides num_heads.
    head_dim: int | None = None  # per-head width; None -> d_model // num_heads.
    mlp_dim: int = 128  # SwiGLU hidden width.
    rope_theta: float = 10000.0  # RoPE base.
    # RoPE frequency scaling of long-context checkpoints (HF `rope_type`): None, 'linear'
    # (every frequency / rope_factor) or 'llama3' (Llama 3.1: low frequencies / rope_factor,
    # high ones kept, a smooth blend between the two wavelength bounds below).
    rope_scaling: str | None = None
    rope_factor: float = 1.0  # the scaling factor of 'linear' and 'llama3'.
    rope_low_freq_factor: float = 1.0  # 'llama3': wavelengths > original / this are scaled.
    rope_high_freq_factor: float = 4.0  # 'llama3': wavelengths < original / this are kept.
    rope_original_max_position: int = 8192  # 'llama3': the pre-training context length.
    norm_eps: float = 1e-5  # RMSNorm epsilon.
    qkv_bias: bool = False  # biases on the q, k, v projections (Qwen2).
    qk_norm: bool = False  # per-head RMSNorm of queries and keys before RoPE (Qwen3).
    tie_embeddings: bool = False  # LM head shares the token embedding matrix.
    value_head: str = "shared"  # 'shared': head on the policy trunk; 'separate': own critic LM.
    num_summary_slots: int = 4  # M: learned summary vectors of turns that left the window.
    summary_dim: int = 64  # width of the recurrent summary state.
    max_markers: int = 16  # largest number K of task-progress markers supported.
    num_marker_states: int = 4  # marker values: 0 absent, 1 pending, 2 done, 3 failed.
    # Pointer prior (See et al., 2017): logits += g * [token in a visible observation],
    # g a learned scalar initialised here; None = no copy gate. A model trained from
    # scratch cannot copy an order id from the user's message until it has learned to;
    # pretrained LLMs can, and this gate gives a tiny policy that ability from the start.
    copy_prior: float | None = None
    param_dtype: str = "float32"  # storage dtype of the parameters.
    dtype: str = "float32"  # compute dtype of matmuls (softmaxes and norms run in float32).
    # Rematerialise each decoder block in the backward pass (`nnx.remat`): a gradient keeps
    # only the blocks' inputs and recomputes one block's activations (its attention weights
    # included) at a time, for one more forward pass of compute. Same numbers either way.
    remat: bool = False
    # Queries per attention block: a chunk longer than this attends block by block under
    # `jax.checkpoint`, so no [H, T, T] score tensor exists at once (forward or backward),
    # only [H, block, T]; exact, the same softmax per query. None = one block.
    attention_block: int | None = 256
    # Vocabulary columns per tile of the teacher-forced log-probs (`sampler.token_log_probs`):
    # one [N, tile] float32 block of logits at a time instead of [N, V]. None = one tile.
    vocab_block: int | None = 8192

    def __post_init__(self):
        positive = ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "mlp_dim",
                    "summary_dim", "max_markers", "num_marker_states")  # fmt: skip
        for name in positive:
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"PolicyConfig.{name} must be an integer >= 1, got "
                                 f"{getattr(self, name)!r}")  # fmt: skip
        for name in ("head_dim", "attention_block", "vocab_block"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"PolicyConfig.{name} must be None or >= 1, got {value!r}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"PolicyConfig.pad_id must be in [0, vocab_size), got {self.pad_id}")
        if not (self.norm_eps > 0 and self.rope_theta > 0):  # also rejects NaN.
            raise ValueError(
                f"PolicyConfig.norm_eps and rope_theta must be > 0, got {self.norm_eps}, "
                f"{self.rope_theta}"
            )
        self._check_rope_scaling()
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.value_head not in ("shared", "separate"):
            raise ValueError(f"value_head must be 'shared' or 'separate', got {self.value_head!r}")
        if self.num_summary_slots < 0:
            raise ValueError(f"num_summary_slots must be >= 0, got {self.num_summary_slots}")
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
                "set head_dim explicitly"
            )
        if self.dim_per_head % 2:
            raise ValueError(
                f"PolicyConfig: the head width {self.dim_per_head} (head_dim, or d_model / "
                "num_heads) must be even: RoPE rotates the two halves of every head"
            )
        self._check_numbers()

    def _check_numbers(self):
        """Dtype names JAX knows as floating point; a finite copy prior."""
        for name in ("dtype", "param_dtype"):
            try:
                floating = jnp.issubdtype(jnp.dtype(getattr(self, name)), jnp.floating)
            except TypeError:
                floating = False
            if not floating:
                raise ValueError(
                    f"PolicyConfig.{name} must name a floating-point dtype (e.g. 'float32', "
                    f"'bfloat16'), got {getattr(self, name)!r}"
                )
        if self.copy_prior is not None and not math.isfinite(self.copy_prior):
            raise ValueError(
                f"PolicyConfig.copy_prior must be finite or None, got {self.copy_prior}"
            )

    def _check_rope_scaling(self):
        if self.rope_scaling not in (None, "linear", "llama3"):
            raise ValueError(
                f"PolicyConfig.rope_scaling must be None, 'linear' or 'llama3', got "
                f"{self.rope_scaling!r}"
            )
        if not self.rope_factor > 0:
            raise ValueError(f"PolicyConfig.rope_factor must be > 0, got {self.rope_factor}")
        if self.rope_scaling == "llama3" and not (
            0 < self.rope_low_freq_factor < self.rope_high_freq_factor
            and self.rope_original_max_position >= 1
        ):
            raise ValueError(
                "PolicyConfig 'llama3' RoPE needs 0 < rope_low_freq_factor < "
                f"rope_high_freq_factor and rope_original_max_position >= 1, got "
                f"{self.rope_low_freq_factor}, {self.rope_high_freq_factor}, "
                f"{self.rope_original_max_position}"
            )

    @property
    def dim_per_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

    @property
    def rope_scaling_params(self) -> RopeScaling | None:
        """The RoPE scaling that `rope` applies, None without scaling."""
        if self.rope_scaling is None:
            return None
        return RopeScaling(
            self.rope_scaling,
            float(self.rope_factor),
            float(self.rope_low_freq_factor),
            float(self.rope_high_freq_factor),
            int(self.rope_original_max_position),
        )


class RopeScaling(NamedTuple):
    """RoPE frequency scaling (`PolicyConfig.rope_scaling` and its parameters)."""

    kind: str  # 'linear' or 'llama3'.
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: int


class KVCache(NamedTuple):
    """Keys and values of every layer for `T_max` slots of a batch of sequences."""

    # Head-major and matmul-ready (keys [B, H_kv, d, T], values [B, H_kv, T, d] per layer):
    # a [.., T, H, ..] layout makes XLA transpose the whole cache at every decoding step,
    # and measured on CPU this layout makes the two attention products 3-5x faster.
    k: jax.Array  # [num_layers, B, H_kv, head_dim, T_max] rotated keys.
    v: jax.Array  # [num_layers, B, H_kv, T_max, head_dim] values.
    valid: jax.Array  # [B, T_max] bool: slot holds a real key (written and not padding).


def init_cache(config: PolicyConfig, batch: int, length: int) -> KVCache:
    """An empty cache of `length` slots: nothing valid, zeros everywhere."""
    heads = (config.num_layers, batch, config.num_kv_heads)
    dtype = jnp.dtype(config.dtype)
    return KVCache(
        k=jnp.zeros((*heads, config.dim_per_head, length), dtype),
        v=jnp.zeros((*heads, length, config.dim_per_head), dtype),
        valid=jnp.zeros((batch, length), bool),
    )


class RMSNorm(nnx.Module):
    """y = x / sqrt(mean(x^2) + eps) * w, computed in float32 (as HF Llama), returned in
    x's dtype: float32 master weights (`PolicyConfig.param_dtype`) are cast to the compute
    dtype here, as a Linear casts its kernel, so bfloat16 activations stay bfloat16."""

    def __init__(self, dim: int, eps: float, param_dtype: jnp.dtype):
        self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * normed.astype(x.dtype)


def rope(
    x: jax.Array, positions: jax.Array, theta: float, scaling: RopeScaling | None = None
) -> jax.Array:
    """Rotary embedding, rotate-half layout.

    x_rot = x * cos(p w) + rotate_half(x) * sin(p w), w_j = theta^(-2j / d), where
    rotate_half([a, b]) = [-b, a] splits the last axis in halves; `scaling` rescales the
    frequencies w (`scale_frequencies`).

    Args:
      x: [B, T, H, d] queries or keys.
      positions: [B, T] or [T] (shared by the batch) int32 slot indices, a jax or NumPy
        array.
    """
    dim = x.shape[-1]
    # Known positions (a NumPy array) give constant tables: XLA would otherwise recompute
    # cos and sin inside every fused use, for every element of x.
    xp = np if isinstance(positions, np.ndarray) else jnp
    inv_freq = 1.0 / (theta ** (xp.arange(0, dim, 2, dtype=xp.float32) / dim))
    if scaling is not None:
        inv_freq = scale_frequencies(inv_freq, scaling)
    angles = positions.astype(xp.float32)[..., None] * inv_freq  # [(B,) T, d/2]
    angles = xp.concatenate([angles, angles], axis=-1)[..., None, :]  # [(B,) T, 1, d]
    cos, sin = xp.cos(angles).astype(xp.float32), xp.sin(angles).astype(xp.float32)
    x32 = x.astype(jnp.float32)
    first, second = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-second, first], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


def scale_frequencies(inv_freq: jax.Array, scaling: RopeScaling) -> jax.Array:
    """[d/2] float32 RoPE frequencies w -> the scaled ones (NumPy or jax, as given).

    'linear': w / factor (position interpolation, Chen et al. 2023). 'llama3' (as HF's
    `_compute_llama3_parameters`): with wavelength l = 2 pi / w and the pre-training
    context N, w / factor where l > N / low_freq_factor, w where l < N / high_freq_factor,
    and in between (1 - s) w / factor + s w, s = (N / l - low) / (high - low).
    """
    xp = np if isinstance(inv_freq, np.ndarray) else jnp
    if scaling.kind == "linear":
        return (inv_freq / scaling.factor).astype(xp.float32)
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    context = scaling.original_max_position
    wavelength = 2 * np.pi / inv_freq
    scaled = xp.where(wavelength > context / low, inv_freq / scaling.factor, inv_freq)
    smooth = (context / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelength >= context / high) & (wavelength <= context / low)
    return xp.where(medium, smoothed, scaled).astype(xp.float32)


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE over a chunk and (optionally) a KV cache."""

    def __init__(self, config: PolicyConfig, *, rngs: nnx.Rngs):
        dim, hd = config.d_model, config.dim_per_head
        pdt = jnp.dtype(config.param_dtype)
        kw = dict(dtype=jnp.dtype(config.dtype), param_dtype=pdt, rngs=rngs)
        qkv = dict(use_bias=config.qkv_bias, **kw)
        self.q_proj = nnx.Linear(dim, config.num_heads * hd, **qkv)
        self.k_proj = nnx.Linear(dim, config.num_kv_heads * hd, **qkv)
        self.v_proj = nnx.Linear(dim, config.num_kv_heads * hd, **qkv)
        self.o_proj = nnx.Linear(config.num_heads * hd, dim, use_bias=False, **kw)
        if config.qk_norm:
            self.q_norm = RMSNorm(hd, config.norm_eps, pdt)
            self.k_norm = RMSNorm(hd, config.norm_eps, pdt)
        else:
            self.q_norm = self.k_norm = None
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = hd
        self.rope_theta = config.rope_theta
        self.rope_scaling = config.rope_scaling_params
        self.attention_block = config.attention_block

    def __call__(
        self,
        x: jax.Array,
        slots: jax.Array,
        keys: tuple[jax.Array, jax.Array, int] | None,
        key_slots: jax.Array,
        key_valid: jax.Array,
        write_index: jax.Array | int,
        *,
        read: jax.Array | None = None,
        offset: jax.Array | int = 0,
        window: TurnWindow | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """Attends a chunk of queries to the chunk (no cache) or to the whole cache.

        Args:
          x: [B, T, D] normed inputs of the chunk.
          slots: [T] slot of each input (RoPE position, causal order), the same in
            every row.
          keys: (k, v, layer) with the cache of all layers, each
            [num_layers, B, H_kv, d, T_max] and [num_layers, B, H_kv, T_max, d], and this
            layer's index; or None.
          key_slots: [T_k] slots of the keys attended to (T_k = T_max or T).
          key_valid: [B, T_k] bool keys that may be attended to.
          write_index: first cache slot of the chunk (ignored without cache).
          read: optional [R] positions of the chunk that ask queries (keys and values
            still come from every position); None = all T.
          offset: added to the slots to give the RoPE positions (causality stays by slot).
          window: an optional `TurnWindow` mask on top of causality and `key_valid`.
        Returns:
          [B, T, D] output (or [B, R, D] at `read`) and the cache (k, v) with the chunk
          written in (without cache, the chunk's own keys and values).
        """
        batch, length, _ = x.shape
        k = self.k_proj(x).reshape(batch, length, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(batch, length, self.num_kv_heads, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k)
        k = rope(k, slots + offset, self.rope_theta, self.rope_scaling)
        k = k.transpose(0, 2, 3, 1)  # [B, H_kv, d, T]
        if read is not None:
            x, slots = x[:, read], slots[read]
            window = None if window is None else window._replace(floor=window.floor[:, read])
            length = x.shape[1]
        q = self.q_proj(x).reshape(batch, length, self.num_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = rope(q, slots + offset, self.rope_theta, self.rope_scaling)
        v = v.transpose(0, 2, 1, 3)  # [B, H_kv, T, d]
        new_keys = (k, v)
        if keys is not None:
            # Written in place into the all-layer buffers (no per-step copy of the cache).
            cache_k, cache_v, layer = keys
            start_k, start_v = (layer, 0, 0, 0, write_index), (layer, 0, 0, write_index, 0)
            cache_k = jax.lax.dynamic_update_slice(cache_k, k[None].astype(cache_k.dtype), start_k)
            cache_v = jax.lax.dynamic_update_slice(cache_v, v[None].astype(cache_v.dtype), start_v)
            new_keys = (cache_k, cache_v)
            k, v = cache_k[layer], cache_v[layer]
        groups = self.num_heads // self.num_kv_heads
        q = q.reshape(batch, length, self.num_kv_heads, groups, self.head_dim)
        q = q.transpose(0, 2, 3, 1, 4)  # [B, H_kv, G, T, d]
        out = attend(
            q, k, v, slots, key_slots, key_valid, block=self.attention_block, window=window
        )
        out = out.transpose(0, 3, 1, 2, 4).reshape(batch, length, self.num_heads * self.head_dim)
        return self.o_proj(out), new_keys


class TurnWindow(NamedTuple):
    """A history window over turns: a query sees a key (besides causality and validity)
    when the key's turn is < 0 (the header) or at least the query's floor. With the turn
    a key belongs to and floor = (the turn a query is read in) - W, a query sees the header
    and the last W turns, as a sampler that evicts older turns from its cache."""

    floor: jax.Array  # [B, T] int32: the oldest turn each query sees.
    turn: jax.Array  # [B, T_k] int32: each key's turn (< 0: the header, always seen).


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    slots: jax.Array,
    key_slots: jax.Array,
    key_valid: jax.Array,
    *,
    block: int | None = None,
    window: TurnWindow | None = None,
) -> jax.Array:
    """softmax(q k / sqrt(d) masked) v, a query at slot i seeing the valid keys at slots <= i.

    A chunk of more than `block` queries runs as a `lax.scan` over blocks of `block`
    queries, each under `jax.checkpoint`: the float32 scores of one block, [B, H, block,
    T_k], exist at a time, in the forward pass and in the backward (which recomputes
    them), never [B, H, T, T_k]. Every query's softmax is the dense one's.

    Args:
      q: [B, H_kv, G, T, d] queries (G query heads share a key/value head).
      k: [B, H_kv, d, T_k] keys; v: [B, H_kv, T_k, d] values.
      slots: [T] the queries' slots; key_slots: [T_k]; key_valid: [B, T_k] bool.
      window: optional `TurnWindow` (floor [B, T], turn [B, T_k]) restricting the keys.
    Returns:
      [B, H_kv, G, T, d] attention outputs in v's dtype.
    """
    length = q.shape[3]
    if block is None or length <= block:
        return _dense_attention(q, k, v, slots, key_slots, key_valid, window=window)
    count = -(-length // block)
    pad = count * block - length  # padded queries (slot 0) are computed, then dropped.
    q = jnp.pad(q, ((0, 0), (0, 0), (0, 0), (0, pad), (0, 0)))
    slot_blocks = jnp.pad(jnp.asarray(slots), (0, pad)).reshape(count, block)
    q_blocks = jnp.moveaxis(q.reshape(*q.shape[:3], count, block, q.shape[-1]), 3, 0)
    floors = None
    if window is not None:  # [n, B, b]: each block's queries' floors.
        floors = jnp.pad(window.floor, ((0, 0), (0, pad))).reshape(-1, count, block)
        floors = jnp.moveaxis(floors, 1, 0)

    @jax.checkpoint
    def one_block(_, inputs):
        q_block, block_slots, floor = inputs
        turns = None if window is None else TurnWindow(floor, window.turn)
        return None, _dense_attention(
            q_block, k, v, block_slots, key_slots, key_valid, window=turns
        )

    inputs = (q_blocks, slot_blocks, floors)
    _, out = jax.lax.scan(one_block, None, inputs)  # [n, B, H_kv, G, b, d]
    out = jnp.moveaxis(out, 0, 3).reshape(*out.shape[1:4], count * block, out.shape[-1])
    return out[:, :, :, :length]


def _dense_attention(q, k, v, slots, key_slots, key_valid, *, window=None):
    """`attend` in one block: the [B, H_kv, G T, T_k] float32 scores at once."""
    batch, kv_heads, groups, length, dim = q.shape
    q = q.reshape(batch, kv_heads, groups * length, dim)
    scores = jnp.einsum("bkqd,bkds->bkqs", q, k, preferred_element_type=jnp.float32)
    scores = scores.reshape(batch, kv_heads, groups, length, -1)
    scores = scores / jnp.sqrt(jnp.float32(dim))
    allowed = (key_slots[None, None, :] <= slots[None, :, None]) & key_valid[:, None, :]
    if window is not None:  # [B, T, T_k]: the header, or turns at or past the floor.
        turn = window.turn[:, None, :]
        allowed = allowed & ((turn < 0) | (turn >= window.floor[:, :, None]))
    scores = jnp.where(allowed[:, None, None], scores, NEG_INF)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    weights = weights.reshape(batch, kv_heads, groups * length, -1)
    out = jnp.einsum("bkqs,bksd->bkqd", weights, v)  # [B, H_kv, G T, d]
    return out.reshape(batch, kv_heads, groups, length, dim)


class MLP(nnx.Module):
    """SwiGLU feed-forward: W_down(silu(W_gate x) * W_up x)."""

    def __init__(self, config: PolicyConfig, *, rngs: nnx.Rngs):
        kw = dict(
            use_bias=False,
            dtype=jnp.dtype(config.dtype),
            param_dtype=jnp.dtype(config.param_dtype),
            rngs=rngs,
        )
        self.gate_proj = nnx.Linear(config.d_model, config.mlp_dim, **kw)
        self.up_proj = nnx.Linear(config.d_model, config.mlp_dim, **kw)
        self.down_proj = nnx.Linear(config.mlp_dim, config.d_model, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    """Pre-norm block: attention then SwiGLU, each with a residual connection."""

    def __init__(self, config: PolicyConfig, *, rngs: nnx.Rngs):
        pdt = jnp.dtype(config.param_dtype)
        self.input_layernorm = RMSNorm(config.d_model, config.norm_eps, pdt)
        self.self_attn = Attention(config, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(config.d_model, config.norm_eps, pdt)
        self.mlp = MLP(config, rngs=rngs)

    def __call__(self, x, slots, keys, key_slots, key_valid, write_index, *, read=None, **kw):
        """[B, T, D] -> [B, T, D], or [B, R, D] at positions `read [R]` only; `kw`: the
        attention's `offset` and `window`."""
        attn, keys = self.self_attn(
            self.input_layernorm(x), slots, keys, key_slots, key_valid, write_index, read=read,
            **kw,
        )  # fmt: skip
        h = (x if read is None else x[:, read]) + attn
        return h + self.mlp(self.post_attention_layernorm(h)), keys


class Llama(nnx.Module):
    """Token embedding + decoder blocks + final norm (+ LM head); see the module docstring."""

    def __init__(self, config: PolicyConfig, *, lm_head: bool = True, rngs: nnx.Rngs):
        pdt = jnp.dtype(config.param_dtype)
        self.config = config
        self.embed_tokens = nnx.Embed(
            config.vocab_size,
            config.d_model,
            dtype=jnp.dtype(config.dtype),
            param_dtype=pdt,
            embedding_init=nnx.initializers.normal(0.02),
            rngs=rngs,
        )
        self.layers = nnx.List([DecoderLayer(config, rngs=rngs) for _ in range(config.num_layers)])
        self.norm = RMSNorm(config.d_model, config.norm_eps, pdt)
        if lm_head and not config.tie_embeddings:
            self.lm_head = nnx.Linear(
                config.d_model,
                config.vocab_size,
                use_bias=False,
                dtype=jnp.dtype(config.dtype),
                param_dtype=pdt,
                rngs=rngs,
            )
        else:
            self.lm_head = None
        self.has_lm_head = lm_head

    def embed(self, tokens: jax.Array) -> jax.Array:
        """[...] int32 token ids -> [..., D] embeddings."""
        return self.embed_tokens(tokens)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """[..., D] final hidden states -> [..., V] float32 next-token logits."""
        if not self.has_lm_head:
            raise ValueError("this Llama was built with lm_head=False (a critic trunk)")
        if self.lm_head is None:
            out = self.embed_tokens.attend(hidden)
        else:
            out = self.lm_head(hidden)
        return out.astype(jnp.float32)

    def head(self) -> jax.Array:
        """[D, V] the LM head's matrix (the token embedding's transpose when tied) in the
        compute dtype, as `logits` multiplies by it: float32 master weights of a bfloat16
        model give a bfloat16 head, so a tiled scorer rounds as the sampler does."""
        if not self.has_lm_head:
            raise ValueError("this Llama was built with lm_head=False (a critic trunk)")
        if self.lm_head is None:
            matrix = self.embed_tokens.embedding[...].T
        else:
            matrix = self.lm_head.kernel[...]
        return matrix.astype(self.config.dtype)

    def __call__(
        self,
        x: jax.Array,
        key_valid: jax.Array,
        cache: KVCache | None = None,
        write_index: jax.Array | int = 0,
        read: jax.Array | None = None,
        *,
        offset: jax.Array | int = 0,
        window: TurnWindow | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Runs the trunk on a chunk of input embeddings.

        Without cache, position t of the chunk has slot t and attends to the chunk's
        slots <= t whose `key_valid` is True. With a cache of `T_max` slots the chunk is
        written at slots `[write_index, write_index + T)` (with validity `key_valid`) and
        each query attends to every valid cache slot at or before its own.

        Args:
          x: [B, T, D] input embeddings.
          key_valid: [B, T] bool: the inputs that later (and equal) slots may attend to.
          cache: optional KVCache of T_max >= write_index + T slots.
          write_index: int32 scalar, first slot of the chunk (may be traced).
          read: optional [R] int positions of the chunk (the same in every row; a NumPy
            array keeps their RoPE tables constant) whose hidden states are returned. The
            last block then computes its queries, attention output and MLP only there
            (keys and values at every position, as they feed the read queries), so
            teacher-forced scoring (or a prefill that reads one position) pays the last
            block for the R positions it reads rather than all T. The cache still gets
            the keys and values of every position.
          offset: int32 scalar, RoPE position - slot of the chunk (causality stays by
            slot): after `sampler.evict` new tokens keep their transcript positions.
          window: an optional `TurnWindow` mask, without a cache (`rlagent.text.score`).
        Returns:
          [B, T, D] final-normed hidden states ([B, R, D] with `read`), the cache or None.
        """
        chex.assert_rank(x, 3)
        chex.assert_rank(key_valid, 2)
        chex.assert_equal_shape_prefix([x, key_valid], 2)
        batch, length, _ = x.shape
        if x.shape[-1] != self.config.d_model:
            raise ValueError(f"x has width {x.shape[-1]}, expected d_model={self.config.d_model}")
        # Static slots (a NumPy array) when the write index is known at trace time.
        xp = np if isinstance(write_index, int) else jnp
        slots = write_index + xp.arange(length, dtype=xp.int32)
        if cache is None:
            key_slots = jnp.arange(length, dtype=jnp.int32)
            all_valid = key_valid
        else:
            if cache.v.shape[3] < length:
                raise ValueError(f"cache has {cache.v.shape[3]} slots, chunk needs {length}")
            key_slots = jnp.arange(cache.v.shape[3], dtype=jnp.int32)
            all_valid = jax.lax.dynamic_update_slice(cache.valid, key_valid, (0, write_index))
        if read is not None:
            chex.assert_rank(read, 1)
        if window is not None and cache is not None:
            raise ValueError("Llama: a TurnWindow mask is for a chunk without a cache")
        extra = dict(offset=offset, window=window)
        last = len(self.layers) - 1
        cache_k, cache_v = (None, None) if cache is None else (cache.k, cache.v)
        for i, layer in enumerate(self.layers):
            layer_keys = None if cache is None else (cache_k, cache_v, i)
            layer_read = read if i == last else None
            if self.config.remat and cache is None:
                x, (k, v) = _remat_block(
                    layer, x, slots, key_slots, all_valid, read=layer_read, extra=extra
                )
            else:
                x, (k, v) = layer(
                    x, slots, layer_keys, key_slots, all_valid, write_index, read=layer_read,
                    **extra,
                )  # fmt: skip
            if cache is not None:
                cache_k, cache_v = k, v
        if read is not None and not self.layers:
            x = x[:, read]
        hidden = self.norm(x)
        if cache is None:
            return hidden, None
        return hidden, KVCache(k=cache_k, v=cache_v, valid=all_valid)


def parameter_count(config: PolicyConfig, *, lm_head: bool = True) -> int:
    """Parameters of `Llama(config)` from abstract shapes (nothing is allocated); a tied
    embedding counts once."""
    abstract = nnx.eval_shape(lambda: Llama(config, lm_head=lm_head, rngs=nnx.Rngs(0)))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def _remat_block(layer, x, slots, key_slots, key_valid, *, read, extra):
    """`layer` on a chunk without cache, its activations recomputed in the backward pass
    (`PolicyConfig.remat`); the slots and read positions stay as they are (NumPy arrays
    keep their RoPE tables constant); `extra`: the attention's offset and window."""

    # Traced slots go in as an argument; NumPy ones stay constants of the block.
    traced = () if isinstance(slots, np.ndarray) else (slots,)

    def block(layer, x, key_slots, key_valid, window, *traced):
        slot = traced[0] if traced else slots
        return layer(x, slot, None, key_slots, key_valid, 0, read=read, offset=extra["offset"],
                     window=window)  # fmt: skip

    return nnx.remat(block)(layer, x, key_slots, key_valid, extra["window"], *traced)
