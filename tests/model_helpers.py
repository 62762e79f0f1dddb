"""Helpers of the tests that load HF checkpoints (tests/test_models_checkpoint.py,
tests/test_hf_agent.py): a hub-style checkpoint folder of random tensors, written with
NumPy (no torch). It needs safetensors (a dependency of rlagent)."""

import json

import numpy as np
from safetensors.numpy import save_file

from rlagent.models import PolicyConfig
from rlagent.models import checkpoint


def write_checkpoint(folder, config: PolicyConfig, *, shards: int = 1, dtype=np.float32, **edits):
    """A hub-style checkpoint of random tensors of `config`'s shapes: config.json +
    safetensors; returns the tensors. `edits` change config.json (None deletes a field)."""
    architecture = {(False, False): "LlamaForCausalLM", (True, False): "Qwen2ForCausalLM",
                    (False, True): "Qwen3ForCausalLM"}[config.qkv_bias, config.qk_norm]  # fmt: skip
    fields = dict(
        architectures=[architecture], vocab_size=config.vocab_size, hidden_size=config.d_model,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads, head_dim=config.head_dim,
        intermediate_size=config.mlp_dim, rms_norm_eps=config.norm_eps,
        rope_theta=config.rope_theta, tie_word_embeddings=config.tie_embeddings,
        hidden_act="silu",
    )  # fmt: skip
    fields.update(edits)
    fields = {k: v for k, v in fields.items() if v is not None}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fields))
    rng = np.random.RandomState(0)
    tensors = {name: (0.2 * rng.randn(*shape)).astype(dtype)
               for name, shape in checkpoint._expected_shapes(config).items()}  # fmt: skip
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, folder / checkpoint.SINGLE)
        return tensors
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[i::shards]}
        save_file(part, folder / file)
        weight_map.update(dict.fromkeys(part, file))
    (folder / checkpoint.INDEX).write_text(json.dumps({"weight_map": weight_map}))
    return tensors
