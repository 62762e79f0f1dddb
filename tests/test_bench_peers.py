"""The peers benchmark (experiments/bench_peers.py) and its single-turn environment."""

import importlib.util
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags

from rlagent.envs import check_environment
from rlagent.envs.base import StepType
from rlagent.envs.prompts import PromptConfig
from rlagent.envs.prompts import PromptEnv
from rlagent.envs.prompts import target_fraction

TINY = [
    "--prompts=2", "--group_size=2", "--prompt_len=3", "--new_tokens=4", "--warmup=1",
    "--repeats=1", "--d_model=16", "--num_layers=1",
]  # fmt: skip


def test_prompt_env_scores_one_turn_then_absorbs():
    env = PromptEnv(PromptConfig(vocab_size=8, prompt_len=3, turn_len=4, target=2))
    check_environment(env)
    state, first = env.reset(jax.random.key(0))
    prompt = np.asarray(first.observation.tokens)
    assert prompt.shape == (3,) and (prompt > 1).all() and (prompt < 8).all()
    state, last = env.step(state, jnp.array([2, 2, 5, 1]))
    assert float(last.signals.outcome) == 0.5 and bool(last.signals.success)
    assert int(last.step_type) == StepType.LAST and float(last.discount) == 0.0
    _, again = env.step(state, jnp.array([2, 2, 2, 2]))
    assert float(again.signals.outcome) == 0.0 and not bool(again.signals.success)
    assert float(target_fraction(jnp.array([[2, 0], [2, 2]]), 2)[1]) == 1.0
    with pytest.raises(ValueError, match="target"):
        PromptConfig(target=1)


def _run(tmp_path, sides):
    from experiments import bench_peers

    out = tmp_path / "peers.json"
    flags.FLAGS(["bench_peers", *TINY, f"--sides={sides}", f"--json_out={out}"])
    try:
        bench_peers.main([])
    finally:
        flags.FLAGS.unparse_flags()
    return json.loads(out.read_text())


@pytest.mark.slow
def test_bench_peers_writes_the_rlagent_keys_and_trl_when_installed(tmp_path):
    """One run (one compile): the rlagent side, and TRL's beside it when trl imports."""
    has_trl = importlib.util.find_spec("trl") is not None
    results = _run(tmp_path, "rlagent,trl" if has_trl else "rlagent")
    for key in ("rlagent_tokens_per_sec", "rlagent_update_ms", "rlagent_sampling_ms",
                "rlagent_update_rest_ms", "rlagent_compile_s", "load_avg_before",
                "versions", "differences", "settings"):  # fmt: skip
        assert key in results, key
    assert results["rlagent_token_slots"] == 2 * 2 * 4
    assert results["rlagent_tokens_per_sec"] > 0
    if has_trl:
        assert {"trl_tokens_per_sec", "speedup_vs_trl"} <= set(results)
        assert results["trl_token_slots"] == results["rlagent_token_slots"]
