"""Rejection sampling -> SFT (rlagent.pipeline.rejection, warm_start.make_sft) and its study."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import rs_sft as rs_sft_config
from experiments.studies import rs_sft
from rlagent import losses
from rlagent.credit import mc
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import level_config
from rlagent.pipeline.rejection import RejectionConfig
from rlagent.pipeline.rejection import accept
from rlagent.pipeline.rejection import best_of_n
from rlagent.pipeline.warm_start import WarmStartConfig
from rlagent.pipeline.warm_start import make_sft
from rlagent.rollout import RolloutConfig
from rlagent.train.config import TrainConfig
from rlagent.train.ppo import make_train


def _accept_reference(scores, threshold, keep):
    out = np.zeros_like(scores, dtype=np.float32)
    for t, row in enumerate(scores):
        if keep == "all":
            out[t] = row >= threshold
        else:
            best = int(np.argmax(row))  # first of the highest
            out[t, best] = float(row[best] >= threshold)
    return out


def test_accept_hand_cases_and_numpy_reference():
    scores = jnp.asarray([[0.0, 1.0, 1.0], [0.0, 0.0, 0.0], [2.0, -1.0, 0.5]])
    np.testing.assert_array_equal(accept(scores, 1.0, "best"), [[0, 1, 0], [0, 0, 0], [1, 0, 0]])
    np.testing.assert_array_equal(accept(scores, 1.0, "all"), [[0, 1, 1], [0, 0, 0], [1, 0, 0]])
    np.testing.assert_array_equal(accept(scores, 0.0, "best"), [[0, 1, 0], [1, 0, 0], [1, 0, 0]])
    rng = np.random.default_rng(0)
    for _ in range(20):
        random = rng.integers(-2, 3, size=(5, 4)).astype(np.float32)  # ties on purpose
        threshold = float(rng.integers(-2, 3))
        for keep in ("best", "all"):
            np.testing.assert_array_equal(
                accept(jnp.asarray(random), threshold, keep),
                _accept_reference(random, threshold, keep),
            )
    with pytest.raises(ValueError, match="keep"):
        accept(scores, 0.0, "top")


@pytest.mark.parametrize(
    "field, value, message",
    [("samples", 0, "samples"), ("tasks", 1.5, "tasks"), ("keep", "top", "keep"),
     ("judge", "vibes", "judge")],
)  # fmt: skip
def test_rejection_config_names_the_bad_field(field, value, message):
    with pytest.raises(ValueError, match=f"RejectionConfig.{message}"):
        RejectionConfig(**{field: value})


def test_weighted_likelihood_equals_slicing_the_accepted_episodes():
    env = ToolWorld(level_config(1))
    sample = jax.jit(lambda key: mc.sample_env_episodes(env, mc.oracle(env), key, 4))
    traj = mc.env_trajectory(env, sample(jax.random.key(0)))
    logp = -jax.random.uniform(jax.random.key(1), traj.action_tokens.shape)
    weights = jnp.asarray([1.0, 0.0, 1.0, 0.0])
    weighted = losses.weighted_log_likelihood(logp, traj.loss_mask, weights)
    kept = jax.tree.map(lambda x: x[::2], traj)
    sliced = losses.weighted_log_likelihood(logp[::2], kept.loss_mask, jnp.ones(2))
    np.testing.assert_allclose(weighted, sliced, rtol=1e-6)
    mask = np.asarray(traj.loss_mask) * np.asarray(weights)[:, None, None]
    by_hand = np.sum(np.asarray(logp) * mask) / mask.sum()  # the formula in NumPy
    np.testing.assert_allclose(weighted, by_hand, rtol=1e-6)
    none = losses.weighted_log_likelihood(logp, traj.loss_mask, jnp.zeros(4))
    assert float(none) == 0.0


def test_best_of_n_sft_accepts_by_threshold_in_one_program(tiny_policy_config):
    env = ToolWorld(level_config(1))
    rollout_config = RolloutConfig(window=1, constrained=True)
    trainer = make_train(TrainConfig(), env, tiny_policy_config(), rollout_config)
    params = trainer.init(jax.random.key(0)).params
    tasks, n = 3, 4
    source = best_of_n(
        env, trainer.graphdef, rollout_config, TrainConfig(),
        RejectionConfig(samples=n, tasks=tasks, judge="outcome", keep="all"),
    )  # fmt: skip
    sft = make_sft(WarmStartConfig(steps=2), [env], [source], trainer.graphdef, rollout_config)
    sft = jax.jit(sft)
    key = jax.random.key(1)
    everything = sft(params, key, -1e9)[1]
    nothing = sft(params, key, 1e9)[1]
    solved = sft(params, key, 1.0)[1]
    assert sft._cache_size() == 1  # the threshold is data
    np.testing.assert_array_equal(everything.accepted, [tasks * n] * 2)
    np.testing.assert_array_equal(everything.episodes, [tasks * n] * 2)
    np.testing.assert_array_equal(nothing.accepted, [0, 0])
    np.testing.assert_array_equal(nothing.loss, [0.0, 0.0])
    assert np.all(np.asarray(everything.loss) > 0)
    # Same key, same first batch: the cost is every sampled episode's turns, accepted or not.
    assert float(everything.env_turns[0]) == float(nothing.env_turns[0]) >= tasks * n
    # The first step's outcome-accepted episodes are the solved ones of that batch.
    first = jax.jit(source)(params, jax.random.split(key, 2)[0], jnp.asarray(1.0))
    assert float(solved.accepted[0]) == float(jnp.sum(first.trajectory.episode_success))


def test_study_config_errors_name_the_field():
    config = rs_sft_config.get_config()
    config.update(dict(samples="2,8", thresholds="outcome@1,process@0.5"))
    labels = [c[0] for c in rs_sft.conditions(config)]
    assert labels == ["scratch", "oracle", "rs_n2_outcome1", "rs_n2_process0.5",
                      "rs_n8_outcome1", "rs_n8_process0.5"]  # fmt: skip
    config.thresholds = "vibes@1"
    with pytest.raises(ValueError, match="config.thresholds"):
        rs_sft.conditions(config)
    config.thresholds = "outcome@1,outcome@1.0"  # one condition spelt twice
    with pytest.raises(ValueError, match=r"config.thresholds names .*'outcome@1'.* more than"):
        rs_sft.conditions(config)
    config = rs_sft_config.get_config()
    with pytest.raises(ValueError, match="config.envs"):
        rs_sft.family_config(config, "level2")
    config.samples = "0"
    with pytest.raises(ValueError, match="config.samples"):
        rs_sft.conditions(config)
    config = rs_sft_config.get_config()
    config.base_steps = 3
    assert [c[0] for c in rs_sft.conditions(config)][:2] == ["base", "oracle"]
    config.base_steps = -1
    with pytest.raises(ValueError, match="config.base_steps"):
        rs_sft.conditions(config)


def test_family_keeps_or_refuses_the_env_fields_the_user_set():
    config = rs_sft_config.get_config()
    base = rs_sft.family_config(config, "h10").env
    assert (base.level, base.num_intents, base.num_distractors, base.max_turns) == (4, 3, 0, 12)
    config.env.task_split, config.env.max_turns = "train", 14  # kept: the plan is still 10.
    kept = rs_sft.family_config(config, "h10").env
    assert (kept.task_split, kept.max_turns, kept.num_intents) == ("train", 14, 3)
    assert rs_sft.family_config(config, "l3").env.task_split == "train"
    config.env.num_intents = 2  # two exchanges: a 7-turn plan, not 10.
    with pytest.raises(ValueError, match=r"config.envs: 'h10'.*shortest_plan=10"):
        rs_sft.family_config(config, "h10")
    config = rs_sft_config.get_config()
    config.env.level = 3
    assert rs_sft.family_config(config, "l3").env.level == 3
    with pytest.raises(ValueError, match=r"config.envs: 'l2': config.env.level=3 is set"):
        rs_sft.family_config(config, "l2")
    with pytest.raises(ValueError, match=r"config.stages: 'l2': config.env.level=3"):
        rs_sft.family_config(config, "l2", "stages")


@pytest.mark.slow
def test_study_runs_end_to_end(tmp_path):
    config = rs_sft_config.get_config()
    config.update(dict(envs="l1", samples="2", thresholds="outcome@1", seeds=2, base_steps=1))
    config.sft.steps, config.train.num_updates, config.eval.every = 2, 2, 2
    config.eval.episodes, config.chunk_size = 8, 2
    config.train.update(dict(num_groups=2, group_size=4, num_minibatches=1))
    summary = rs_sft.run(config, str(tmp_path), progress=False)
    entry = summary["families"]["l1"]
    assert set(entry["summary"]["conditions"]) == {"l1/base", "l1/oracle", "l1/rs_n2_outcome1"}
    heads = entry["heads"]
    # Every condition starts from the one base policy (one oracle step of 16 episodes);
    # its turns are part of every condition's SFT cost.
    base = heads["l1/base"]["base_turns"]
    assert base == heads["l1/base"]["sft_turns"] == heads["l1/oracle"]["base_turns"]
    assert min(base) > 0
    for label in ("l1/oracle", "l1/rs_n2_outcome1"):
        assert all(s > b for s, b in zip(heads[label]["sft_turns"], base, strict=True))
    for name in ("summary.md", "summary.json", "sweep.png", "curves_l1.png", "provenance.json"):
        assert (tmp_path / name).exists()
    assert "Paired over seeds" in (tmp_path / "summary.md").read_text()
    # --report_only rebuilds the same report from the files and leaves provenance alone.
    provenance = (tmp_path / "provenance.json").read_text()
    (tmp_path / "summary.md").unlink()
    again = rs_sft.run(config, str(tmp_path), report_only=True)
    assert again["families"]["l1"]["heads"] == json.loads(json.dumps(entry["heads"]))
    assert (tmp_path / "summary.md").exists()
    assert (tmp_path / "provenance.json").read_text() == provenance
    with pytest.raises(ValueError, match="holds no finished study"):
        rs_sft.run(config, str(tmp_path / "empty"), report_only=True)


def test_paired_table_is_every_condition_against_the_start_and_rs_against_oracle():
    seeds = [0, 1, 2]
    names = ["l2/base", "l2/oracle", "l2/rs_n4_outcome1"]
    final = {"l2/base": [0.1, 0.2, 0.3], "l2/oracle": [0.5, 0.6, 0.7],
             "l2/rs_n4_outcome1": [0.2, 0.1, 0.5]}  # fmt: skip
    summary = {"conditions": {
        n: {"seeds": seeds, "per_seed": {"eval_sampled_success": final[n], "auc": final[n]}}
        for n in names
    }}  # fmt: skip
    heads = {n: {"eval_sampled_success": [v + 1 for v in final[n]]} for n in names}
    family = rs_sft.paired_table(summary, heads, reps=500)
    assert set(family) == {"head_sampled_success", "eval_sampled_success", "auc"}
    pairs = [(e["a"], e["b"]) for e in family["eval_sampled_success"]]
    assert pairs == [("l2/base", "l2/oracle"), ("l2/base", "l2/rs_n4_outcome1"),
                     ("l2/oracle", "l2/rs_n4_outcome1")]  # fmt: skip
    rs_vs_oracle = family["head_sampled_success"][2]["difference"]["value"]
    assert rs_vs_oracle == pytest.approx(np.mean(np.subtract(final[names[2]], final[names[1]])))
    # Exact sign flip over 3 pairs that all favour the oracle: p = 2 / 8.
    assert family["auc"][0]["p_value"] == pytest.approx(0.25)
