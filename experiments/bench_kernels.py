"""Benchmark: masked multi-turn token GAE against the usual implementations.

For every shape `[B, T]` the same agent-like batch (a prompt, then alternating policy
turns and observation spans; a reward at the end of each turn) is run through:

* `masked_gae`: `rlagent.gae` (bridges observation tokens), jitted.
* `plain_scan`: textbook unmasked GAE, one `lax.scan` over time (PureJaxRL style).
* `numpy_loop`: a NumPy reverse loop over time with the same bridging semantics.
* `torch_loop`: the PyTorch reverse loop of popular LLM RL frameworks (verl's masked
  `compute_gae_advantage_return`), when torch is importable.
* `rlax_vmap`: `rlax.truncated_generalized_advantage_estimation` vmapped over rows on
  the unmasked case, jitted, when rlax is importable.
* `memcpy`: `np.copyto` of as many bytes as the kernel reads (rewards, values, mask),
  the memory-bandwidth floor.

Whitening, on the same batch:

* `whiten`: `rlagent.whiten` of the values over the mask, jitted.
* `gae_whiten`: `rlagent.gae` then `rlagent.whiten` of its advantages, one jitted program.
* `tunix_whiten` / `tunix_gae_whiten`: Tunix's `masked_whiten` and
  `compute_gae_advantages` (GAE over the completion mask, then whitening), when
  `tunix.rl.algo_core` is importable; otherwise `n/a` and the reason in the JSON's
  `tunix`. Tunix leaves masked positions unwhitened and uses the Bessel-corrected
  variance, so its outputs differ from ours (slightly on the mask, wholly off it); the
  work is comparable.

Times are medians over repeated runs after warm-up. Run:
  python -m experiments.bench_kernels --json_out=/tmp/gae.json --markdown_out=/tmp/gae.md
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags
from jax import lax

import rlagent

_JSON_OUT = flags.DEFINE_string("json_out", None, "Where to write the JSON results.")
_MARKDOWN_OUT = flags.DEFINE_string("markdown_out", None, "Where to write a Markdown table.")
_REPEATS = flags.DEFINE_integer("repeats", 20, "Timed runs per compiled method.")
_LOOP_REPEATS = flags.DEFINE_integer("loop_repeats", 3, "Timed runs of the Python loops.")
_SHAPES = flags.DEFINE_list(
    "shapes", ["64x4096", "16x32768", "256x1024", "1024x64"], "Shapes BxT to run."
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the synthetic batch.")

GAMMA, LAM = 0.99, 0.95
HEADLINE = "64x4096"


def agent_batch(batch: int, length: int, seed: int) -> dict[str, np.ndarray]:
    """A prompt, then policy turns (mask True) alternating with observation spans."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((batch, length), bool)
    rewards = np.zeros((batch, length), np.float32)
    scale = max(1, length // 64)  # keep several turns per row at every length
    for b in range(batch):
        t = int(rng.integers(1, 4 * scale + 2))  # prompt
        while t < length:
            turn = int(rng.integers(scale, 4 * scale + 1))
            mask[b, t : t + turn] = True
            end = min(t + turn, length) - 1
            rewards[b, end] = rng.normal()
            t += turn + int(rng.integers(scale, 6 * scale + 1))  # tool output / user turn
    values = rng.normal(size=(batch, length)).astype(np.float32)
    return {"rewards": rewards, "values": values, "mask": mask}


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def plain_scan_gae(rewards: jax.Array, values: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Unmasked GAE, terminal at T: the usual single `lax.scan` over time."""
    next_values = jnp.concatenate([values[:, 1:], jnp.zeros_like(values[:, :1])], axis=1)
    deltas = rewards + GAMMA * next_values - values

    def step(carry, delta):
        carry = delta + GAMMA * LAM * carry
        return carry, carry

    _, advantages = lax.scan(step, jnp.zeros(rewards.shape[0]), deltas.T, reverse=True)
    return advantages.T, advantages.T + values


def numpy_loop_gae(rewards: np.ndarray, values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Reverse loop over time, vectorised over rows, bridging masked tokens."""
    batch, length = rewards.shape
    advantages = np.zeros_like(rewards)
    next_value = np.zeros(batch, np.float32)
    next_adv = np.zeros(batch, np.float32)
    pending = np.zeros(batch, np.float32)
    for t in reversed(range(length)):
        m = mask[:, t]
        pending = pending + rewards[:, t]
        adv = pending + GAMMA * next_value - values[:, t] + GAMMA * LAM * next_adv
        advantages[:, t] = np.where(m, adv, 0.0)
        next_value = np.where(m, values[:, t], next_value)
        next_adv = np.where(m, adv, next_adv)
        pending = np.where(m, 0.0, pending)
    return advantages


def torch_loop_gae(torch, rewards, values, mask):
    """verl's masked `compute_gae_advantage_return` reverse loop."""
    with torch.no_grad():
        next_values = torch.zeros_like(values[:, 0])
        last_gae = torch.zeros_like(values[:, 0])
        advantages_reversed = []
        for t in reversed(range(rewards.shape[-1])):
            delta = rewards[:, t] + GAMMA * next_values - values[:, t]
            last_gae_ = delta + GAMMA * LAM * last_gae
            next_values = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_values
            last_gae = last_gae_ * mask[:, t] + (1 - mask[:, t]) * last_gae
            advantages_reversed.append(last_gae)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        return advantages, advantages + values


def tunix_algo_core() -> tuple[object | None, str]:
    """Tunix's `algo_core` module and "ok", or None and why it does not import."""
    try:
        from tunix.rl import algo_core
    except Exception as error:  # a missing dependency of tunix fails in many ways
        return None, f"{type(error).__name__}: {error}"
    return algo_core, "ok"


def bench_whiten(rewards: jax.Array, values: jax.Array, mask: jax.Array) -> dict:
    """Masked whitening and GAE + whitening, beside Tunix's when it imports."""
    times: dict[str, float | None] = {}
    whiten = jax.jit(rlagent.whiten)

    def gae_whiten(r, v, m):
        advantages, returns = rlagent.gae(r, v, m, gamma=GAMMA, lam=LAM)
        return rlagent.whiten(advantages, m), returns

    fused = jax.jit(gae_whiten)
    times["whiten"] = median_seconds(
        lambda: jax.block_until_ready(whiten(values, mask)), _REPEATS.value
    )
    times["gae_whiten"] = median_seconds(
        lambda: jax.block_until_ready(fused(rewards, values, mask)), _REPEATS.value
    )
    algo_core, _ = tunix_algo_core()
    times["tunix_whiten"] = times["tunix_gae_whiten"] = None
    if algo_core is not None:
        float_mask = mask.astype(jnp.float32)  # Tunix's completion mask is 0/1 numbers
        times["tunix_whiten"] = median_seconds(
            lambda: jax.block_until_ready(algo_core.masked_whiten(values, float_mask)),
            _REPEATS.value,
        )
        times["tunix_gae_whiten"] = median_seconds(
            lambda: jax.block_until_ready(
                algo_core.compute_gae_advantages(rewards, values, float_mask, GAMMA, LAM)
            ),
            _REPEATS.value,
        )
    return times


def bench_shape(batch: int, length: int) -> dict[str, float | None]:
    data = agent_batch(batch, length, _SEED.value)
    # Device-resident and materialised before any timing, so no method pays the transfer.
    rewards, values, mask = jax.block_until_ready(
        tuple(jax.device_put(data[k]) for k in ("rewards", "values", "mask"))
    )
    times: dict[str, float | None] = {}

    masked = jax.jit(lambda r, v, m: rlagent.gae(r, v, m, gamma=GAMMA, lam=LAM))
    times["masked_gae"] = median_seconds(
        lambda: jax.block_until_ready(masked(rewards, values, mask)), _REPEATS.value
    )
    plain = jax.jit(plain_scan_gae)
    times["plain_scan"] = median_seconds(
        lambda: jax.block_until_ready(plain(rewards, values)), _REPEATS.value
    )
    times["numpy_loop"] = median_seconds(
        lambda: numpy_loop_gae(data["rewards"], data["values"], data["mask"]),
        _LOOP_REPEATS.value,
        warmup=1,
    )
    try:
        import torch

        torch.set_num_threads(1)  # per-step kernels on [B] vectors are overhead-bound
        t_args = [torch.from_numpy(data[k]) for k in ("rewards", "values")]
        t_mask = torch.from_numpy(data["mask"].astype(np.float32))
        times["torch_loop"] = median_seconds(
            lambda: torch_loop_gae(torch, *t_args, t_mask), _LOOP_REPEATS.value, warmup=1
        )
    except ImportError:
        times["torch_loop"] = None
    try:
        import rlax

        rlax_gae = jax.jit(
            jax.vmap(rlax.truncated_generalized_advantage_estimation, in_axes=(0, 0, None, 0))
        )
        discounts = jnp.full(rewards.shape, GAMMA)
        values_ext = jnp.concatenate([values, jnp.zeros_like(values[:, :1])], axis=1)
        times["rlax_vmap"] = median_seconds(
            lambda: jax.block_until_ready(rlax_gae(rewards, discounts, LAM, values_ext)),
            _REPEATS.value,
        )
    except ImportError:
        times["rlax_vmap"] = None
    nbytes = data["rewards"].nbytes + data["values"].nbytes + data["mask"].nbytes
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    times["memcpy"] = median_seconds(lambda: np.copyto(dst, src), 5 * _REPEATS.value)
    times.update(bench_whiten(rewards, values, mask))
    return times


def ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None else num / den


def main(argv: list[str]) -> None:
    del argv
    table = []
    for shape in _SHAPES.value:
        batch, length = (int(x) for x in shape.split("x"))
        times = bench_shape(batch, length)
        row = {
            "shape": shape,
            **{f"{k}_ms": (None if v is None else 1e3 * v) for k, v in times.items()},
        }
        row["gae_masked_vs_plain_scan"] = ratio(times["masked_gae"], times["plain_scan"])
        row["speedup_vs_numpy_loop"] = ratio(times["numpy_loop"], times["masked_gae"])
        row["speedup_vs_torch_loop"] = ratio(times["torch_loop"], times["masked_gae"])
        row["speedup_vs_rlax"] = ratio(times["rlax_vmap"], times["masked_gae"])
        row["ratio_to_memcpy"] = ratio(times["masked_gae"], times["memcpy"])
        row["gae_whiten_vs_tunix"] = ratio(times["gae_whiten"], times["tunix_gae_whiten"])
        table.append(row)
        print(json.dumps(row), flush=True)
    headline = next((r for r in table if r["shape"] == HEADLINE), table[0])
    keys = (
        "gae_masked_vs_plain_scan",
        "speedup_vs_torch_loop",
        "speedup_vs_rlax",
        "ratio_to_memcpy",
    )
    result = {
        "shape": headline["shape"],
        **{k: headline[k] for k in keys},
        "targets": {
            "gae_masked_vs_plain_scan": "<= 1.5",
            "speedup_vs_torch_loop": ">= 100",
            "speedup_vs_rlax": ">= 3",
            "ratio_to_memcpy": "<= 4",
        },
        "backend": jax.default_backend(),
        "tunix": tunix_algo_core()[1],
        "table": table,
    }
    if _JSON_OUT.value:
        with open(_JSON_OUT.value, "w") as f:
            json.dump(result, f, indent=2)
    markdown = to_markdown(table)
    if result["tunix"] != "ok":
        markdown += (
            f"\nTunix columns n/a: `tunix.rl.algo_core` does not import ({result['tunix']}).\n"
        )
    print(markdown)
    if _MARKDOWN_OUT.value:
        with open(_MARKDOWN_OUT.value, "w") as f:
            f.write(markdown)


def to_markdown(table: list[dict]) -> str:
    columns = [k for k in table[0] if k != "shape"]

    def fmt(x):
        return "n/a" if x is None else f"{x:.3g}"

    lines = ["| shape | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for row in table:
        lines.append(f"| {row['shape']} | " + " | ".join(fmt(row[c]) for c in columns) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    app.run(main)
