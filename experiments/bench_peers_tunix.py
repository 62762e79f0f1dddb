"""The Tunix side of experiments/bench_peers.py: Tunix's `GRPOLearner` on the same tiny
Llama (its own `Llama3` class, loaded from a safetensors file of the rlagent weights), the
same batch, reward and hyperparameters.

Kept apart from the launcher because Tunix is not a package dependency: it is imported
from a folder put on `sys.path` (`google-tunix` and its dependencies installed with
`--no-deps`; see docs/benchmarks_history.md).
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import jax
import numpy as np
import optax


def run(path: str, side: dict) -> dict:
    """Times `side['warmup'] + side['repeats']` Tunix GRPO steps.

    `side`: the shared settings (`prompts`, `group_size`, `prompt_len`, `new_tokens`,
    `learning_rate`, `target`, `pad`, `end`), `llama` (the rlagent Llama to copy),
    `prompts_text` (one string per prompt) and `between` (run after each step, outside
    its timing).
    """
    add_path(path)
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout

    steps = side["warmup"] + side["repeats"]
    # Auto axes: Tunix 0.1.7's gathers predate JAX's explicit-sharding default.
    auto = (jax.sharding.AxisType.Auto,) * 2
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=auto)
    model = tunix_model(side["llama"], mesh, "llama3")
    cluster_config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={role: mesh for role in rl_cluster_lib.Role},
        rollout_engine="vanilla",
        offload_to_cpu=False,
        training_config=rl_cluster_lib.RLTrainingConfig(
            actor_optimizer=optax.chain(
                optax.clip_by_global_norm(1.0),
                optax.adamw(side["learning_rate"], b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0),
            ),
            eval_every_n_steps=10**6,
            max_steps=steps + 1,  # the last one only closes the timing of the one before.
        ),
        rollout_config=base_rollout.RolloutConfig(
            max_tokens_to_generate=side["new_tokens"],
            max_prompt_length=side["prompt_len"],
            kv_cache_size=side["prompt_len"] + side["new_tokens"] + 8,
            temperature=1.0,
            top_p=1.0,
            top_k=None,
            eos_tokens=[side["end"]],
        ),
    )
    cluster = rl_cluster_lib.RLCluster(
        actor=model,
        reference=None,
        tokenizer=WordTokenizer(side["pad"], side["end"]),
        cluster_config=cluster_config,
    )
    config = grpo_learner.GRPOConfig(
        num_generations=side["group_size"], num_iterations=1, beta=0.0, epsilon=0.2,
        loss_agg_mode="token-mean",
    )  # fmt: skip
    timer = _StepTimer(side["between"])
    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster, algo_config=config, reward_fns=[_reward(side, timer)]
    )
    _time_generate(cluster, timer)
    learner.train(timer.batches(side["prompts_text"], side["prompts"], steps + 1))
    return timer.summary(side)


class _StepTimer:
    """Time per step = time between consecutive batch fetches, minus `between`'s time."""

    def __init__(self, between: Callable[[], object]):
        self.between = between
        self.step_s, self.sampling_s, self.tokens = [], [], []

    def batches(self, prompts: list[str], per_batch: int, batches: int):
        """`batches` batches; the fetch of one ends the timing of the step before it."""
        last = None
        for index in range(batches):
            now = time.perf_counter()
            if last is not None:
                self.step_s.append(now - last)
                self.between()
            last = time.perf_counter()
            start = (index % (len(prompts) // per_batch)) * per_batch
            # An array, not a list: Tunix maps np.repeat over the batch as a pytree.
            yield {"prompts": np.array(prompts[start : start + per_batch])}

    def summary(self, side: dict) -> dict:
        slots = side["prompts"] * side["group_size"] * side["new_tokens"]
        return timings("tunix", self.step_s, self.sampling_s, self.tokens,
                       skip=side["warmup"], slots=slots)  # fmt: skip


def timings(name, step_s, sampling_s, tokens, *, skip: int, slots: int) -> dict:
    """The keys every side of the bench reports, `<name>_...`, from per-step seconds (the
    first `skip` are warm-up), sampling seconds and generated tokens: medians of the
    timed steps, tokens per second over the `slots` completion token slots."""
    step = statistics.median(step_s[skip:])
    sampling = statistics.median(sampling_s[skip:])
    return {
        f"{name}_update_ms": 1e3 * step,
        f"{name}_sampling_ms": 1e3 * sampling,
        f"{name}_update_rest_ms": 1e3 * (step - sampling),
        f"{name}_warmup_s": sum(step_s[:skip]),
        f"{name}_update_ms_all": [1e3 * t for t in step_s],
        f"{name}_token_slots": slots,
        f"{name}_generated_tokens": statistics.median(tokens[skip:]),
        f"{name}_tokens_per_sec": slots / step,
    }


class WordTokenizer:
    """The bench's word-level tokenizer ('t<id>' words, ids = model tokens) in the plain
    form Tunix accepts (encode, decode, bos_id, eos_id, pad_id)."""

    def __init__(self, pad: int, end: int):
        self.pad, self.end = pad, end

    def encode(self, text: str, **kwargs) -> list[int]:
        del kwargs
        return [int(word[1:]) for word in str(text).split()]

    def decode(self, ids, **kwargs) -> str:
        del kwargs
        return " ".join(f"t{int(i)}" for i in ids if int(i) not in (self.pad, self.end))

    def bos_id(self) -> None:  # no BOS: the prompt is the model's input as it is.
        return None

    def eos_id(self) -> int:
        return self.end

    def pad_id(self) -> int:
        return self.pad


def _time_generate(cluster, timer: _StepTimer) -> None:
    generate = cluster.generate

    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = generate(*args, **kwargs)
        jax.block_until_ready(getattr(out, "tokens", None))
        timer.sampling_s.append(time.perf_counter() - start)
        return out

    cluster.generate = timed


def _reward(side: dict, timer: _StepTimer):
    """PromptEnv's reward from the decoded text: the fraction of the N slots equal to the
    target word (the tokenizer is word-level, one word per token)."""
    target, slots = f"t{side['target']}", side["new_tokens"]

    def target_fraction(prompts, completions, **kwargs):
        del prompts, kwargs
        words = [completion.split() for completion in completions]
        timer.tokens.append(float(sum(len(w) for w in words)))
        return [sum(word == target for word in w) / slots for w in words]

    return target_fraction


def add_path(path: str) -> None:
    """Puts the side folder holding tunix and its `--no-deps` dependencies on sys.path."""
    if path and path not in sys.path:
        sys.path.append(path)


def hf_folder(llama, prefix: str) -> str:
    """A new folder holding `llama`'s weights as a HF safetensors file and its config.json
    (the form Tunix's `create_model_from_safe_tensors` loads)."""
    from safetensors.numpy import save_file

    from rlagent.models.hf import hf_config
    from rlagent.models.hf import to_hf_state_dict

    folder = tempfile.mkdtemp(prefix=prefix)
    save_file(to_hf_state_dict(llama), os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hf_config(llama.config).to_dict(), f)
    return folder


def tunix_model(llama, mesh, family: str):
    """Tunix's model of `family` ('llama3' or 'qwen2': q/k/v biases) holding `llama`'s
    weights, through a safetensors file."""
    model_lib = importlib.import_module(f"tunix.models.{family}.model")
    params_lib = importlib.import_module(f"tunix.models.{family}.params")
    cfg = llama.config
    tied = {"llama3": "weight_tying", "qwen2": "use_tied_embedding"}[family]
    config = model_lib.ModelConfig(
        num_layers=cfg.num_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.d_model,
        hidden_dim=cfg.mlp_dim, num_heads=cfg.num_heads, head_dim=cfg.dim_per_head,
        num_kv_heads=cfg.num_kv_heads, rope_theta=int(cfg.rope_theta), norm_eps=cfg.norm_eps,
        **{tied: cfg.tie_embeddings},
    )  # fmt: skip
    folder = hf_folder(llama, f"bench-tunix-{family}-")
    return params_lib.create_model_from_safe_tensors(folder, config, mesh, dtype=np.float32)
