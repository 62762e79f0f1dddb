"""Weight conversion between `rlagent.models.Llama` and `transformers.LlamaForCausalLM`.

The NNX module uses HF's parameter names, so the map is one-to-one; only linear kernels are
transposed (NNX stores `[in, out]`, torch `[out, in]`). transformers and torch are imported
lazily: the rest of rlagent does not need them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlagent.models.llama import Llama
from rlagent.models.llama import PolicyConfig

_LAYER_LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
_LAYER_NORMS = ("input_layernorm", "post_attention_layernorm")


def hf_config(config: PolicyConfig, *, max_position_embeddings: int = 4096) -> Any:
    """The `transformers.LlamaConfig` of the same architecture."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.mlp_dim,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.dim_per_head,
        rms_norm_eps=config.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        tie_word_embeddings=config.tie_embeddings,
        max_position_embeddings=max_position_embeddings,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        pad_token_id=config.pad_id,
    )


def policy_config_from_hf(hf: Any, **overrides: Any) -> PolicyConfig:
    """PolicyConfig of a `LlamaConfig` (default rope only); `overrides` set other fields."""
    rope = getattr(hf, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"only default RoPE is supported, got {rope.get('rope_type')!r}")
    if getattr(hf, "attention_bias", False) or getattr(hf, "mlp_bias", False):
        raise ValueError("attention_bias / mlp_bias are not supported")
    theta = rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    fields = dict(
        vocab_size=hf.vocab_size,
        d_model=hf.hidden_size,
        num_layers=hf.num_hidden_layers,
        num_heads=hf.num_attention_heads,
        num_kv_heads=hf.num_key_value_heads or hf.num_attention_heads,
        head_dim=getattr(hf, "head_dim", None),
        mlp_dim=hf.intermediate_size,
        rope_theta=float(theta),
        norm_eps=hf.rms_norm_eps,
        tie_embeddings=bool(hf.tie_word_embeddings),
    )
    fields.update(overrides)
    return PolicyConfig(**fields)


def to_hf_state_dict(llama: Llama) -> dict[str, np.ndarray]:
    """HF-named float32 numpy arrays of a Llama's weights."""
    out = {"model.embed_tokens.weight": _np(llama.embed_tokens.embedding[...])}
    for i, layer in enumerate(llama.layers):
        for name in _LAYER_LINEARS:
            out[f"model.layers.{i}.{name}.weight"] = _np(_get(layer, name).kernel[...]).T
        for name in _LAYER_NORMS:
            out[f"model.layers.{i}.{name}.weight"] = _np(_get(layer, name).weight[...])
    out["model.norm.weight"] = _np(llama.norm.weight[...])
    if llama.lm_head is not None:
        out["lm_head.weight"] = _np(llama.lm_head.kernel[...]).T
    return out


def load_hf_state_dict(llama: Llama, state_dict: Mapping[str, Any]) -> Llama:
    """Writes HF-named weights (numpy or torch tensors) into `llama`, in place; returns it."""

    def put(param: nnx.Param, name: str, transpose: bool = False) -> None:
        if name not in state_dict:
            raise ValueError(f"state_dict lacks {name!r}")
        value = _np(state_dict[name])
        value = value.T if transpose else value
        if value.shape != param[...].shape:
            raise ValueError(f"{name}: shape {value.shape}, expected {param[...].shape}")
        param[...] = jnp.asarray(value, param[...].dtype)

    put(llama.embed_tokens.embedding, "model.embed_tokens.weight")
    for i, layer in enumerate(llama.layers):
        for name in _LAYER_LINEARS:
            put(_get(layer, name).kernel, f"model.layers.{i}.{name}.weight", transpose=True)
        for name in _LAYER_NORMS:
            put(_get(layer, name).weight, f"model.layers.{i}.{name}.weight")
    put(llama.norm.weight, "model.norm.weight")
    if llama.lm_head is not None:
        put(llama.lm_head.kernel, "lm_head.weight", transpose=True)
    return llama


def to_hf_model(llama: Llama, *, max_position_embeddings: int = 4096) -> Any:
    """A float32 `transformers.LlamaForCausalLM` with the same weights (needs torch)."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(
        hf_config(llama.config, max_position_embeddings=max_position_embeddings)
    )
    tensors = {
        k: torch.from_numpy(np.array(v, copy=True)) for k, v in to_hf_state_dict(llama).items()
    }
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    # A tied head is not a separate tensor; anything else missing is a conversion bug.
    missing = [m for m in missing if not (llama.config.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"HF conversion mismatch: missing={missing}, unexpected={unexpected}")
    return model.float().eval()


def from_hf_model(model: Any, *, seed: int = 0, **config_overrides: Any) -> Llama:
    """An NNX Llama holding the weights of a `transformers.LlamaForCausalLM`."""
    config = policy_config_from_hf(model.config, **config_overrides)
    llama = Llama(config, lm_head=True, rngs=nnx.Rngs(seed))
    return load_hf_state_dict(llama, model.state_dict())


def _get(module: nnx.Module, dotted: str) -> Any:
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def _np(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # torch tensor
        value = value.detach().cpu().float().numpy()
    return np.asarray(value, dtype=np.float32)
