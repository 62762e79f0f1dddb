"""experiments/bench_text_rollout.py at its smallest shapes: it runs both engines, they
give the same tokens, and its JSON holds the keys the docs read; Tunix's side."""

import json
import math
import os
import subprocess
import sys
import types

ROOT = os.path.dirname(os.path.abspath(os.path.dirname(__file__)))


def test_bench_text_rollout_smallest_shape_writes_its_keys(tmp_path):
    out = tmp_path / "bench_text_rollout.json"
    command = [sys.executable, "-m", "experiments.bench_text_rollout", "--episodes=2",
               "--turns=3", "--first_len=8", "--reply_min=2", "--reply_max=6",
               "--max_new_tokens=4", "--warmup_turns=1", "--repeats=2",
               "--staggered_groups=2", f"--json_out={out}"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["identical_tokens"] is True and results["max_abs_logp_diff"] <= 1e-5
    assert results["turn16_over_turn2"] is None and results["turn_last_over_turn2"] > 0
    assert math.isfinite(results["speedup_vs_reprefill"]) and results["speedup_vs_reprefill"] > 0
    assert "tunix" in results and results["provenance"]["config"]["turns"] == 3
    # Two groups of 2 episodes of 1 and 3 turns: compaction packs the two live episodes of
    # turns 2 and 3 into one group (4 group-turns instead of 6).
    staggered = results["staggered"]
    assert staggered["episode_turns"] == [1, 3, 1, 3] and staggered["identical_tokens"] is True
    assert staggered["max_abs_logp_diff"] <= 1e-6
    assert staggered["kept"]["group_turns"] == 6 and staggered["kept"]["moved_rows"] == 0
    assert staggered["compact"]["group_turns"] == 4 and staggered["compact"]["moved_rows"] == 2
    for engine in ("cached", "reprefill"):
        part = results["engines"][engine]
        assert part["tokens_per_s"] > 0 and part["generated_tokens"] > 0
        assert [turn["turn"] for turn in part["turns"]] == [1, 2, 3]
        for turn in part["turns"]:
            assert turn["prefill_s"] > 0 and turn["decode_s"] >= 0 and turn["host_s"] >= 0


def test_tunix_sampler_greedy_matches_rlagent_or_says_why_not():
    """With Tunix in its side folder: its Qwen2, loaded from the rlagent weights, decodes
    greedily the same ids as rlagent's sampler, and the turn-by-turn driver reads each
    turn's transcript and counts the generated tokens. Without it: the reason given."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from experiments import bench_text_rollout_tunix as tunix_side
    from rlagent.models.llama import Llama
    from rlagent.models.llama import PolicyConfig
    from rlagent.models.sampler import generate
    from rlagent.text.loop import TextConfig

    why = tunix_side.status(os.environ.get("TUNIX_PATH", "/tmp/tunix_pkg"))
    if why is not None:
        assert why.startswith("not run: google-tunix is not installed")
        return
    config = PolicyConfig(vocab_size=40, pad_id=0, d_model=16, num_layers=1, num_heads=2,
                          num_kv_heads=1, mlp_dim=32, qkv_bias=True)  # fmt: skip
    llama = Llama(config, rngs=nnx.Rngs(0))
    text = TextConfig(max_new_tokens=5, obs_len=8, max_prompt_len=12, temperature=0.0)
    prepared = tunix_side.make_sampler(llama, text, 2, pad_id=0, end_id=-1)
    prompts = [[3, 5, 7, 9, 11], [4, 6, 8, 10, 12, 14, 16, 18]]
    out = prepared["sampler"](
        [" ".join(f"t{i}" for i in p) for p in prompts], max_generation_steps=5,
        max_prompt_length=12, temperature=0.0, eos_tokens=[-1],
    )  # fmt: skip
    graphdef, params = nnx.split(llama)
    for prompt, tokens in zip(prompts, out.tokens, strict=True):
        ours = generate(
            graphdef, params, jnp.array([prompt], jnp.int32), jax.random.key(0),
            max_new_tokens=5, prompt_valid=jnp.ones((1, len(prompt)), bool), end_id=-1,
            pad_id=0, temperature=0.0,
        )  # fmt: skip
        assert np.asarray(tokens).tolist() == np.asarray(ours.tokens[0]).tolist()
    episode = types.SimpleNamespace(
        tokens=[3, 5, 7, 20, 21, 9, 11, 22], loss_mask=[0, 0, 0, 1, 1, 0, 0, 1], turns=[0, 0]
    )
    assert tunix_side.turn_prompts(episode) == [[3, 5, 7], [3, 5, 7, 20, 21, 9, 11]]
    assert tunix_side.play(prepared, [episode, episode], seed=0) == [[5, 5], [5, 5]]
