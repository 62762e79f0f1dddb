"""The agent's networks: a Llama policy with a state encoder and a value head.

`Policy` holds an *actor* (`ContextLM` with LM head) and, when
`config.value_head == 'separate'`, a *critic* of the same family (its own trunk, token
embeddings and state encoder, no LM head). With `'shared'` the value head sits on the actor's
final hidden states. Training code works on `graphdef, params = nnx.split(Policy(...))`;
`nnx.merge(graphdef, params)` inside a jitted function gives back a module whose methods
are pure functions of `params`.

Values are read at the same positions as the logits: the value of action token i of a turn
is predicted from the hidden state that also predicts token i (the state before emitting it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rlagent.models.llama import Llama
from rlagent.models.llama import PolicyConfig
from rlagent.models.state_encoder import StateEncoder


class ContextLM(nnx.Module):
    """Llama trunk + state encoder (+ value head): reads the multi-turn context."""

    def __init__(self, config: PolicyConfig, *, lm_head: bool, value_head: bool, rngs: nnx.Rngs):
        self.config = config
        self.lm = Llama(config, lm_head=lm_head, rngs=rngs)
        self.encoder = StateEncoder(config, rngs=rngs)
        if value_head:
            self.value_head = nnx.Linear(
                config.d_model,
                1,
                use_bias=True,
                kernel_init=nnx.initializers.normal(0.02),
                param_dtype=jnp.dtype(config.param_dtype),
                rngs=rngs,
            )
        else:
            self.value_head = None
        if config.copy_prior is None:
            self.copy_gate = None
        else:
            self.copy_gate = nnx.Param(
                jnp.asarray(config.copy_prior, jnp.dtype(config.param_dtype))
            )

    def embed(self, tokens: jax.Array) -> jax.Array:
        """[...] token ids -> [..., D]."""
        return self.lm.embed(tokens)

    def logits(self, hidden: jax.Array, observed: jax.Array | None = None) -> jax.Array:
        """[..., D] -> [..., V] float32.

        `observed` ([..., V] float, broadcastable to the logits): 1 for tokens present in
        the visible observations (`visible_observations`); with a copy gate g the logits get
        `+ g * observed`.
        """
        logits = self.lm.logits(hidden)
        if self.copy_gate is not None and observed is not None:
            logits = logits + self.copy_gate[...].astype(jnp.float32) * observed
        return logits

    def values(self, hidden: jax.Array) -> jax.Array:
        """[..., D] -> [...] float32 state values."""
        if self.value_head is None:
            raise ValueError("this ContextLM has no value head")
        return self.value_head(hidden)[..., 0].astype(jnp.float32)


def observed_tokens(obs_tokens: jax.Array, vocab_size: int, pad_id: int = 0) -> jax.Array:
    """[..., O] int tokens -> [..., V] float32: 1 where a token occurs (PAD excluded)."""
    present = jax.nn.one_hot(obs_tokens, vocab_size, dtype=jnp.float32).max(axis=-2)
    return present.at[..., pad_id].set(0.0)


def visible_observations(observed: jax.Array, window: int | None) -> jax.Array:
    """[B, S, V] per-turn `observed_tokens` -> tokens visible in the context of each turn.

    Turn s sees its own observation and those of the last `window` turns (all earlier
    turns when `window` is None, full context): the copy gate may point at any of them,
    e.g. at an address the user gave before the agent looked the order up.
    """
    if window is None:
        return jax.lax.cummax(observed, axis=1)
    # A running max over the W + 1 shifted copies, not a [B, S, S, V] masked max.
    visible = observed
    for shift in range(1, min(window, observed.shape[1] - 1) + 1):
        earlier = jnp.pad(observed[:, :-shift], ((0, 0), (shift, 0), (0, 0)))
        visible = jnp.maximum(visible, earlier)
    return visible


class ValueLM(nnx.Module):
    """A Llama trunk without LM head and a scalar value head: a critic model on plain token
    sequences (text mode's, `rlagent.text.critic`), no state encoder.

    The head starts at zero (V = 0 everywhere before the first update), so a critic loaded
    from a checkpoint is a function of that checkpoint alone.
    """

    def __init__(self, config: PolicyConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.lm = Llama(config, lm_head=False, rngs=rngs)
        self.value_head = nnx.Linear(
            config.d_model,
            1,
            use_bias=True,
            kernel_init=nnx.initializers.zeros_init(),
            param_dtype=jnp.dtype(config.param_dtype),
            rngs=rngs,
        )

    def values(self, hidden: jax.Array) -> jax.Array:
        """[..., D] final hidden states -> [...] float32 state values."""
        return self.value_head(hidden)[..., 0].astype(jnp.float32)


class Policy(nnx.Module):
    """Actor LM with a shared value head, or actor + separate critic (`config.value_head`)."""

    def __init__(self, config: PolicyConfig, *, rngs: nnx.Rngs):
        self.config = config
        shared = config.value_head == "shared"
        self.actor = ContextLM(config, lm_head=True, value_head=shared, rngs=rngs)
        if shared:
            self.critic = None
        else:
            self.critic = ContextLM(config, lm_head=False, value_head=True, rngs=rngs)

    @property
    def value_model(self) -> ContextLM:
        """The network whose value head gives V(s): the actor or the separate critic."""
        return self.actor if self.critic is None else self.critic
