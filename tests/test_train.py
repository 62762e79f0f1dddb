"""End-to-end PPO on ToolWorld: learning smoke test, resume, sharding, the main experiment.

Compiles dominate the cost, so every test here shares one tiny setup and the cached
trainer / chunk functions of `rlagent.host.loop`.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.envs.toolworld import dsl
from rlagent.host import loop
from rlagent.models import PolicyConfig
from rlagent.rollout import RolloutConfig
from rlagent.train import TrainConfig

# The smoke test's seeded budget was set under the first ('legacy') verdict; with the
# 'clean' default, seed 0 ends at about 0.5 success after 50 updates (0.93 with
# normalize_returns): a finding of the reward-scale study, not a trainer regression.
ENV = ToolWorld(ToolWorldConfig(level=1, verdict="legacy"))
POLICY = PolicyConfig(
    vocab_size=dsl.VOCAB_SIZE,
    d_model=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    mlp_dim=64,
    summary_dim=32,
    num_summary_slots=2,
    copy_prior=3.0,
)
ROLLOUT = RolloutConfig(window=1, constrained=True)
# The learning budget of the smoke test: 50 updates of 128 episodes (about 15,000 turns).
# Seed 0 learns; on some seeds (1 of the 3 tried) the legacy verdicts trap the policy in
# "close the task with any answer, then BYE" (return 0 beats the -1 of every failed call).
SMOKE = TrainConfig(num_updates=50, num_groups=16, group_size=8, reward="process",
                    learning_rate=1e-3)  # fmt: skip


def test_dense_process_reward_solves_level_1(tmp_path):
    """Seeded smoke run: >= 0.9 success on level 1 within 50 updates (~15k turns)."""
    rows = loop.run(SMOKE, ENV, POLICY, ROLLOUT, seeds=[0], workdir=str(tmp_path),
                    progress=False, tensorboard=False, checkpoint=False)  # fmt: skip
    success = [row["success"] for row in rows]
    assert np.mean(success[:3]) < 0.5  # it starts far from solved ...
    assert np.mean(success[-5:]) >= 0.9, success  # ... and learns.


def test_resume_continues_exactly(tmp_path):
    # normalize_returns: the running return statistics are checkpointed state too.
    config = TrainConfig(num_updates=2, num_groups=2, group_size=2, num_minibatches=1,
                         reward="process", normalize_returns=True)  # fmt: skip
    kwargs = dict(seeds=[0, 1], conditions=["process", "outcome"], chunk_size=1,
                  progress=False, tensorboard=False)  # fmt: skip
    straight = loop.run(config, ENV, POLICY, ROLLOUT, workdir=str(tmp_path / "a"), **kwargs)
    first = loop.run(config, ENV, POLICY, ROLLOUT, workdir=str(tmp_path / "b"), stop_after=1,
                     **kwargs)  # fmt: skip
    assert len(first) == 4 and {row["update"] for row in first} == {1}
    resumed = loop.run(config, ENV, POLICY, ROLLOUT, workdir=str(tmp_path / "b"), resume=True,
                       **kwargs)  # fmt: skip
    assert len(resumed) == len(straight) == 8

    def strip(rows):
        return [{k: v for k, v in row.items() if k != "turns_per_sec"} for row in rows]

    assert strip(resumed) == strip(straight)
    assert all(np.isfinite(row["return_std"]) for row in straight)
    on_disk = (tmp_path / "b" / "metrics.csv").read_text().splitlines()
    assert len(on_disk) == 1 + 8


SHARDED_SCRIPT = textwrap.dedent(
    """
    import os
    flags = os.environ.get("XLA_FLAGS", "")  # the suite's (tests/conftest.py), and 4 devices:
    os.environ["XLA_FLAGS"] = flags + " --xla_force_host_platform_device_count=4"
    import json, jax, numpy as np
    sys_path = {path!r}
    import sys; sys.path.insert(0, sys_path)
    from tests.test_train import ENV, POLICY, ROLLOUT
    from rlagent import parallel
    from rlagent.train import TrainConfig, make_train
    assert len(jax.devices()) == 4
    config = TrainConfig(num_updates=1, num_groups=2, group_size=4, num_minibatches=2)
    out = {{}}
    for name, mesh in (("one", None), ("four", parallel.data_mesh(4))):
        trainer = make_train(config, ENV, POLICY, ROLLOUT, mesh=mesh)
        state = trainer.init(jax.random.PRNGKey(3))
        state, metrics = jax.jit(trainer.update)(state)
        leaves = jax.tree.leaves(state.params)
        out[name] = {{
            "metrics": {{k: float(v) for k, v in metrics.items()}},
            "params": [float(np.sum(np.abs(np.asarray(x)))) for x in leaves],
        }}
    print(json.dumps(out))
    """
)


def test_sharded_update_matches_single_device():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = SHARDED_SCRIPT.format(path=root)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=600, cwd=root)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for key, value in out["one"]["metrics"].items():
        assert out["four"]["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    np.testing.assert_allclose(out["four"]["params"], out["one"]["params"], rtol=1e-5)


def test_copy_gate_scores_like_the_rollout_and_learns():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rlagent.models import Policy
    from rlagent.models import observed_tokens
    from rlagent.rollout import make_rollout
    from rlagent.rollout import make_score

    graphdef, params = nnx.split(Policy(POLICY, rngs=nnx.Rngs(0)))
    traj = jax.jit(make_rollout(ENV, graphdef, ROLLOUT))(
        params,
        jax.random.split(jax.random.PRNGKey(1), 4),
        jax.random.split(jax.random.PRNGKey(2), 4),
    )
    score = make_score(ENV, graphdef, ROLLOUT)
    logp, _, _ = jax.jit(score)(params, traj)
    played = np.asarray(traj.loss_mask)
    np.testing.assert_allclose(np.asarray(logp)[played], np.asarray(traj.logp)[played], atol=1e-5)
    # The gate is a parameter: the log-likelihood of the sampled tokens depends on it.
    grads = jax.jit(jax.grad(lambda p: jnp.sum(score(p, traj)[0])))(params)
    assert float(jnp.abs(grads["actor"]["copy_gate"][...])) > 0
    observed = observed_tokens(jnp.array([[5, 7, 0]]), POLICY.vocab_size)
    assert observed.shape == (1, POLICY.vocab_size)
    assert np.flatnonzero(np.asarray(observed[0])).tolist() == [5, 7]
