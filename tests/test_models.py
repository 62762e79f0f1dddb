"""Policy LM, KV cache, sampler and HF conversion (tiny configs)."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlagent.models import Llama
from rlagent.models import PolicyConfig
from rlagent.models import generate
from rlagent.models import init_cache
from rlagent.models import policy_log_probs
from rlagent.models import sample_token
from rlagent.models import visible_observations
from rlagent.models.live_rows import live_map
from rlagent.models.live_rows import live_row_sum
from rlagent.models.live_rows import live_rows

VOCAB = 24
CONFIG = PolicyConfig(
    vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=48
)


@pytest.fixture(scope="module")
def model():
    lm = Llama(CONFIG, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(lm)
    return lm, graphdef, params


@jax.jit
def _uncached_logits(lm_params, tokens, valid):
    lm = nnx.merge(*lm_params)
    hidden, _ = lm(lm.embed(tokens), valid)
    return lm.logits(hidden)


def _teacher_forced(lm, tokens, valid=None):
    valid = jnp.ones(tokens.shape, bool) if valid is None else valid
    return _uncached_logits(nnx.split(lm), tokens, valid)


@jax.jit
def _cached_logits(lm_params, tokens, valid):
    """Prefill 5 tokens, a 2-token chunk, then one token at a time (cache of 14 slots)."""
    lm = nnx.merge(*lm_params)
    cache = init_cache(CONFIG, tokens.shape[0], 14)
    chunks = []
    for start, stop in [(0, 5), (5, 7)] + [(i, i + 1) for i in range(7, tokens.shape[1])]:
        x = lm.embed(tokens[:, start:stop])
        hidden, cache = lm(x, valid[:, start:stop], cache, start)
        chunks.append(lm.logits(hidden))
    return jnp.concatenate(chunks, axis=1)


def test_cached_and_uncached_logits_equal(model):
    lm = model[0]
    tokens = jax.random.randint(jax.random.key(1), (3, 11), 1, VOCAB)
    valid = jnp.ones(tokens.shape, bool).at[0, 2].set(False).at[2, 7].set(False)
    full = _teacher_forced(lm, tokens, valid)
    cached = _cached_logits(nnx.split(lm), tokens, valid)
    np.testing.assert_allclose(cached, full, atol=1e-5)
    # A key marked invalid is ignored: changing that token changes no other position.
    other = tokens.at[0, 2].set((tokens[0, 2] + 1) % VOCAB)
    changed = _teacher_forced(lm, other, valid)
    np.testing.assert_allclose(np.delete(changed[0], 2, 0), np.delete(full[0], 2, 0), atol=1e-6)


def test_read_positions_equal_the_full_pass(model):
    """`read` computes the last block only where it is read: same hidden states, same grads."""
    lm, graphdef, params = model
    tokens = jax.random.randint(jax.random.key(4), (3, 9), 1, VOCAB)
    valid = jnp.ones(tokens.shape, bool).at[1, 3].set(False)
    read = jnp.array([0, 4, 5, 8])

    def hidden(params, read):
        lm = nnx.merge(graphdef, params)
        return lm(lm.embed(tokens), valid, read=read)[0]

    full = hidden(params, None)[:, read]
    np.testing.assert_allclose(hidden(params, read), full, atol=1e-6)
    weights = jax.random.normal(jax.random.key(5), full.shape)
    full_grad = jax.grad(lambda p: jnp.sum(hidden(p, None)[:, read] * weights))(params)
    read_grad = jax.grad(lambda p: jnp.sum(hidden(p, read) * weights))(params)
    chex.assert_trees_all_close(read_grad, full_grad, atol=1e-6)
    # With a cache: the same hidden states at `read`, the same keys and values cached.
    cache = init_cache(CONFIG, 3, 9)
    cached, full_cache = lm(lm.embed(tokens), valid, cache)
    read_cached, read_cache = lm(lm.embed(tokens), valid, cache, read=read)
    np.testing.assert_allclose(read_cached, cached[:, read], atol=1e-6)
    chex.assert_trees_all_close(read_cache, full_cache, atol=1e-6)


def test_remat_gives_the_same_gradients_and_keeps_no_attention_maps(model):
    """`PolicyConfig.remat`: the same loss and gradients (jit, with `read` positions too),
    and the backward pass saves the blocks' inputs only, not every block's T x T maps."""
    from jax._src.ad_checkpoint import saved_residuals

    _, graphdef, params = model
    remat_def, _ = nnx.split(Llama(dataclasses.replace(CONFIG, remat=True), rngs=nnx.Rngs(0)))
    tokens = jax.random.randint(jax.random.key(7), (2, 64), 1, VOCAB)
    valid = jnp.ones(tokens.shape, bool).at[1, :5].set(False)

    def loss(graphdef, read):
        def value(params):
            lm = nnx.merge(graphdef, params)
            hidden, _ = lm(lm.embed(tokens), valid, read=read)
            return jnp.mean(jax.nn.log_softmax(lm.logits(hidden))[..., 1])

        return value

    for read in (None, np.array([3, 40, 63])):
        plain = jax.jit(jax.value_and_grad(loss(graphdef, read)))(params)
        remat = jax.jit(jax.value_and_grad(loss(remat_def, read)))(params)
        # Recomputing the blocks may fuse their sums in another order: float32 rounding
        # (measured up to 1.9e-6 on gradients of ~0.4 on an Intel Xeon), not a wrong value.
        chex.assert_trees_all_close(remat, plain, atol=1e-5)

    def residual_bytes(graphdef):
        saved = saved_residuals(loss(graphdef, None), params)
        return sum(np.prod(aval.shape) * aval.dtype.itemsize for aval, _ in saved)

    attention_maps = CONFIG.num_layers * CONFIG.num_heads * 2 * 64 * 64 * 4  # bytes
    assert residual_bytes(graphdef) - residual_bytes(remat_def) > attention_maps


def test_live_rows_equal_the_masked_pass(model):
    """Only chunks holding live rows are computed; values and gradients equal, vmapped too."""
    _, graphdef, params = model
    x = jax.random.normal(jax.random.key(6), (2, 7, 5, CONFIG.d_model))
    valid = jnp.ones(x.shape[:3], bool).at[:, :, 1].set(False)
    live = jnp.array([[1, 0, 0, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0, 1]], bool)
    weights = jax.random.normal(jax.random.key(7), (2, 7, 2, CONFIG.d_model))
    read = np.array([3, 4])

    def masked(params, x, valid, live, weights):
        hidden = nnx.merge(graphdef, params)(x, valid, read=read)[0]
        return jnp.sum(jnp.where(live[:, None, None], hidden, 0.0) * weights)

    def rows(params, x, valid):
        return nnx.merge(graphdef, params)(x, valid, read=read)[0]

    def packed(params, x, valid, live, weights):
        return jnp.sum(live_rows(rows, num_chunks=3)(params, x, valid, live) * weights)

    want = jax.vmap(jax.value_and_grad(masked, argnums=(0, 1)), (None, 0, 0, 0, 0))
    got = jax.vmap(jax.value_and_grad(packed, argnums=(0, 1)), (None, 0, 0, 0, 0))
    chex.assert_trees_all_close(
        jax.jit(got)(params, x, valid, live, weights),
        jax.jit(want)(params, x, valid, live, weights),
        atol=1e-5,
    )
    hidden = live_rows(rows, num_chunks=2)(params, x[0], valid[0], live[0])
    np.testing.assert_array_equal(hidden[~live[0]], 0.0)
    np.testing.assert_allclose(hidden[live[0]], rows(params, x[0], valid[0])[live[0]], atol=1e-6)


def test_live_map_equals_the_masked_map():
    """Live rows only (keys travel with their rows), zeros elsewhere; vmapped, a member's
    parameters per chunk; one pass over every row when nearly all are live."""

    def fn(weights, rows):
        x, keys = rows
        noise = jax.vmap(lambda key: jax.random.normal(key, (3,)))(keys)
        return {"y": x @ weights + noise, "positive": x.sum(-1) > 0}

    weights = jax.random.normal(jax.random.key(0), (3, 4, 3))
    x = jax.random.normal(jax.random.key(1), (3, 10, 4))
    keys = jax.random.split(jax.random.key(2), 30).reshape(3, 10)
    live = jax.random.bernoulli(jax.random.key(3), 0.4, (3, 10)).at[2].set(True)

    def want(live):
        out = jax.vmap(fn)(weights, (x, keys))
        mask = lambda a: jnp.where(live.reshape(3, 10, *[1] * (a.ndim - 2)), a, False)  # noqa: E731
        return jax.tree.map(mask, out)

    batched, alone = jax.jit(jax.vmap(live_map(fn, 4))), jax.jit(live_map(fn, 3))
    for rows in (live, live.at[:2].set(True)):  # chunks; then 26 of 30 rows live
        chex.assert_trees_all_close(batched(weights, (x, keys), rows), want(rows), atol=1e-6)
        first = jax.tree.map(lambda a: a[0], want(rows))
        chex.assert_trees_all_close(alone(weights[0], (x[0], keys[0]), rows[0]), first, atol=1e-6)


def test_live_row_sum_equals_the_masked_sum(model):
    """Sums over live rows, with the gradients of the masked sum; stats summed too, vmapped."""
    _, graphdef, params = model
    x = jax.random.normal(jax.random.key(6), (2, 7, 5, CONFIG.d_model))
    valid = jnp.ones(x.shape[:3], bool).at[:, :, 1].set(False)
    live = jnp.array([[1, 0, 0, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0, 1]], bool)
    read = np.array([3, 4])

    def rows(params, x, valid):
        hidden = nnx.merge(graphdef, params)(x, valid, read=read)[0]
        return jnp.sum(jnp.sin(hidden), axis=(1, 2)), {"norm": jnp.sum(hidden**2, axis=(1, 2))}

    def masked(params, x, valid, live):
        value, stats = rows(params, x, valid)
        return jnp.sum(jnp.where(live, value, 0.0)), {"norm": jnp.sum(stats["norm"] * live)}

    def summed(params, x, valid, live):
        return live_row_sum(rows, num_chunks=3)(params, x, valid, live)

    want = jax.vmap(jax.value_and_grad(masked, argnums=(0, 1), has_aux=True), (None, 0, 0, 0))
    got = jax.vmap(jax.value_and_grad(summed, argnums=(0, 1), has_aux=True), (None, 0, 0, 0))
    chex.assert_trees_all_close(
        jax.jit(got)(params, x, valid, live), jax.jit(want)(params, x, valid, live), atol=1e-5
    )


def test_live_row_sum_packs_members_of_a_vmap(model):
    """Vmapped with batched params, the chunks of all members are packed into shared steps,
    each run with its member's params (live counts 0, 2, 7 and 5 of 7 rows): sums and
    gradients of the masked sum. (The test above covers unbatched params.)"""
    _, graphdef, params = model
    members = jax.tree.map(
        lambda p: p * (1.0 + 0.1 * jnp.arange(4.0).reshape(-1, *[1] * p.ndim)), params
    )
    x = jax.random.normal(jax.random.key(8), (4, 7, 5, CONFIG.d_model))
    valid = jnp.ones(x.shape[1:3], bool).at[:, 2].set(False)
    live = jnp.array([[0] * 7, [0, 1, 0, 0, 0, 1, 0], [1] * 7, [1, 1, 0, 1, 1, 0, 1]], bool)
    read = np.array([3, 4])

    def rows(params, x, valid):
        hidden = nnx.merge(graphdef, params)(x, valid, read=read)[0]
        return jnp.mean(jnp.cos(hidden), axis=(1, 2)), {"max": jnp.max(hidden, axis=(1, 2))}

    def masked(params, x, valid, live):
        value, stats = rows(params, x, valid)
        return jnp.sum(jnp.where(live, value, 0.0)), {"max": jnp.sum(stats["max"] * live)}

    def summed(params, x, valid, live):
        return live_row_sum(rows, num_chunks=3)(params, x, valid, live)

    axes = (0, 0, None, 0)
    want = jax.vmap(jax.value_and_grad(masked, argnums=(0, 1), has_aux=True), axes)
    got = jax.vmap(jax.value_and_grad(summed, argnums=(0, 1), has_aux=True), axes)
    chex.assert_trees_all_close(
        jax.jit(got)(members, x, valid, live), jax.jit(want)(members, x, valid, live), atol=1e-5
    )


@pytest.mark.parametrize("window", [None, 0, 1, 3, 9])
def test_visible_observations_by_brute_force(window):
    observed = (np.random.RandomState(0).rand(2, 6, 5) < 0.3).astype(np.float32)
    want = np.zeros_like(observed)
    for s in range(6):
        first = 0 if window is None else max(0, s - window)
        want[:, s] = observed[:, first : s + 1].max(axis=1)
    np.testing.assert_array_equal(visible_observations(jnp.asarray(observed), window), want)


def test_causality(model):
    lm = model[0]
    tokens = jax.random.randint(jax.random.key(2), (1, 8), 1, VOCAB)
    base = _teacher_forced(lm, tokens)
    changed = _teacher_forced(lm, tokens.at[0, 5].set((tokens[0, 5] + 3) % VOCAB))
    np.testing.assert_array_equal(changed[0, :5], base[0, :5])
    assert np.abs(changed[0, 5:] - base[0, 5:]).max() > 1e-4


def test_config_errors():
    with pytest.raises(ValueError, match="num_kv_heads"):
        PolicyConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="value_head"):
        PolicyConfig(value_head="both")
    lm = Llama(CONFIG, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="d_model"):
        lm(jnp.zeros((1, 3, 16)), jnp.ones((1, 3), bool))


def test_generate_obeys_mask_stops_at_end_and_scores(model):
    lm, graphdef, params = model
    prompt = jax.random.randint(jax.random.key(3), (4, 5), 1, VOCAB)
    allowed = jnp.zeros((VOCAB,), bool).at[jnp.array([3, 7, 11])].set(True)
    mask = jnp.where(allowed, 0.0, -jnp.inf)
    out = generate(
        graphdef,
        params,
        prompt,
        jax.random.key(4),
        max_new_tokens=12,
        temperature=0.7,
        logits_mask=mask,
        end_id=3,
    )
    tokens, logp, live = map(np.asarray, out)
    assert np.isin(tokens[live], [3, 7, 11]).all()
    for row in range(4):
        ends = np.flatnonzero(tokens[row] == 3)
        stop = ends[0] + 1 if len(ends) else tokens.shape[1]
        assert live[row, :stop].all() and not live[row, stop:].any()
        assert (tokens[row, stop:] == 0).all() and (logp[row, stop:] == 0).all()
    assert (tokens == 3).any(), "no row reached END: the stop logic went untested"
    # Behaviour log-probs equal teacher-forced log pi (temperature-scaled, masked).
    seq = jnp.concatenate([prompt, jnp.asarray(tokens)], axis=1)
    logits = _teacher_forced(lm, seq, jnp.concatenate([jnp.ones_like(prompt, bool), live], 1))
    log_pi = policy_log_probs(logits[:, 4:-1], temperature=0.7, mask=mask)
    expected = np.take_along_axis(np.asarray(log_pi), tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.where(live, logp, 0), np.where(live, expected, 0), atol=1e-5)


def test_greedy_is_argmax(model):
    lm, graphdef, params = model
    prompt = jax.random.randint(jax.random.key(5), (2, 4), 1, VOCAB)
    out = generate(graphdef, params, prompt, jax.random.key(0), max_new_tokens=6, temperature=0)
    seq = jnp.concatenate([prompt, out.tokens], axis=1)
    logits = _teacher_forced(lm, seq)
    np.testing.assert_array_equal(out.tokens, jnp.argmax(logits[:, 3:-1], axis=-1))


_sample_many = jax.jit(
    jax.vmap(
        lambda key, logits, k, p: sample_token(key, logits, top_k=k, top_p=p)[0],
        in_axes=(0, None, None, None),
    ),
    static_argnums=(2, 3),
)


def test_sampling_frequencies_top_k_top_p():
    logits = jnp.log(jnp.array([0.4, 0.25, 0.15, 0.12, 0.08]))
    keys = jax.random.split(jax.random.key(0), 20000)
    freq = np.bincount(np.asarray(_sample_many(keys, logits, 0, 1.0)), minlength=5) / 20000
    np.testing.assert_allclose(freq, [0.4, 0.25, 0.15, 0.12, 0.08], atol=0.015)
    top2 = np.bincount(np.asarray(_sample_many(keys, logits, 2, 1.0)), minlength=5) / 20000
    np.testing.assert_allclose(top2, [0.4 / 0.65, 0.25 / 0.65, 0, 0, 0], atol=0.015)
    # Nucleus 0.7: {0.4, 0.25} has mass 0.65 < 0.7, so the smallest set reaching it adds 0.15.
    nucleus = np.bincount(np.asarray(_sample_many(keys, logits, 0, 0.7)), minlength=5) / 20000
    np.testing.assert_allclose(nucleus, np.array([0.4, 0.25, 0.15, 0, 0]) / 0.8, atol=0.015)


def test_sampler_argument_errors():
    with pytest.raises(ValueError, match="top_p"):
        sample_token(jax.random.key(0), jnp.zeros(4), top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        policy_log_probs(jnp.zeros(4), temperature=-1.0)


def test_hf_llama_parity_and_round_trip(model):
    import torch

    from rlagent.models import hf

    lm = model[0]
    hf_model = hf.to_hf_model(lm)
    tokens = np.random.RandomState(0).randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        reference = hf_model(torch.from_numpy(tokens)).logits.numpy()
    np.testing.assert_allclose(_teacher_forced(lm, jnp.asarray(tokens)), reference, atol=1e-5)
    back = hf.from_hf_model(hf_model)
    assert back.config.num_kv_heads == CONFIG.num_kv_heads
    np.testing.assert_allclose(_teacher_forced(back, jnp.asarray(tokens)), reference, atol=1e-5)
