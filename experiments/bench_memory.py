r"""Benchmark: memory of the text trainer's programs at real model sizes, from compiled
programs (abstract shapes only: no weight is allocated or read).

  python -m experiments.bench_memory --json_out=/tmp/bench_memory.json

For each model of `MODELS` (the numbers of its config.json), with the trainer's defaults
for checkpoints above 100M parameters (`rlagent.text.train`: float32 master weights and
AdamW moments, `--param_dtype`; bfloat16 compute; decoder blocks rematerialised; one
episode per forward / backward pass),
two programs are lowered and compiled (`jax.jit(...).lower(...).compile()`) on abstract
arguments (`jax.ShapeDtypeStruct`, parameters from `nnx.eval_shape`):

* `update`: one GRPO update of `rlagent.text.update` (one epoch, one minibatch, k3 KL to
  the reference in the loss, AdamW), `--micro_batch_size` episodes per forward / backward
  pass (gradient accumulation), the state donated;
* `rollout`: one turn of the text loop (`rlagent.text.loop.make_text_loop`) for each of
  `--rollout_episodes` episodes at once (the loop calls it with at most
  `TextConfig.sample_batch` episodes, 16 by default), with `--engine`'s programs: 'cached'
  (the default engine) compiles its prefill (a turn's new tokens, up to `max_prompt_len`,
  appended to each episode's KV cache of `TextConfig.cache_len` slots) and its decode
  (`max_new_tokens` steps), the caches donated, and reports the larger peak;
  'reprefill' compiles the one program that prefills a `max_prompt_len` prompt and decodes.

BFCL shapes: `--episodes` episodes of `--turns` turns, the first reading `--first_obs_len`
template tokens (system prompt and tool schemas), later ones `--later_obs_len` (a tool's
reply), `--turn_len` generated tokens a turn; transcripts up to `--transcript_len` tokens
(`TextConfig.transcript_len`: max_prompt_len = transcript_len - turn_len).

Peak bytes are `memory_analysis()`'s argument + output - aliased (donated) + temporary
bytes: what the program holds at its peak, its inputs included. The analysis is the
compiling backend's: on a CPU it is XLA:CPU's buffer assignment, which a GPU's may differ
from (fusion and scheduling differ). Every model is compiled at its full depth: XLA's
buffer reuse across layers is not linear in the layer count (compiles at 1 and 2 layers
differ by 0.25 to 2.6 GiB per layer with the block size and dtype), so no depth is
extrapolated. The JSON holds provenance (`rlagent.host.provenance`).
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags
from flax import nnx

from experiments.model_shapes import MODELS
from experiments.studies.text_batch import text_trajectory
from rlagent.host import provenance
from rlagent.models.llama import Llama
from rlagent.models.llama import PolicyConfig
from rlagent.models.llama import parameter_count
from rlagent.text.chat import ChatFormat
from rlagent.text.loop import ENGINES
from rlagent.text.loop import TextConfig
from rlagent.text.loop import make_text_loop
from rlagent.text.score import make_text_score
from rlagent.text.update import make_text_update
from rlagent.train.config import TrainConfig

PAD_ID, END_ID, TOKENIZER_SIZE = 151643, 151645, 151665  # <|endoftext|>, <|im_end|>.
GIB = 2**30

_MODELS = flags.DEFINE_list("models", list(MODELS), "Models of MODELS to compile.")
_LAYERS = flags.DEFINE_integer("layers", None, "Compile with this many layers (default all).")
_EPISODES = flags.DEFINE_integer("episodes", 32, "Episodes of a batch (the update's).")
_ROLLOUT_EPISODES = flags.DEFINE_list(
    "rollout_episodes", ["32", "16"], "Episodes of one sampler call, each compiled."
)
_TURNS = flags.DEFINE_integer("turns", 16, "Turns per episode (S).")
_TURN_LEN = flags.DEFINE_integer("turn_len", 128, "Generated tokens per turn (L).")
_FIRST_OBS = flags.DEFINE_integer("first_obs_len", 4096, "Template tokens of the first turn.")
_LATER_OBS = flags.DEFINE_integer("later_obs_len", 128, "Template tokens of later turns.")
_TRANSCRIPT = flags.DEFINE_integer("transcript_len", 8192, "Longest transcript (P + L).")
_MICRO = flags.DEFINE_integer("micro_batch_size", 1, "Episodes per forward / backward pass.")
_ATTENTION_BLOCK = flags.DEFINE_integer("attention_block", 256, "PolicyConfig.attention_block.")
_VOCAB_BLOCK = flags.DEFINE_integer("vocab_block", 8192, "PolicyConfig.vocab_block.")
_REMAT = flags.DEFINE_bool("remat", True, "Rematerialise the decoder blocks.")
_PARAM_DTYPE = flags.DEFINE_enum(
    "param_dtype",
    "float32",
    ["float32", "bfloat16"],
    "Parameters' and AdamW moments' dtype (the trainer's default: float32 master weights; "
    "the compute is bfloat16 either way).",
)
_ENGINE = flags.DEFINE_enum("engine", "cached", list(ENGINES), "TextConfig.engine's rollout.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the results here.")


def main(argv):
    del argv
    settings = {name: flags.FLAGS[name].value for name in (
        "models", "layers", "episodes", "rollout_episodes", "turns", "turn_len", "first_obs_len",
        "later_obs_len", "transcript_len", "micro_batch_size", "attention_block",
        "vocab_block", "remat", "param_dtype", "engine")}  # fmt: skip
    record = provenance.collect(settings)
    results = {"backend": jax.default_backend(), "device": str(jax.devices()[0]), "models": {}}
    for name in _MODELS.value:
        results["models"][name] = model_memory(name)
        print(name, json.dumps(_headline(results["models"][name])), flush=True)
    results["settings"] = settings
    results["provenance"] = provenance.finish(record)
    if _JSON_OUT.value:
        with open(_JSON_OUT.value, "w") as f:
            json.dump(results, f, indent=1)


def policy_config(name: str) -> PolicyConfig:
    """The PolicyConfig of `MODELS[name]`: `--param_dtype` parameters, bfloat16 compute
    (`--layers` layers when given)."""
    numbers = dict(MODELS[name])
    if _LAYERS.value is not None:
        numbers["num_layers"] = _LAYERS.value
    return PolicyConfig(
        **numbers, pad_id=PAD_ID, param_dtype=_PARAM_DTYPE.value, dtype="bfloat16",
        remat=_REMAT.value, attention_block=_ATTENTION_BLOCK.value, vocab_block=_VOCAB_BLOCK.value,
    )  # fmt: skip


def model_memory(name: str) -> dict:
    """Peak bytes of both programs compiled for the model at its full depth."""
    config = policy_config(name)
    out = {"parameters": parameter_count(config), "num_layers": config.num_layers}
    # The frozen reference the trainer keeps beside the update (in the compute dtype).
    out["reference_bytes"] = 2 * out["parameters"]
    out["update"] = compile_memory(config, "update", _EPISODES.value)
    print(name, "update", json.dumps(out["update"]), flush=True)
    out["rollout"] = {}
    for episodes in _ROLLOUT_EPISODES.value:
        out["rollout"][episodes] = compile_memory(config, "rollout", int(episodes))
        print(name, "rollout", episodes, json.dumps(out["rollout"][episodes]), flush=True)
    return out


def compile_memory(config: PolicyConfig, program: str, episodes: int) -> dict:
    """`memory_analysis()` of `program` ('update' or 'rollout') compiled for `config` and
    a batch of `episodes`."""
    began = time.perf_counter()
    graphdef, params = abstract_model(config)
    chat = ChatFormat(None, end_id=END_ID, pad_id=PAD_ID, vocab_size=TOKENIZER_SIZE)
    text = TextConfig(
        max_new_tokens=_TURN_LEN.value, obs_len=_FIRST_OBS.value,
        max_prompt_len=_TRANSCRIPT.value - _TURN_LEN.value, engine=_ENGINE.value,
    )  # fmt: skip
    if program == "update":
        score = make_text_score(chat, graphdef, config, text)
        train = TrainConfig(
            num_groups=episodes // 8, group_size=8, reward="outcome", estimator="grpo",
            num_epochs=1, num_minibatches=1, micro_batch_size=_MICRO.value, entropy_coef=0.0,
            kl_placement="loss", kl_coef=0.02, learning_rate=1e-6,
        )  # fmt: skip
        update = make_text_update(train, score)
        trajectory = abstract_trajectory(chat, text, episodes)
        state = jax.eval_shape(update.init, params)
        ref_logp = jax.ShapeDtypeStruct(trajectory.logp.shape, jnp.float32)
        lowered = update.update.lower(state, trajectory, ref_logp)
    else:
        loop = make_text_loop(chat, graphdef, config, text)
        programs = {
            name: _sizes(lowered) for name, lowered in _rollout_lowered(loop, params, episodes)
        }
        sizes = dict(max(programs.values(), key=lambda p: p["peak_bytes"]))
        sizes["programs"], sizes["compile_s"] = programs, time.perf_counter() - began
        return sizes
    sizes = _sizes(lowered)
    sizes["compile_s"] = time.perf_counter() - began
    return sizes


def _rollout_lowered(loop, params, batch: int):
    """(name, lowered program) of one sampled turn of `batch` episodes: the re-prefill
    engine's 'sample', or the cached engine's 'prefill' and 'decode' (caches donated)."""
    spec = jax.ShapeDtypeStruct
    keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), batch))
    if loop.cached is None:
        prompt = spec((batch, loop.config.max_prompt_len), jnp.int32)
        yield "sample", loop.sample.lower(params, prompt, spec(prompt.shape, bool), keys)
        return
    cached, rows = loop.cached, spec((batch,), jnp.int32)
    caches = jax.eval_shape(cached.init, batch)
    tokens, moves = spec((batch, cached.width), jnp.int32), (rows, rows, rows)
    prefill = cached.prefill.lower(params, caches, tokens, rows, rows, moves)
    yield "prefill", prefill
    logits = spec(prefill.out_info[0].shape, prefill.out_info[0].dtype)  # traced once.
    active = spec((batch,), bool)
    yield "decode", cached.decode.lower(params, caches, logits, keys, (rows, active, rows))


def _sizes(lowered) -> dict:
    """memory_analysis() of the compiled program, and its peak."""
    stats = lowered.compile().memory_analysis()
    sizes = {
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
        "alias_bytes": int(stats.alias_size_in_bytes),
        "temp_bytes": int(stats.temp_size_in_bytes),
    }
    sizes["peak_bytes"] = (
        sizes["argument_bytes"] + sizes["output_bytes"] - sizes["alias_bytes"]
        + sizes["temp_bytes"]
    )  # fmt: skip
    return sizes


def abstract_model(config: PolicyConfig):
    """`(graphdef, params)` of `Llama(config)`, the parameters as ShapeDtypeStructs."""
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Llama(config, rngs=nnx.Rngs(0))))
    return graphdef, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)


def abstract_trajectory(chat: ChatFormat, text: TextConfig, episodes: int):
    """The shapes of a text-loop Trajectory of the BFCL batch (`text_trajectory`)."""
    trajectory = text_trajectory(
        np.random.default_rng(0), batch=episodes, turns=_TURNS.value,
        obs_len=_FIRST_OBS.value, turn_len=_TURN_LEN.value, tokenizer_size=TOKENIZER_SIZE,
        chat=chat, later_obs_len=_LATER_OBS.value,
    )  # fmt: skip
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype),
                        trajectory)  # fmt: skip


def _headline(result: dict) -> dict:
    line = {"parameters": result["parameters"]}
    line["update_gib"] = round(result["update"]["peak_bytes"] / GIB, 2)
    for episodes, rollout in result["rollout"].items():
        line[f"rollout_{episodes}_gib"] = round(rollout["peak_bytes"] / GIB, 2)
    return line


if __name__ == "__main__":
    app.run(main)
