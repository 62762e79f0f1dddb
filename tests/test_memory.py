"""Memory of real model sizes: log-probs over vocabulary tiles against a plain log-softmax,
blockwise attention against the dense one, micro-batched reference and critic passes
against whole-batch ones, gradient accumulation against the one-step update, and the
refusals of a micro-batch that does not divide the minibatch."""

import dataclasses
import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.studies.text_batch import QWEN25_05B
from experiments.studies.text_batch import TINY_QWEN
from experiments.studies.text_batch import text_trajectory
from rlagent.models import ValueLM
from rlagent.models.llama import NEG_INF
from rlagent.models.llama import Llama
from rlagent.models.llama import PolicyConfig
from rlagent.models.llama import init_cache
from rlagent.models.llama import parameter_count
from rlagent.models.sampler import token_log_probs
from rlagent.text.chat import ChatFormat
from rlagent.text.loop import TextConfig
from rlagent.text.score import make_text_score
from rlagent.text.score import make_text_values
from rlagent.text.update import make_text_update
from rlagent.train.config import TrainConfig
from rlagent.train.ppo import _check_extras


def _numpy_log_softmax(z):
    z = np.asarray(z, np.float64)
    top = z.max(axis=-1, keepdims=True)
    return z - top - np.log(np.exp(z - top).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("block", [None, 128, 1000, 4096])
def test_token_log_probs_equal_a_plain_log_softmax(block):
    """Tiles of 128 columns (the last one padded: 1000 = 7 x 128 + 104), one tile, or a
    tile wider than V: log pi of the chosen ids equals float64 NumPy's log_softmax of
    logits / tau + mask to 2e-5, and the gradients equal those of the [N, V] computation
    (`policy_log_probs`) to 1e-5."""
    from rlagent.models.sampler import policy_log_probs

    keys = jax.random.split(jax.random.key(0), 4)
    hidden = jax.random.normal(keys[0], (3, 5, 16))
    head = jax.random.normal(keys[1], (16, 1000)) * 0.5
    tokens = jax.random.randint(keys[2], (3, 5), 0, 1000)
    banned = jax.random.bernoulli(keys[3], 0.2, (1000,)).at[tokens.ravel()].set(False)
    mask = jnp.where(banned, -jnp.inf, 0.0)  # -inf is clamped to NEG_INF as the sampler does.
    got = token_log_probs(hidden, head, tokens, temperature=0.7, mask=mask, block=block)
    logits = np.asarray(hidden, np.float64) @ np.asarray(head, np.float64) / 0.7
    logits = logits + np.where(np.asarray(banned), NEG_INF, 0.0)
    expected = np.take_along_axis(_numpy_log_softmax(logits), np.asarray(tokens)[..., None], -1)
    np.testing.assert_allclose(got, expected[..., 0], atol=2e-5)

    weights = jax.random.normal(jax.random.key(9), tokens.shape)

    def tiled(hidden, head):
        logp = token_log_probs(hidden, head, tokens, temperature=0.7, mask=mask, block=block)
        return jnp.sum(weights * logp)

    def dense(hidden, head):
        log_pi = policy_log_probs(hidden @ head, temperature=0.7, mask=mask)
        return jnp.sum(weights * jnp.take_along_axis(log_pi, tokens[..., None], -1)[..., 0])

    chex.assert_trees_all_close(
        jax.grad(tiled, argnums=(0, 1))(hidden, head),
        jax.grad(dense, argnums=(0, 1))(hidden, head),
        atol=1e-5,
    )


def test_token_log_probs_keep_no_full_logits_for_the_backward_pass():
    """The backward pass of tiled log-probs saves no [N, V] float32 array: its residuals
    are less than one N x V logit table (the dense computation saves several)."""
    from jax._src.ad_checkpoint import saved_residuals

    hidden = jax.random.normal(jax.random.key(1), (256, 32))
    head = jax.random.normal(jax.random.key(2), (32, 4096))
    tokens = jnp.arange(256) * 7

    def loss(hidden, head):
        logp = token_log_probs(hidden, head, tokens, temperature=1.0, block=512)
        return jnp.sum(logp)

    saved = saved_residuals(loss, hidden, head)
    total = sum(np.prod(aval.shape) * aval.dtype.itemsize for aval, _ in saved)
    assert total < 256 * 4096 * 4, [aval.shape for aval, _ in saved]


def test_token_log_probs_round_logits_as_the_model_computes_them():
    """A bfloat16 head: the log-prob is the log_softmax of `Llama.logits` (its bfloat16
    logits cast to float32) to 1e-5, so a bfloat16 model scores what it sampled."""
    config = dataclasses.replace(TINY_QWEN, num_layers=1)  # bfloat16 params and matmuls.
    lm = Llama(config, rngs=nnx.Rngs(0))
    hidden = jax.random.normal(jax.random.key(3), (4, 6, config.d_model)).astype(jnp.bfloat16)
    tokens = jax.random.randint(jax.random.key(4), (4, 6), 0, config.vocab_size)
    got = token_log_probs(hidden, lm.head(), tokens, temperature=1.0, block=100)
    log_pi = jax.nn.log_softmax(lm.logits(hidden), axis=-1)
    expected = jnp.take_along_axis(log_pi, tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(got, expected, atol=1e-5)


SMALL = PolicyConfig(vocab_size=40, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                     mlp_dim=48)  # fmt: skip


def test_blockwise_attention_equals_the_dense_attention():
    """Blocks of 4 queries (the last of 13 padded) against one dense block: the same hidden
    states to 1e-5 (gradients to float32 rounding) with padding keys switched off, with
    `read` positions and with a cached prefill followed by single-token steps."""
    dense_lm = Llama(dataclasses.replace(SMALL, attention_block=None), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(dense_lm)
    block_def, _ = nnx.split(Llama(dataclasses.replace(SMALL, attention_block=4), rngs=nnx.Rngs(0)))
    tokens = jax.random.randint(jax.random.key(5), (2, 13), 1, SMALL.vocab_size)
    valid = jnp.ones(tokens.shape, bool).at[0, :3].set(False).at[1, 6].set(False)
    weights = jax.random.normal(jax.random.key(6), (2, 13, SMALL.d_model))

    def hidden(graphdef, params, read=None):
        lm = nnx.merge(graphdef, params)
        return lm(lm.embed(tokens), valid, read=read)[0]

    np.testing.assert_allclose(hidden(block_def, params), hidden(graphdef, params), atol=1e-5)
    read = np.array([0, 5, 12])
    np.testing.assert_allclose(
        hidden(block_def, params, read), hidden(graphdef, params, read), atol=1e-5
    )
    grads = [
        jax.grad(lambda p, g=g: jnp.sum(weights * hidden(g, p)))(params)
        for g in (block_def, graphdef)
    ]
    # Gradients reach ~130 here: 2e-4 is float32 rounding of sums taken in another order.
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads[1])) > 50
    chex.assert_trees_all_close(*grads, atol=2e-4, rtol=1e-5)

    # A cache of 16 slots: a query that sees no valid key (row 0's first three) averages
    # all slots, uncached all 13 positions, so here every query sees one valid key.
    seen = valid.at[0, :3].set(True)

    def cached(graphdef):
        lm = nnx.merge(graphdef, params)
        cache = init_cache(SMALL, 2, 16)
        out, cache = lm(lm.embed(tokens[:, :10]), seen[:, :10], cache, 0)
        steps = [out]
        for i in range(10, 13):
            out, cache = lm(lm.embed(tokens[:, i : i + 1]), seen[:, i : i + 1], cache, i)
            steps.append(out)
        return jnp.concatenate(steps, axis=1)

    uncached = dense_lm(dense_lm.embed(tokens), seen)[0]
    np.testing.assert_allclose(cached(block_def), uncached, atol=1e-5)


def _text_setup(micro_batch_size=None, estimator="grpo", **fields):
    """A one-layer float32 policy (vocabulary tiles of 100 of 512) and critic, 8 random
    two-turn episodes in 2 groups, and the TrainConfig of the update."""
    policy = dataclasses.replace(TINY_QWEN, param_dtype="float32", dtype="float32",
                                 num_layers=1, vocab_block=100, attention_block=16)  # fmt: skip
    chat = ChatFormat(None, end_id=1, pad_id=0, vocab_size=500)
    trajectory = text_trajectory(np.random.default_rng(3), batch=8, turns=2, obs_len=6,
                                 turn_len=6, tokenizer_size=500, chat=chat)  # fmt: skip
    graphdef, params = nnx.split(Llama(policy, rngs=nnx.Rngs(0)))
    critic_def, critic = nnx.split(ValueLM(policy, rngs=nnx.Rngs(1)))
    text = TextConfig(max_new_tokens=6, obs_len=6, max_prompt_len=18)
    score = make_text_score(chat, graphdef, policy, text)
    # Behaviour log-probs of a slightly other policy: ratios != 1, so clipping is exercised.
    other = jax.tree.map(lambda x: x * 1.05, params)
    trajectory = trajectory._replace(logp=score(other, trajectory))
    values = make_text_values(chat, critic_def, text) if estimator == "gae_token" else None
    config = TrainConfig(num_groups=2, group_size=4, reward="outcome", estimator=estimator,
                         num_epochs=1, num_minibatches=1, entropy_coef=0.0, kl_placement="loss",
                         kl_coef=0.1, learning_rate=1e-2, micro_batch_size=micro_batch_size,
                         **fields)  # fmt: skip
    return config, score, values, params, critic, trajectory


def test_text_score_equals_the_full_vocabulary_log_softmax():
    """The scorer (log-probs at generated positions only, vocabulary tiles of 100) equals
    log_softmax of the full [B, W, V] logits gathered at the generated ids, to 1e-5."""
    from rlagent.models.sampler import allowed_to_mask
    from rlagent.text.score import _packed_hidden

    config, score, _, params, _, trajectory = _text_setup()
    dense = dataclasses.replace(TINY_QWEN, param_dtype="float32", dtype="float32", num_layers=1)
    lm = Llama(dense, rngs=nnx.Rngs(0))  # the same weights, dense attention and logits.
    packed, hidden = _packed_hidden(lm, trajectory, 0, 24)
    # PAD and the ids >= the tokenizer's 500 are banned, as the loop samples.
    mask = allowed_to_mask((jnp.arange(dense.vocab_size) < 500).at[0].set(False))
    log_pi = jax.nn.log_softmax(lm.logits(hidden[:, :-1]) + mask, axis=-1)
    token_logp = jnp.take_along_axis(log_pi, packed.tokens[:, 1:, None], -1)[..., 0]
    expected = packed.generated(token_logp, trajectory)
    got = score(params, trajectory)
    assert np.asarray(trajectory.loss_mask).sum() > 20
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_micro_batched_reference_and_critic_equal_whole_batch_passes():
    """micro_batch_size = 2 of 8 episodes: the reference's log-probs and the critic's
    V_old (the update's `value_mean`) equal the whole-batch passes to 1e-6."""
    runs = {}
    for micro in (None, 2):
        config, score, values, params, critic, trajectory = _text_setup(micro, "gae_token")
        program = make_text_update(config, score, values=values)
        ref = program.reference(params, trajectory)
        _, metrics = program.update(program.init(params, critic), trajectory, ref)
        runs[micro] = (ref, metrics)
    np.testing.assert_allclose(runs[2][0], runs[None][0], atol=1e-6)
    assert np.abs(np.asarray(runs[None][0])).sum() > 0
    for name in ("value_mean", "value_loss", "loss"):
        assert float(runs[2][1][name]) == pytest.approx(float(runs[None][1][name]), abs=1e-6)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_accumulated_gradient_equals_the_full_batch_gradient_and_update(agg):
    """Gradient accumulation over 4 micro-batches of 2 episodes: the policy's gradient equals
    the whole minibatch's to 2e-5 (float32 sums in another order), its loss statistics are
    the same, and the parameters after the one AdamW step equal the one-step update's to
    1e-6 but for fewer than 0.1% of the elements (those whose gradient is at rounding
    level)."""
    from rlagent.text.update import _accumulated
    from rlagent.text.update import _policy_objective

    out = {}
    for micro in (None, 2):
        config, score, _, params, _, trajectory = _text_setup(micro, agg=agg)
        program = make_text_update(config, score)
        ref = program.reference(params, trajectory)
        advantages = jax.random.normal(jax.random.key(7), trajectory.loss_mask.shape)
        value_and_grad = _accumulated(_policy_objective(config), score, micro)
        (value, stats), grads = jax.jit(value_and_grad)(params, trajectory, advantages, ref)
        state, metrics = program.update(program.init(params), trajectory, ref)
        out[micro] = (value, grads, state.params, metrics)
    (value, grads, stepped, metrics), (value_m, grads_m, stepped_m, metrics_m) = out[None], out[2]
    assert float(value_m) == pytest.approx(float(value), abs=1e-6)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) > 1e-3
    # The tied embedding's gradient sums many positions' terms: float32 rounding of those
    # sums in another order reaches 2e-5 on gradients of up to ~0.1 (4 elements of 32768
    # beyond 1e-6); a wrong normaliser would be off by the gradient's own size.
    chex.assert_trees_all_close(grads_m, grads, atol=2e-5)
    # AdamW's first step moves an element by about the learning rate times the sign of its
    # gradient: an element whose gradient is at rounding level may move otherwise.
    pairs = zip(jax.tree.leaves(stepped_m), jax.tree.leaves(stepped), strict=True)
    diff = np.concatenate([np.abs(np.asarray(a) - np.asarray(b)).ravel() for a, b in pairs])
    assert np.mean(diff > 1e-6) < 1e-3 and diff.max() < 2e-2, (np.mean(diff > 1e-6), diff.max())
    for name, number in metrics.items():
        assert float(metrics_m[name]) == pytest.approx(float(number), rel=1e-5, abs=1e-6), name


def test_micro_batch_refusals_name_the_field():
    base = dict(num_groups=2, group_size=4, num_minibatches=2, entropy_coef=0.0)
    with pytest.raises(ValueError, match="micro_batch_size = 3 must divide a minibatch of 4"):
        TrainConfig(**base, micro_batch_size=3)
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="micro_batch_size must be None or an integer"):
            TrainConfig(**base, micro_batch_size=bad)
    with pytest.raises(ValueError, match="TrainConfig.micro_batch_size=2: the token-level"):
        _check_extras(TrainConfig(**base, micro_batch_size=2), None)
    for name in ("attention_block", "vocab_block"):
        with pytest.raises(ValueError, match=f"PolicyConfig.{name} must be None or >= 1"):
            PolicyConfig(**{name: 0})


def test_parameter_count_is_the_checkpoints():
    """Qwen2.5-0.5B (tied embeddings) has 494,032,768 parameters (its model card's 0.49B;
    transformers' `num_parameters()`), counted from abstract shapes."""
    assert parameter_count(QWEN25_05B) == 494_032_768
    lm = Llama(SMALL, rngs=nnx.Rngs(0))
    assert parameter_count(SMALL) == sum(x.size for x in jax.tree.leaves(nnx.state(lm)))


def test_bench_memory_compiles_and_writes_its_table(tmp_path):
    """experiments.bench_memory at smoke shapes (one layer, 8 episodes of 2 turns of 16
    tokens): the programs compile and report peak = arguments + outputs - aliased + temp."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "memory.json"
    command = [
        sys.executable, "-m", "experiments.bench_memory", "--models=Qwen2.5-0.5B",
        "--layers=1", "--episodes=8", "--rollout_episodes=8", "--turns=2",
        "--first_obs_len=64", "--later_obs_len=16", "--turn_len=16", "--transcript_len=256",
        f"--json_out={out}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=root, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())["models"]["Qwen2.5-0.5B"]
    for program in (result["update"], result["rollout"]["8"]):
        parts = program["argument_bytes"] + program["output_bytes"] - program["alias_bytes"]
        assert program["peak_bytes"] == parts + program["temp_bytes"] > 0
    # The update donates its state: the parameters and AdamW's moments are aliased.
    assert result["update"]["alias_bytes"] > 3 * 2 * result["parameters"] * 0.9
    # The default (cached) engine: its prefill and decode, each donating the KV caches;
    # the rollout's peak is the larger of the two.
    programs = result["rollout"]["8"]["programs"]
    assert set(programs) == {"prefill", "decode"}
    assert all(program["alias_bytes"] > 0 for program in programs.values())
    assert result["rollout"]["8"]["peak_bytes"] == max(p["peak_bytes"] for p in programs.values())


def test_blockwise_attention_keeps_parity_with_transformers():
    """Blocks of 4 queries over 2 x 11 tokens: the logits equal transformers' Llama of the
    same weights to 1e-5, the tolerance of `test_models.py`'s parity test."""
    torch = pytest.importorskip("torch")
    from rlagent.models import hf

    lm = Llama(dataclasses.replace(SMALL, attention_block=4), rngs=nnx.Rngs(0))
    tokens = np.random.RandomState(0).randint(0, SMALL.vocab_size, (2, 11))
    with torch.no_grad():
        reference = hf.to_hf_model(lm)(torch.from_numpy(tokens)).logits.numpy()
    hidden, _ = lm(lm.embed(jnp.asarray(tokens)), jnp.ones(tokens.shape, bool))
    np.testing.assert_allclose(lm.logits(hidden), reference, atol=1e-5)


def test_check_model_rematerialises_checkpoints_above_the_threshold(tmp_path, monkeypatch):
    """`check_model(remat=None)`: off for a checkpoint of at most `REMAT_ABOVE` parameters,
    on above it (the threshold lowered to the tiny checkpoint's size); an explicit
    `remat=False` or `True` is kept."""
    from model_helpers import write_checkpoint
    from text_helpers import tiny_tokenizer

    from rlagent.text import train as text_train

    config = PolicyConfig(vocab_size=768, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1,
                          mlp_dim=64, qkv_bias=True, tie_embeddings=True)  # fmt: skip
    tiny_tokenizer(vocab_size=768).save_pretrained(tmp_path)
    write_checkpoint(tmp_path, config)
    size = parameter_count(config)
    assert not text_train.check_model(str(tmp_path), None).checkpoint.config.remat
    monkeypatch.setattr(text_train, "REMAT_ABOVE", size - 1)
    assert text_train.check_model(str(tmp_path), None).checkpoint.config.remat
    assert not text_train.check_model(str(tmp_path), None, remat=False).checkpoint.config.remat
    monkeypatch.setattr(text_train, "REMAT_ABOVE", size)
    assert text_train.check_model(str(tmp_path), None, remat=True).checkpoint.config.remat
    assert not text_train.check_model(str(tmp_path), None).checkpoint.config.remat
    # The same threshold gives the update one episode per device at a time.
    model = text_train.check_model(str(tmp_path), None)
    train = TrainConfig(num_groups=2, group_size=4)
    assert text_train.with_memory_defaults(train, model).micro_batch_size is None
    monkeypatch.setattr(text_train, "REMAT_ABOVE", size - 1)
    assert text_train.with_memory_defaults(train, model).micro_batch_size == 1
    two_devices = types.SimpleNamespace(size=2)  # what it reads of a mesh
    assert text_train.with_memory_defaults(train, model, two_devices).micro_batch_size == 2
    chosen = dataclasses.replace(train, micro_batch_size=4)
    assert text_train.with_memory_defaults(chosen, model).micro_batch_size == 4
