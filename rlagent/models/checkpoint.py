"""Pretrained HF checkpoints (`config.json` + safetensors) loaded into the NNX trunk, no torch.

    llama, config = load_pretrained("path/to/Qwen2.5-0.5B", dtype=jnp.bfloat16)
    policy, config = load_policy("path/to/Llama-3.2-1B", value_head="separate")
    critic, config = load_value_model("path/to/Qwen2.5-0.5B")   # text mode's critic

A checkpoint folder holds `config.json` and either `model.safetensors` or the shards that
`model.safetensors.index.json` lists (`weight_map`: tensor name -> shard file). The
families and the HF name of every parameter are `rlagent.models.hf`'s (`FAMILIES`,
`hf_tensors`).

Everything is checked before a parameter is allocated (`read_checkpoint`), from
`config.json` and the safetensors headers only: the architecture and config options, every
shard the index names, the tensor names (missing or unexpected), every tensor's shape
against the one the config implies and its dtype (float32, float16, bfloat16). The
parameters are then read into an abstract module (`nnx.eval_shape`): the trunk is never
also initialised at random.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  registers bfloat16 with NumPy, which safetensors' np API needs.
from flax import nnx
from safetensors import SafetensorError
from safetensors import safe_open

from rlagent.models.hf import CheckpointError
from rlagent.models.hf import hf_tensors
from rlagent.models.hf import parameter
from rlagent.models.hf import policy_config_from_hf
from rlagent.models.llama import Llama
from rlagent.models.llama import PolicyConfig
from rlagent.models.policy import Policy
from rlagent.models.policy import ValueLM

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
DTYPES = ("F32", "F16", "BF16")  # safetensors dtypes the loader converts from.
# Tensors some exporters write that carry nothing the trunk needs (HF ignores them too):
# RoPE tables of older Llama conversions, and an LM head beside tied embeddings.
_ROPE_TABLE = "rotary_emb.inv_freq"
_TIED_HEAD = "lm_head.weight"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A checked checkpoint: its PolicyConfig and where each tensor the trunk reads lives."""

    config: PolicyConfig
    files: Mapping[str, pathlib.Path]  # HF tensor name -> its safetensors file.


def load_pretrained(
    model_dir: str | pathlib.Path,
    *,
    dtype: Any = jnp.float32,
    compute_dtype: Any = None,
    lm_head: bool = True,
    **config_fields: Any,
) -> tuple[Llama, PolicyConfig]:
    """The Llama trunk of an HF checkpoint (`read_checkpoint` checks it first).

    Args:
      model_dir: folder with `config.json` and the safetensors file(s).
      dtype: parameter dtype (`PolicyConfig.param_dtype`), e.g. jnp.bfloat16.
      compute_dtype: matmul dtype (`PolicyConfig.dtype`); None = `dtype`.
      lm_head: False drops the LM head (a critic trunk).
      config_fields: other PolicyConfig fields (e.g. `pad_id`).
    """
    checkpoint = read_checkpoint(model_dir, **_dtype_fields(dtype, compute_dtype), **config_fields)
    config = checkpoint.config
    llama = nnx.eval_shape(lambda: Llama(config, lm_head=lm_head, rngs=nnx.Rngs(0)))
    _read_trunk(llama, checkpoint)
    _check_concrete(llama)
    return llama, config


def load_policy(
    model_dir: str | pathlib.Path,
    *,
    dtype: Any = jnp.float32,
    compute_dtype: Any = None,
    seed: int = 0,
    **config_fields: Any,
) -> tuple[Policy, PolicyConfig]:
    """A `Policy` whose trunks are an HF checkpoint's; the rest freshly initialised.

    The actor's Llama (and, with `value_head='separate'`, the critic's, without LM head)
    holds the checkpoint; the state encoders, value heads and copy gate are those of
    `Policy(config, rngs=nnx.Rngs(seed))`, computed without initialising the trunks.
    Arguments as `load_pretrained`; `config_fields` may set `value_head`, `summary_dim`, ...
    """
    checkpoint = read_checkpoint(model_dir, **_dtype_fields(dtype, compute_dtype), **config_fields)
    policy = _around_trunks(lambda: Policy(checkpoint.config, rngs=nnx.Rngs(seed)), checkpoint)
    return policy, checkpoint.config


def load_value_model(
    model_dir: str | pathlib.Path,
    *,
    dtype: Any = jnp.float32,
    compute_dtype: Any = None,
    **config_fields: Any,
) -> tuple[ValueLM, PolicyConfig]:
    """A `ValueLM` (critic) whose trunk is an HF checkpoint's (no LM head) and whose value
    head is zero; arguments as `load_pretrained`."""
    checkpoint = read_checkpoint(model_dir, **_dtype_fields(dtype, compute_dtype), **config_fields)
    critic = _around_trunks(lambda: ValueLM(checkpoint.config, rngs=nnx.Rngs(0)), checkpoint)
    return critic, checkpoint.config


def _around_trunks(build: Any, checkpoint: Checkpoint) -> Any:
    """The module `build()` with every Llama trunk in it (modules at a path ending `lm`)
    read from `checkpoint` and the rest initialised as `build` does."""
    module = nnx.eval_shape(build)
    not_trunk = nnx.Not(nnx.PathContains("lm"))
    # Only the non-trunk state is an output: XLA drops the trunks' random initialisation.
    nnx.update(module, jax.jit(lambda: nnx.state(build(), not_trunk))())
    for _, trunk in nnx.iter_graph(module):
        if isinstance(trunk, Llama):
            _read_trunk(trunk, checkpoint)
    _check_concrete(module)
    return module


def read_checkpoint(model_dir: str | pathlib.Path, **config_fields: Any) -> Checkpoint:
    """Checks a checkpoint folder without reading a tensor; CheckpointError names the fault.

    `config_fields` override PolicyConfig fields of `config.json`'s (not its shapes).
    """
    folder = pathlib.Path(model_dir)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{folder}: no config.json")
    try:
        config = policy_config_from_hf(json.loads(config_path.read_text()), **config_fields)
    except (ValueError, TypeError) as error:  # CheckpointError and PolicyConfig's own checks.
        raise CheckpointError(f"{config_path}: {error}") from None
    files = _tensor_files(folder)
    headers = _headers(files)
    expected = _expected_shapes(config)
    missing = sorted(set(expected) - set(headers))
    if missing:
        raise CheckpointError(f"{folder}: missing tensors {_few(missing)} ({len(missing)})")
    unexpected = sorted(n for n in set(headers) - set(expected) if not _ignored(n, config))
    if unexpected:
        raise CheckpointError(
            f"{folder}: unexpected tensors {_few(unexpected)} ({len(unexpected)}) for "
            f"{config_path.name}"
        )
    for name, want in expected.items():
        shape, dtype = headers[name]
        if shape != want:
            raise CheckpointError(
                f"{files[name]}: tensor {name} has shape {shape}, config.json implies {want}"
            )
        if dtype not in DTYPES:
            raise CheckpointError(f"{files[name]}: tensor {name} has dtype {dtype}, not {DTYPES}")
    return Checkpoint(config, {name: files[name] for name in expected})


def _tensor_files(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    """Tensor name -> file, from the index (its shards checked to exist) or the lone file."""
    index = folder / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as error:
            raise CheckpointError(f"{index}: not a safetensors index ({error!r})") from None
        files = {name: folder / shard for name, shard in weight_map.items()}
        for name, path in sorted(files.items()):
            if not path.is_file():
                raise CheckpointError(f"{index}: shard {path.name} (of {name}) is missing")
        return files
    if not (folder / SINGLE).is_file():
        found = sorted(p.name for p in folder.glob("*.safetensors"))
        raise CheckpointError(f"{folder}: neither {INDEX} nor {SINGLE} (found {found})")
    return {name: folder / SINGLE for name in _headers_of(folder / SINGLE)}


def _headers(files: Mapping[str, pathlib.Path]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor name -> (shape, safetensors dtype), each file's header read once."""
    headers = {}
    for path in sorted(set(files.values())):
        for name, header in _headers_of(path).items():
            if files.get(name) == path:
                headers[name] = header
    listed = sorted(set(files) - set(headers))
    if listed:
        raise CheckpointError(f"{files[listed[0]]}: lacks tensor {listed[0]} that {INDEX} lists")
    return headers


def _headers_of(path: pathlib.Path) -> dict[str, tuple[tuple[int, ...], str]]:
    try:
        with safe_open(str(path), framework="np") as f:
            slices = {name: f.get_slice(name) for name in f.keys()}
            return {n: (tuple(s.get_shape()), s.get_dtype()) for n, s in slices.items()}
    except (OSError, SafetensorError) as error:
        raise CheckpointError(f"{path}: not a safetensors file ({error})") from None


def _expected_shapes(config: PolicyConfig) -> dict[str, tuple[int, ...]]:
    """HF name -> the HF-layout shape the config implies, from an abstract trunk."""
    llama = nnx.eval_shape(lambda: Llama(config, lm_head=True, rngs=nnx.Rngs(0)))
    shapes = {}
    for name, tensor in hf_tensors(config).items():
        shape = tuple(parameter(llama, tensor.path).get_value().shape)
        shapes[name] = shape[::-1] if tensor.transpose else shape
    return shapes


def _read_trunk(llama: Llama, checkpoint: Checkpoint) -> None:
    """Reads every parameter of an (abstract) Llama from the checked files, in place."""
    tensors = hf_tensors(llama.config, lm_head=llama.has_lm_head)
    for path in sorted({checkpoint.files[name] for name in tensors}):
        with safe_open(str(path), framework="np") as f:
            for name, tensor in tensors.items():
                if checkpoint.files[name] != path:
                    continue
                param = parameter(llama, tensor.path)
                value = f.get_tensor(name)
                value = value.T if tensor.transpose else value
                param.set_value(jnp.asarray(value, param.get_value().dtype))


def _check_concrete(module: nnx.Module) -> None:
    abstract = [
        jax.tree_util.keystr(path)
        for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(module))
        if isinstance(leaf, jax.ShapeDtypeStruct)
    ]
    if abstract:  # a parameter no tensor was read into: a bug of the name map.
        raise AssertionError(f"parameters left unread: {abstract[:3]}")


def _ignored(name: str, config: PolicyConfig) -> bool:
    return name.endswith(_ROPE_TABLE) or (config.tie_embeddings and name == _TIED_HEAD)


def _dtype_fields(dtype: Any, compute_dtype: Any) -> dict[str, str]:
    compute = dtype if compute_dtype is None else compute_dtype
    return dict(param_dtype=jnp.dtype(dtype).name, dtype=jnp.dtype(compute).name)


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
