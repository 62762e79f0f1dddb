"""ToolWorld: interface, dynamics per intent, rules, verdicts, oracle, grammar mask."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlagent.envs.toolworld import RULE_NAMES
from rlagent.envs.toolworld import Command
from rlagent.envs.toolworld import Progress
from rlagent.envs.toolworld import Signals
from rlagent.envs.toolworld import StepType
from rlagent.envs.toolworld import TaskKind
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.envs.toolworld import dsl
from rlagent.envs.toolworld import guardrail
from rlagent.envs.toolworld import oracle_policy
from rlagent.envs.toolworld import unroll

BATCH = 64


@functools.cache
def _env(**kwargs) -> ToolWorld:
    return ToolWorld(ToolWorldConfig(**kwargs))


@functools.cache
def _jitted(env: ToolWorld):
    """reset / step / oracle / batched oracle unroll, compiled once per env."""
    reset = jax.jit(env.reset)
    step = jax.jit(env.step)
    oracle = jax.jit(functools.partial(oracle_policy, env))
    batch_oracle = jax.jit(
        jax.vmap(lambda key: unroll(env, lambda s, k: oracle_policy(env, s), key))
    )
    return reset, step, oracle, batch_oracle


def _play(env, reset_state, commands):
    """Steps plain-Python commands `(command, arg1, arg2)`; returns the timesteps."""
    _, step, _, _ = _jitted(env)
    state, out = reset_state, []
    for command in commands:
        action = jnp.asarray(dsl.encode(*command, turn_len=env.turn_len), jnp.int32)
        state, ts = step(state, action)
        out.append((state, ts))
    return out


def _find_task(env, kind, predicate=lambda s: True, max_keys=400):
    """Reset state whose first task has `kind` and satisfies `predicate(state)`."""
    reset = _jitted(env)[0]
    for seed in range(max_keys):
        state, _ = reset(jax.random.PRNGKey(seed))
        if int(state.task_kind[0]) == kind and predicate(state):
            return state
    raise AssertionError(f"no reset state with first task kind {kind}")


# Interface --------------------------------------------------------------------------


def test_interface_shapes_and_dtypes():
    env = _env(level=2)
    reset, step, oracle, _ = _jitted(env)
    state, ts = reset(jax.random.PRNGKey(0))
    assert dsl.VOCAB_SIZE <= 128 and dsl.PAD == 0
    assert ts.step_type == StepType.FIRST and ts.step_type.dtype == jnp.int8
    assert ts.observation.tokens.shape == (env.obs_len,)
    assert ts.observation.tokens.dtype == jnp.int32
    assert ts.observation.progress.shape == (env.num_markers,)
    state, ts = step(state, oracle(state))
    assert ts.reward.dtype == jnp.float32 and ts.discount.dtype == jnp.float32
    expected = {
        "outcome": (jnp.float32, ()),
        "success": (jnp.bool_, ()),
        "verdict": (jnp.float32, ()),
        "efficiency": (jnp.float32, ()),
        "violations": (jnp.int32, ()),
        "violation_flags": (jnp.bool_, (len(RULE_NAMES),)),
        "shortest_plan": (jnp.int32, ()),
        "accuracy": (jnp.float32, ()),
        "user_feedback": (jnp.float32, ()),
    }
    assert isinstance(ts.signals, Signals) and set(Signals._fields) == set(expected)
    for name, (dtype, shape) in expected.items():
        assert getattr(ts.signals, name).dtype == dtype, name
        assert getattr(ts.signals, name).shape == shape, name


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="level"):
        ToolWorldConfig(level=5)
    with pytest.raises(ValueError, match="turn_len"):
        ToolWorldConfig(turn_len=4)
    with pytest.raises(ValueError, match="guardrail"):
        ToolWorldConfig(guardrail="strict")
    with pytest.raises(ValueError, match="kinds"):
        ToolWorldConfig(kinds=("teleport",))
    with pytest.raises(ValueError, match="num_intents"):
        ToolWorldConfig(level=4, num_intents=9)
    # Non-integer counts and a non-finite penalty (accepted silently before).
    with pytest.raises(ValueError, match="num_intents: must be an integer"):
        ToolWorldConfig(num_intents=2.5)
    with pytest.raises(ValueError, match="max_turns: must be an integer"):
        ToolWorldConfig(max_turns=2.5)
    with pytest.raises(ValueError, match="num_orders: must be an integer"):
        ToolWorldConfig(num_orders=8.0)
    with pytest.raises(ValueError, match="level: must be an integer"):
        ToolWorldConfig(level=True)
    with pytest.raises(ValueError, match="penalty: must be finite"):
        ToolWorldConfig(penalty=float("nan"))
    with pytest.raises(ValueError, match="penalty: must be finite"):
        ToolWorldConfig(penalty=float("inf"))
    with pytest.raises(ValueError, match="penalty: must be a number"):
        ToolWorldConfig(penalty="1")
    assert ToolWorldConfig(num_intents=np.int64(1), penalty=2).num_intents == 1
    env = _env(level=1)
    with pytest.raises(AssertionError):
        env.step(env.reset(jax.random.PRNGKey(0))[0], jnp.zeros((env.turn_len + 1,), jnp.int32))


def test_verdict_presets_fill_the_values():
    assert ToolWorldConfig().verdict == "clean"
    clean = ToolWorldConfig()
    legacy = ToolWorldConfig(verdict="legacy", verdict_wrong_final=-3)
    assert (clean.verdict_bye_failed, clean.verdict_wrong_final) == (0.0, -2.0)
    assert clean.verdict_unneeded_lookup == 0.0
    assert (legacy.verdict_bye_failed, legacy.verdict_unneeded_lookup) == (1.0, 1.0)
    assert legacy.verdict_wrong_final == -3.0  # a value given overrides the preset.
    with pytest.raises(ValueError, match="verdict: must be one of"):
        ToolWorldConfig(verdict="strict")
    with pytest.raises(ValueError, match="verdict_bye_failed: must be finite"):
        ToolWorldConfig(verdict_bye_failed=float("nan"))
    with pytest.raises(ValueError, match="verdict_wrong_final: must be a number"):
        ToolWorldConfig(verdict_wrong_final="-2")


@pytest.mark.parametrize(
    "preset, wrong_final, bye_failed, lookup",
    [("clean", -2, 0, 0), ("legacy", -1, 1, 1), ("legacy_override", -3, -0.5, -1)],
)
def test_verdict_knobs(preset, wrong_final, bye_failed, lookup):
    """Each knob on a hand case: wrong final then BYE, BYE too early, the lookup detour."""
    if preset == "legacy_override":
        kwargs = dict(verdict_wrong_final=-3.0, verdict_bye_failed=-0.5)
        env = _env(level=1, verdict="legacy", verdict_unneeded_lookup=-1.0, **kwargs)
    else:
        env = _env(level=1, verdict=preset)
    state = _find_task(env, TaskKind.CHANGE_ADDRESS)
    order, new_address = int(state.task_order[0]), int(state.task_address[0])
    wrong = next(
        a
        for a in range(env.config.num_addresses)
        if a not in (new_address, int(state.address[order]))
    )
    steps = _play(env, state, [(Command.CHANGE_ADDRESS, order, wrong), (Command.BYE,)])
    assert [float(ts.signals.verdict) for _, ts in steps] == [wrong_final, bye_failed]
    [(_, ts)] = _play(env, state, [(Command.BYE,)])
    assert float(ts.signals.verdict) == wrong_final
    detour = [
        (Command.LOOKUP_ORDER, order),
        (Command.LOOKUP_ORDER, order),
        (Command.CHANGE_ADDRESS, order, new_address),
        (Command.BYE,),
    ]
    steps = _play(env, state, detour)
    assert [float(ts.signals.verdict) for _, ts in steps] == [lookup, 0, 1, 1]
    assert float(steps[-1][1].signals.outcome) == 1
    # A recoverable slip costs -1 in every preset: a lookup of another order.
    [(_, ts)] = _play(env, state, [(Command.LOOKUP_ORDER, (order + 1) % 8)])
    assert float(ts.signals.verdict) == -1


def test_config_is_hashable_and_fills_level_defaults():
    config = ToolWorldConfig(level=4)
    assert hash(config) == hash(ToolWorldConfig(level=4))
    assert (config.num_intents, config.num_distractors, config.num_tasks) == (3, 1, 4)
    assert ToolWorldConfig(level=3).max_turns == 1 + 3 + 2


def test_dsl_encode_parse_render_roundtrip():
    for command in range(dsl.NUM_COMMANDS):
        tokens = dsl.encode(command, 1, 2, turn_len=6)
        assert tokens.index(dsl.END) == len(dsl.COMMAND_PATTERNS[command]) - 1
        parsed = dsl.parse(tokens, 8, 8, 4)
        nargs = dsl.num_args(command)
        assert parsed == (command, 1 if nargs >= 1 else 0, 2 if nargs >= 2 else 0)
    assert dsl.render(dsl.encode(Command.REFUND, 3)) == "CALL refund ORDER_3 END"
    assert dsl.parse([dsl.CALL, dsl.END, 0, 0, 0], 8, 8, 4)[0] == Command.MALFORMED
    # ORDER_9 is outside a config with 8 orders.
    assert dsl.parse(dsl.encode(Command.LOOKUP_ORDER, 9), 8, 8, 4)[0] == Command.MALFORMED
    env = _env(level=1)
    for command in range(dsl.NUM_COMMANDS):
        tokens = jnp.asarray(dsl.encode(command, 1, 2, turn_len=env.turn_len))
        np.testing.assert_array_equal(env.encode(command, jnp.int32(1), jnp.int32(2)), tokens)


# Oracle and random policies ---------------------------------------------------------


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_oracle_solves_every_level_in_the_shortest_plan(level):
    env = _env(level=level)
    episodes = _jitted(env)[3](jax.random.split(jax.random.PRNGKey(level), BATCH))
    ts = episodes.timesteps
    last = np.asarray(ts.step_type) == StepType.LAST
    first_last = last.argmax(axis=1)
    shortest = np.asarray(episodes.first.signals.shortest_plan)
    np.testing.assert_array_equal(first_last + 1, shortest)
    assert np.asarray(ts.signals.success).any(axis=1).all()
    played = np.arange(env.max_turns)[None, :] < shortest[:, None]
    verdict = np.asarray(ts.signals.verdict)
    assert (verdict[played] == 1).all()
    assert (np.asarray(ts.signals.efficiency)[played] == 0).all()
    assert (np.asarray(ts.signals.violations) == 0).all()
    expected = {1: {2}, 2: {3}, 3: {4}}.get(level)
    if expected is not None:
        assert set(shortest.tolist()) == expected
    else:  # 3 intents of cost 1-3 plus one distractor, plus BYE
        assert shortest.min() >= 5 and shortest.max() <= 11


# Dynamics per intent ----------------------------------------------------------------


def test_change_address_and_cancel():
    env = _env(level=1)
    state = _find_task(env, TaskKind.CHANGE_ADDRESS)
    order, new_address = int(state.task_order[0]), int(state.task_address[0])
    [(after, ts)] = _play(env, state, [(Command.CHANGE_ADDRESS, order, new_address)])
    assert int(after.address[order]) == new_address
    assert float(ts.signals.verdict) == 1 and int(after.progress[0]) == Progress.DONE
    assert dsl.render(ts.observation.tokens) == "USER thanks"
    # The wrong address settles the task as failed.
    wrong = (new_address + 1) % env.config.num_addresses
    if wrong == int(state.address[order]):
        wrong = (wrong + 1) % env.config.num_addresses
    [(after, ts)] = _play(env, state, [(Command.CHANGE_ADDRESS, order, wrong)])
    assert int(after.progress[0]) == Progress.FAILED and float(ts.signals.verdict) == -2
    [_, (_, ts)] = _play(env, state, [(Command.CHANGE_ADDRESS, order, wrong), (Command.BYE,)])
    assert float(ts.signals.outcome) == 0 and ts.discount == 0
    state = _find_task(env, TaskKind.CANCEL)
    order = int(state.task_order[0])
    [(after, ts), (_, ts_bye)] = _play(env, state, [(Command.CANCEL_ORDER, order), (Command.BYE,)])
    assert bool(after.cancelled[order]) and float(ts_bye.signals.outcome) == 1


def test_status_question_needs_a_grounded_answer():
    env = _env(level=2)
    state = _find_task(env, TaskKind.STATUS)
    order = int(state.task_order[0])
    status = int(state.status[order])
    # Lookup, lookup again (redundant: 0), then the right answer.
    steps = _play(
        env,
        state,
        [
            (Command.LOOKUP_ORDER, order),
            (Command.LOOKUP_ORDER, order),
            (Command.SAY_STATUS, order, status),
            (Command.BYE,),
        ],
    )
    assert [float(ts.signals.verdict) for _, ts in steps] == [1, 0, 1, 1]
    assert [float(ts.signals.efficiency) for _, ts in steps] == [0, 0, 0, -1]
    text = dsl.render(steps[0][1].observation.tokens)
    assert text.startswith(f"TOOL order ORDER_{order} ITEM_")
    assert dsl.render(dsl.STATUS_0 + status) in text
    assert float(steps[-1][1].signals.outcome) == 1
    # The right answer without a lookup is a guess: the task fails (irreversible, -2).
    [(after, ts)] = _play(env, state, [(Command.SAY_STATUS, order, status)])
    assert int(after.progress[0]) == Progress.FAILED and float(ts.signals.verdict) == -2
    # A lookup of another order is a wrong argument.
    [(_, ts)] = _play(env, state, [(Command.LOOKUP_ORDER, (order + 1) % 8)])
    assert float(ts.signals.verdict) == -1


def _refundable(state):
    order = state.task_order[0]
    return bool((state.status[order] == dsl.DELIVERED) & (state.amount[order] <= 2))


def test_refund_rules_and_flags():
    env = _env(level=2)
    state = _find_task(env, TaskKind.REFUND, _refundable)
    order = int(state.task_order[0])
    # Refund without a lookup breaks rule 0; the refund still runs (guardrail off) and,
    # ungrounded, settles the task wrongly: an irreversible mistake (-2).
    [(after, ts)] = _play(env, state, [(Command.REFUND, order)])
    assert ts.signals.violation_flags.tolist() == [True, False, False, False]
    assert int(ts.signals.violations) == 1 and float(ts.signals.verdict) == -2
    assert bool(after.refunded[order]) and bool(after.violated)
    # Correct: lookup then refund then BYE.
    steps = _play(
        env, state, [(Command.LOOKUP_ORDER, order), (Command.REFUND, order), (Command.BYE,)]
    )
    assert float(steps[-1][1].signals.outcome) == 1
    assert int(steps[1][0].progress[0]) == Progress.DONE

    state = _find_task(env, TaskKind.REFUND, lambda s: not _refundable(s))
    order = int(state.task_order[0])
    steps = _play(env, state, [(Command.LOOKUP_ORDER, order), (Command.REFUND, order)])
    flags = steps[1][1].signals.violation_flags.tolist()
    delivered = int(state.status[order]) == dsl.DELIVERED
    assert flags == [False, not delivered, False, delivered]
    steps = _play(
        env, state, [(Command.LOOKUP_ORDER, order), (Command.SAY_CANNOT, order), (Command.BYE,)]
    )
    assert [float(ts.signals.verdict) for _, ts in steps] == [1, 1, 1]
    assert float(steps[-1][1].signals.outcome) == 1


def test_penalise_mode_blocks_and_ends_the_episode():
    env = _env(level=2, guardrail="penalise", penalty=2.0)
    state = _find_task(env, TaskKind.REFUND, _refundable)
    order = int(state.task_order[0])
    [(after, ts)] = _play(env, state, [(Command.REFUND, order)])
    assert ts.step_type == StepType.LAST and float(ts.discount) == 0
    assert float(ts.reward) == -2.0 and float(ts.signals.outcome) == 0
    assert not bool(after.refunded[order])  # blocked: the call did not run
    assert dsl.render(ts.observation.tokens) == "TOOL blocked"
    # A call that breaks three rules still costs the penalty once.
    state = _find_task(
        env, TaskKind.REFUND, lambda s: int(s.amount[s.task_order[0]]) > 2, max_keys=2000
    )
    order = int(state.task_order[0])
    [(_, ts)] = _play(env, state, [(Command.REFUND, order)])
    assert int(ts.signals.violations) >= 2 and float(ts.reward) == -2.0


def test_change_after_shipping_rule():
    env = _env(level=2)
    state = _find_task(env, TaskKind.STATUS)
    shipped = np.flatnonzero(np.asarray(state.status) != dsl.PROCESSING)
    [(after, ts)] = _play(env, state, [(Command.CANCEL_ORDER, int(shipped[0]))])
    assert ts.signals.violation_flags.tolist() == [False, False, True, False]
    assert dsl.render(ts.observation.tokens) == f"TOOL error ORDER_{shipped[0]}"
    assert int(after.progress[0]) == Progress.PENDING  # a failed call settles nothing


@pytest.mark.parametrize("in_stock", [True, False])
def test_exchange_is_nested(in_stock):
    env = _env(level=3)
    state = _find_task(
        env,
        TaskKind.EXCHANGE,
        lambda s: bool(s.in_stock[s.item[s.task_order[0]]]) == in_stock,
    )
    order = int(state.task_order[0])
    item = int(state.item[order])
    final = (Command.EXCHANGE, order, item) if in_stock else (Command.SAY_NO_STOCK, item)
    # Checking the stock before the lookup is an unfounded guess.
    [(_, ts)] = _play(env, state, [(Command.CHECK_STOCK, item)])
    assert float(ts.signals.verdict) == -1
    steps = _play(
        env,
        state,
        [(Command.LOOKUP_ORDER, order), (Command.CHECK_STOCK, item), final, (Command.BYE,)],
    )
    word = "in_stock" if in_stock else "out_of_stock"
    assert dsl.render(steps[1][1].observation.tokens) == f"TOOL stock ITEM_{item} {word}"
    assert [float(ts.signals.verdict) for _, ts in steps] == [1, 1, 1, 1]
    assert float(steps[-1][1].signals.outcome) == 1
    # Skipping the stock check makes the final step ungrounded: failed task.
    steps = _play(env, state, [(Command.LOOKUP_ORDER, order), final])
    assert int(steps[-1][0].progress[0]) == Progress.FAILED


def test_malformed_turn_and_early_bye():
    env = _env(level=2)
    reset, step, _, _ = _jitted(env)
    state, _ = reset(jax.random.PRNGKey(3))
    garbage = jnp.asarray([dsl.CALL, dsl.END, dsl.END, 0, 0, 0], jnp.int32)
    state2, ts = step(state, garbage)
    assert float(ts.signals.verdict) == -1 and ts.step_type == StepType.MID
    assert dsl.render(ts.observation.tokens) == "TOOL error"
    np.testing.assert_array_equal(state2.progress, state.progress)
    _, ts = step(state, jnp.asarray(dsl.encode(Command.BYE, turn_len=6), jnp.int32))
    assert ts.step_type == StepType.LAST and float(ts.signals.outcome) == 0
    assert float(ts.signals.verdict) == -2 and float(ts.discount) == 0  # gives up: irreversible


# Episode ends -----------------------------------------------------------------------


def test_truncation_and_absorbing_terminal():
    env = _env(level=2)
    reset, step, _, _ = _jitted(env)
    state, _ = reset(jax.random.PRNGKey(1))
    garbage = jnp.zeros((env.turn_len,), jnp.int32)
    for _ in range(env.max_turns):
        state, ts = step(state, garbage)
    assert ts.step_type == StepType.LAST and float(ts.discount) == 1  # truncation
    assert bool(state.truncated) and not bool(state.terminated)
    obs = ts.observation.tokens
    again, ts2 = step(state, jnp.asarray(dsl.encode(Command.BYE, turn_len=6), jnp.int32))
    assert ts2.step_type == StepType.LAST and float(ts2.reward) == 0
    np.testing.assert_array_equal(ts2.observation.tokens, obs)
    assert all(not np.asarray(v).any() for v in ts2.signals)
    chex.assert_trees_all_equal(again, state)


def test_determinism_per_key_and_compile_once():
    env = _env(level=4)
    reset = jax.jit(chex.assert_max_traces(env.reset, n=1))
    step = jax.jit(chex.assert_max_traces(env.step, n=1))
    a, _ = reset(jax.random.PRNGKey(5))
    b, _ = reset(jax.random.PRNGKey(5))
    c, _ = reset(jax.random.PRNGKey(6))
    chex.assert_trees_all_equal(a, b)
    assert not all(
        np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(c), strict=True)
    )
    action = oracle_policy(env, a)
    for _ in range(3):
        a, _ = step(a, action)
        b, _ = step(b, action)
    chex.assert_trees_all_equal(a, b)


# Grammar mask -----------------------------------------------------------------------


def _allowed_fn(env):
    return jax.jit(env.allowed_tokens)


def test_allowed_tokens_grammar():
    env = _env(level=2)
    reset = _jitted(env)[0]
    allowed = _allowed_fn(env)
    state, _ = reset(jax.random.PRNGKey(0))
    empty = jnp.zeros((env.turn_len,), jnp.int32)
    first = np.flatnonzero(allowed(state, empty, 0))
    assert set(first.tolist()) == {dsl.CALL, dsl.SAY, dsl.BYE}
    prefix = jnp.asarray(dsl.encode(Command.CHANGE_ADDRESS, 3, 1, turn_len=env.turn_len))
    pos2 = set(np.flatnonzero(allowed(state, prefix, 2)).tolist())
    assert pos2 == {dsl.ORDER_0 + k for k in range(env.config.num_orders)}
    pos3 = set(np.flatnonzero(allowed(state, prefix, 3)).tolist())
    assert pos3 == {dsl.ADDR_0 + a for a in range(env.config.num_addresses)}
    assert np.flatnonzero(allowed(state, prefix, 4)).tolist() == [dsl.END]
    assert np.flatnonzero(allowed(state, prefix, 5)).tolist() == [dsl.PAD]
    bye = jnp.asarray(dsl.encode(Command.BYE, turn_len=env.turn_len))
    assert np.flatnonzero(allowed(state, bye, 1)).tolist() == [dsl.END]
    assert np.flatnonzero(allowed(state, bye, env.turn_len - 1)).tolist() == [dsl.PAD]
    # Entries at and after `position` are ignored.
    noisy = prefix.at[2:].set(dsl.CALL)
    assert set(np.flatnonzero(allowed(state, noisy, 2)).tolist()) == pos2


def test_rule_mask_excludes_violations():
    env = _env(level=2, guardrail="mask")
    state = _find_task(env, TaskKind.REFUND, _refundable)
    order = int(state.task_order[0])
    allowed = _allowed_fn(env)
    refund_prefix = jnp.asarray(dsl.encode(Command.REFUND, 0, turn_len=env.turn_len))
    # Nothing looked up yet: no order can be refunded, so `refund` is not offered.
    tools = np.asarray(allowed(state, refund_prefix, 1))
    assert not tools[dsl.token("refund")] and tools[dsl.token("lookup_order")]
    [(after, _)] = _play(env, state, [(Command.LOOKUP_ORDER, order)])
    assert np.asarray(allowed(after, refund_prefix, 1))[dsl.token("refund")]
    orders = np.flatnonzero(allowed(after, refund_prefix, 2)).tolist()
    assert orders == [dsl.ORDER_0 + order]
    cancel_prefix = jnp.asarray(dsl.encode(Command.CANCEL_ORDER, 0, turn_len=env.turn_len))
    cancellable = np.flatnonzero(allowed(after, cancel_prefix, 2)) - dsl.ORDER_0
    expected = np.flatnonzero(np.asarray(after.status) == dsl.PROCESSING)
    np.testing.assert_array_equal(cancellable, expected)
    # The rule mask on its own: exactly the order tokens the mask removes at position 2.
    forbidden = np.asarray(guardrail.forbidden_tokens(after, env.config.refund_limit))
    assert forbidden[Command.REFUND].tolist() == [
        t in range(dsl.ORDER_0, dsl.ORDER_0 + 8) and t != dsl.ORDER_0 + order
        for t in range(dsl.VOCAB_SIZE)
    ]
    assert not forbidden[Command.LOOKUP_ORDER].any()


@pytest.mark.parametrize("mode", ["off", "penalise"])
def test_only_mask_mode_masks_rules(mode):
    """The guardrail mode is the one setting: off and penalise offer rule-breaking calls."""
    env = _env(level=2, guardrail=mode)
    state = _find_task(env, TaskKind.REFUND, _refundable)
    allowed = _allowed_fn(env)
    refund_prefix = jnp.asarray(dsl.encode(Command.REFUND, 0, turn_len=env.turn_len))
    assert np.asarray(allowed(state, refund_prefix, 1))[dsl.token("refund")]
    orders = np.flatnonzero(allowed(state, refund_prefix, 2))
    assert orders.tolist() == list(range(dsl.ORDER_0, dsl.ORDER_0 + env.config.num_orders))
