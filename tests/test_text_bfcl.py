"""BFCL multi-turn as a text environment (`rlagent.text.bfcl`): the ground truth replayed
through the environment passes the package's own checker for every task, wrong calls
fail it, malformed text is a step with its own signal, episodes are deterministic and
forks continue alike, and the text loop plays a task with a tiny random model.

Skipped without `bfcl_eval` (pip install --no-deps 'bfcl-eval==2026.3.23').
"""

import copy
import json
import time

import jax
import numpy as np
import pytest
from text_helpers import assert_loss_mask_on_assistant_tokens
from text_helpers import tiny_text_policy
from text_helpers import tiny_tokenizer

from rlagent.text import TextConfig
from rlagent.text import bfcl
from rlagent.text import make_chat
from rlagent.text import make_text_loop
from rlagent.text.bfcl import bfcl_task_ids
from rlagent.text.bfcl import make_bfcl_text
from rlagent.text.bfcl import package_check
from rlagent.text.bfcl import split_of
from rlagent.text.toolcalls import tool_call_text
from rlagent.train.ppo import episode_metrics

CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
              "multi_turn_long_context")  # fmt: skip
DONE = "I have done what you asked."
# The task with the fewest tools (TradingBot only): ~9.3k tokens of the tiny tokenizer.
LOOP_TASK = "multi_turn_base_100"
LOOP_CONFIG = TextConfig(max_new_tokens=8, obs_len=9600, max_prompt_len=10240)


def _calls_text(calls) -> str:
    return "\n".join(tool_call_text(call.name, call.arguments) for call in calls)


def _replay(env, per_step: int | None = None):
    """Plays the ground truth: each user turn's calls (all in one step, or `per_step` a
    step), then a reply without a call. Returns the signals of every step."""
    env.reset(0)
    played = []
    for turn in range(len(env.task.questions)):
        calls = env.ground_truth_calls(turn)
        size = per_step or max(len(calls), 1)
        for start in range(0, len(calls), size):
            played.append(env.step(_calls_text(calls[start : start + size])))
        played.append(env.step(DONE))
    return played


@pytest.mark.parametrize("category", CATEGORIES)
def test_the_ground_truth_replayed_passes_the_packages_checker(category):
    started, ids = time.perf_counter(), bfcl_task_ids(category, "all")
    assert len(ids) == 200
    for task_id in ids:
        env = make_bfcl_text(task_id)
        played = _replay(env)
        signals = [s for _, s, _ in played]
        assert [d for _, _, d in played] == [False] * (len(played) - 1) + [True], task_id
        assert signals[-1]["outcome"] == signals[-1]["success"] == 1.0, task_id
        assert package_check(env) == {"valid": True}, task_id
        checked = [bool(calls) for calls in env.task.ground_truth]
        assert env.state.verdicts == [1.0 if c else 0.0 for c in checked], task_id
        assert len(played) == env.plan_steps  # the shortest plan: no efficiency penalty.
        assert all(s["efficiency"] == 0 and s["malformed"] == 0 for s in signals)
        calls = sum(s["calls"] for s in signals)
        assert calls == sum(len(c) for c in env.task.ground_truth)
    assert time.perf_counter() - started < 120


def test_one_call_a_step_passes_too_and_costs_efficiency():
    for task_id in bfcl_task_ids("multi_turn_base", "all")[:50]:
        env = make_bfcl_text(task_id)
        played = _replay(env, per_step=1)
        assert played[-1][1]["outcome"] == 1.0 and package_check(env)["valid"], task_id
        over = len(played) - env.plan_steps
        assert -sum(s["efficiency"] for _, s, _ in played) == over


def test_a_wrong_call_or_a_skipped_turn_fails_the_check():
    env = make_bfcl_text("multi_turn_base_0")  # turn 0: cd, mkdir temp, mv into temp.
    env.reset(0)
    calls = env.ground_truth_calls(0)
    assert [c.name for c in calls] == ["cd", "mkdir", "mv"]
    wrong = [calls[0], calls[1]._replace(arguments={"dir_name": "tmp"}), calls[2]]
    env.step(_calls_text(wrong))
    reply, signals, done = env.step(DONE)
    assert signals["verdict"] == -1.0 and not done and reply[0]["role"] == "user"
    for turn in range(1, len(env.task.questions)):
        env.step(_calls_text(env.ground_truth_calls(turn)))
        _, signals, done = env.step(DONE)
    assert done and signals["outcome"] == 0.0 and signals["success"] == 0.0
    result = package_check(env)
    assert not result["valid"] and result["error_type"] == "multi_turn:instance_state_mismatch"
    env.reset(0)  # a turn closed without a call: BFCL's empty-turn failure.
    _, signals, _ = env.step(DONE)
    assert signals["verdict"] == -1.0 and signals["calls"] == 0.0


@pytest.mark.parametrize(
    "text,error",
    [
        ('<tool_call>{"name": "cd", "arguments": {"folder": "document"}}', "unbalanced"),
        ('<tool_call>{"name": "cd", "arguments": {"folder": </tool_call>', "not valid JSON"),
        ('{"name": "cd", "arguments": {"folder": "document"}', "not valid JSON"),
        ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "unknown tool"),
        ('<tool_call>{"name": "cd", "arguments": ["document"]}</tool_call>', "JSON object"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "not valid JSON"),
    ],
)
def test_malformed_text_is_a_step_with_the_malformed_signal(text, error):
    env = make_bfcl_text("multi_turn_base_0")
    env.reset(0)
    before = copy.deepcopy(env.state.model)
    reply, signals, done = env.step(text)
    assert signals["malformed"] == 1.0 and signals["calls"] == 0.0 and not done
    (message,) = reply
    assert message["role"] == "tool"
    assert json.loads(message["content"])["error"].startswith("malformed turn: ")
    assert error in message["content"]
    assert bfcl.state_checker(env.state.model, before)["valid"]  # nothing ran.
    # The user turn goes on, and the task can still be solved.
    env.step(_calls_text(env.ground_truth_calls(0)))
    _, signals, _ = env.step(DONE)
    assert signals["verdict"] == 1.0


def test_a_bad_argument_is_an_executed_call_with_an_error_result():
    env = make_bfcl_text("multi_turn_base_0")
    env.reset(0)
    reply, signals, _ = env.step(tool_call_text("cd", {"directory": "document"}))
    assert signals["malformed"] == 0.0 and signals["calls"] == signals["call_errors"] == 1.0
    assert reply[0]["content"].startswith("Error during execution: ")


def test_same_task_same_episode_and_a_fork_continues_alike():
    first, second = make_bfcl_text("multi_turn_base_7"), make_bfcl_text("multi_turn_base_7")
    assert first.reset(0) == second.reset(5)  # BFCL tasks are deterministic.
    script = []
    for turn in range(len(first.task.questions)):
        script += [_calls_text(first.ground_truth_calls(turn)), DONE]
    script.insert(1, '{"name": "cd"')  # a malformed step inside turn 0.
    for text in script[:3]:
        assert first.step(text) == second.step(text)
    forked, wrong = copy.deepcopy(first), copy.deepcopy(first)
    assert forked.task is first.task and forked.state.model is not first.state.model
    wrong.step(tool_call_text("cd", {"folder": ".."}))  # moves only its own instances.
    original = [first.step(text) for text in script[3:]]
    assert [forked.step(text) for text in script[3:]] == original
    assert original[-1][1]["outcome"] == 1.0 and original[-1][2]
    assert bfcl.state_checker(forked.state.model, first.state.model)["valid"]
    assert package_check(forked) == package_check(first) == {"valid": True}


def test_the_split_is_deterministic_by_task_number():
    ids = bfcl_task_ids("multi_turn_base", "all")
    train, heldout = bfcl_task_ids("multi_turn_base"), bfcl_task_ids("multi_turn_base", "heldout")
    assert set(train) | set(heldout) == set(ids) and not set(train) & set(heldout)
    assert 0.1 < len(heldout) / len(ids) < 0.3
    assert heldout == tuple(i for i in ids if split_of(i) == "heldout")
    for task_id in heldout:  # a scenario's variants share its split.
        assert split_of(task_id.replace("base", "miss_param")) == "heldout"


def test_refusals_name_the_fault(monkeypatch):
    with pytest.raises(ValueError, match="unknown BFCL multi-turn category 'multi_turn_x'"):
        make_bfcl_text("multi_turn_x_1")
    with pytest.raises(ValueError, match="no task 'multi_turn_base_999'"):
        make_bfcl_text("multi_turn_base_999")
    with pytest.raises(ValueError, match="unknown split"):
        bfcl_task_ids("multi_turn_base", "test")
    env = make_bfcl_text("multi_turn_base_100")
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(DONE)
    _replay(env)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(DONE)
    monkeypatch.setattr(bfcl, "_IMPORT_ERROR", ImportError("No module named 'bfcl_eval'"))
    bfcl.load_tasks.cache_clear()
    with pytest.raises(ImportError, match="pip install --no-deps 'bfcl-eval"):
        make_bfcl_text("multi_turn_base_1")
    monkeypatch.undo()
    bfcl.load_tasks.cache_clear()


def test_the_step_limit_ends_the_episode_failed():
    env = make_bfcl_text("multi_turn_base_100", max_steps=2)
    env.reset(0)
    call = tool_call_text("get_stock_info", {"symbol": "NVDA"})
    assert not env.step(call)[2] and not env.step(call)[2]
    _, signals, done = env.step(call)
    assert done and signals["verdict"] == -1.0 and signals["outcome"] == 0.0
    assert not package_check(env)["valid"]


def test_the_text_loop_plays_a_task_with_a_tiny_random_model():
    env = make_bfcl_text(LOOP_TASK, max_turns=2)
    chat = make_chat(tiny_tokenizer(), tools=env.tools)
    policy_config, graphdef, params = tiny_text_policy(chat)
    loop = make_text_loop(chat, graphdef, policy_config, LOOP_CONFIG)
    episodes = [loop.start(env, 0)]
    loop.play(params, episodes, jax.random.split(jax.random.key(0), 1))
    traj = loop.trajectory(episodes)
    assert set(traj.signals) == set(env.signal_names) and traj.turn_mask.shape == (1, 2)
    assert np.asarray(traj.turn_mask).all()
    # A random model writes no call: each step ends a user turn unchecked by any call
    # (verdict -1), or, text that starts like a call, is malformed.
    verdict, malformed = np.asarray(traj.signals["verdict"]), np.asarray(traj.signals["malformed"])
    np.testing.assert_array_equal(np.where(malformed == 1, 0, -1), verdict)
    assert not np.asarray(traj.signals["outcome"]).any()
    assert_loss_mask_on_assistant_tokens(traj, episodes)
    metrics = episode_metrics(env, traj)
    assert float(metrics["outcome"]) == 0.0 and float(metrics["calls"]) == 0.0
