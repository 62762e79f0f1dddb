r"""Benchmark: the training update on an accelerator, with model FLOPs utilisation.

  python -m experiments.bench_accel --json_out=/tmp/bench_accel.json   # <= 8 min, one GPU
  python -m experiments.bench_accel --tiny --json_out=/tmp/tiny.json   # CPU smoke shapes

Two parts, each timed after warm-up (median of `--repeats` calls; compile time, i.e.
tracing + lowering + XLA compiling, separately):

* `main`: `jit(vmap(trainer.update))` of the main experiment at its accelerator budget
  (`--config`, default experiments/configs/sparse_vs_dense_full.py: 4 reward forms x 30
  seeds = 120 vmapped runs of 64 episodes; the main experiment has no `_accel.py` config,
  its `_full` one is the accelerator's size), through bench_train's helpers (`_init`,
  `_time_update`, `_extras`). Rollout, reference, advantages and PPO epochs are one
  program, so its MFU counts only the teacher-forced training passes (a lower bound:
  the rollout's sampling and attention are left out).
* `text`: `rlagent.text.update` (GRPO, PPO-clip with a k3 KL to a frozen reference) of a
  random Qwen2.5-0.5B-shaped model (hidden 896, 24 layers, 14 heads, 2 key/value heads,
  head 64, SwiGLU 4864, vocabulary 151936, q/k/v biases, tied embeddings) in bfloat16,
  parameters FSDP-sharded over the local devices (`rlagent.models.sharding`), on a
  text-loop Trajectory (`rlagent.text.loop.to_trajectory`) of random tokens:
  `--text_batch` episodes of `--text_turns` turns of `--text_obs_len` template and
  `--text_turn_len` generated tokens. The reference's log-probs (forward only) are timed
  apart from the update (forward + backward + AdamW).
* `text_width`: the `text` part on a batch whose turns after the first read
  `--text_later_obs_len` template tokens (a tool's reply after a long system prompt),
  timed twice in one run: scored over packed rows of `TextConfig.transcript_len` = P + L
  positions (what the trainer does) and over all S x (O + L) slots (what it did before),
  with the ratio.

Model FLOPs (PaLM's accounting, Chowdhery et al. 2022, appendix B), per token of a
sequence of T positions, N parameters (a tied embedding counted once: it is the LM
head's matmul), L layers, H query heads of width d:

    forward  = 2 N + 4 L H d T         (the attention products QK^T and AV, full T x T,
    update   = 3 x forward              as `Llama` computes them under the causal mask)

MFU = model FLOPs / seconds / (peak dense bf16 FLOP/s of a device x devices), the peak
from `PEAK_FLOPS` by `device_kind` (null where unknown, e.g. CPU). Peak memory is
`device.memory_stats()["peak_bytes_in_use"]` (the process's peak so far; null where the
backend keeps no statistics, e.g. CPU). The JSON holds provenance
(`rlagent.host.provenance`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time

import jax
import numpy as np
from absl import app
from absl import flags
from flax import nnx
from ml_collections import config_flags

from experiments import bench_train
from experiments import launch
from experiments.studies.common import build as build_setup
from experiments.studies.text_batch import QWEN25_05B
from experiments.studies.text_batch import TINY_QWEN
from experiments.studies.text_batch import text_config as text_batch_config
from experiments.studies.text_batch import text_trajectory
from rlagent.host import provenance
from rlagent.models import sharding
from rlagent.models.llama import Llama
from rlagent.models.llama import PolicyConfig
from rlagent.text.chat import ChatFormat
from rlagent.text.score import make_text_score
from rlagent.text.update import make_text_update
from rlagent.train.config import TrainConfig
from rlagent.train.ppo import make_train

_MAIN_CONFIG = os.path.join(os.path.dirname(__file__), "configs", "sparse_vs_dense_full.py")
_TINY = flags.DEFINE_bool("tiny", False, "CPU smoke shapes (tests): a tiny model and batch.")
_PARTS = flags.DEFINE_list("parts", ["main", "text"], "Parts to run: main, text, text_width.")
_TEXT_BATCH = flags.DEFINE_integer("text_batch", 8, "Episodes of the text update.")
_TEXT_TURNS = flags.DEFINE_integer("text_turns", 2, "Turns per text episode (S).")
_TEXT_OBS = flags.DEFINE_integer("text_obs_len", 256, "Template tokens read per turn (O).")
_TEXT_TURN_LEN = flags.DEFINE_integer("text_turn_len", 256, "Generated tokens per turn (L).")
_TEXT_LATER_OBS = flags.DEFINE_integer(
    "text_later_obs_len", 32, "text_width: template tokens read by the turns after the first."
)

# Peak dense bfloat16 FLOP/s of one device, by a lower-case fragment of `device_kind`
# (vendor datasheets, no sparsity), first match wins.
PEAK_FLOPS = (
    ("h100", 989e12),  # SXM; the PCIe card is 756e12.
    ("h200", 989e12),  # and GH200.
    ("a100", 312e12),
    ("l4", 121e12),
    ("tpu v4", 275e12),
    ("tpu v5 lite", 197e12),  # v5e
    ("tpu v5e", 197e12),
    ("tpu v5p", 459e12),
    ("tpu v5", 459e12),
    ("tpu v6", 918e12),  # Trillium (v6e)
)
FLOPS_FORMULA = (
    "per token: forward = 2 N + 4 L H d T, update = 3 x forward (N parameters, tied "
    "embedding once; L layers, H query heads of width d, T positions per row)"
)
QWEN25_END_ID, QWEN25_TOKENS = 151645, 151665  # <|im_end|>; len(tokenizer).
GROUP_SIZE = 4  # GRPO episodes per prompt in the text batch.


def main(argv):
    del argv
    if bench_train._CACHE_DIR.value is not None:
        launch.enable_cache(bench_train._CACHE_DIR.value)
    start = time.perf_counter()
    device = jax.devices()[0]
    results = {
        "device": str(device),
        "device_kind": device.device_kind,
        "backend": jax.default_backend(),
        "num_devices": jax.local_device_count(),
        "tiny": _TINY.value,
        "peak_flops_per_device": peak_flops(device.device_kind),
        "flops_formula": FLOPS_FORMULA,
    }
    settings = {name: flags.FLAGS[name].value for name in
                ("tiny", "parts", "text_batch", "text_turns", "text_obs_len", "text_turn_len",
                 "text_later_obs_len", "repeats")}  # fmt: skip
    record = provenance.collect(settings, main_config=bench_train._CONFIG.value.to_dict())
    if "main" in _PARTS.value:
        results["main"] = main_update(bench_train._CONFIG.value, _TINY.value)
        print("main:", json.dumps(_headline(results["main"])))
    if "text" in _PARTS.value:
        results["text"] = text_update(_TINY.value)
        print("text:", json.dumps(_headline(results["text"])))
    if "text_width" in _PARTS.value:
        later = _TEXT_LATER_OBS.value
        widths = {w: text_update(_TINY.value, later, w) for w in ("packed", "slots")}
        widths["slots_over_packed"] = widths["slots"]["update_s"] / widths["packed"]["update_s"]
        results["text_width"] = widths
        print("text_width:", json.dumps({w: _headline(widths[w]) for w in ("packed", "slots")}),
              f"slots / packed update time {widths['slots_over_packed']:.2f}")  # fmt: skip
    results["wall_s"] = time.perf_counter() - start
    results["provenance"] = provenance.finish(record)
    if bench_train._JSON_OUT.value:
        with open(bench_train._JSON_OUT.value, "w") as f:
            json.dump(results, f, indent=2)


def peak_flops(device_kind: str) -> float | None:
    """Peak dense bf16 FLOP/s of a device of this kind (`PEAK_FLOPS`), None if unknown."""
    kind = device_kind.lower()
    return next((peak for fragment, peak in PEAK_FLOPS if fragment in kind), None)


def peak_memory() -> int | None:
    """The first local device's peak bytes in use so far, None without statistics."""
    stats = jax.local_devices()[0].memory_stats()
    return None if not stats else int(stats.get("peak_bytes_in_use", 0)) or None


def mfu(flops: float, seconds: float) -> float | None:
    """Model FLOPs utilisation over the local devices, None without a known peak."""
    peak = peak_flops(jax.devices()[0].device_kind)
    return None if peak is None else flops / seconds / (peak * jax.local_device_count())


def forward_flops(config: PolicyConfig, params: int, length: int) -> float:
    """Model FLOPs of one forward pass per token of a row of `length` positions."""
    attention = 4 * config.num_layers * config.num_heads * config.dim_per_head * length
    return 2.0 * params + attention


def main_update(config, tiny: bool) -> dict:
    """The main experiment's `jit(vmap(trainer.update))` (bench_train's timing)."""
    if tiny:  # one run of 4 episodes; `config` is bench_train's flag value, which its
        # helpers read too.
        config.seeds, config.conditions = 1, "outcome"
        config.train.update(num_groups=2, group_size=2, num_epochs=1, num_minibatches=1)
    setup = build_setup(config)
    conditions = [name.strip() for name in config.conditions.split(",") if name.strip()]
    seeds = range(config.first_seed, config.first_seed + config.seeds)
    runs = [(condition, seed) for condition in conditions for seed in seeds]
    train_config = setup.train_config
    extras = bench_train._extras(setup, train_config)
    trainer = make_train(
        train_config, setup.env, setup.policy_config, setup.rollout_config, **extras
    )
    state = bench_train._init(trainer, train_config, runs)
    row = bench_train._time_update(trainer, state)
    first = row.pop("first_update_metrics")
    params = _count(state.params) // len(runs)
    generated = float(np.sum(first["tokens"])) * train_config.batch_size
    shapes = jax.eval_shape(
        jax.vmap(trainer.rollout), state.params, *bench_train._rollout_keys(state)
    )
    # Token slots of the batch (observation and action tokens of every turn of every run).
    slots = int(np.prod(shapes.obs_tokens.shape) + np.prod(shapes.action_tokens.shape))
    seconds = row["update_ms_median"] / 1e3
    flops = 6.0 * params * slots * train_config.num_epochs
    return dict(
        config=config_flags.get_config_filename(flags.FLAGS["config"]),
        runs=len(runs),
        episodes_per_run=train_config.batch_size,
        params_per_run=params,
        update_s=seconds,
        update_s_fastest=row["update_ms"] / 1e3,
        compile_s=row["compile_s"],
        env_turns_per_sec=row["env_turns"] / seconds,
        generated_tokens_per_sec=generated / seconds,
        live_slot_fraction=row["live_slot_fraction"],
        token_slots=slots,
        train_pass_flops=flops,
        mfu_train_passes=mfu(flops, seconds),
        peak_memory_bytes=peak_memory(),
    )


def text_update(tiny: bool, later_obs_len: int | None = None, width: str = "packed") -> dict:
    """The text-mode GRPO update of a Qwen2.5-0.5B-shaped random model (module docstring);
    `width` 'slots' scores over all S x (O + L) slots instead of P + L packed positions."""
    policy_config = TINY_QWEN if tiny else QWEN25_05B
    batch, turns, obs_len, turn_len = (
        (4, 2, 16, 8) if tiny
        else (_TEXT_BATCH.value, _TEXT_TURNS.value, _TEXT_OBS.value, _TEXT_TURN_LEN.value)
    )  # fmt: skip
    if later_obs_len is not None and not 1 <= later_obs_len <= obs_len:
        raise ValueError(f"--text_later_obs_len={later_obs_len} must be in 1..{obs_len}, the "
                         "template tokens of the first turn")  # fmt: skip
    end_id = 1 if tiny else QWEN25_END_ID
    mesh = sharding.fsdp_mesh(jax.local_devices())
    graphdef, params = sharding.init_sharded(lambda: Llama(policy_config, rngs=nnx.Rngs(0)), mesh)
    ref_params = jax.tree.map(lambda x: x.copy(), params)  # the update donates `params`.
    tokenizer_size = policy_config.vocab_size if tiny else QWEN25_TOKENS
    # No tokenizer: the scorer reads only the END / PAD ids and the sampling mask.
    chat = ChatFormat(None, end_id=end_id, pad_id=policy_config.pad_id, vocab_size=tokenizer_size)
    text_config = text_batch_config(turns, obs_len, turn_len, later_obs_len)
    slots = turns * (obs_len + turn_len)
    if width == "slots":  # a P so large that the packed rows keep every slot.
        text_config = dataclasses.replace(text_config, max_prompt_len=slots)
    score = make_text_score(chat, graphdef, policy_config, text_config)
    trajectory = text_trajectory(
        np.random.default_rng(0), batch=batch, turns=turns, obs_len=obs_len, turn_len=turn_len,
        tokenizer_size=tokenizer_size, chat=chat, later_obs_len=later_obs_len,
    )  # fmt: skip
    trajectory = sharding.shard_batch(trajectory, mesh)
    # On-policy: the behaviour log-probs are the policy's own.
    trajectory = trajectory._replace(logp=score(params, trajectory))
    train_config = TrainConfig(
        num_updates=1, num_groups=batch // GROUP_SIZE, group_size=GROUP_SIZE, reward="outcome",
        estimator="grpo", num_epochs=1, num_minibatches=1, entropy_coef=0.0,
        kl_placement="loss", kl_coef=0.04, learning_rate=1e-6,
    )  # fmt: skip
    program = make_text_update(train_config, score, mesh=mesh)
    state = program.init(params)
    reference = _timed(program.reference, (ref_params, trajectory))
    ref_logp = reference.pop("out")
    # Each call donates its state: the next one takes the state it returned.
    update = _timed(
        program.update, (state, trajectory, ref_logp), lambda out, args: (out[0], *args[1:])
    )
    state, metrics = update.pop("out")
    metrics = {k: float(v) for k, v in metrics.items()}
    count = _count(params)
    length = min(slots, text_config.transcript_len)  # the packed rows' width.
    tokens = batch * length
    per_token = forward_flops(policy_config, count, length)
    update_flops = 3 * per_token * tokens * train_config.num_epochs
    biggest = max(jax.tree.leaves(state.params), key=lambda x: x.size)
    return dict(
        model=dataclasses.asdict(policy_config),
        params=count,
        batch=dict(episodes=batch, turns=turns, obs_len=obs_len, turn_len=turn_len,
                   later_obs_len=later_obs_len, slots=slots, row_length=length, tokens=tokens,
                   generated_tokens=int(np.sum(np.asarray(trajectory.loss_mask)))),
        mesh=dict(zip(mesh.axis_names, (int(n) for n in mesh.devices.shape), strict=True)),
        largest_param=dict(shape=list(biggest.shape), spec=str(biggest.sharding.spec)),
        compile_s=dict(update=update["compile_s"], reference=reference["compile_s"]),
        update_s=update["median_s"], update_s_all=update["times_s"],
        reference_s=reference["median_s"], reference_s_all=reference["times_s"],
        tokens_per_sec=tokens / update["median_s"],
        update_flops=update_flops,
        reference_flops=per_token * tokens,
        mfu=mfu(update_flops, update["median_s"]),
        reference_mfu=mfu(per_token * tokens, reference["median_s"]),
        peak_memory_bytes=peak_memory(),
        metrics=metrics,
    )  # fmt: skip


def _timed(program, args: tuple, advance=None) -> dict:
    """Compile time of jitted `program` (trace + lower + XLA), then `--repeats` timed
    calls after one warm-up call; `advance(output, args)` gives the next call's arguments
    (default: the same)."""
    start = time.perf_counter()
    compiled = program.lower(*args).compile()
    compile_s = time.perf_counter() - start
    out = jax.block_until_ready(compiled(*args))  # warm-up
    times = []
    for _ in range(bench_train._REPEATS.value):
        args = args if advance is None else advance(out, args)
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return dict(compile_s=compile_s, median_s=statistics.median(times), times_s=times, out=out)


def _count(tree) -> int:
    return int(sum(np.prod(x.shape, dtype=np.int64) for x in jax.tree.leaves(tree)))


def _headline(part: dict) -> dict:
    keys = ("update_s", "compile_s", "tokens_per_sec", "env_turns_per_sec", "mfu",
            "mfu_train_passes", "peak_memory_bytes")  # fmt: skip
    return {k: part[k] for k in keys if k in part}


if __name__ == "__main__":
    flags.FLAGS.set_default("config", _MAIN_CONFIG)
    flags.FLAGS.set_default("repeats", 5)
    app.run(main, flags_parser=launch.parse_flags)
