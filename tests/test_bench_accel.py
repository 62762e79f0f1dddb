"""experiments/bench_accel.py on CPU at its --tiny shapes: it runs, and its JSON holds
positive, finite timings and rates (MFU and peak memory null: no CPU peak is known)."""

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _positive(part: dict, *keys: str) -> None:
    for key in keys:
        value = part[key]
        assert isinstance(value, int | float) and math.isfinite(value) and value > 0, (key, value)


@pytest.mark.slow  # three updates' compiles: 20-65 s on the shared 2-core CPU.
def test_bench_accel_tiny_writes_its_measurements(tmp_path):
    """The main part, and the text part at both widths (`text_width`: later turns read 4
    template tokens, not 16): the packed rows give the update the all-slots rows give."""
    out = tmp_path / "bench_accel.json"
    command = [sys.executable, "-m", "experiments.bench_accel", "--tiny", "--repeats=2",
               "--parts=main,text_width", "--text_later_obs_len=4",
               f"--json_out={out}"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["tiny"] is True and results["backend"] == "cpu"
    assert results["peak_flops_per_device"] is None and "2 N" in results["flops_formula"]
    main, text, slots = results["main"], *(results["text_width"][w] for w in ("packed", "slots"))
    _positive(main, "update_s", "compile_s", "env_turns_per_sec", "generated_tokens_per_sec",
              "params_per_run", "token_slots", "train_pass_flops")  # fmt: skip
    assert main["runs"] == 1 and main["mfu_train_passes"] is None
    _positive(text, "params", "update_s", "reference_s", "tokens_per_sec", "update_flops",
              "reference_flops")  # fmt: skip
    _positive(text["compile_s"], "update", "reference")
    assert len(text["update_s_all"]) == 2
    assert min(text["update_s_all"]) <= text["update_s"] <= max(text["update_s_all"])
    assert text["tokens_per_sec"] == text["batch"]["tokens"] / text["update_s"]
    assert text["model"]["qkv_bias"] and text["model"]["tie_embeddings"]
    assert text["model"]["param_dtype"] == "bfloat16" and text["model"]["num_kv_heads"] == 2
    assert text["mfu"] is None and text["peak_memory_bytes"] is None
    assert 0 < text["batch"]["generated_tokens"] < text["batch"]["tokens"]
    for name in ("loss", "policy_loss", "kl_loss", "grad_norm", "ratio_mean"):
        assert math.isfinite(text["metrics"][name]), name
    assert text["metrics"]["nonfinite_loss"] == 0 and text["metrics"]["grad_norm"] > 0
    assert results["provenance"]["git"]["commit"] and results["provenance"]["config"]["tiny"]
    # 2 turns of 16 + 8 slots; the packed width 16 + 8 + 4 + 8 = 36 (P = 16 + 8 + 4).
    assert slots["batch"]["row_length"] == slots["batch"]["slots"] == text["batch"]["slots"] == 48
    assert text["batch"]["row_length"] == 36 and text["batch"]["later_obs_len"] == 4
    for name, value in text["metrics"].items():
        assert slots["metrics"][name] == pytest.approx(value, rel=1e-3, abs=1e-5), name
    ratio = results["text_width"]["slots_over_packed"]
    assert ratio == slots["update_s"] / text["update_s"] and math.isfinite(ratio)
