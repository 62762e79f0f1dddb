"""Weight and config conversion between `rlagent.models.Llama` and transformers' causal LMs.

Families: `LlamaForCausalLM` (Llama 3, incl. its 'llama3' RoPE scaling), `Qwen2ForCausalLM`
(q/k/v biases) and `Qwen3ForCausalLM` (per-head q/k RMSNorm, a free head width). The NNX
module uses HF's parameter names, so `hf_tensors` (the one name map, which
`rlagent.models.checkpoint` reads safetensors through too) is one-to-one; only linear
kernels are transposed (NNX stores `[in, out]`, torch `[out, in]`). `policy_config_from_hf`
reads a `config.json` (a dict or a transformers config) and refuses, naming the field,
what the trunk does not implement. transformers and torch are imported lazily: the rest of
rlagent does not need them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlagent.models.llama import Llama
from rlagent.models.llama import PolicyConfig

# architecture -> the PolicyConfig options of its family.
FAMILIES = {
    "LlamaForCausalLM": {},
    "Qwen2ForCausalLM": {"qkv_bias": True},
    "Qwen3ForCausalLM": {"qk_norm": True},
}
# config.json's `model_type`, for configs without `architectures` (built in code).
_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
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
_QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
_QK_NORMS = ("self_attn.q_norm", "self_attn.k_norm")


class CheckpointError(ValueError):
    """A checkpoint or HF config the trunk cannot hold; the message names what is wrong."""


class HFTensor(NamedTuple):
    """Where an HF-named tensor lives in a `Llama`."""

    path: str  # dotted attribute path of the nnx.Param, e.g. 'layers.0.self_attn.q_proj.kernel'.
    transpose: bool  # a linear kernel: NNX [in, out] is the transpose of torch's [out, in].


def hf_tensors(config: PolicyConfig, *, lm_head: bool = True) -> dict[str, HFTensor]:
    """HF tensor name -> its parameter in a `Llama(config, lm_head=lm_head)`, every one."""
    names = {"model.embed_tokens.weight": HFTensor("embed_tokens.embedding", False)}
    for i in range(config.num_layers):
        for name in _LAYER_LINEARS:
            names[f"model.layers.{i}.{name}.weight"] = HFTensor(f"layers.{i}.{name}.kernel", True)
        for name in _QKV if config.qkv_bias else ():
            names[f"model.layers.{i}.{name}.bias"] = HFTensor(f"layers.{i}.{name}.bias", False)
        for name in _LAYER_NORMS + (_QK_NORMS if config.qk_norm else ()):
            names[f"model.layers.{i}.{name}.weight"] = HFTensor(f"layers.{i}.{name}.weight", False)
    names["model.norm.weight"] = HFTensor("norm.weight", False)
    if lm_head and not config.tie_embeddings:
        names["lm_head.weight"] = HFTensor("lm_head.kernel", True)
    return names


def parameter(llama: Llama, path: str) -> nnx.Variable:
    """The nnx.Param at a dotted `HFTensor.path` of `llama`."""
    node: Any = llama
    for part in path.split("."):
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    return node


def policy_config_from_hf(hf: Any, **overrides: Any) -> PolicyConfig:
    """PolicyConfig of an HF config (a `config.json` dict or a transformers config).

    Refuses (CheckpointError naming the field) an architecture outside `FAMILIES` and the
    options the trunk does not implement; `overrides` set other PolicyConfig fields.
    """
    cfg = dict(hf) if isinstance(hf, Mapping) else hf.to_dict()
    family = _family(cfg)
    _refuse_unsupported(cfg, family)
    pad = cfg.get("pad_token_id")
    fields = dict(
        vocab_size=_field(cfg, "vocab_size"),
        pad_id=pad if isinstance(pad, int) and 0 <= pad < cfg["vocab_size"] else 0,
        d_model=_field(cfg, "hidden_size"),
        num_layers=_field(cfg, "num_hidden_layers"),
        num_heads=_field(cfg, "num_attention_heads"),
        num_kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
        head_dim=cfg.get("head_dim"),
        mlp_dim=_field(cfg, "intermediate_size"),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        **FAMILIES[family],
        **_rope_fields(cfg),
    )
    fields.update(overrides)
    return PolicyConfig(**fields)


def hf_config(config: PolicyConfig, *, max_position_embeddings: int = 4096) -> Any:
    """The transformers config of the same architecture (Llama, Qwen2 or Qwen3 family)."""
    import transformers

    if config.qkv_bias and (config.qk_norm or config.head_dim not in (None, _even_head(config))):
        raise ValueError("no HF family has q/k/v biases with qk_norm or a free head_dim")
    rope = {"rope_type": config.rope_scaling or "default", "rope_theta": config.rope_theta}
    if config.rope_scaling is not None:
        rope["factor"] = config.rope_factor
    if config.rope_scaling == "llama3":
        rope.update(
            low_freq_factor=config.rope_low_freq_factor,
            high_freq_factor=config.rope_high_freq_factor,
            original_max_position_embeddings=config.rope_original_max_position,
        )
    fields = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.mlp_dim,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        rms_norm_eps=config.norm_eps,
        rope_parameters=rope,
        tie_word_embeddings=config.tie_embeddings,
        max_position_embeddings=max_position_embeddings,
        hidden_act="silu",
        pad_token_id=config.pad_id,
    )
    if config.qkv_bias:
        return transformers.Qwen2Config(**fields)
    fields.update(head_dim=config.dim_per_head, attention_bias=False)
    if config.qk_norm:
        return transformers.Qwen3Config(**fields)
    return transformers.LlamaConfig(**fields, mlp_bias=False)


def to_hf_state_dict(llama: Llama) -> dict[str, np.ndarray]:
    """HF-named float32 numpy arrays of a Llama's weights (C-contiguous)."""
    out = {}
    for name, tensor in hf_tensors(llama.config, lm_head=llama.has_lm_head).items():
        value = _np(parameter(llama, tensor.path)[...])
        # Contiguous, not a transposed view: safetensors' numpy `save_file` writes an
        # array's memory as it lies, so a view would be saved scrambled.
        out[name] = np.ascontiguousarray(value.T if tensor.transpose else value)
    return out


def load_hf_state_dict(llama: Llama, state_dict: Mapping[str, Any]) -> Llama:
    """Writes HF-named weights (numpy or torch tensors) into `llama`, in place; returns it."""
    for name, tensor in hf_tensors(llama.config, lm_head=llama.has_lm_head).items():
        if name not in state_dict:
            raise ValueError(f"state_dict lacks {name!r}")
        param = parameter(llama, tensor.path)
        value = _np(state_dict[name])
        value = value.T if tensor.transpose else value
        if value.shape != param[...].shape:
            raise ValueError(f"{name}: shape {value.shape}, expected {param[...].shape}")
        param[...] = jnp.asarray(value, param[...].dtype)
    return llama


def to_hf_model(llama: Llama, *, max_position_embeddings: int = 4096) -> Any:
    """A float32 transformers causal LM of the same family and weights (needs torch)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(
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
    """An NNX Llama holding the weights of a transformers causal LM of `FAMILIES`."""
    config = policy_config_from_hf(model.config, **config_overrides)
    llama = Llama(config, lm_head=True, rngs=nnx.Rngs(seed))
    return load_hf_state_dict(llama, model.state_dict())


def _family(cfg: Mapping[str, Any]) -> str:
    architectures = cfg.get("architectures") or [_MODEL_TYPES.get(cfg.get("model_type"))]
    if len(architectures) != 1 or architectures[0] not in FAMILIES:
        named = architectures if cfg.get("architectures") else cfg.get("model_type")
        raise CheckpointError(
            f"unsupported architecture {named!r} (architectures / model_type); supported: "
            f"{', '.join(FAMILIES)}"
        )
    return architectures[0]


def _refuse_unsupported(cfg: Mapping[str, Any], family: str) -> None:
    """The config options that would change the network but that the trunk lacks."""
    refused = {
        "hidden_act": cfg.get("hidden_act", "silu") != "silu",
        "attention_bias": family != "Qwen2ForCausalLM" and bool(cfg.get("attention_bias")),
        "mlp_bias": bool(cfg.get("mlp_bias")),
        "use_sliding_window": bool(cfg.get("use_sliding_window")),
        "layer_types": any(t != "full_attention" for t in cfg.get("layer_types") or ()),
        "partial_rotary_factor": cfg.get("partial_rotary_factor") not in (None, 1, 1.0),
    }
    for name, bad in refused.items():
        if bad:
            raise CheckpointError(f"config field {name}={cfg[name]!r} is not supported")


def _rope_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """PolicyConfig RoPE fields of `rope_parameters` (transformers 5) or `rope_scaling`."""
    where = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
    rope = cfg.get(where) or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    fields = dict(rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    if kind == "default":
        return fields
    if kind not in ("linear", "llama3"):
        raise CheckpointError(
            f"config field {where}.rope_type={kind!r} is not supported (default, linear, llama3)"
        )
    fields.update(rope_scaling=kind, rope_factor=float(_field(rope, "factor", where)))
    if kind == "llama3":
        fields.update(
            rope_low_freq_factor=float(_field(rope, "low_freq_factor", where)),
            rope_high_freq_factor=float(_field(rope, "high_freq_factor", where)),
            rope_original_max_position=int(_field(rope, "original_max_position_embeddings", where)),
        )
    return fields


def _field(cfg: Mapping[str, Any], name: str, where: str = "") -> Any:
    if cfg.get(name) is None:
        raise CheckpointError(f"config lacks field {where + '.' if where else ''}{name}")
    return cfg[name]


def _even_head(config: PolicyConfig) -> int | None:
    return config.d_model // config.num_heads if config.d_model % config.num_heads == 0 else None


def _np(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # torch tensor
        value = value.detach().cpu().float().numpy()
    return np.asarray(value, dtype=np.float32)
