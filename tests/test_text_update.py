"""FSDP sharding (rlagent.models.sharding) and the text-mode update (rlagent.text.update):
the sharding rule; on 8 host devices the sharded PPO update with its critic equal to the
single-device one, with its parameters really split; GRPO's loss by hand; the critic's
value regression and warm-up on a fixed batch, and the refusals of a critic it cannot use."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from flax import nnx

from experiments.studies.text_batch import TINY_QWEN
from experiments.studies.text_batch import text_trajectory
from rlagent.models import ValueLM
from rlagent.models import sharding
from rlagent.models.llama import Llama
from rlagent.text.chat import ChatFormat
from rlagent.text.loop import TextConfig
from rlagent.text.score import make_text_score
from rlagent.text.score import make_text_values
from rlagent.text.update import make_text_update
from rlagent.train.config import TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mesh(fsdp: int, data: int = 1):
    return jax.sharding.AbstractMesh((data, fsdp), (sharding.DATA, sharding.FSDP))


def test_fsdp_spec_splits_the_largest_divisible_dimension():
    mesh = _mesh(8)
    P = jax.sharding.PartitionSpec
    assert sharding.fsdp_spec((151936, 896), mesh) == P("fsdp", None)
    assert sharding.fsdp_spec((896, 4864), mesh) == P(None, "fsdp")
    # 14 * 64 = 896 divides; 900 does not, so the smaller divisible dimension is taken.
    assert sharding.fsdp_spec((900, 128), mesh) == P(None, "fsdp")
    assert sharding.fsdp_spec((64, 64), mesh) == P("fsdp", None)  # ties: the first.
    assert sharding.fsdp_spec((896,), mesh) == P(None)  # small: replicated.
    assert sharding.fsdp_spec((1001, 999), mesh) == P(None, None)  # nothing divides.
    assert sharding.fsdp_spec((4096, 4096), _mesh(1, data=8)) == P(None, None)
    assert sharding.fsdp_spec((64, 64), mesh, min_size=10**6) == P(None, None)


def test_role_meshes_and_batch_rows_are_checked():
    meshes = sharding.role_meshes()
    assert meshes.policy is meshes.reference is meshes.critic
    assert meshes.policy.axis_names == (sharding.DATA, sharding.FSDP)
    with pytest.raises(ValueError, match="multiple of 3"):
        sharding.role_meshes(jax.devices()[:1], split=True)
    with pytest.raises(ValueError, match="does not divide"):
        sharding.fsdp_mesh(jax.devices()[:1], data=2)


@pytest.mark.parametrize(
    "field,value", [("estimator", "gae_turn"), ("entropy_coef", 0.01), ("kl_target", 0.1)]
)
def test_text_update_refuses_what_a_text_batch_cannot_serve(field, value):
    config = TrainConfig(**{**dict(estimator="grpo", entropy_coef=0.0), field: value})
    with pytest.raises(ValueError, match=field):
        make_text_update(config, lambda params, trajectory: None)


SHARDED_SCRIPT = textwrap.dedent(
    """
    import os
    flags = os.environ.get("XLA_FLAGS", "")  # the suite's (tests/conftest.py), and 8 devices:
    os.environ["XLA_FLAGS"] = flags + " --xla_force_host_platform_device_count=8"
    import dataclasses, json, sys
    sys.path.insert(0, {root!r})
    import jax, numpy as np
    from flax import nnx
    from experiments.studies.text_batch import TINY_QWEN, text_trajectory
    from rlagent.models import sharding
    from rlagent.models import Policy
    from rlagent.models import ValueLM
    from rlagent.models.llama import Llama
    from rlagent.text.chat import ChatFormat
    from rlagent.text.loop import TextConfig
    from rlagent.text.score import make_text_score
    from rlagent.text.score import make_text_values
    from rlagent.text.update import make_text_update
    from rlagent.train.config import TrainConfig
    assert len(jax.devices()) == 8
    # One layer: the sharding rule sees every kind of parameter; each layer more compiles.
    policy = dataclasses.replace(TINY_QWEN, param_dtype="float32", dtype="float32",
                                 num_layers=1)
    chat = ChatFormat(None, end_id=1, pad_id=0, vocab_size=500)
    text = TextConfig(max_new_tokens=8, obs_len=12)
    config = TrainConfig(num_updates=1, num_groups=4, group_size=4, reward="outcome",
                         estimator="grpo", num_epochs=2, num_minibatches=2, entropy_coef=0.0,
                         kl_placement="loss", kl_coef=0.1, learning_rate=1e-3)
    trajectory = text_trajectory(np.random.default_rng(1), batch=16, turns=2, obs_len=12,
                                 turn_len=8, tokenizer_size=500, chat=chat)
    # "check": one GRPO on-policy step without KL, whose loss the test recomputes by hand;
    # the others: PPO with token-level GAE from a critic (ValueLM) on the policy's mesh.
    check = dataclasses.replace(config, num_epochs=1, num_minibatches=1, kl_coef=0.0)
    config = dataclasses.replace(config, estimator="gae_token")
    eight = sharding.fsdp_mesh(data=2)
    roles = sharding.role_meshes(jax.devices()[:6], split=True)  # 3 meshes of 2 devices.
    runs = (("one", None, None, config), ("eight", eight, eight, config),
            ("roles", roles.policy, roles.reference, config), ("check", None, None, check))
    out = {{}}
    for name, mesh, ref_mesh, config in runs:
        build = lambda: Llama(policy, rngs=nnx.Rngs(0))
        critic_graphdef, critic = nnx.split(ValueLM(policy, rngs=nnx.Rngs(1)))
        if mesh is None:
            graphdef, params = nnx.split(build())
            ref_params = jax.tree.map(lambda x: x.copy(), params)
            batch = ref_batch = trajectory
        else:
            critic = sharding.shard_params(critic, mesh)
            graphdef, params = sharding.init_sharded(build, mesh)
            # The same initial weights, laid out on the reference's mesh (no second init).
            ref_params = sharding.shard_params(jax.tree.map(lambda x: x.copy(), params),
                                               ref_mesh)
            batch = sharding.shard_batch(trajectory, mesh)
        score = make_text_score(chat, graphdef, policy, text)
        batch = batch._replace(logp=score(params, batch))
        values = make_text_values(chat, critic_graphdef, text) if config.uses_critic else None
        program = make_text_update(config, score, values=values, mesh=mesh,
                                   reference_mesh=ref_mesh)
        state = program.init(params, critic if config.uses_critic else None)
        if mesh is not None:
            ref_batch = sharding.shard_batch(batch, ref_mesh)
        ref_logp = program.reference(ref_params, ref_batch)
        ref_devices = sorted(d.id for d in ref_logp.sharding.device_set)
        if name == "roles":  # placement only: "eight" checks the sharded numbers.
            devices = lambda tree: sorted(  # noqa: E731
                d.id for d in max(jax.tree.leaves(tree), key=lambda x: x.size).sharding.device_set)
            out[name] = dict(param_devices=devices(state.params), ref_devices=ref_devices)
            continue
        if mesh is not None:  # the reference's log-probs onto the policy's mesh.
            ref_logp = sharding.shard_batch(ref_logp, mesh)
        state, metrics = program.update(state, batch, ref_logp)
        leaves = jax.tree.leaves((state.params, state.critic))
        big = max(leaves, key=lambda x: x.size)
        out[name] = dict(
            metrics={{k: float(v) for k, v in metrics.items()}},
            params=[np.asarray(x, np.float64).ravel().tolist() for x in leaves],
            big_spec=str(getattr(big.sharding, "spec", "one device")), big_shape=list(big.shape),
            big_devices=len(big.sharding.device_set),
            param_devices=sorted(d.id for d in big.sharding.device_set), ref_devices=ref_devices,
            big_shard=list(big.addressable_shards[0].data.shape),
            opt_specs=sorted({{str(getattr(x.sharding, "spec", "one device"))
                               for x in jax.tree.leaves(state.opt_state) if x.ndim == 2}}),
            loss_mask=np.asarray(batch.loss_mask).tolist(),
            outcome=np.asarray(batch.signals["outcome"]).tolist(),
        )
    # A critic trunk (Policy's value_head='separate') on the third role mesh.
    separate = dataclasses.replace(policy, value_head="separate")
    critic = nnx.split(Policy(separate, rngs=nnx.Rngs(0)))[1]["critic"]
    big = max(jax.tree.leaves(sharding.shard_params(critic, roles.critic)), key=lambda x: x.size)
    out["critic"] = dict(devices=sorted(d.id for d in big.sharding.device_set),
                         spec=str(big.sharding.spec), shape=list(big.shape),
                         shard=list(big.addressable_shards[0].data.shape))
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def sharded_run():
    script = SHARDED_SCRIPT.format(root=ROOT)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=600, cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_sharded_text_update_matches_single_device(sharded_run):
    """FSDP over a (2, 4) mesh: the same metrics and parameters (policy and critic) of a
    PPO update with a critic as on one device."""
    one, sharded = sharded_run["one"], sharded_run["eight"]
    for key, value in one["metrics"].items():
        assert sharded["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert one["metrics"]["grad_norm"] > 0 and one["metrics"]["kl_loss"] > 0  # it moved.
    assert one["metrics"]["value_loss"] > 0 and one["metrics"]["critic_grad_norm"] > 0
    one_params, sharded_params = (np.concatenate(run["params"]) for run in (one, sharded))
    # AdamW normalises each element's step, so an element whose gradient is at rounding
    # level may step differently (by up to the learning rate, 1e-3, per step); all others
    # agree to float32 rounding.
    diff = np.abs(one_params - sharded_params)
    assert np.mean(diff > 1e-5) < 1e-3 and diff.max() < 4e-3, (np.mean(diff > 1e-5), diff.max())


def test_roles_live_on_their_own_devices(sharded_run):
    roles, eight = sharded_run["roles"], sharded_run["eight"]
    assert roles["param_devices"] == [0, 1] and roles["ref_devices"] == [2, 3]
    assert eight["param_devices"] == eight["ref_devices"] == list(range(8))
    critic = sharded_run["critic"]  # its token embedding [512, 64], by rows over 2 devices.
    assert critic["devices"] == [4, 5] and critic["spec"] == "P('fsdp', None)"
    assert critic["shape"] == [512, 64] and critic["shard"] == [256, 64]


def test_sharded_parameters_and_optimizer_state_are_split(sharded_run):
    one, eight = sharded_run["one"], sharded_run["eight"]
    assert one["big_devices"] == 1 and "fsdp" not in one["big_spec"]
    # The tied embedding [512, 64]: rows over the 4-way fsdp axis, replicated over data.
    assert eight["big_shape"] == [512, 64] and eight["big_spec"] == "P('fsdp', None)"
    assert eight["big_devices"] == 8 and eight["big_shard"] == [128, 64]
    assert all("fsdp" in spec for spec in eight["opt_specs"]), eight["opt_specs"]


def test_text_update_loss_is_grpo_on_generated_tokens(sharded_run):
    """One on-policy step (ratio 1): policy loss = -token-mean over generated tokens of
    the episode's group-relative advantage (R - mean_g) / (std_g + 1e-6)."""
    check = sharded_run["check"]
    mask = np.asarray(check["loss_mask"])  # [B, S, L]
    groups = np.asarray(check["outcome"]).sum(axis=1).reshape(4, 4)
    spread = groups.std(axis=1, ddof=1, keepdims=True)
    advantage = ((groups - groups.mean(axis=1, keepdims=True)) / (spread + 1e-6)).ravel()
    assert np.abs(advantage).sum() > 0  # the batch has a group of mixed outcomes.
    expected = -np.sum(advantage[:, None, None] * mask) / mask.sum()
    assert check["metrics"]["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert check["metrics"]["policy_loss"] == pytest.approx(expected, abs=1e-5)
    assert check["metrics"]["tokens"] == mask.sum()


def _tiny_critic_setup():
    """A one-layer policy and critic (ValueLM) of TINY_QWEN's family and a batch of two
    groups of 4 random two-turn episodes, outcome 1 on the last turn of some."""
    policy = dataclasses.replace(TINY_QWEN, param_dtype="float32", dtype="float32", num_layers=1)
    chat = ChatFormat(None, end_id=1, pad_id=0, vocab_size=500)
    trajectory = text_trajectory(np.random.default_rng(3), batch=8, turns=2, obs_len=6,
                                 turn_len=6, tokenizer_size=500, chat=chat)  # fmt: skip
    graphdef, params = nnx.split(Llama(policy, rngs=nnx.Rngs(0)))
    critic_graphdef, critic = nnx.split(ValueLM(policy, rngs=nnx.Rngs(1)))
    text = TextConfig(max_new_tokens=6, obs_len=6)
    score = make_text_score(chat, graphdef, policy, text)
    trajectory = trajectory._replace(logp=score(params, trajectory))
    return score, make_text_values(chat, critic_graphdef, text), params, critic, trajectory


def test_the_critic_regresses_the_returns_and_warms_up_alone():
    score, values, params, critic, batch = _tiny_critic_setup()
    config = TrainConfig(num_groups=2, group_size=4, reward="outcome", estimator="gae_token",
                         gamma=1.0, lam=1.0, value_clip=None, num_epochs=1, num_minibatches=1,
                         entropy_coef=0.0, kl_coef=0.0, learning_rate=1e-2)  # fmt: skip
    program = make_text_update(config, score, values=values, critic_warmup=2)
    start = [np.asarray(x) for x in jax.tree.leaves(params)]
    ref_logp = program.reference(params, batch)
    state = program.init(params, critic)
    # V = 0 before the first step (the head starts at zero) and, with gamma = lam = 1 and
    # no KL, every generated token's target is its episode's outcome: the first value
    # loss is 0.5 x the token-mean of outcome^2 by hand, and nothing is explained.
    mask = np.asarray(batch.loss_mask)
    outcome = np.asarray(batch.signals["outcome"]).sum(axis=1)
    assert 0 < outcome.mean() < 1
    expected = 0.5 * np.sum(mask * outcome[:, None, None] ** 2) / mask.sum()
    rows = []
    for update in range(12):
        state, metrics = program.update(state, batch, ref_logp)
        rows.append({k: float(v) for k, v in metrics.items()})
        moved = [not np.array_equal(a, np.asarray(b)) for a, b in
                 zip(start, jax.tree.leaves(state.params), strict=True)]  # fmt: skip
        assert any(moved) == (update >= 2), update  # the policy waits out the warm-up.
    assert rows[0]["value_loss"] == pytest.approx(expected, rel=1e-5)
    assert rows[0]["value_mean"] == 0.0 and rows[0]["explained_variance"] == pytest.approx(0.0)
    assert rows[0]["critic_grad_norm"] > 0
    # The critic fits the batch it keeps seeing (the values, not just their mean).
    assert rows[-1]["value_loss"] < 0.3 * rows[0]["value_loss"], [r["value_loss"] for r in rows]
    assert rows[-1]["explained_variance"] > 0.5, [r["explained_variance"] for r in rows]


@pytest.mark.parametrize(
    "fields,kwargs,match",
    [
        (dict(estimator="grpo"), dict(values=True), "reads no values"),
        (dict(estimator="gae_token", bootstrap_truncated=True), dict(values=True),
         "bootstrap_truncated"),
        (dict(estimator="grpo"), dict(critic_warmup=2), "critic_warmup"),
    ],
)  # fmt: skip
def test_text_update_refuses_a_critic_it_cannot_use(fields, kwargs, match):
    config = TrainConfig(**{"entropy_coef": 0.0, **fields})
    values = (lambda params, trajectory: None) if kwargs.pop("values", False) else None
    with pytest.raises(ValueError, match=match):
        make_text_update(config, lambda params, trajectory: None, values=values, **kwargs)


def test_normalize_returns_divides_the_text_rewards_by_the_running_std():
    """`TrainConfig.normalize_returns` in the text update: the first on-policy RLOO step's
    loss (linear in the rewards) is the unnormalised one over the batch returns' std, and
    the statistics ride in the state to the next update."""
    score, _, params, _, batch = _tiny_critic_setup()
    returns = np.asarray(batch.signals["outcome"]).sum(axis=1)
    sigma = returns.std()  # population std: m2 / count after one batch.
    assert 0 < sigma < 1  # a mixed batch: the scale changes the loss.
    rows = {}
    for normalize in (False, True):
        config = TrainConfig(num_groups=2, group_size=4, reward="outcome", estimator="rloo",
                             num_epochs=1, num_minibatches=1, entropy_coef=0.0, kl_coef=0.0,
                             learning_rate=1e-3, normalize_returns=normalize)  # fmt: skip
        program = make_text_update(config, score)
        state = program.init(jax.tree.map(lambda x: x.copy(), params))
        ref_logp = program.reference(params, batch)
        state, first = program.update(state, batch, ref_logp)
        rows[normalize] = {k: float(v) for k, v in first.items()}
        assert float(state.return_stats.count) == len(returns) * normalize
    raw, scaled = rows[False], rows[True]
    assert raw["policy_loss"] != 0.0
    assert scaled["policy_loss"] == pytest.approx(raw["policy_loss"] / sigma, rel=1e-4)
    assert scaled["return_std"] == pytest.approx(sigma, rel=1e-5) and "return_std" not in raw
    assert scaled["reward"] == raw["reward"]  # the logged reward stays unscaled.


def test_the_text_update_follows_the_learning_rate_schedule():
    """The compiled trainer's optimizer (`make_optimizer`): with one update of linear
    warm-up the first step runs at learning rate 0 (the parameters stay, AdamW's decay
    included) and the second moves them; constant steps at once."""
    score, _, params, _, batch = _tiny_critic_setup()
    for warmup in (0, 1):
        config = TrainConfig(num_updates=2, warmup_updates=warmup, lr_schedule="linear",
                             num_groups=2, group_size=4, reward="outcome", estimator="rloo",
                             num_epochs=1, num_minibatches=1, entropy_coef=0.0,
                             learning_rate=1e-2)  # fmt: skip
        program = make_text_update(config, score)
        state = program.init(jax.tree.map(lambda x: x.copy(), params))
        ref_logp = program.reference(params, batch)
        moved = []
        for _ in range(2):
            before = [np.asarray(x) for x in jax.tree.leaves(state.params)]
            state, _ = program.update(state, batch, ref_logp)
            after = jax.tree.leaves(state.params)
            moved.append(any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True)))
        assert moved == [not warmup, True], (warmup, moved)
