"""experiments/bench_text_rollout.py at its smallest shapes: it runs both engines, they
give the same tokens, and its JSON holds the keys the docs read."""

import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.abspath(os.path.dirname(__file__)))


def test_bench_text_rollout_smallest_shape_writes_its_keys(tmp_path):
    out = tmp_path / "bench_text_rollout.json"
    command = [sys.executable, "-m", "experiments.bench_text_rollout", "--episodes=2",
               "--turns=3", "--first_len=8", "--reply_min=2", "--reply_max=6",
               "--max_new_tokens=4", "--warmup_turns=1", "--repeats=2",
               f"--json_out={out}"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["identical_tokens"] is True and results["max_abs_logp_diff"] <= 1e-5
    assert results["turn16_over_turn2"] is None and results["turn_last_over_turn2"] > 0
    assert math.isfinite(results["speedup_vs_reprefill"]) and results["speedup_vs_reprefill"] > 0
    assert "tunix" in results and results["provenance"]["config"]["turns"] == 3
    for engine in ("cached", "reprefill"):
        part = results["engines"][engine]
        assert part["tokens_per_s"] > 0 and part["generated_tokens"] > 0
        assert [turn["turn"] for turn in part["turns"]] == [1, 2, 3]
        for turn in part["turns"]:
            assert turn["prefill_s"] > 0 and turn["decode_s"] >= 0 and turn["host_s"] >= 0
