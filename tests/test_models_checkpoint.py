"""Loading HF safetensors checkpoints (rlagent.models.checkpoint), tiny configs.

Logits parity against transformers needs torch and transformers (skipped without them);
the refusals, bf16 and the policy load write their checkpoints with NumPy.
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_helpers import write_checkpoint
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from rlagent.models import Llama
from rlagent.models import PolicyConfig
from rlagent.models import checkpoint
from rlagent.models import hf

VOCAB = 40
TOKENS = np.random.RandomState(0).randint(0, VOCAB, (2, 11))
# HF configs of each family: (config class, its fields), hidden 32, 2 layers, GQA.
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
FAMILIES = {
    # Llama 3.1 RoPE scaling with a short original context, so that every band of
    # wavelengths (kept, blended, scaled) occurs at head_dim 8.
    "llama3": ("LlamaConfig", dict(rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=16))),
    "qwen2_tied_sharded": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3_head_dim_linear_rope": ("Qwen3Config", dict(head_dim=16, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="linear", factor=2.0))),
}  # fmt: skip


def _logits(llama: Llama) -> np.ndarray:
    """[2, 11, V] float32 teacher-forced logits of TOKENS."""
    return np.asarray(_forward(*nnx.split(llama)))


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state):
    llama = nnx.merge(graphdef, state)
    hidden, _ = llama(llama.embed(jnp.asarray(TOKENS)), jnp.ones(TOKENS.shape, bool))
    return llama.logits(hidden)


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory):
    """family -> (folder of a `save_pretrained`, transformers' float32 logits of TOKENS)."""
    import torch
    import transformers

    out = {}
    for family, (config_class, fields) in FAMILIES.items():
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(**SIZES, **fields)
        model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
        with torch.no_grad():  # zero biases and unit norms would hide a swapped mapping.
            for param in model.parameters():
                param.add_(0.1 * torch.randn_like(param))
            reference = model(torch.from_numpy(TOKENS)).logits.numpy()
        folder = tmp_path_factory.mktemp(family)
        shard = "4KB" if "sharded" in family else "1GB"
        model.save_pretrained(folder, safe_serialization=True, max_shard_size=shard)
        out[family] = folder, reference
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_transformers(hf_checkpoints, family):
    folder, reference = hf_checkpoints[family]
    llama, config = checkpoint.load_pretrained(folder)
    if "sharded" in family:
        assert (folder / checkpoint.INDEX).is_file()
    assert config.qkv_bias == family.startswith("qwen2")
    assert config.qk_norm == family.startswith("qwen3")
    assert np.abs(_logits(llama) - reference).max() <= 1e-4
    # And back: the transformers model of the trunk's family (hf.hf_config) is the original.
    import torch

    with torch.no_grad():
        back = hf.to_hf_model(llama)(torch.from_numpy(TOKENS)).logits.numpy()
    np.testing.assert_allclose(back, reference, atol=1e-5)


def _assert_holds(llama: Llama, tensors) -> None:
    held = hf.to_hf_state_dict(llama)
    assert sorted(held) == sorted(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(held[name], np.asarray(value, np.float32), err_msg=name)


QWEN3 = PolicyConfig(vocab_size=VOCAB, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2,
                     head_dim=16, mlp_dim=48, qk_norm=True, norm_eps=1e-6)  # fmt: skip
QWEN2 = PolicyConfig(vocab_size=VOCAB, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2,
                     mlp_dim=48, qkv_bias=True, tie_embeddings=True, norm_eps=1e-6)  # fmt: skip


def test_numpy_checkpoint_round_trip_in_bfloat16(tmp_path):
    tensors = write_checkpoint(tmp_path / "f32", QWEN2, shards=3)
    loaded, config = checkpoint.load_pretrained(tmp_path / "f32")
    assert config == QWEN2
    _assert_holds(loaded, tensors)
    bf16, config = checkpoint.load_pretrained(tmp_path / "f32", dtype=jnp.bfloat16)
    assert (config.param_dtype, config.dtype) == ("bfloat16", "bfloat16")
    assert {leaf.dtype for leaf in jax.tree.leaves(nnx.state(bf16))} == {jnp.dtype(jnp.bfloat16)}
    logits, reference = _logits(bf16), _logits(loaded)
    assert logits.dtype == np.float32
    scale = np.abs(reference).max()
    assert np.abs(logits - reference).max() < 0.05 * scale, (
        np.abs(logits - reference).max(),
        scale,
    )
    # bf16 files load exactly, into bf16 parameters or upcast into float32 ones.
    tensors = write_checkpoint(tmp_path / "bf16", QWEN2, dtype=jnp.bfloat16)
    _assert_holds(checkpoint.load_pretrained(tmp_path / "bf16", dtype=jnp.bfloat16)[0], tensors)
    _assert_holds(checkpoint.load_pretrained(tmp_path / "bf16")[0], tensors)


def test_load_policy_with_a_separate_critic_in_bfloat16(tmp_path):
    tensors = write_checkpoint(tmp_path, QWEN3, dtype=jnp.bfloat16)
    policy, config = checkpoint.load_policy(
        tmp_path, dtype=jnp.bfloat16, value_head="separate", summary_dim=16
    )
    assert (config.value_head, config.summary_dim, config.qk_norm) == ("separate", 16, True)
    _assert_holds(policy.actor.lm, tensors)
    assert policy.critic.lm.lm_head is None
    _assert_holds(policy.critic.lm, {k: v for k, v in tensors.items() if k != "lm_head.weight"})
    assert {leaf.dtype for leaf in jax.tree.leaves(nnx.state(policy))} == {jnp.dtype(jnp.bfloat16)}
    assert policy.critic.values(jnp.ones((3, 32), jnp.bfloat16)).shape == (3,)
    # Encoders and heads are a fresh Policy's: random, not zeros or ShapeDtypeStructs.
    for weights in (policy.critic.value_head.kernel, policy.actor.encoder.role):
        assert 0.01 < np.std(np.asarray(weights[...], np.float32)) < 0.04


def test_load_value_model_reads_the_trunk_without_head_and_starts_at_zero(tmp_path):
    tensors = write_checkpoint(tmp_path, QWEN2)
    critic, config = checkpoint.load_value_model(tmp_path)
    assert critic.lm.lm_head is None and config.qkv_bias
    _assert_holds(critic.lm, {k: v for k, v in tensors.items() if k != "lm_head.weight"})
    hidden, _ = critic.lm(critic.lm.embed(jnp.arange(6)[None]), jnp.ones((1, 6), bool))
    np.testing.assert_array_equal(np.asarray(critic.values(hidden)), np.zeros((1, 6)))


@pytest.fixture
def no_tensor_read(monkeypatch):
    """Refusals happen before any parameter is read or allocated."""
    monkeypatch.setattr(checkpoint, "_read_trunk", lambda *a: pytest.fail("tensors were read"))


def _drop_tensor(folder, name):
    path = folder / checkpoint.SINGLE
    tensors = load_file(path)
    del tensors[name]
    save_file(tensors, path)


def _add_tensor(folder, name, value):
    path = folder / checkpoint.SINGLE
    save_file({**load_file(path), name: value}, path)


REFUSALS = {
    "architecture": (dict(architectures=["GemmaForCausalLM"]), None, "'GemmaForCausalLM'"),
    "rope": (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), None,
             r"rope_scaling.rope_type='dynamic'"),
    "activation": (dict(hidden_act="gelu"), None, "hidden_act='gelu'"),
    "field": (dict(num_hidden_layers=None), None, "config lacks field num_hidden_layers"),
    "shape": (dict(intermediate_size=56), None, r"model.safetensors: tensor "
              r"model.layers.0.mlp.gate_proj.weight has shape \(48, 32\), config.json implies "
              r"\(56, 32\)"),
    "missing": ({}, lambda f: _drop_tensor(f, "model.layers.0.self_attn.k_norm.weight"),
                "missing tensors model.layers.0.self_attn.k_norm.weight"),
    "unexpected": ({}, lambda f: _add_tensor(f, "model.layers.0.extra.weight", np.ones(3)),
                   "unexpected tensors model.layers.0.extra.weight"),
    "dtype": ({}, lambda f: _add_tensor(f, "model.norm.weight", np.ones(32, np.int32)),
              "tensor model.norm.weight has dtype I32"),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(REFUSALS))
def test_bad_checkpoints_are_refused_naming_the_fault(tmp_path, no_tensor_read, kind):
    edits, damage, message = REFUSALS[kind]
    write_checkpoint(tmp_path, QWEN3, **edits)
    if damage is not None:
        damage(tmp_path)
    with pytest.raises(checkpoint.CheckpointError, match=message):
        checkpoint.load_pretrained(tmp_path)


def test_missing_shard_and_files_are_refused(tmp_path, no_tensor_read):
    write_checkpoint(tmp_path, QWEN3, shards=2)
    index = json.loads((tmp_path / checkpoint.INDEX).read_text())
    moved = {**index["weight_map"], "lm_head.weight": "model-00002-of-00002.safetensors"}
    (tmp_path / checkpoint.INDEX).write_text(json.dumps({"weight_map": moved}))
    with pytest.raises(checkpoint.CheckpointError, match="00002.safetensors: lacks tensor lm_head"):
        checkpoint.load_pretrained(tmp_path)
    (tmp_path / checkpoint.INDEX).write_text(json.dumps(index))
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(checkpoint.CheckpointError, match="shard model-00002-of-00002.safetensors"):
        checkpoint.load_policy(tmp_path)
    (tmp_path / checkpoint.INDEX).unlink()
    with pytest.raises(checkpoint.CheckpointError, match="neither"):
        checkpoint.load_pretrained(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(checkpoint.CheckpointError, match="no config.json"):
        checkpoint.load_pretrained(tmp_path)


def test_tolerated_extras_and_config_forms(tmp_path):
    # A tied checkpoint that still carries an LM head, and an old RoPE table: ignored, as
    # transformers does; transformers 5's `rope_parameters` reads as `rope_scaling`.
    rope = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=16, rope_theta=500000.0)  # fmt: skip
    write_checkpoint(tmp_path, QWEN2, rope_theta=None, rope_parameters=rope)
    _add_tensor(tmp_path, "lm_head.weight", np.zeros((VOCAB, 32), np.float32))
    _add_tensor(tmp_path, "model.layers.0.self_attn.rotary_emb.inv_freq", np.ones(4, np.float32))
    _, config = checkpoint.load_pretrained(tmp_path, pad_id=3)
    assert (config.rope_scaling, config.rope_theta, config.rope_original_max_position) == (
        "llama3",
        500000.0,
        16,
    )
    assert config.pad_id == 3 and config.tie_embeddings


def test_new_config_options_are_validated(tmp_path):
    with pytest.raises(ValueError, match="rope_scaling must be None, 'linear' or 'llama3'"):
        PolicyConfig(rope_scaling="yarn")
    with pytest.raises(ValueError, match="rope_factor must be > 0"):
        PolicyConfig(rope_scaling="linear", rope_factor=0.0)
    with pytest.raises(ValueError, match="rope_low_freq_factor < rope_high_freq_factor"):
        PolicyConfig(rope_scaling="llama3", rope_low_freq_factor=4.0)
    write_checkpoint(tmp_path, QWEN3)  # PolicyConfig's own refusals name config.json too.
    with pytest.raises(checkpoint.CheckpointError, match="config.json: num_heads=4 must be"):
        checkpoint.read_checkpoint(tmp_path, num_kv_heads=3)
