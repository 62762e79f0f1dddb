"""The success-driven curriculum (rlagent.pipeline.curriculum) and its resume in the loop."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlagent.credit import mc
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import dsl
from rlagent.envs.toolworld import level_config
from rlagent.host import loop
from rlagent.host.writers import MetricWriter
from rlagent.models import PolicyConfig
from rlagent.pipeline import curriculum as cur
from rlagent.pipeline.curriculum import CurriculumConfig
from rlagent.pipeline.curriculum import Scheduler
from rlagent.pipeline.curriculum import StageMixture
from rlagent.rollout import RolloutConfig
from rlagent.train.config import TrainConfig

CONFIG = CurriculumConfig(every=2, smoothing=0.5, promote=0.7, demote=0.4, target=0.5,
                          width=0.25, floor=0.1, plateau_window=2, plateau_delta=0.05,
                          plateau_factor=0.5)  # fmt: skip


def _state(frontier, ema, seen=None, best=None, stale=None):
    ema = np.asarray(ema, np.float32)
    return cur.SchedulerState(
        frontier=np.asarray(frontier, np.int32),
        ema=ema,
        seen=np.ones(ema.shape, bool) if seen is None else np.asarray(seen, bool),
        best=np.zeros(ema.shape, np.float32) if best is None else np.asarray(best, np.float32),
        stale=np.zeros(ema.shape, np.int32) if stale is None else np.asarray(stale, np.int32),
    )


# Plain-Python reference of one run (lists of floats), written from the docstring.


def _ref_observe(c, run, episodes, solved):
    for k, n in enumerate(episodes):
        if n > 0:
            rate = solved[k] / n
            run["ema"][k] = (
                c.smoothing * run["ema"][k] + (1 - c.smoothing) * rate if run["seen"][k] else rate
            )
            run["seen"][k] = True


def _ref_decide(c, run):
    for k, p in enumerate(run["ema"]):
        if p > run["best"][k] + c.plateau_delta:
            run["best"][k], run["stale"][k] = p, 0
        elif run["seen"][k]:
            run["stale"][k] += 1
        else:
            run["stale"][k] = 0
    f = run["frontier"]
    if run["seen"][f] and run["ema"][f] >= c.promote and f < len(run["ema"]) - 1:
        run["frontier"] = f + 1
    elif f > 0 and run["seen"][f - 1] and run["ema"][f - 1] < c.demote:
        run["frontier"] = f - 1


def _ref_probs(c, run):
    unlocked = list(range(run["frontier"] + 1))
    weights = []
    for k in unlocked:
        p = run["ema"][k] if run["seen"][k] else c.target
        w = math.exp(-0.5 * ((p - c.target) / c.width) ** 2)
        weights.append(w * (c.plateau_factor if run["stale"][k] >= c.plateau_window else 1.0))
    out = [0.0] * len(run["ema"])
    for k, w in zip(unlocked, weights, strict=True):
        out[k] = (1 - c.floor) * w / sum(weights) + c.floor / len(unlocked)
    front = out[run["frontier"]]
    if front < c.frontier_share:  # the frontier's floor; the rest share what is left
        out = [p * (1 - c.frontier_share) / (1 - front) for p in out]
        out[run["frontier"]] = c.frontier_share
    return out


def test_observe_sets_then_smooths_and_skips_unplayed_stages():
    state = cur.init_state(1, 3)
    state = cur.observe(CONFIG, state, np.array([[4.0, 0.0, 2.0]]), np.array([[2.0, 0.0, 2.0]]))
    np.testing.assert_allclose(state.ema, [[0.5, 0.0, 1.0]])  # first batch sets the EMA
    np.testing.assert_array_equal(state.seen, [[True, False, True]])
    state = cur.observe(CONFIG, state, np.array([[4.0, 0.0, 0.0]]), np.array([[4.0, 0.0, 0.0]]))
    np.testing.assert_allclose(state.ema, [[0.75, 0.0, 1.0]])  # 0.5 * 0.5 + 0.5 * 1


def test_promotion_and_demotion_have_hysteresis():
    # promote at >= 0.7; stage below the frontier under 0.4 demotes; between: nothing.
    cases = [  # (frontier, ema, expected frontier)
        (0, [0.70, 0.0, 0.0], 1), (0, [0.69, 0.0, 0.0], 0), (1, [0.55, 0.1, 0.0], 1),
        (1, [0.39, 0.1, 0.0], 0), (2, [0.9, 0.9, 1.0], 2), (1, [0.3, 0.8, 0.0], 2),
    ]  # fmt: skip
    state = _state([c[0] for c in cases], [c[1] for c in cases])
    np.testing.assert_array_equal(cur.decide(CONFIG, state).frontier, [c[2] for c in cases])
    unseen = _state([0], [[0.9, 0.0, 0.0]], seen=[[False, False, False]])
    assert cur.decide(CONFIG, unseen).frontier[0] == 0  # no promotion on a stage never played


def test_sampling_favours_half_success_and_down_weights_plateaus():
    probs = cur.sampling_probs(CONFIG, _state([2, 0], [[1.0, 0.5, 0.0], [0.5, 0.5, 0.5]]))
    assert probs[0, 1] > probs[0, 0] and probs[0, 1] > probs[0, 2]  # 0.5 beats 1.0 and 0.0
    np.testing.assert_allclose(probs[1], [1.0, 0.0, 0.0])  # locked stages get nothing
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-6)
    assert probs[0].min() >= CONFIG.floor / 3 - 1e-7
    flat = _state([1], [[0.5, 0.5, 0.0]], stale=[[2, 0, 0]])  # stage 0 plateaued
    probs = cur.sampling_probs(CONFIG, flat)[0]
    np.testing.assert_allclose(probs[:2], [0.9 / 3 + 0.05, 0.9 * 2 / 3 + 0.05], rtol=1e-6)


@pytest.mark.parametrize("frontier_share", [0.0, 0.6])
def test_scheduler_matches_the_plain_python_reference(frontier_share):
    config = dataclasses.replace(CONFIG, frontier_share=frontier_share)
    rng = np.random.default_rng(0)
    runs, stages = 4, 3
    state = cur.init_state(runs, stages)
    frontiers = []
    ref = [dict(frontier=0, ema=[0.0] * stages, seen=[False] * stages, best=[0.0] * stages,
                stale=[0] * stages) for _ in range(runs)]  # fmt: skip
    for update in range(1, 41):
        episodes = rng.integers(0, 5, size=(runs, stages)).astype(np.float32)
        # Skill rises over updates (runs 0-2, at different speeds) or decays (run 3: the
        # policy forgets), lower on harder stages: promotions and a demotion happen.
        progress = np.array([1.5, 1.0, 0.5, -1.0])[:, None] * update / 40
        skill = np.clip(0.5 + progress - 0.2 * np.arange(stages), 0.0, 1.0)
        solved = rng.binomial(episodes.astype(int), skill).astype(np.float32)
        state = cur.observe(config, state, episodes, solved)
        for r in range(runs):
            _ref_observe(config, ref[r], episodes[r], solved[r])
        if update % config.every == 0:
            state = cur.decide(config, state)
            for r in range(runs):
                _ref_decide(config, ref[r])
        np.testing.assert_allclose(state.ema, [r["ema"] for r in ref], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(state.frontier, [r["frontier"] for r in ref])
        frontiers.append(state.frontier.copy())
        np.testing.assert_array_equal(state.stale, [r["stale"] for r in ref])
        np.testing.assert_allclose(
            cur.sampling_probs(config, state), [_ref_probs(config, r) for r in ref], rtol=1e-5
        )
        if frontier_share:
            front = cur.sampling_probs(config, state)[np.arange(runs), state.frontier]
            assert np.all(front >= frontier_share - 1e-6)
    frontiers = np.stack(frontiers)
    assert frontiers.max() == stages - 1  # promoted to the last stage
    assert np.any(np.diff(frontiers, axis=0) < 0)  # and demoted somewhere


def test_fixed_and_final_schedules():
    mixture = StageMixture([ToolWorld(level_config(level)) for level in (1, 2, 3, 4)])
    state = cur.init_state(2, 4)
    fixed = Scheduler(CurriculumConfig(kind="fixed"), mixture, num_updates=40)
    assert [int(np.argmax(fixed.probs(state, u)[0])) for u in (0, 9, 10, 25, 39)] == [0, 0, 1, 2, 3]
    final = Scheduler(CurriculumConfig(kind="final"), mixture, num_updates=40)
    np.testing.assert_array_equal(final.probs(state, 0), [[0, 0, 0, 1]] * 2)


@pytest.mark.parametrize(
    "field, value",
    [("kind", "random"), ("every", 0), ("demote", 0.9), ("smoothing", 1.0), ("width", 0.0),
     ("floor", -0.1), ("plateau_window", 1.5), ("frontier_share", 1.5)],
)  # fmt: skip
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"CurriculumConfig.{field}"):
        CurriculumConfig(**{field: value})


def test_mixture_plays_the_drawn_stage_and_draws_by_probs():
    stages = [ToolWorld(level_config(level)) for level in (1, 3)]
    mixture = StageMixture(stages, pad_progress=2)
    assert (mixture.max_turns, mixture.num_markers) == (stages[1].max_turns, 1)
    key = jax.random.PRNGKey(5)
    # The probabilities are data: one compiled sampler serves both stages.
    sample = jax.jit(lambda probs, k: _episodes(mixture.with_probs(probs), k))
    for k, stage in enumerate(stages):
        mixed, metrics = sample(jnp.eye(2)[k], key)
        plain, _ = jax.jit(_episodes, static_argnums=0)(stage, key)
        turns = stage.max_turns
        np.testing.assert_array_equal(mixed.actions[:, :turns], plain.actions)
        np.testing.assert_array_equal(mixed.signals.turn_mask[:, :turns], plain.signals.turn_mask)
        assert not np.any(mixed.signals.turn_mask[:, turns:])
        assert float(metrics[f"curriculum_episodes_{k}"]) == 4.0
        assert float(metrics[f"curriculum_solved_{k}"]) == 4.0  # the oracle solves them all
    assert sample._cache_size() == 1
    reset = jax.jit(jax.vmap(mixture.with_probs(jnp.asarray([0.25, 0.75])).reset))
    states, _ = reset(jax.random.split(key, 4000))
    assert abs(float(jnp.mean(states.stage)) - 0.75) < 0.03
    with pytest.raises(ValueError, match="turn_len"):
        StageMixture([stages[0], ToolWorld(level_config(1, turn_len=7))])


def _episodes(env, key):
    """4 oracle episodes of `env` and their `episode_metrics`."""
    episodes = mc.sample_env_episodes(env, mc.oracle(env), key, 4)
    traj = mc.env_trajectory(env, episodes)
    return episodes, env.episode_metrics(traj.signals, traj.turn_mask, traj.action_tokens)


# Resume: the scheduler's state is checkpointed with the runner states.

POLICY = PolicyConfig(vocab_size=dsl.VOCAB_SIZE, d_model=16, num_layers=1, num_heads=2,
                      num_kv_heads=1, mlp_dim=16, num_summary_slots=1, summary_dim=8)  # fmt: skip
TRAIN = TrainConfig(num_updates=4, num_groups=2, group_size=2, num_minibatches=1)
ROLLOUT = RolloutConfig(window=1, constrained=True)
MIXTURE = StageMixture([ToolWorld(level_config(1)), ToolWorld(level_config(2))], pad_progress=2)


class _Started(Scheduler):
    """Both stages unlocked with set EMAs, so that the probabilities of every decision
    depend on the EMAs the scheduler carries (a lost state would change them)."""

    def init(self, num_runs):
        return _state([1] * num_runs, [[0.9, 0.3]] * num_runs)


def _curriculum_run(workdir, **kwargs):
    scheduler = _Started(CurriculumConfig(every=1, smoothing=0.5), MIXTURE, TRAIN.num_updates)
    return loop.run(TRAIN, MIXTURE, POLICY, ROLLOUT, seeds=[0, 1], workdir=str(workdir),
                    chunk_size=1, progress=False, tensorboard=False, curriculum=scheduler,
                    **kwargs)  # fmt: skip


def test_resume_restores_the_scheduler_state_exactly(tmp_path):
    straight = _curriculum_run(tmp_path / "straight")
    _curriculum_run(tmp_path / "cut", stop_after=2)
    _curriculum_run(tmp_path / "cut", resume=True)
    resumed = MetricWriter(str(tmp_path / "cut")).read()
    drop = ("turns_per_sec",)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in drop} for r in rows]  # noqa: E731
    assert strip(resumed) == strip(MetricWriter(str(tmp_path / "straight")).read())
    probs = {(r["update"], r["seed"]): r["curriculum_p0"] for r in straight}
    assert len(set(probs.values())) > 2  # the probabilities moved with the EMAs
    emas = [r["curriculum_ema0"] for r in straight if r["seed"] == 0]
    assert emas[0] < 0.9 and emas == sorted(emas, reverse=True)  # state carried, not reset


@pytest.mark.slow
def test_schedule_names_set_scheduler_fields():
    from experiments.studies import curriculum as study

    assert study.schedule_config(CONFIG, "fixed") == dataclasses.replace(CONFIG, kind="fixed")
    got = study.schedule_config(CONFIG, "success/frontier_share=0.5/every=3")
    assert got == dataclasses.replace(CONFIG, frontier_share=0.5, every=3)
    for name, message in (
        ("anneal", "unknown 'anneal'"), ("success/speed=2", "'speed=2' .* not field=value"),
        ("success/kind=fixed", "not field=value"), ("success/every=2.5", "'2.5' is no int"),
        ("success/frontier_share=2", r"'success/frontier_share=2': CurriculumConfig.frontier"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=f"config.schedules: .*{message}"):
            study.schedule_config(CONFIG, name)


def test_study_runs_end_to_end(tmp_path):
    from experiments.configs import curriculum as curriculum_config
    from experiments.studies import curriculum as study

    config = curriculum_config.get_config()
    config.update(dict(stages="l1,l2", seeds=1))
    config.train.update(dict(num_updates=5, num_groups=2, group_size=2))
    config.curriculum.every, config.eval.every, config.eval.episodes = 5, 5, 8
    summary = study.run(config, str(tmp_path), progress=False)
    assert set(summary["stage_reached"]) == {"success", "fixed", "final"}
    assert summary["stage_reached"]["final"] == ["l2"]
    for name in ("summary.md", "summary.json", "curves.png", "stages.png", "provenance.json"):
        assert (tmp_path / name).exists()
    config.schedules = "success,anneal"
    with pytest.raises(ValueError, match="config.schedules"):
        study.run(config, str(tmp_path / "bad"), progress=False)
