"""The dialogue environment: its JAX dynamics against the plain-Python twin, the oracle,
random play, the feedback model, configs, and a rollout and trainer run on it.

The differential test loads JAX reset states into `ReferenceDialogue`, plays them with a
mixed policy (oracle turns, oracle turns with a corrupted argument, random acts, JAX
`random_action` turns, random tokens) one turn past max_turns (the absorbing state), and
replays the same turns in JAX: every timestep, and the JAX oracle's turn at every visited
state, must equal the reference's. One compiled replay per config also serves the oracle
and random-play tests (`random_action` does not read the state: the grammar is the same
at every turn, so a pool of its turns is random play). The held-out goals (`task_split`)
are checked at the end: each split's side, the 'all' draw unchanged, the twin's own
classification, `heldout_env` and the oracle on held-out dialogues.
"""

import dataclasses
import functools
import hashlib
import random

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlagent.envs import check_environment
from rlagent.envs import random_action
from rlagent.envs.dialogue import Act
from rlagent.envs.dialogue import DialogueConfig
from rlagent.envs.dialogue import DialogueEnv
from rlagent.envs.dialogue import Marker
from rlagent.envs.dialogue import Persona
from rlagent.envs.dialogue import Signals
from rlagent.envs.dialogue import dsl
from rlagent.envs.dialogue import horizon_config
from rlagent.envs.dialogue import level_config
from rlagent.envs.dialogue import oracle_policy
from rlagent.envs.dialogue import shortest_dialogue
from rlagent.envs.dialogue import unroll
from rlagent.envs.dialogue.config import heldout_goals
from rlagent.envs.dialogue.generator import heldout_goal
from rlagent.envs.dialogue.reference import ReferenceDialogue
from rlagent.models import PolicyConfig
from rlagent.rollout import RolloutConfig
from rlagent.train import TrainConfig
from rlagent.train import make_train

T = dsl.TOKEN_IDS
CONFIGS = {
    # C=3, R=2, one remark; one act wanted of 2 (more is a fluency error).
    "short_chats": level_config(3),
    # C=4, R=3, two remarks; up to 3 acts a turn, a constraint volunteered every reply.
    "detailed_volunteers": level_config(
        4,
        max_acts=3,
        persona=Persona(answers="detailed", volunteers=True, chats=2, patience=12,
                        feedback_rate=0.5, feedback_noise=0.25),
    ),
}  # fmt: skip
EPISODES = 128
RANDOM_POOL = 512
POLICY = PolicyConfig(
    vocab_size=dsl.VOCAB_SIZE, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1,
    mlp_dim=16, num_summary_slots=0, summary_dim=8,
)  # fmt: skip
ROLLOUT = RolloutConfig(window=1, constrained=True)
TINY = level_config(1, max_acts=1)
ACT_KINDS = [kind for kind in Act if kind not in (Act.NONE, Act.BYE)]  # bye: last, below


@functools.cache
def _compiled(name: str):
    """(env, batched reset, batched replay, a pool of `random_action` turns)."""
    env = DialogueEnv(CONFIGS[name])
    positions = jnp.arange(env.turn_len)

    def replay(state, actions):
        def turn(state, action):
            oracle = env.oracle_action(state)
            allowed = jax.vmap(env.allowed_tokens, in_axes=(None, None, 0))(
                state, action, positions
            )
            grammatical = allowed[positions, action].all()
            state, timestep = env.step(state, action)
            return state, (oracle, grammatical, timestep)

        return jax.lax.scan(turn, state, actions)[1]

    reset = jax.jit(jax.vmap(env.reset))
    dummy = jax.tree.map(lambda x: x[0], reset(jax.random.split(jax.random.key(0), EPISODES))[0])
    sample = jax.vmap(functools.partial(random_action, env, dummy))  # the state is not read
    pool = jax.jit(sample)(jax.random.split(jax.random.key(7), RANDOM_POOL))
    return env, reset, jax.jit(jax.vmap(replay)), np.asarray(pool)


def _mixed_action(reference: ReferenceDialogue, state, rng: random.Random, pool) -> list:
    """Oracle 45%, corrupted oracle 15%, random acts 20%, JAX random turn 15%, tokens 5%."""
    cfg = reference.config
    u = rng.random()
    if u < 0.6:
        action = reference.oracle(state)
        argument = [j for j, t in enumerate(action) if t >= dsl.ENT_0]
        if u >= 0.45 and argument:
            j = rng.choice(argument)
            bases = [dsl.ENT_0, dsl.ATTR_0, dsl.VAL_0]
            base = max(b for b in bases if b <= action[j])
            action[j] = base + rng.randrange(reference.sizes[bases.index(base)])
        return action
    if u < 0.8:
        action = _random_turn(reference, rng)
        if rng.random() < 0.15:  # bye, as the last act
            acts = reference.parse(action)
            action = reference.encode(acts[:-1] + [(Act.BYE, 0, 0, 0)])
        return action
    if u < 0.95:
        return pool[rng.randrange(len(pool))].tolist()
    return [rng.randrange(dsl.VOCAB_SIZE) for _ in range(cfg.turn_len)]


POLICIES = {
    "mixed": _mixed_action,
    "oracle": lambda reference, state, rng, pool: reference.oracle(state),
    "random": lambda reference, state, rng, pool: pool[rng.randrange(len(pool))].tolist(),
}


@functools.cache
def _play(name: str, policy: str):
    """Plays `POLICIES[policy]` on JAX reset states in the reference, then replays in JAX.

    Returns (actions [B, S + 1, L], reference fields, JAX fields): per field `[B, S + 1,
    ...]` arrays of the timesteps, the oracle's turn at each state ("oracle") and whether
    the turn parses ("grammatical": reference; every token allowed by the mask: JAX).
    """
    env, reset, replay, pool = _compiled(name)
    reference = ReferenceDialogue(env.config)
    seed = sorted(POLICIES).index(policy)
    states, first = reset(jax.random.split(jax.random.key(seed), EPISODES))
    host = jax.tree.map(np.asarray, states)
    turns = env.max_turns + 1
    rng = random.Random(seed)
    actions = np.zeros((EPISODES, turns, env.turn_len), np.int32)
    keys = ("step_type", "reward", "discount", "tokens", "progress", "oracle", "grammatical")
    want = {key: [] for key in keys + Signals._fields}
    for b in range(EPISODES):
        state = reference.load(jax.tree.map(lambda x, b=b: x[b], host))
        assert state.obs == np.asarray(first.observation.tokens[b]).tolist()
        for s in range(turns):
            want["oracle"].append(reference.oracle(state))
            actions[b, s] = POLICIES[policy](reference, state, rng, pool)
            want["grammatical"].append(reference.parse(actions[b, s]) is not None)
            state, ts = reference.step(state, actions[b, s].tolist())
            fields = (ts.step_type, ts.reward, ts.discount, ts.obs, ts.progress)
            for key, value in zip(keys[:5], fields, strict=True):
                want[key].append(value)
            for key in Signals._fields:
                want[key].append(getattr(ts.signals, key))
    want = {k: np.asarray(v) for k, v in want.items()}
    want = {k: v.reshape((EPISODES, turns) + v.shape[1:]) for k, v in want.items()}
    oracles, grammatical, timesteps = jax.tree.map(np.asarray, replay(states, jnp.asarray(actions)))
    got = {
        "step_type": timesteps.step_type,
        "reward": timesteps.reward,
        "discount": timesteps.discount,
        "tokens": timesteps.observation.tokens,
        "progress": timesteps.observation.progress,
        "oracle": oracles,
        "grammatical": grammatical,
        **timesteps.signals._asdict(),
    }
    return actions, want, got


def _played(step_type: np.ndarray) -> np.ndarray:
    """`[B, S]` bool: turn s was played (no earlier step ended the dialogue)."""
    last = step_type == 2
    return (np.cumsum(last, axis=1) - last) == 0


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_plays_against_the_reference(name):
    """One test per config, so that its plays compile once (and on one xdist worker)."""
    _check_jax_matches_reference(name)
    _check_reset_invariants(name)
    _check_oracle_reaches_the_goal_in_the_shortest_dialogue(name)
    _check_random_play_almost_never_reaches_the_goal(name)
    if CONFIGS[name].persona.feedback_rate == 0.5:
        _check_feedback_rate_and_noise_match_the_persona(name)


def _check_jax_matches_reference(name):
    """JAX equals the twin on mixed, oracle and random play; mixed play reaches every rule."""
    for policy in POLICIES:
        actions, want, got = _play(name, policy)
        for key in want:
            close = np.isclose(got[key], want[key]).reshape(*want[key].shape[:2], -1).all(-1)
            if not close.all():
                b, s = np.argwhere(~close)[0]
                raise AssertionError(
                    f"{policy} play: {key} differs at episode {b} turn {s} after "
                    f"{dsl.render(actions[b, s])!r}: jax {got[key][b, s]} vs "
                    f"reference {want[key][b, s]}"
                )
    # The mixed play reaches every outcome the rules distinguish.
    _, want, _ = _play(name, "mixed")
    played = _played(want["step_type"])
    assert set(np.unique(want["verdict"][played])) == {-1.0, 0.0, 1.0}
    assert set(np.unique(want["feedback"][played])) == {-1.0, 0.0, 1.0}
    assert 0 < want["success"].any(axis=1).mean() < 1
    for signal in ("factuality", "coherence", "fluency"):
        assert (want[signal] < 0).any(), signal
    assert {0, 1, 2, 4, 5} <= set(np.unique(want["stars"]).tolist())
    assert 0 < want["grammatical"].mean() < 1
    for word in ("leave", "goodbye", "huh", "repeat", "negate", "affirm", "accept", "KB"):
        assert (want["tokens"] == T[word]).any(), word


def _check_reset_invariants(name):
    """JAX and Python resets keep the generator's promises, with the same target spread."""
    env, reset, _, _ = _compiled(name)
    states, _ = reset(jax.random.split(jax.random.key(0), EPISODES))
    host = jax.tree.map(np.asarray, states)
    reference = ReferenceDialogue(env.config)
    rng = random.Random(0)
    jax_states = [reference.load(jax.tree.map(lambda x, b=b: x[b], host)) for b in range(EPISODES)]
    python_states = [reference.reset(rng) for _ in range(EPISODES)]
    for state in jax_states + python_states:
        _assert_generated(env.config, state)
    targets = [np.mean([s.target for s in states]) for states in (jax_states, python_states)]
    assert abs(targets[0] - targets[1]) < 1.0  # target uniform in [C, N): sd ~ 0.2 here


def _assert_generated(config, state):
    a, c = config.num_attributes, config.num_constraints
    kb, goal = np.asarray(state.kb), np.asarray(state.goal_value)
    constraints = sorted((x for x in range(a) if goal[x] >= 0), key=lambda x: state.goal_rank[x])
    assert len(constraints) == c and sum(r < a for r in state.request_rank) == config.num_requests
    meets = (kb[:, constraints] == goal[constraints]).all(axis=1)
    assert meets.nonzero()[0].tolist() == [state.target]
    for k in range(1, c):  # told in agenda order: a query's first match misses the goal
        first = (kb[:, constraints[:k]] == goal[constraints[:k]]).all(axis=1).argmax()
        assert first != state.target
    wanted = [Marker.TOLD] + [Marker.WANTED] * (c - 1)
    assert [state.marker[x] for x in constraints] == wanted
    assert sum(m != Marker.NONE for m in state.marker) == c


def _check_oracle_reaches_the_goal_in_the_shortest_dialogue(name):
    env, _, _, _ = _compiled(name)
    actions, _, got = _play(name, "oracle")
    played = _played(got["step_type"])
    shortest = env.config.shortest
    assert (played.sum(axis=1) == shortest).all() and got["success"].any(axis=1).all()
    assert (got["verdict"][:, :shortest] == 1).all()  # every turn a step of the shortest
    for signal in ("factuality", "coherence", "fluency", "efficiency"):
        assert (got[signal] == 0).all(), signal
    assert (got["stars"].max(axis=1) == 5).all() and (got["opinion"][played] == 1).all()
    signals = {k: jnp.asarray(got[k]) for k in env.signal_names}
    metrics = env.episode_metrics(signals, jnp.asarray(played), jnp.asarray(actions))
    assert float(metrics["goal_success"]) == 1 and float(metrics["satisfaction"]) == 5
    assert float(metrics["dialogue_turns"]) == shortest
    assert float(metrics["collapse_rate"]) == 0  # the oracle queries the catalogue.


def _check_random_play_almost_never_reaches_the_goal(name):
    _, _, got = _play(name, "random")
    assert got["success"].any(axis=1).mean() < 0.02
    assert got["grammatical"].all() and (got["coherence"] < 0).any()
    if CONFIGS[name].persona.answers == "short":
        assert (got["fluency"] < 0).any()  # two acts where one is wanted


def _check_feedback_rate_and_noise_match_the_persona(name):
    """Thumbs come with probability feedback_rate and are flipped with feedback_noise.

    Over the ~1.7k played turns of the three plays the standard error of the thumb rate
    is about 0.012 (0.017 for the flip rate among ~850 thumbs); the bound of 0.06 is
    loose but fails for a rate off by 0.1 (e.g. the default persona's 0.3 / 0.1 in place
    of this one's 0.5 / 0.25).
    """
    persona = CONFIGS[name].persona
    feedback, opinion = [], []
    for policy in POLICIES:
        _, _, got = _play(name, policy)
        played = _played(got["step_type"])
        feedback.append(got["feedback"][played])
        opinion.append(got["opinion"][played])
    feedback, opinion = np.concatenate(feedback), np.concatenate(opinion)
    given = feedback != 0
    assert len(feedback) > 1500 and set(np.unique(opinion)) == {-1.0, 1.0}
    assert abs(given.mean() - persona.feedback_rate) < 0.06
    assert abs((feedback[given] != opinion[given]).mean() - persona.feedback_noise) < 0.06


def test_degenerate_feedback_settings_in_the_reference():
    base = level_config(3)
    rng = random.Random(0)
    for rate, noise in ((0.0, 0.5), (1.0, 0.0), (1.0, 1.0)):
        persona = dataclasses.replace(base.persona, feedback_rate=rate, feedback_noise=noise)
        reference = ReferenceDialogue(dataclasses.replace(base, persona=persona))
        for _ in range(16):
            state = reference.reset(rng)
            while not state.over:
                state, ts = reference.step(state, _random_turn(reference, rng))
                want = 0.0 if rate == 0 else ts.signals.opinion * (-1 if noise == 1 else 1)
                assert ts.signals.feedback == want


def _random_turn(reference: ReferenceDialogue, rng: random.Random) -> list:
    cfg = reference.config
    acts = [
        (rng.choice(ACT_KINDS), rng.randrange(cfg.num_entities),
         rng.randrange(cfg.num_attributes), rng.randrange(cfg.num_values))
        for _ in range(rng.randint(1, cfg.max_acts))
    ]  # fmt: skip
    return reference.encode(acts)


def test_scripted_errors_are_the_documented_ones():
    """A hand-written level-2 dialogue (C=2, R=1): each turn's signals as the rules say."""
    config = level_config(2, persona=Persona(patience=20))  # patient: it must not leave
    reference = ReferenceDialogue(config)
    rs = reference.reset(random.Random(11))
    first, second = sorted((a for a in range(config.num_attributes) if rs.goal_value[a] >= 0),
                           key=lambda a: rs.goal_rank[a])  # fmt: skip
    (request,) = [a for a in range(config.num_attributes) if rs.request_rank[a] == 0]
    other = next(a for a in range(config.num_attributes) if rs.goal_value[a] < 0 and a != request)
    target = rs.target
    right = rs.kb[target][request]
    wrong = (right + 1) % config.num_values
    script = [
        # (acts, factuality, coherence, fluency, verdict)
        ([(Act.ASK, 0, first, 0)], 0, -1, 0, -1),  # asks what the opening told
        ([(Act.ASK, 0, other, 0)], 0, 0, 0, 0),  # the user does not care: neutral
        ([(Act.ASK, 0, other, 0)], 0, -1, 0, -1),  # ... and asked again
        ([(Act.RECOMMEND, target, 0, 0)], -1, 0, 0, -1),  # no query returned it: ungrounded
        ([(Act.CHAT, 0, 0, 0)], 0, -1, 0, -1),  # ignores the pending request (it repeats)
        ([(Act.INFORM, target, request, wrong)], -1, 0, 0, -1),  # a wrong fact, answered
        ([(Act.INFORM, target, request, right), (Act.BYE, 0, 0, 0)], 0, -1, -1, -1),
    ]  # fmt: skip
    observations = []
    for acts, factuality, coherence, fluency, verdict in script:
        rs, ts = reference.step(rs, reference.encode(acts))
        observations.append(dsl.render(ts.obs))
        got = (ts.signals.factuality, ts.signals.coherence, ts.signals.fluency, ts.signals.verdict)
        assert got == (factuality, coherence, fluency, verdict), (acts, got)
    assert rs.marker[second] == Marker.WANTED  # never asked: the ungrounded pick was lucky
    assert "u_inform" in observations[1] and "any" in observations[1]
    assert "accept" in observations[3] and "request" in observations[3]
    assert "repeat" in observations[4]
    # The bye came in the turn that fixed the answer: the goal was not met before it.
    assert ts.step_type == 2 and not ts.signals.success and ts.signals.stars == 1


def test_the_user_leaves_when_out_of_patience():
    config = level_config(1, persona=Persona(patience=6))
    reference = ReferenceDialogue(config)
    rs = reference.reset(random.Random(3))
    told = rs.marker.index(Marker.TOLD)
    turns = 0
    while not rs.over:
        rs, ts = reference.step(rs, reference.encode([(Act.ASK, 0, told, 0)]))
        turns += 1
    # Each turn costs 1 + 1 coherence error of patience 6: the user leaves on turn 3.
    assert turns == 3 and rs.obs[1] == T["leave"] and ts.signals.stars == 1
    assert ts.signals.rating == -1.0 and ts.discount == 0.0


def test_levels_horizons_and_the_shortest_dialogue():
    assert [level_config(level).shortest for level in range(1, 6)] == [3, 5, 8, 11, 16]
    for horizon in (3, 9, 16, 20):
        config = horizon_config(horizon)
        assert config.shortest == horizon
        reference = ReferenceDialogue(config)
        rs = reference.reset(random.Random(horizon))
        turns = 0
        while not rs.over:
            rs, ts = reference.step(rs, reference.oracle(rs))
            turns += 1
        assert ts.signals.success and turns == horizon
    detailed = level_config(4, max_acts=3, persona=Persona(answers="detailed"))
    assert shortest_dialogue(detailed) == 5 < level_config(4).shortest


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(persona=Persona(patience=4)), r"persona\.patience: must be >= the shortest"),
        (dict(num_entities=3, num_constraints=3, num_requests=0), r"num_entities: a catalogue "),
        (dict(num_attributes=3, num_constraints=2, num_requests=2), r"num_requests: must be in "),
        (dict(max_acts=4), r"max_acts: must be in \[1, 3\]"),
        (dict(level=6), r"level: must be one of"),
        (dict(num_values=1), r"num_values: must be in \[2, 4\]"),
        (dict(num_constraints=2.5), r"num_constraints: must be an integer"),
        (dict(task_split="test"), r"task_split: must be one of \('all', 'train', 'heldout'\)"),
        # 2 attributes x 2 values, one constraint: the hash holds out none of the 4 goals.
        (dict(num_attributes=2, num_values=2, num_constraints=1, num_requests=0,
              task_split="train"),
         r"task_split: needs goals on both sides, but the 4 goals hold out 0 and leave 4"),
    ],
)  # fmt: skip
def test_bad_configs_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        DialogueConfig(**{"level": 2, **fields})


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(feedback_rate=1.5), r"Persona\.feedback_rate: must be in \[0, 1\]"),
        (dict(feedback_noise=-0.1), r"Persona\.feedback_noise: must be in \[0, 1\]"),
        (dict(feedback_rate=float("nan")), r"Persona\.feedback_rate"),
        (dict(answers="verbose"), r"Persona\.answers"),
        (dict(chats=7), r"Persona\.chats"),
    ],
)
def test_bad_personas_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        Persona(**fields)


def test_step_compiles_once_and_the_protocol():
    env = DialogueEnv(TINY)
    check_environment(env)
    reference = ReferenceDialogue(TINY)
    step = jax.jit(chex.assert_max_traces(env.step, n=1))
    state, _ = jax.jit(env.reset)(jax.random.key(0))
    twin = reference.load(state)
    for _ in range(TINY.shortest):
        twin, _ = reference.step(twin, action := reference.oracle(twin))
        state, timestep = step(state, jnp.asarray(action, jnp.int32))
    assert bool(state.over) and bool(timestep.signals.success)
    assert set(env.reward_components) >= {"outcome", "process", "potential", "prm_min"}


def test_the_trainer_runs_two_updates_on_rollouts_of_it():
    """make_train's rollouts record the signals by name (episode_metrics reads each one),
    success is the environment's outcome, and constrained turns are never malformed.

    (One compile: a separate make_rollout test would compile the same rollout again.)
    """
    env = DialogueEnv(TINY)
    config = TrainConfig(num_updates=2, num_groups=2, group_size=2, reward="process")
    _, metrics = jax.jit(make_train(config, env, POLICY, ROLLOUT).train)(jax.random.key(0))
    metrics = jax.tree.map(np.asarray, metrics)
    assert {"success", "goal_success", "satisfaction", "coherence_errors"} <= set(metrics)
    assert all(np.isfinite(v).all() for v in metrics.values())
    np.testing.assert_array_equal(metrics["success"], metrics["goal_success"])
    assert (metrics["format_errors"] == 0).all() and (metrics["dialogue_turns"] >= 1).all()
    assert (metrics["feedback_rate"] > 0).all()


# Held-out goals (task_split) -------------------------------------------------------------
SPLIT_KEYS = 2048
# Exact held-out fractions of the goals (enumerated): level 1 holds out 2 of its 12 goals,
# level 3 40,360 of its 161,280.
HELDOUT_FRACTION = {1: 2 / 12, 3: 40360 / 161280}
# sha256 (first 16 hex digits) of the reset states of `jax.random.split(key(0), 8)` at
# levels 1, 3 and 5, recorded with the generator before task_split existed, and of
# `uniform(key(0), (8,))`: if JAX's PRNG changes, the states change with it (re-record).
PRE_SPLIT_DIGESTS = {1: "e6e2f58df7a37664", 3: "1a05dc547276aa96", 5: "ac335f5a4c98c1f7"}
PRNG_DIGEST = "09444c74446788c0"


def _digest(tree) -> str:
    sha = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
        sha.update(np.asarray(leaf).tobytes())
    return sha.hexdigest()[:16]


def _split_resets(level: int, keys):
    """{split: (host states, host held-out flags)} of one vmapped, jitted reset per split."""
    out = {}
    for split in ("all", "train", "heldout"):
        env = DialogueEnv(level_config(level, task_split=split))
        states = jax.jit(jax.vmap(lambda key, env=env: env.reset(key)[0]))(keys)
        held = jax.jit(jax.vmap(functools.partial(heldout_goal, env.config)))(states)
        out[split] = (jax.tree.map(np.asarray, states), np.asarray(held))
    return out


@pytest.mark.parametrize("level", [1, 3])
def test_task_split_draws_only_its_side_of_the_heldout_goals(level):
    """'train' never draws a held-out goal, 'heldout' only held-out ones, 'all' about a
    quarter (the exact fraction; sd ~0.009 over 2048 keys); a split keeps the 'all' draw
    of a key whenever it fits, its states keep the generator's promises, and a reset is a
    function of its key."""
    keys = jax.random.split(jax.random.key(level), SPLIT_KEYS)
    resets = _split_resets(level, keys)
    (all_states, all_held), (train, train_held), (heldout, heldout_held) = resets.values()
    assert not train_held.any() and heldout_held.all()
    assert abs(all_held.mean() - HELDOUT_FRACTION[level]) < 0.03
    for states, fits in ((train, ~all_held), (heldout, all_held)):
        for name, leaf in all_states._asdict().items():
            same = (getattr(states, name) == leaf).reshape(SPLIT_KEYS, -1).all(axis=1)
            assert (same[fits]).all(), name  # the first draw is kept when it fits
        assert not (states.kb == all_states.kb).reshape(SPLIT_KEYS, -1).all(axis=1).all()
    config = level_config(level)
    reference = ReferenceDialogue(config)
    for states in (train, heldout):
        for b in range(64):
            _assert_generated(config, reference.load(jax.tree.map(lambda x, b=b: x[b], states)))
    again = _split_resets(level, keys)
    for split, (states, _) in resets.items():
        assert _digest(states) == _digest(again[split][0]), split


def test_the_all_split_draws_the_states_of_before_the_split():
    """task_split='all' (the default) is the generator's old draw, bit for bit."""
    prng = _digest(jax.random.uniform(jax.random.key(0), (8,)))
    assert prng == PRNG_DIGEST, "JAX's PRNG changed: re-record PRE_SPLIT_DIGESTS"
    keys = jax.random.split(jax.random.key(0), 8)
    for level, digest in PRE_SPLIT_DIGESTS.items():
        env = DialogueEnv(level_config(level))
        assert env.config.task_split == "all"
        states = jax.jit(jax.vmap(lambda key, env=env: env.reset(key)[0]))(keys)
        assert _digest(states) == digest, level


@pytest.mark.parametrize("level", [1, 3, 5])
def test_the_reference_classifies_goals_as_jax_does(level):
    """The twin's own cell index and hash agree with `heldout_goals` on loaded JAX states
    (level 5: indices past 2**32, which wrap), and its reset follows the split."""
    config = level_config(level)
    reference = ReferenceDialogue(config)
    env = DialogueEnv(config)
    keys = jax.random.split(jax.random.key(10 + level), 512)
    states = jax.jit(jax.vmap(lambda key: env.reset(key)[0]))(keys)
    held = np.asarray(jax.vmap(functools.partial(heldout_goal, config))(states))
    host = jax.tree.map(np.asarray, states)
    mine = [reference.heldout_goal(reference.load(jax.tree.map(lambda x, b=b: x[b], host)))
            for b in range(len(keys))]  # fmt: skip
    np.testing.assert_array_equal(mine, held)
    assert 0.15 < held.mean() < 0.35
    rng = random.Random(level)
    for split in ("train", "heldout"):
        twin = ReferenceDialogue(dataclasses.replace(config, task_split=split))
        drawn = [twin.reset(rng) for _ in range(64)]
        fields = [np.asarray([getattr(s, name) for s in drawn])
                  for name in ("goal_rank", "goal_value", "request_rank")]  # fmt: skip
        assert (np.asarray(heldout_goals(config, *fields)) == (split == "heldout")).all()
        for state in drawn:
            _assert_generated(config, state)


def test_heldout_env_needs_a_training_split_and_its_oracle_succeeds():
    """`heldout_env` is refused unless the split is 'train'; the held-out env is the same
    config but its split, and the oracle meets every held-out goal in the shortest
    dialogue."""
    for split in ("all", "heldout"):
        with pytest.raises(ValueError, match="DialogueConfig.task_split='train'"):
            DialogueEnv(level_config(3, task_split=split)).heldout_env()
    train = DialogueEnv(level_config(3, task_split="train"))
    env = train.heldout_env()
    assert env.config == dataclasses.replace(train.config, task_split="heldout")
    play = jax.jit(jax.vmap(lambda key: unroll(env, functools.partial(oracle_policy, env), key)))
    episodes = play(jax.random.split(jax.random.key(5), 64))
    first_states = jax.vmap(lambda key: env.reset(jax.random.split(key)[0])[0])(
        jax.random.split(jax.random.key(5), 64)
    )
    assert np.asarray(jax.vmap(functools.partial(heldout_goal, env.config))(first_states)).all()
    success = np.asarray(episodes.timesteps.signals.success)
    assert success.any(axis=1).all()
    assert (success.argmax(axis=1) == env.config.shortest - 1).all()
