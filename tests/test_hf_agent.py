"""The HF-agent launcher (experiments.hf_agent, rlagent.text.train): GRPO / PPO of a tiny
random Qwen2-shaped checkpoint written to a temporary folder with a tiny local tokenizer
and chat template, on ToolWorld in text mode and on one BFCL task."""

import csv
import dataclasses
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from model_helpers import write_checkpoint
from text_helpers import assert_loss_mask_on_assistant_tokens
from text_helpers import family_tokenizer
from text_helpers import tiny_tokenizer
from transformers import AutoTokenizer

from experiments.configs.hf_agent import get_config
from experiments.studies import hf_agent
from rlagent.host.workdir import RunError
from rlagent.models import PolicyConfig
from rlagent.text import train as text_train
from rlagent.text.chat import QWEN3_PREFIX_STABLE
from rlagent.text.loop import TextLoop
from rlagent.text.toolworld import _SYSTEM
from rlagent.text.toolworld import make_toolworld_text
from rlagent.train.evaluation import EvalConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Qwen2.5-shaped (q/k/v biases, tied embeddings), 768 embedding rows for the tokenizer's
# tokens (704: every merge its corpus has; a padded vocabulary, as real checkpoints have).
QWEN = PolicyConfig(vocab_size=768, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1,
                    mlp_dim=64, qkv_bias=True, tie_embeddings=True, norm_eps=1e-6)  # fmt: skip
TIMINGS = ("sample_s", "update_s", "time_s")
BFCL_TASK = "multi_turn_base_100"  # the fewest tools of the category.


# Qwen3-shaped (q/k norms, no biases, tied embeddings): the official Qwen3 template's family.
QWEN3 = dataclasses.replace(QWEN, qkv_bias=False, qk_norm=True)


def _model_folder(folder, tools, texts, vocab_size=768, config=QWEN, family=None):
    """A checkpoint folder: random tensors, and a tokenizer whose merges know the prompts
    (`family`: the official template and special tokens of 'qwen3', ...; None: ChatML)."""
    corpus = [json.dumps(tool) for tool in tools] * 3 + list(texts) * 3
    if family is None:
        tokenizer = tiny_tokenizer(vocab_size=vocab_size, corpus=corpus)
    else:
        tokenizer = family_tokenizer(family, vocab_size=vocab_size, corpus=corpus)
    tokenizer.save_pretrained(folder)
    write_checkpoint(folder, config, **({"model_type": family} if family else {}))
    return folder


@pytest.fixture(scope="module")
def toolworld_model(tmp_path_factory):
    env = make_toolworld_text(level=1)
    texts = [_SYSTEM, "Yes No " * 8]  # the LM judge's answers: one token each.
    return _model_folder(tmp_path_factory.mktemp("qwen_toolworld"), env.tools, texts)


def _config(algorithm="grpo", **train):
    """Two updates of one group of two episodes, two turns of at most 6 tokens."""
    config = get_config()
    config.algorithm = algorithm
    config.env.toolworld_text.max_turns = 2
    config.train.update(
        {**dict(num_updates=2, num_groups=1, group_size=2, learning_rate=1e-2), **train}
    )
    config.sampling.update(max_new_tokens=6, obs_len=1100, max_prompt_len=1240)
    config.eval.update(every=0)  # evaluation has its own tests.
    return config


def _run(config, workdir, model_dir, env="toolworld_text", **kwargs):
    return hf_agent.run(
        config, str(workdir), model_dir=str(model_dir), env=env, progress=False, **kwargs
    )


def _rows(workdir):
    with open(os.path.join(workdir, "metrics.csv"), newline="") as f:
        return list(csv.DictReader(f))


def _params(workdir, step):
    """The policy parameters of checkpoint `step` (a plain tree of arrays)."""
    with ocp.CheckpointManager(os.path.join(workdir, "checkpoints")) as manager:
        restored = manager.restore(step, args=ocp.args.StandardRestore())
    return restored["params"] if isinstance(restored, dict) else restored[0]


def _leaves(tree):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def assert_rows_close(rows, expected, *, rel, abs):
    """Metric rows (CSV strings) as `expected`: text equal, numbers to `rel` / `abs`."""
    assert len(rows) == len(expected)
    for got, want in zip(rows, expected, strict=True):
        assert got.keys() == want.keys()
        for key, value in want.items():
            try:
                number = float(value)
            except ValueError:
                assert got[key] == value, key
                continue
            assert float(got[key]) == pytest.approx(number, rel=rel, abs=abs, nan_ok=True), key


def _assert_run_folder(workdir, algorithm):
    rows = _rows(workdir)
    assert [int(row["update"]) for row in rows] == [1, 2]
    for name in ("success", "return", "malformed_rate", "tokens_generated", "kl_ref", *TIMINGS):
        assert all(np.isfinite(float(row[name])) for row in rows), name
    assert {row["condition"] for row in rows} == {algorithm}
    record = json.loads((workdir / "provenance.json").read_text())
    assert record["config"]["algorithm"] == algorithm
    assert record["config"]["train"]["estimator"] == text_train.ALGORITHMS[algorithm]["estimator"]
    assert sorted(os.listdir(workdir / "checkpoints")) == ["0", "1", "2"]
    return rows


def test_the_launcher_trains_grpo_on_toolworld_text(toolworld_model, tmp_path):
    workdir = tmp_path / "run"
    overrides = [
        "--config.env.toolworld_text.max_turns=2", "--config.train.num_updates=2",
        "--config.train.num_groups=1", "--config.train.group_size=2",
        "--config.sampling.max_new_tokens=6", "--config.sampling.obs_len=1100",
        "--config.sampling.max_prompt_len=1240", "--config.eval.episodes=2",
    ]  # fmt: skip
    command = [sys.executable, "-m", "experiments.hf_agent", f"--model_dir={toolworld_model}",
               "--env=toolworld_text", f"--workdir={workdir}", *overrides]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "update 2/2" in done.stdout
    rows = _assert_run_folder(workdir, "grpo")
    # The random model writes no call: every turn is malformed, the group's episodes score
    # alike, GRPO's advantages are 0 (up to rounding) and the parameters stay as loaded, up
    # to AdamW's step of the learning rate (1e-6) an update: under the default bfloat16
    # compute the update's forward pass rounds otherwise than the reference's, a KL
    # gradient at rounding level that the float32 master weights keep.
    assert all(float(row["malformed_rate"]) == 1.0 for row in rows)
    # The defaults evaluate on held-out tasks after the last update (every 25 otherwise).
    assert np.isnan(float(rows[0]["eval_sampled_success"]))
    assert float(rows[1]["eval_greedy_malformed_rate"]) == 1.0
    assert "eval success" in done.stdout
    for before, after in zip(
        _leaves(_params(workdir, 0)), _leaves(_params(workdir, 2)), strict=True
    ):
        np.testing.assert_allclose(after, before, rtol=0, atol=2 * 1.01e-6)
    # A rerun into the same folder is refused and changes nothing: hf_agent.run's refusal
    # in test_ppo_changes_the_parameters_and_resumes_exactly; the launchers' one line for
    # it (launch.run_study, shared) in tests/studies/test_study_generalization.py.


def test_episodes_past_max_prompt_len_end_truncated_and_the_run_goes_on(toolworld_model, tmp_path):
    """A max_prompt_len that holds the first prompt and one turn but not the reply: the
    episodes end truncated after their first turn, metrics.csv counts them, and the run
    (and a resume from checkpoint 1, which replays them) finishes."""
    config = _config()
    _, text_config, tasks = hf_agent.build(config, "toolworld_text")
    model = text_train.check_model(str(toolworld_model), tasks.tools)
    make_env, seed = tasks.pick(np.random.default_rng(0))
    first = TextLoop(model.chat, text_config, sample=None).start(make_env(), seed)
    config.sampling.update(max_prompt_len=len(first.tokens) + config.sampling.max_new_tokens)
    rows = _run(config, tmp_path / "full", toolworld_model)
    assert [float(row["truncated"]) for row in _rows(tmp_path / "full")] == [1.0, 1.0]
    assert all(row["turns"] == 1.0 for row in rows)  # max_turns is 2: cut, not ended.
    part = _less_the_last_checkpoint(tmp_path / "full", tmp_path / "part")
    _run(config, part, toolworld_model, resume=True)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMINGS} for r in rows]  # noqa: E731
    assert strip(_rows(part)) == strip(_rows(tmp_path / "full"))


def _less_the_last_checkpoint(full, part):
    """A copy of finished run `full` stopped after its last row, before its last checkpoint:
    a resume replays the last update (a num_updates grown on resume: test_ppo_...)."""
    shutil.copytree(full, part)
    checkpoints = os.path.join(part, "checkpoints")
    shutil.rmtree(os.path.join(checkpoints, str(max(map(int, os.listdir(checkpoints))))))
    return part


@pytest.fixture(scope="module")
def ppo_one_update(toolworld_model, tmp_path_factory):
    """A finished PPO run of one update (`_config("ppo", num_updates=1)`), read by the tests
    that take it, never changed: the resume test resumes a copy, export reads it."""
    run = tmp_path_factory.mktemp("ppo_one_update") / "run"
    _run(_config("ppo", num_updates=1), run, toolworld_model)
    return run


def test_ppo_changes_the_parameters_and_resumes_exactly(toolworld_model, ppo_one_update, tmp_path):
    full = tmp_path / "full"
    rows = _run(_config("ppo"), full, toolworld_model)
    _assert_run_folder(full, "ppo")
    assert float(rows[1]["kl_ref"]) > 0  # the policy moved away from the reference.
    changed = [
        not np.array_equal(a, b)
        for a, b in zip(_leaves(_params(full, 0)), _leaves(_params(full, 1)), strict=True)
    ]
    assert all(changed), changed
    # One update, then --resume to two (num_updates may grow at a constant learning rate).
    part = tmp_path / "part"
    shutil.copytree(ppo_one_update, part)
    stamp = (part / "metrics.csv").read_text()
    with pytest.raises(RunError, match="not empty"):  # a rerun is refused, changing nothing.
        _run(_config("ppo"), part, toolworld_model)
    assert (part / "metrics.csv").read_text() == stamp
    _run(_config("ppo"), part, toolworld_model, resume=True)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMINGS} for r in rows]  # noqa: E731
    assert strip(_rows(part)) == strip(_rows(full))
    with pytest.raises(RunError, match="different config: train.learning_rate"):
        _run(_config("ppo", learning_rate=1e-3), part, toolworld_model, resume=True)


def test_checkpoints_every_two_updates_resume_exactly(toolworld_model, tmp_path):
    """Checkpoints after updates 2 and 3 (every 2, and the last), written asynchronously;
    a run stopped after update 3's row but before its checkpoint resumes from step 2,
    replays update 3 and ends with the same rows and parameters."""
    config = _config("ppo", num_updates=3)
    config.checkpoint.update(every=2, keep=2, asynchronous=True)
    full = tmp_path / "full"
    _run(config, full, toolworld_model)
    assert sorted(os.listdir(full / "checkpoints")) == ["0", "2", "3"]
    part = _less_the_last_checkpoint(full, tmp_path / "part")
    config.checkpoint.update(asynchronous=False)  # changes no result: may change on resume.
    _run(config, part, toolworld_model, resume=True)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMINGS} for r in rows]  # noqa: E731
    assert strip(_rows(part)) == strip(_rows(full))
    for a, b in zip(_leaves(_params(part, 3)), _leaves(_params(full, 3)), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(_leaves(_params(full, 2)), _leaves(_params(full, 3)), strict=True)
    )  # update 3 moved the policy: the replay had something to reproduce.


def test_export_writes_a_folder_transformers_loads_with_our_logits(
    toolworld_model, ppo_one_update, tmp_path
):
    """`experiments.export_hf RUN@1`: config.json, safetensors, tokenizer and chat template
    of a run's policy after one PPO update; transformers' float32 logits equal ours."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers import AutoTokenizer

    from rlagent.text.export import _policy
    from rlagent.text.export import export_hf

    run = ppo_one_update
    out = tmp_path / "hf"
    command = [sys.executable, "-m", "experiments.export_hf", f"{run}@1", f"--out={out}"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(out))
    tokenizer = AutoTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": "guess"}, {"role": "assistant", "content": "5"}]
    source = AutoTokenizer.from_pretrained(toolworld_model)
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == source.apply_chat_template(messages, tokenize=False) and "<|im_end|>" in text
    ids = np.asarray([tokenizer(text)["input_ids"]])
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        theirs = hf(torch.from_numpy(ids)).logits.numpy()
    policy = json.loads((run / "provenance.json").read_text())["config"]["model"]["policy"]
    config = PolicyConfig(**{**policy, "dtype": "float32"})
    llama = _policy(str(run), 1, config)
    hidden, _ = llama(llama.embed(ids), np.ones(ids.shape, bool))
    ours = np.asarray(llama.logits(hidden))
    assert np.abs(ours - theirs).max() <= 1e-4, np.abs(ours - theirs).max()
    start = _policy(str(run), 0, config)  # the update moved the exported weights.
    assert not np.array_equal(
        np.asarray(start.norm.weight[...]), np.asarray(llama.norm.weight[...])
    )
    for spec, target, message in [
        (str(toolworld_model), tmp_path / "x", "is not a text run folder"),
        (f"{run}@7", tmp_path / "x", r"no checkpoint step 7 in .*; it holds \[0, 1\]"),
        (str(run), out, "exists and is not an empty folder"),
    ]:
        with pytest.raises(ValueError, match=message):
            export_hf(spec, str(target))
    assert not (tmp_path / "x").exists()


def test_ppo_reads_its_critic_from_another_checkpoint_with_the_same_tokenizer(
    toolworld_model, tmp_path
):
    """A smaller critic (d_model 16) beside the policy: its folder, shape and learning rate
    are in provenance; a critic whose tokenizer is not the policy's is refused."""
    small = tmp_path / "critic"
    small.mkdir()
    for name in os.listdir(toolworld_model):
        if name != "config.json" and not name.endswith(".safetensors"):
            shutil.copy(toolworld_model / name, small / name)
    write_checkpoint(small, dataclasses.replace(QWEN, d_model=16, num_heads=2, mlp_dim=32))
    config = _config("ppo", num_updates=1)
    config.critic.update(model_dir=str(small), learning_rate=1e-3, warmup_updates=1)
    rows = _run(config, tmp_path / "w", toolworld_model)
    assert rows[0]["value_loss"] > 0 and np.isfinite(rows[0]["explained_variance"])
    record = json.loads((tmp_path / "w" / "provenance.json").read_text())["config"]["critic"]
    assert record["folder"] == str(small) and record["policy"]["d_model"] == 16
    assert record["learning_rate"] == 1e-3 and record["warmup_updates"] == 1
    # The warm-up update trained the critic only: the policy is the checkpoint's.
    for before, after in zip(
        _leaves(_params(tmp_path / "w", 0)), _leaves(_params(tmp_path / "w", 1)), strict=True
    ):
        np.testing.assert_array_equal(after, before)
    foreign = _model_folder(tmp_path / "foreign", [], ["other words"], vocab_size=400)
    config.critic.update(model_dir=str(foreign))
    with pytest.raises(ValueError, match="its tokenizer is not the policy's"):
        _run(config, tmp_path / "w2", toolworld_model)
    assert not (tmp_path / "w2").exists()


def test_online_dpo_with_the_lm_judge_trains_and_resumes_exactly(toolworld_model, tmp_path):
    """RLAIF in text mode: the checkpoint judges its own transcripts (log-odds of Yes)."""
    full = tmp_path / "full"
    rows = _run(_config("online_dpo"), full, toolworld_model)
    _assert_run_folder(full, "online_dpo")
    record = json.loads((full / "provenance.json").read_text())
    assert record["config"]["preference"]["judge"] == "lm"
    np.testing.assert_allclose(rows[0]["dpo_loss"], np.log(2.0), atol=1e-5)  # policy = ref.
    assert rows[0]["pairs"] == 1.0 and rows[0]["judge_spread"] > 0  # one task, two episodes.
    assert float(rows[1]["kl_ref"]) != 0.0  # the second batch came from a moved policy.
    changed = [
        not np.array_equal(a, b)
        for a, b in zip(_leaves(_params(full, 0)), _leaves(_params(full, 1)), strict=True)
    ]
    assert any(changed)
    part = _less_the_last_checkpoint(full, tmp_path / "part")
    _run(_config("online_dpo"), part, toolworld_model, resume=True)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMINGS} for r in rows]  # noqa: E731
    assert strip(_rows(part)) == strip(_rows(full))


@pytest.fixture(scope="module")
def grpo_text_run(toolworld_model):
    """`(tasks, TextRun, initial parameters)` of `_config()` (GRPO) on the tiny checkpoint,
    built once for the tests that play batches or evaluate with it."""
    train_config, text_config, tasks = hf_agent.build(_config(), "toolworld_text")
    model = text_train.check_model(str(toolworld_model), tasks.tools)
    run, params = text_train.make_text_run(train_config, text_config, tasks, model)
    return tasks, run, params


def test_the_loss_mask_covers_only_the_assistant_tokens(toolworld_model, grpo_text_run, tmp_path):
    """The loss mask of a played batch is its assistant tokens, and a run's first update
    (a one-update run of the same config) plays that very batch."""
    _, run, params = grpo_text_run
    episodes, trajectory = text_train.play_batch(run, params, 0)
    assert_loss_mask_on_assistant_tokens(trajectory, episodes)
    assert len({tuple(e.tokens[: len(e.turns[0].obs)]) for e in episodes}) == 1  # one task.
    rows = _run(_config(num_updates=1), tmp_path / "w", toolworld_model)
    assert rows[0]["tokens_generated"] == float(np.sum(np.asarray(trajectory.loss_mask)))


def _one_step_changes(model_dir, **precision):
    """The fraction of the policy's weight entries that one AdamW step at learning rate
    1e-6 changes (PPO, one epoch of one minibatch: one step), with the dtypes of the
    reference and the critic beside it. The embedding rows of ids the sampler never emits
    (PAD, the padded vocabulary) get no gradient in any precision and are not counted."""
    config = _config("ppo", learning_rate=1e-6, num_epochs=1, num_minibatches=1)
    train_config, text_config, tasks = hf_agent.build(config, "toolworld_text")
    model = text_train.check_model(str(model_dir), tasks.tools, **precision)
    run, params = text_train.make_text_run(train_config, text_config, tasks, model)
    rows = model.chat.sampling_mask(model.checkpoint.config.vocab_size)

    def entries(tree):  # path -> the counted entries, a float64 copy.
        out = {}
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
            name, leaf = jax.tree_util.keystr(path), np.asarray(leaf, np.float64)
            out[name] = leaf[rows] if "embed_tokens" in name else leaf
        return out

    before = entries(params)
    state = run.program.init(params, run.critic)
    _, trajectory = text_train.play_batch(run, state.params, 0)
    ref_logp = run.program.reference(run.reference, trajectory)
    # The reference, stored in the compute dtype, scores as the master weights do.
    policy_logp = run.program.reference(state.params, trajectory)
    np.testing.assert_array_equal(np.asarray(ref_logp), np.asarray(policy_logp))
    state, _ = run.program.update(state, trajectory, ref_logp)
    after = entries(state.params)
    changed = sum(int(np.sum(after[name] != before[name])) for name in before)
    dtypes = {
        role: {str(leaf.dtype) for leaf in jax.tree.leaves(tree)}
        for role, tree in [("params", state.params), ("opt_state", state.opt_state),
                           ("reference", run.reference), ("critic", state.critic)]
    }  # fmt: skip
    dtypes["opt_state"] -= {"int32"}  # AdamW's step count.
    return changed / sum(leaf.size for leaf in before.values()), dtypes


def test_mixed_precision_keeps_small_steps_that_bfloat16_weights_lose(toolworld_model):
    """The default precision (float32 master weights and AdamW moments, bfloat16 compute):
    one step at learning rate 1e-6 moves nearly every weight; with bfloat16 parameters
    (asked for by param_dtype) the same step is below most weights' bfloat16 spacing."""
    mixed, dtypes = _one_step_changes(toolworld_model)
    assert mixed >= 0.99, mixed
    assert dtypes == dict(params={"float32"}, opt_state={"float32"}, reference={"bfloat16"},
                          critic={"float32"})  # fmt: skip
    narrow, dtypes = _one_step_changes(toolworld_model, param_dtype="bfloat16")
    assert narrow < 0.5, narrow
    assert set().union(*dtypes.values()) == {"bfloat16"}
    with pytest.raises(ValueError, match="config.model.param_dtype='bfloat16' needs"):
        text_train.check_model(str(toolworld_model), (), dtype="float32", param_dtype="bfloat16")
    print(f"weights changed by one step: {mixed:.4f} mixed, {narrow:.4f} bfloat16 parameters")


def test_heldout_evaluation_plays_fixed_heldout_tasks_sampled_and_greedy(
    toolworld_model, grpo_text_run, tmp_path
):
    """Held-out evaluation plays the same held-out worlds each time, sampled and greedy,
    and a run with `eval.every=1` logs both after every update."""
    config = _config()
    config.eval.update(every=1, episodes=2, tasks="heldout")
    tasks, run, params = grpo_text_run  # the evaluation settings do not enter the run.
    evaluation = EvalConfig(every=1, episodes=2, tasks="heldout")
    eval_tasks = text_train.eval_task_list(tasks, evaluation)
    assert [make_env.args[0].task_split for make_env, _ in eval_tasks] == ["heldout"] * 2
    assert eval_tasks[0][1] != eval_tasks[1][1]  # two worlds ...
    again = text_train.eval_task_list(tasks, evaluation)
    assert [seed for _, seed in again] == [seed for _, seed in eval_tasks]  # ... always those.
    first, second = (text_train.evaluate_text(run, params, eval_tasks) for _ in range(2))
    first.pop("eval_s"), second.pop("eval_s")
    assert first == second and first["eval_sampled_entropy"] > 0
    # The held-out worlds are drawn from the held-out cells only.
    episode = run.loop.start(eval_tasks[0][0](), eval_tasks[0][1])
    assert episode.env.config.task_split == "heldout"
    rows = _run(config, tmp_path / "w", toolworld_model)
    for row in rows:  # evaluated after every update, both modes.
        assert all(np.isfinite(row[f"eval_{m}_success"]) for m in ("sampled", "greedy"))
        assert row["eval_sampled_malformed_rate"] == 1.0  # a random model writes no call.


def test_bfcl_tasks_are_every_task_of_their_categories_over_several_tool_sets():
    from rlagent.text import bfcl

    tasks = text_train.bfcl_tasks("multi_turn_base,multi_turn_miss_func", max_turns=4)
    train = set(tasks.config["tasks"])
    assert train == {
        *bfcl.bfcl_task_ids("multi_turn_base", "train"),
        *bfcl.bfcl_task_ids("multi_turn_miss_func", "train"),
    }
    heldout = tasks.heldout()
    assert heldout.config["split"] == "heldout" and not train & set(heldout.config["tasks"])
    assert len(heldout.config["tasks"]) > 5  # the held-out split of every tool set.
    rng = np.random.default_rng(0)
    drawn = [make_env() for make_env, _ in (tasks.pick(rng) for _ in range(8))]
    assert len({json.dumps(env.tools) for env in drawn}) > 1  # several tool sets in a run.
    with pytest.raises(ValueError, match="config.env.bfcl.split='train'"):
        heldout.heldout()
    with pytest.raises(ValueError, match="config.env.bfcl.task='multi_turn_base_0' is not in"):
        text_train.bfcl_tasks(split="heldout", task="multi_turn_base_0")


def test_grpo_on_one_bfcl_task(tmp_path_factory, tmp_path):
    from rlagent.text import bfcl

    env = bfcl.make_bfcl_text(BFCL_TASK, max_turns=1)
    texts = [m["content"] for m in env.reset(0)]
    big = dataclasses.replace(QWEN, vocab_size=1024)
    folder = _model_folder(tmp_path_factory.mktemp("qwen_bfcl"), env.tools, texts, 1000, big)
    config = _config()
    config.env.bfcl.update(task=BFCL_TASK, max_turns=1)
    config.sampling.update(obs_len=2816, max_prompt_len=2880)
    rows = _run(config, tmp_path / "bfcl", folder, env="bfcl")
    _assert_run_folder(tmp_path / "bfcl", "grpo")
    assert all(row["tokens_generated"] > 0 for row in rows)
    record = json.loads((tmp_path / "bfcl" / "provenance.json").read_text())
    assert (
        record["config"]["env"]["task"] == BFCL_TASK
        and BFCL_TASK in record["config"]["env"]["tasks"]
    )


def _launch(folder, env, workdir, overrides):
    """`python -m experiments.hf_agent` (two updates of one group of two episodes, turns of
    at most 6 tokens, no evaluation); the finished process."""
    common = ["--config.train.num_updates=2", "--config.train.num_groups=1",
              "--config.train.group_size=2", "--config.sampling.max_new_tokens=6",
              "--config.eval.every=0"]  # fmt: skip
    command = [sys.executable, "-m", "experiments.hf_agent", f"--model_dir={folder}",
               f"--env={env}", f"--workdir={workdir}", *common, *overrides]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_hf_agent_trains_a_qwen3_checkpoint_with_the_official_template_on_toolworld(
    tmp_path_factory, tmp_path
):
    """A Qwen3-shaped checkpoint whose tokenizer carries the official Qwen3 template: the
    shipped prefix-stable one is used in its place, two updates (in this process: the
    launcher's flags and exit status are the grpo and bfcl launcher tests')."""
    env = make_toolworld_text(level=1)
    folder = _model_folder(
        tmp_path_factory.mktemp("qwen3"), env.tools, [_SYSTEM], config=QWEN3, family="qwen3"
    )
    assert "last_query_index" in AutoTokenizer.from_pretrained(folder).chat_template
    config = _config()
    config.sampling.update(obs_len=1500, max_prompt_len=1600)
    _run(config, tmp_path / "run", folder)
    _assert_run_folder(tmp_path / "run", "grpo")
    record = json.loads((tmp_path / "run" / "provenance.json").read_text())["config"]["model"]
    assert record["chat_template"] == QWEN3_PREFIX_STABLE and record["policy"]["qk_norm"]


def test_the_launcher_trains_a_qwen3_checkpoint_on_every_bfcl_task(tmp_path_factory, tmp_path):
    """Two updates drawing from the whole training split (each episode renders its own
    task's tools) with the official Qwen3 template, exit status 0: the leaderboard's
    accuracy and the truncated share are columns."""
    config = _config()
    config.env.bfcl.update(max_turns=1)
    _, _, tasks = hf_agent.build(config, "bfcl")
    rngs = [np.random.default_rng(0), *(np.random.default_rng([0, u]) for u in range(2))]
    envs = [tasks.pick(rng)[0]() for rng in rngs]  # the tasks the run draws.
    texts = [m["content"] for env in envs for m in env.reset(0)]
    tools = [tool for env in envs for tool in env.tools]
    big = dataclasses.replace(QWEN3, vocab_size=2048)
    folder = _model_folder(tmp_path_factory.mktemp("qwen3_bfcl"), tools, texts, 2000, big, "qwen3")
    workdir = tmp_path / "bfcl"
    done = _launch(folder, "bfcl", workdir, [
        "--config.env.bfcl.max_turns=1", "--config.sampling.obs_len=5300",
        "--config.sampling.max_prompt_len=5400"])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _assert_run_folder(workdir, "grpo")
    assert all(float(row["bfcl_accuracy"]) == 0.0 for row in rows)  # a random model fails.
    assert all(0.0 <= float(row["truncated"]) <= 1.0 for row in rows)
    record = json.loads((workdir / "provenance.json").read_text())["config"]
    assert record["model"]["chat_template"] == QWEN3_PREFIX_STABLE
    assert record["env"]["tasks"] == list(tasks.config["tasks"])
    assert len(record["env"]["tasks"]) > 100


def _no_template(folder):
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    for name in ("chat_template.jinja", "chat_template.json"):
        if (folder / name).exists():
            (folder / name).unlink()


def _no_tokenizer(folder):
    for name in os.listdir(folder):
        if name.startswith(("tokenizer", "chat_template", "special_tokens")):
            os.remove(folder / name)


BROKEN_MODELS = {
    "no config.json": (lambda f: (f / "config.json").unlink(), "no config.json"),
    "no safetensors": (lambda f: (f / "model.safetensors").unlink(), "neither"),
    "no tokenizer": (_no_tokenizer, "no tokenizer transformers can load"),
    "no chat template": (_no_template, "has no chat template"),
    "vocab mismatch": (lambda f: write_checkpoint(f, dataclasses.replace(QWEN, vocab_size=256)),
                       "vocab_size=256 is smaller than the tokenizer's 704 tokens"),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(BROKEN_MODELS))
def test_a_bad_model_folder_is_refused_before_anything_is_written(toolworld_model, tmp_path, kind):
    damage, message = BROKEN_MODELS[kind]
    folder = tmp_path / "model"
    shutil.copytree(toolworld_model, folder)
    damage(folder)
    with pytest.raises(ValueError, match=message):
        _run(_config(), tmp_path / "w", folder)
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda f: (f / "config.json").unlink(), "no config.json"),
        (lambda f: write_checkpoint(f, QWEN, architectures=None, model_type="gpt2"),
         "config.json: unsupported architecture 'gpt2'"),
    ],
    ids=["no config.json", "gpt2"],
)  # fmt: skip
def test_the_model_config_is_checked_before_the_tokenizer(toolworld_model, tmp_path, edit, message):
    """A folder whose config.json is missing or names an architecture the trunk lacks is
    refused for that, not for its tokenizer's template (GPT-2's ends no assistant turn
    with an end-of-turn token), in one line, before anything is written."""
    from transformers import AutoTokenizer

    folder = tmp_path / "model"
    shutil.copytree(toolworld_model, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = "{% for message in messages %}{{ message.content }}{% endfor %}"
    tokenizer.save_pretrained(folder)
    with pytest.raises(ValueError, match="does not end assistant turns"):
        _run(_config(), tmp_path / "w", folder)  # the template is at fault here.
    edit(folder)
    with pytest.raises(ValueError, match=message) as refused:
        _run(_config(), tmp_path / "w", folder)
    assert len(str(refused.value).splitlines()) == 1
    assert not (tmp_path / "w").exists()


BAD_CONFIGS = {
    "algorithm": (lambda c: setattr(c, "algorithm", "a2c"), "config.algorithm must be one of"),
    "num_groups": (lambda c: c.train.update(num_groups=0), "TrainConfig.num_groups must be >= 1"),
    "estimator": (lambda c: c.train.update(bootstrap_truncated=True, estimator="gae_turn"),
                  "bootstrap_truncated"),
    "critic": (lambda c: c.critic.update(warmup_updates=2), "config.critic is set"),
    "critic_dir": (lambda c: (setattr(c, "algorithm", "ppo"), c.critic.update(model_dir="/no")),
                   "config.critic.model_dir='/no' is not a folder"),
    "critic_lr": (lambda c: (setattr(c, "algorithm", "ppo"), c.critic.update(learning_rate=0.0)),
                  "CriticConfig.learning_rate must be > 0"),
    "dpo_critic": (lambda c: (setattr(c, "algorithm", "online_dpo"),
                              c.train.update(estimator="gae_turn")), "online DPO trains no critic"),
    "tree": (lambda c: c.train.update(estimator="tree_grpo"), "trains on tree rollouts"),
    "sampling": (lambda c: c.sampling.update(max_new_tokens=0), "TextConfig.max_new_tokens"),
    "window": (lambda c: c.sampling.update(history_window=2, engine="reprefill"),
               "TextConfig.history_window=2 needs engine='cached'"),
    "dtype": (lambda c: c.model.update(dtype="int8"), "config.model.dtype"),
    "param_dtype": (lambda c: c.model.update(param_dtype="float16"), "config.model.param_dtype"),
    "reward": (lambda c: c.train.update(reward="dialogue"), "config.train.reward"),
    "every": (lambda c: c.checkpoint.update(every=0), "CheckpointConfig.every must be an integer"),
    "keep": (lambda c: c.checkpoint.update(keep=0), "CheckpointConfig.keep must be an integer"),
    "guardrail": (lambda c: c.env.toolworld_text.update(guardrail="mask"), "guardrail='mask'"),
    "prompt": (lambda c: c.sampling.update(obs_len=64), "more than TextConfig.obs_len=64"),
    "heldout": (lambda c: (c.env.toolworld_text.update(task_split="all"), c.eval.update(every=1)),
                "config.env.toolworld_text.task_split='train'"),
    "eval": (lambda c: c.eval.update(every=1, tasks="other"), "EvalConfig.tasks must be one of"),
    "judge": (lambda c: (setattr(c, "algorithm", "online_dpo"), c.preference.update(judge="gpt")),
              "Unknown judge 'gpt'"),
    "accuracy": (lambda c: (setattr(c, "algorithm", "online_dpo"),
                            c.preference.update(accuracy=2.0)), "config.preference.accuracy"),
    "dpo": (lambda c: (setattr(c, "algorithm", "online_dpo"), c.preference.update(kind="kto")),
            "DPOConfig.kind must be one of"),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(BAD_CONFIGS))
def test_bad_config_values_are_refused_naming_the_field(toolworld_model, tmp_path, kind):
    edit, message = BAD_CONFIGS[kind]
    config = _config()
    edit(config)
    with pytest.raises(ValueError, match=message):
        _run(config, tmp_path / "w", toolworld_model)
    assert not (tmp_path / "w").exists()


def test_missing_model_dir_unknown_env_and_bad_flags_exit_with_one_line(tmp_path):
    for flag, message in (
        ("--model_dir=" + str(tmp_path / "absent"), "is not a folder"),
        ("--env=atari", "--env must be one of"),
        ("--config.train.num_groups=2.5", "flag --config.train.num_groups=2.5: invalid literal"),
    ):
        command = [sys.executable, "-m", "experiments.hf_agent", f"--workdir={tmp_path / 'w'}",
                   f"--model_dir={tmp_path}", flag]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert done.returncode == 1, done.stderr[-2000:]
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and message in last, last
        assert not (tmp_path / "w").exists()


MESH_SCRIPT = """
import json, os, sys
flags = os.environ.get("XLA_FLAGS", "")  # the suite's (tests/conftest.py), and 8 devices:
os.environ["XLA_FLAGS"] = flags + " --xla_force_host_platform_device_count=8"
sys.path[:0] = [{root!r}, {tests!r}]
import jax
from test_hf_agent import _config, _less_the_last_checkpoint, _run
from experiments.studies import hf_agent
from rlagent.host.workdir import RunError
from rlagent.text import train as text_train
model, out = sys.argv[1], sys.argv[2]
result = {{}}

def config(devices, num_updates=2, group_size=4):  # PPO (a critic): GRPO's advantages
    config = _config("ppo", num_updates=num_updates, num_groups=2,  # are 0 here.
                     group_size=group_size, num_epochs=1, num_minibatches=1)
    config.mesh.update(devices=devices, data=2 if devices > 1 else 1)
    # float32 compute: the mesh and one device agree to float32 rounding; under bfloat16
    # compute each layout's reductions round otherwise (0.3% in grad_norm).
    config.model.dtype = "float32"
    return config

for name, devices in [("one", 0), ("mesh", 4)]:
    _run(config(devices), os.path.join(out, name), model)
# The mesh run stopped after update 2's row, before its checkpoint: resumed from step 1.
_less_the_last_checkpoint(os.path.join(out, "mesh"), os.path.join(out, "part"))
_run(config(4), os.path.join(out, "part"), model, resume=True)
for name, folder, cfg, kwargs in [("other_mesh", "part", config(0, 3), dict(resume=True)),
                                  ("indivisible", "indivisible", config(8, 2, 2), {{}})]:
    try:
        _run(cfg, os.path.join(out, folder), model, **kwargs)
    except (RunError, ValueError) as error:
        result[name] = str(error)
cfg = config(4)
train, text, tasks = hf_agent.build(cfg, "toolworld_text")
agent = text_train.check_model(model, tasks.tools)
run, params = text_train.make_text_run(train, text, tasks, agent, mesh=hf_agent.mesh(cfg))
result["cache"] = str(run.loop.cached.init(4).k.sharding.spec)
big = max(jax.tree.leaves(params), key=lambda leaf: leaf.size)
result["big"] = dict(spec=str(big.sharding.spec), devices=len(big.sharding.device_set),
                     shard=list(big.addressable_shards[0].data.shape), shape=list(big.shape))
print(json.dumps(result))
"""


def test_fsdp_mesh_trains_as_one_device_and_resumes_exactly(toolworld_model, tmp_path):
    """`--config.mesh.devices=4 --config.mesh.data=2` on 8 fake CPU devices, PPO with its
    critic: parameters in FSDP layout, the sampler's episodes over the data axis, the same
    rows as on one device (float rounding), an exact resume (of the mesh run's copy less
    its last checkpoint: a grown num_updates is the one-device PPO test's); a
    resume on another mesh and a batch that does not split over the devices are refused."""
    script = MESH_SCRIPT.format(root=ROOT, tests=os.path.join(ROOT, "tests"))
    command = [sys.executable, "-c", script, str(toolworld_model), str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    big = result["big"]  # the tied embedding [768, 32]: rows over the 2-way fsdp axis.
    assert big["shape"] == [768, 32] and big["spec"] == "P('fsdp', None)", big
    assert big["devices"] == 4 and big["shard"] == [384, 32]
    assert result["cache"] == "P('data',)", result  # sampled rows over data.
    one, mesh, part = (_rows(tmp_path / name) for name in ("one", "mesh", "part"))
    assert float(mesh[1]["kl_ref"]) > 1e-9  # the first update moved the policy.
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMINGS} for r in rows]  # noqa: E731
    assert strip(part) == strip(mesh)
    assert len(one) == len(mesh) == 2
    assert_rows_close(strip(mesh), strip(one), rel=1e-4, abs=1e-5)
    assert "different config: mesh" in result["other_mesh"], result
    assert "8 devices do not divide a minibatch of 4 episodes" in result["indivisible"], result


def test_mesh_config_is_checked_before_anything_runs(toolworld_model, tmp_path):
    for fields, message in [
        (dict(devices=len(jax.devices()) + 1), "config.mesh.devices must be -1, 0 or"),
        (dict(devices=1, data=2), "config.mesh.data = 2 must divide config.mesh.devices = 1"),
        (dict(rows=2), "Unknown mesh config fields \\['rows'\\]"),
    ]:
        config = _config()
        config.mesh.update(fields)
        with pytest.raises(ValueError, match=message):
            _run(config, tmp_path / "w", toolworld_model)
    config = _config("online_dpo")
    config.mesh.devices = 1
    with pytest.raises(ValueError, match="config.mesh: online DPO trains on one device"):
        _run(config, tmp_path / "w", toolworld_model)
    assert not (tmp_path / "w").exists()
