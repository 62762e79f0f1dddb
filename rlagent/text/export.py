"""A text run's policy as a Hugging Face folder that transformers loads (`experiments.export_hf`).

    export_hf("runs/hf_agent@200", "exported/qwen05_toolworld")

writes, from a text run folder (`rlagent.text.train.run_text`: provenance.json and Orbax
checkpoints of `TextTrainState`) and the checkpoint folder the run started from (its path
and config.json digest are in provenance.json), an HF folder:

- `config.json`: the source checkpoint's (fields it lacks, such as `model_type`, from
  `rlagent.models.hf.hf_config`), its `torch_dtype` / `dtype` set to the saved one (the
  run's parameter dtype: float32 master weights by default);
- `model.safetensors`: the policy's parameters of checkpoint STEP (default the newest),
  named and laid out by `rlagent.models.hf.hf_tensors` (the loader's map, read backwards);
- the tokenizer files and the chat template (`save_pretrained` of the source's tokenizer),
  and `generation_config.json` when the source has one.

Only the policy's parameters are read (a partial Orbax restore), not the optimiser state
or the critic. Everything is checked before `--out` is written: a folder that is not a text
run, a step it does not hold, a source folder that is gone or whose config.json changed,
an `--out` that exists and is not empty (one-line `ValueError`s naming the fault).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from safetensors.numpy import save_file

from rlagent.host import provenance
from rlagent.host.shadow import checkpoint_step
from rlagent.host.shadow import strip_value
from rlagent.models.checkpoint import SINGLE
from rlagent.models.hf import hf_config
from rlagent.models.hf import to_hf_state_dict
from rlagent.models.llama import Llama
from rlagent.models.llama import PolicyConfig
from rlagent.text.chat import load_tokenizer

GENERATION_CONFIG = "generation_config.json"
_NUMPY_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


def export_hf(spec: str, out: str) -> int:
    """Writes the policy of `RUN_FOLDER[@STEP]` (STEP: a checkpoint step, default the
    newest) to the empty or new folder `out` (module docstring); returns the step."""
    folder, _, step_text = spec.partition("@")
    if step_text and not step_text.isdigit():
        raise ValueError(f"{spec}: the step {step_text!r} is not a whole number (RUN_FOLDER@STEP)")
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ValueError(f"--out={out!r} exists and is not an empty folder")
    model = _text_model(folder)
    step = checkpoint_step(spec, folder, step_text)
    source = _checked_source(model)
    config = PolicyConfig(**model["policy"])
    llama = _policy(folder, step, config)
    os.makedirs(out, exist_ok=True)
    _write(out, llama, config, source)
    return step


def _text_model(folder: str) -> dict[str, Any]:
    """provenance.json's `model` section of a text run folder."""
    stored = provenance.read(folder) if os.path.isdir(folder) else None
    model = None if stored is None else stored["config"].get("model")
    if not isinstance(model, dict) or not {"model_dir", "config_sha256", "policy"} <= set(model):
        raise ValueError(
            f"{folder} is not a text run folder (no provenance.json with the model section "
            "that experiments.hf_agent writes)"
        )
    return model


def _checked_source(model: dict[str, Any]) -> str:
    """The checkpoint folder the run started from, with the config.json it read."""
    source = model["model_dir"]
    path = os.path.join(source, "config.json")
    if not os.path.isfile(path):
        raise ValueError(
            f"{path}: missing; the export needs the run's source checkpoint folder (its "
            "config.json and tokenizer)"
        )
    if provenance.file_sha256(path) != model["config_sha256"]:
        raise ValueError(f"{path} is not the config.json the run read (its sha256 differs)")
    return source


def _policy(folder: str, step: int, config: PolicyConfig) -> Llama:
    """The policy of checkpoint `step`, its parameters read alone (no optimiser state)."""
    path = os.path.abspath(os.path.join(folder, "checkpoints", str(step), "default"))
    checkpointer = ocp.PyTreeCheckpointer()
    stored = checkpointer.metadata(path).item_metadata.tree["params"]
    item = {"params": jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), stored)}
    restore = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
    restored = checkpointer.restore(
        path, args=ocp.args.PyTreeRestore(item, restore_args=restore, partial_restore=True)
    )
    llama = nnx.eval_shape(lambda: Llama(config, lm_head=True, rngs=nnx.Rngs(0)))
    params = nnx.state(llama, nnx.Param)
    nnx.replace_by_pure_dict(params, strip_value(restored["params"]))
    nnx.update(llama, params)
    return llama


def _write(out: str, llama: Llama, config: PolicyConfig, source: str) -> None:
    with open(os.path.join(source, "config.json")) as f:
        # The source's fields win (what the loader read, token ids, context length);
        # `hf_config`'s fill what a config written in code may lack (model_type).
        fields = json.load(f)
    write_hf(out, llama, config, load_tokenizer(source), fields)
    if os.path.isfile(os.path.join(source, GENERATION_CONFIG)):
        shutil.copy(os.path.join(source, GENERATION_CONFIG), os.path.join(out, GENERATION_CONFIG))


def write_hf(
    out: str, llama: Llama, config: PolicyConfig, tokenizer: Any, fields: dict[str, Any]
) -> None:
    """Writes `llama` to the folder `out` as transformers reads it: model.safetensors in
    `config.param_dtype` (`to_hf_state_dict`), config.json (`hf_config`'s fields, then
    `fields` over them, the dtype fields set to the saved one) and the tokenizer's files
    with its chat template (`save_pretrained`)."""
    dtype = config.param_dtype
    tensors = {
        name: value.astype(_NUMPY_DTYPES[dtype]) for name, value in to_hf_state_dict(llama).items()
    }
    save_file(tensors, os.path.join(out, SINGLE), metadata={"format": "pt"})
    fields = {**hf_config(config).to_dict(), **fields}
    fields.update({key: dtype for key in ("torch_dtype", "dtype") if key in fields})
    fields.setdefault("torch_dtype", dtype)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(fields, f, indent=2)
    tokenizer.save_pretrained(out)  # the tokenizer files and chat template.
