r"""Benchmark: one GRPO update side by side with peers, at equal work, in one process.

One update = sample `prompts x group_size` completions of `new_tokens` tokens, score them
with the reward function, the GRPO loss and its backward pass, one AdamW step. The same
tiny Llama (`--d_model`, ...; weights copied with `rlagent.models.hf.to_hf_model`), the
same batch, reward and hyperparameters on every side:

* `rlagent`: `make_train` (estimator 'grpo') on `rlagent.envs.prompts.PromptEnv`, a
  single-turn environment on the protocol (reward: the fraction of the `new_tokens` slots
  equal to `--target`); `toolworld`: the same trainer on ToolWorld (multi-turn, its own
  sizes: `max_turns` turns of `turn_len` tokens per episode), a separate row.
* `trl`: TRL's `GRPOTrainer` on the transformers twin of the model (a word-level tokenizer
  whose ids are the model's tokens), the same reward as a python function of
  `completion_ids`.
* `tunix`: Tunix's GRPO learner when it imports and runs here; otherwise the error is
  recorded under `tunix_error`.

Timing: TRL's steps run in its own training loop; after each TRL step (a callback, outside
TRL's timing) one rlagent update, one rlagent rollout and one ToolWorld update run, so
every side sees the same load. The first `--warmup` updates of every side are dropped;
the median of the next `--repeats` is reported. Compile (rlagent: first call minus median)
and warm-up times are reported separately. Keys:

* `<side>_update_ms`, `<side>_sampling_ms`, `<side>_update_rest_ms` (scoring + loss +
  backward + optimizer: update minus sampling), `<side>_tokens_per_sec` (completion token
  slots, prompts x group x new_tokens, per second of update), `<side>_generated_tokens`
  (tokens actually produced up to and including END, per update, median);
* `speedup_vs_trl`, `speedup_vs_tunix`: rlagent tokens/s over the peer's (equal slots, so
  the ratio of update times), each against the rlagent updates interleaved with that
  peer: TRL's steps and rlagent's alternate in the first phase, Tunix's and rlagent's in
  the second (`rlagent_update_ms_during_tunix`, `rlagent_tokens_per_sec_during_tunix`);
* `load_avg` (1-minute load before and after), `versions`, `settings`, `differences`.

  python -m experiments.bench_peers --json_out=/tmp/bench_peers.json
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags
from flax import nnx

from experiments import bench_peers_tunix
from experiments import launch
from rlagent.envs.prompts import PromptConfig
from rlagent.envs.prompts import PromptEnv
from rlagent.envs.prompts.env import END
from rlagent.envs.prompts.env import PAD
from rlagent.envs.toolworld import ToolWorld
from rlagent.models import Policy
from rlagent.models import PolicyConfig
from rlagent.models.hf import to_hf_model
from rlagent.rollout import RolloutConfig
from rlagent.train import TrainConfig
from rlagent.train import make_train

_JSON_OUT = flags.DEFINE_string("json_out", None, "Where to write the JSON results.")
_PROMPTS = flags.DEFINE_integer("prompts", 8, "Distinct prompts per update.")
_GROUP = flags.DEFINE_integer("group_size", 8, "Completions per prompt (num_generations).")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 16, "Prompt tokens.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 32, "New tokens per completion.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed updates of every side.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed updates of every side (median).")
_LR = flags.DEFINE_float("learning_rate", 1e-3, "AdamW learning rate (constant).")
_D_MODEL = flags.DEFINE_integer("d_model", 64, "Model width.")
_LAYERS = flags.DEFINE_integer("num_layers", 2, "Decoder blocks.")
_SIDES = flags.DEFINE_list("sides", ["rlagent", "toolworld", "trl", "tunix"], "What to time.")
_TRL_CHECKPOINTING = flags.DEFINE_bool(
    "trl_gradient_checkpointing",
    False,
    "TRL's GRPOConfig default (True) recomputes activations in the backward pass; rlagent "
    "does not, so it is off for equal work unless set.",
)
# Shared with the launchers (one definition per process); unset, this bench uses no
# persistent cache, so that compile times are measured.
_CACHE_DIR = launch.define_cache_flag()
_TUNIX_PATH = flags.DEFINE_string(
    "tunix_path", "/tmp/tunix_pkg", "A folder holding tunix and its --no-deps dependencies."
)

# What the sides do differently, for the JSON and docs/benchmarks_history.md.
DIFFERENCES = (
    "rlagent's context is prompt + 1 task-progress marker slot (the protocol's K >= 1) + "
    "completion: P + 1 + N positions vs TRL's P + N; the marker embedding is added by the "
    "state encoder, not in the HF twin.",
    "rlagent's policy carries a shared value head (unused by GRPO: zero gradient) and TRL's "
    "model does not; so the two models are not bit-identical in their outputs.",
    "Sampling: both draw at temperature 1 from the full softmax, PAD banned on rlagent's "
    "side (PAD never appears in TRL's samples either: it is never likely enough to matter, "
    "but it is not banned there), both stop a row at END and the batch when every row has "
    "ended or N tokens are drawn.",
    "rlagent samples with its JAX KV-cache sampler inside one jitted update (sampling, "
    "reward, advantages, loss, backward and AdamW are one XLA program); TRL runs "
    "transformers' generate (DynamicCache) then a separate teacher-forced forward/backward "
    "in PyTorch eager mode.",
    "TRL's GRPOConfig turns gradient checkpointing on by default; it is off here "
    "(--trl_gradient_checkpointing), as rlagent keeps its activations.",
    "Tunix: its Llama3 class loaded from a safetensors file of the same weights, its "
    "vanilla JAX sampler (prompt left-padded to prompt_len, a KV cache of P + N + 8), "
    "GRPOConfig(beta 0, epsilon 0.2, loss_agg_mode 'token-mean'), no reference model, the "
    "same optax chain (clip_by_global_norm(1), adamw); reward from the decoded words. Its "
    "steps run after TRL's, interleaved with rlagent updates (rlagent_update_ms_during_tunix).",
    "The ToolWorld row is the same trainer and trunk sizes on ToolWorld (vocabulary 71, "
    "windowed context W=4, up to max_turns turns of turn_len tokens): multi-turn work, "
    "not comparable token for token with the single-turn rows.",
    "Both: GRPO advantages (group mean, group std), no KL (beta 0, no reference model), "
    "PPO clip 0.2 both sides (no dual clip), no entropy bonus, one epoch of one minibatch "
    "(num_iterations 1, steps_per_generation 1), token-mean loss (TRL 'dapo'), grad-norm "
    "clip 1.0, AdamW(b1 .9, b2 .999, eps 1e-8, no weight decay), constant learning rate.",
)


def main(argv):
    del argv
    if _CACHE_DIR.value is not None:
        launch.enable_cache(_CACHE_DIR.value)
    results = {
        "load_avg_before": os.getloadavg(),
        "settings": _settings(),
        "differences": list(DIFFERENCES),
        "commit": _commit(),
    }
    sides = set(_SIDES.value)
    policy_config = _policy_config()
    rows = {}
    if "rlagent" in sides:
        rows["rlagent"] = RlagentSide(_prompt_env(), policy_config, _train_config())
    if "toolworld" in sides:
        env = ToolWorld()  # its own vocabulary (the trunk's other sizes are the same).
        config = dataclasses.replace(policy_config, vocab_size=env.token_spec.vocab_size)
        rows["toolworld"] = RlagentSide(env, config, _train_config(), window=4)
    for name, side in rows.items():
        results[f"{name}_compile_s"] = side.compile_s
    if "trl" in sides:
        trl_side = TRLSide(rows.get("rlagent"), policy_config)
        results.update(trl_side.run(between=lambda: [side.step() for side in rows.values()]))
    else:
        for _ in range(_WARMUP.value + _REPEATS.value):
            for side in rows.values():
                side.step()
    for name, side in rows.items():
        results.update(side.summary(name))
    if "tunix" in sides:
        between = rows["rlagent"].step if "rlagent" in rows else (lambda: None)
        before = len(rows["rlagent"].update_s) if "rlagent" in rows else 0
        results.update(tunix_row(_TUNIX_PATH.value, _initial_llama(rows, policy_config), between))
        if "rlagent" in rows and len(rows["rlagent"].update_s) > before:
            during = rows["rlagent"].update_s[before + _WARMUP.value :] or [float("nan")]
            results["rlagent_update_ms_during_tunix"] = 1e3 * statistics.median(during)
    results["load_avg_after"] = os.getloadavg()
    results["versions"] = _versions()  # after Tunix's folder joined sys.path.
    _ratios(results)
    print(json.dumps(results, indent=2))
    if _JSON_OUT.value:
        with open(_JSON_OUT.value, "w") as f:
            json.dump(results, f, indent=2)


def _prompt_env() -> PromptEnv:
    return PromptEnv(PromptConfig(prompt_len=_PROMPT_LEN.value, turn_len=_NEW_TOKENS.value))


def _policy_config() -> PolicyConfig:
    d_model = _D_MODEL.value
    return PolicyConfig(
        vocab_size=128, d_model=d_model, num_layers=_LAYERS.value, num_heads=4,
        num_kv_heads=2, mlp_dim=2 * d_model, num_summary_slots=0,
    )  # fmt: skip


def _train_config() -> TrainConfig:
    """GRPO with the settings both sides can share (module docstring, DIFFERENCES)."""
    return TrainConfig(
        num_groups=_PROMPTS.value, group_size=_GROUP.value, reward="outcome",
        estimator="grpo", num_epochs=1, num_minibatches=1, clip_low=0.2, clip_high=0.2,
        dual_clip=None, entropy_coef=0.0, kl_placement="none", kl_coef=0.0,
        learning_rate=_LR.value, max_grad_norm=1.0, weight_decay=0.0,
    )  # fmt: skip


class RlagentSide:
    """`jit(trainer.update)` and `jit(trainer.rollout)` of one run, stepped one at a time."""

    def __init__(self, env, policy_config, train_config, window: int | None = None):
        self.env, self.config = env, train_config
        self.trainer = make_train(train_config, env, policy_config, RolloutConfig(window=window))
        self.state = jax.jit(self.trainer.init)(jax.random.key(0))
        self.initial_params = self.state.params
        self._update = jax.jit(self.trainer.update)
        self._rollout = jax.jit(self.trainer.rollout)
        self.update_s, self.sampling_s, self.tokens, self.turns = [], [], [], []
        start = time.perf_counter()
        jax.block_until_ready(self._update(self.state))
        jax.block_until_ready(self._rollout(self.state.params, *self._keys()))
        first = time.perf_counter() - start
        self.step()
        self.compile_s = first - (self.update_s[-1] + self.sampling_s[-1])
        self.update_s, self.sampling_s, self.tokens, self.turns = [], [], [], []

    def step(self) -> None:
        """One timed update, then one timed rollout (sampling alone) on its new params."""
        start = time.perf_counter()
        self.state, metrics = jax.block_until_ready(self._update(self.state))
        self.update_s.append(time.perf_counter() - start)
        self.tokens.append(float(metrics["tokens"]) * self.config.batch_size)
        self.turns.append(float(metrics["env_turns"]))
        keys = self._keys()
        start = time.perf_counter()
        jax.block_until_ready(self._rollout(self.state.params, *keys))
        self.sampling_s.append(time.perf_counter() - start)

    def _keys(self):
        """Env / policy keys as `update` derives them (a group shares its prompt)."""
        config = self.config
        _, env_key, policy_key, _ = jax.random.split(self.state.key, 4)
        env_keys = jnp.repeat(jax.random.split(env_key, config.num_groups), config.group_size, 0)
        return env_keys, jax.random.split(policy_key, config.batch_size)

    def summary(self, name: str) -> dict:
        skip = _WARMUP.value
        slots = self.config.batch_size * self.env.turn_len * self.env.max_turns
        out = bench_peers_tunix.timings(name, self.update_s, self.sampling_s, self.tokens,
                                        skip=skip, slots=slots)  # fmt: skip
        update = statistics.median(self.update_s[skip:])
        # The sampling calls are extra here (a rollout after each update): warm-up has both.
        out[f"{name}_warmup_s"] += sum(self.sampling_s[:skip])
        out[f"{name}_generated_tokens_per_sec"] = out[f"{name}_generated_tokens"] / update
        if self.env.max_turns > 1:
            out[f"{name}_env_turns_per_sec"] = statistics.median(self.turns[skip:]) / update
        return out


class TRLSide:
    """TRL's GRPOTrainer on the transformers twin of the rlagent side's initial weights."""

    def __init__(self, rlagent_side: RlagentSide | None, policy_config: PolicyConfig):
        self.model = to_hf_model(_initial_llama({"rlagent": rlagent_side}, policy_config))
        self.step_s, self.sampling_s, self.tokens = [], [], []

    def run(self, between: Callable[[], object]) -> dict:
        import torch

        trainer = _trl_trainer(self.model, self._reward, _trl_callback(self, between))
        generate = trainer._generate

        def timed_generate(*args, **kwargs):
            start = time.perf_counter()
            out = generate(*args, **kwargs)
            self.sampling_s.append(time.perf_counter() - start)
            return out

        trainer._generate = timed_generate
        start = time.perf_counter()
        trainer.train()
        total = time.perf_counter() - start
        slots = _PROMPTS.value * _GROUP.value * _NEW_TOKENS.value
        out = bench_peers_tunix.timings("trl", self.step_s, self.sampling_s, self.tokens,
                                        skip=_WARMUP.value, slots=slots)  # fmt: skip
        step = statistics.median(self.step_s[_WARMUP.value :])
        out["trl_generated_tokens_per_sec"] = out["trl_generated_tokens"] / step
        return {**out, "trl_train_call_s": total, "trl_torch_threads": torch.get_num_threads()}

    def _reward(self, prompts, completions, completion_ids, **kwargs) -> list[float]:
        """PromptEnv's reward on token ids: the fraction of the N slots equal to the target."""
        del prompts, completions, kwargs
        target, slots = PromptConfig().target, _NEW_TOKENS.value
        self.tokens.append(float(sum(len(ids) for ids in completion_ids)))
        return [sum(int(t == target) for t in ids) / slots for ids in completion_ids]


def _initial_llama(rows: dict, policy_config: PolicyConfig):
    """The Llama trunk rlagent starts from (a fresh one without an rlagent side)."""
    side = rows.get("rlagent")
    if side is None:
        return Policy(policy_config, rngs=nnx.Rngs(0)).actor.lm
    return nnx.merge(side.trainer.graphdef, side.initial_params).actor.lm


def _prompt_texts(steps: int) -> list[str]:
    """`prompts x steps` prompts of PromptEnv's distribution, as 't<id>' words."""
    rng = np.random.default_rng(0)
    prompts = rng.integers(END + 1, 128, (_PROMPTS.value * steps, _PROMPT_LEN.value))
    return [" ".join(f"t{t}" for t in row) for row in prompts]


def _trl_callback(side: TRLSide, between: Callable[[], object]):
    """Times each TRL step (begin to end) and runs `between` after it, outside the timing."""
    from transformers import TrainerCallback

    class Interleave(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            side.step_s.append(time.perf_counter() - self.start)
            between()

    return Interleave()


def _trl_trainer(model, reward: Callable, callback):
    from datasets import Dataset
    from trl import GRPOConfig
    from trl import GRPOTrainer

    steps = _WARMUP.value + _REPEATS.value
    dataset = Dataset.from_dict({"prompt": _prompt_texts(steps)})
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-peers-trl-"),
        per_device_train_batch_size=_PROMPTS.value * _GROUP.value,
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        num_generations=_GROUP.value, max_completion_length=_NEW_TOKENS.value,
        learning_rate=_LR.value, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, adam_beta1=0.9, adam_beta2=0.999,
        adam_epsilon=1e-8, beta=0.0, epsilon=0.2, epsilon_high=0.2, loss_type="dapo",
        scale_rewards="group", temperature=1.0, top_k=0, top_p=1.0, max_steps=steps,
        logging_steps=10**6, report_to="none", save_strategy="no", use_cpu=True,
        disable_tqdm=True, seed=0, bf16=False, log_completions=False,
        gradient_checkpointing=_TRL_CHECKPOINTING.value,
    )  # fmt: skip
    return GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset,
        processing_class=_word_tokenizer(), callbacks=[callback],
    )  # fmt: skip


def _word_tokenizer():
    """A tokenizer whose ids are the model's tokens: 't<id>' words, PAD and END special."""
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "<end>": END, **{f"t{i}": i for i in range(END + 1, 128)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<end>", padding_side="left"
    )


def tunix_row(path: str, llama, between: Callable[[], object]) -> dict:
    """Tunix's GRPO learner, if it imports and runs; else what failed (`tunix_error`)."""
    side = dict(
        prompts=_PROMPTS.value, group_size=_GROUP.value, prompt_len=_PROMPT_LEN.value,
        new_tokens=_NEW_TOKENS.value, learning_rate=_LR.value, target=PromptConfig().target,
        end=END, warmup=_WARMUP.value, repeats=_REPEATS.value, llama=llama,
        pad=PAD, between=between,
        prompts_text=_prompt_texts(_WARMUP.value + _REPEATS.value),
    )  # fmt: skip
    try:
        return bench_peers_tunix.run(path, side)
    except Exception as error:  # noqa: BLE001 - the failure itself is the result.
        trace = traceback.format_exc(limit=-4)
        return {"tunix_error": f"{type(error).__name__}: {error}"[:2000], "tunix_trace": trace}


def _ratios(results: dict) -> None:
    """rlagent over each peer, each against the rlagent updates interleaved with it (TRL's:
    `rlagent_update_ms`; Tunix's: `rlagent_update_ms_during_tunix`), equal slots."""
    ours = {
        "trl": results.get("rlagent_update_ms"),
        "tunix": results.get("rlagent_update_ms_during_tunix"),
    }
    for peer, ours_ms in ours.items():
        theirs_ms = results.get(f"{peer}_update_ms")
        if ours_ms and theirs_ms:
            results[f"speedup_vs_{peer}"] = theirs_ms / ours_ms
    if "speedup_vs_tunix" in results:
        slots = results["rlagent_token_slots"]
        results["rlagent_tokens_per_sec_during_tunix"] = slots / (
            1e-3 * results["rlagent_update_ms_during_tunix"]
        )


def _settings() -> dict:
    policy = dataclasses.asdict(_policy_config())
    return dict(
        prompts=_PROMPTS.value, group_size=_GROUP.value, prompt_len=_PROMPT_LEN.value,
        new_tokens=_NEW_TOKENS.value, warmup=_WARMUP.value, repeats=_REPEATS.value,
        learning_rate=_LR.value, trl_gradient_checkpointing=_TRL_CHECKPOINTING.value,
        policy=policy, cpu=platform.processor() or platform.machine(),
        cpu_count=os.cpu_count(), jax_devices=[str(d) for d in jax.devices()],
    )  # fmt: skip


def _versions() -> dict:
    import importlib.metadata

    names = ("jax", "flax", "optax", "torch", "transformers", "trl", "accelerate", "datasets",
             "google-tunix")  # fmt: skip
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _commit() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"
    return commit + ("-dirty" if dirty else "")


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
