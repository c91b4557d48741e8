"""Token losses and NCI's consistency regularisers, per target position (callers weight and sum them).

Everything is computed in float32 from logits (log space); masked logits are the network's finite NEG_INF, so no
term is inf - inf and padding positions are zeroed by the caller's weights, never by multiplying an inf.

Consistency (NCI, Wang et al. 2022, Sec. 3.4; R-Drop): the same batch goes through the network twice with
different dropout masks, and the two passes are pulled together at every valid target position, either
  * 'symmetric_kl': 1/2 [KL(p1 || p2) + KL(p2 || p1)] of the two output distributions (R-Drop's form), or
  * 'contrastive':  NCI's Eq. 5, a softmax over the batch: the decoder state of pass 1 must pick out its own pass-2
    state among the states of all other examples (and vice versa), as `Rdrop_loss="Contrast"` in NCI's code.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from gr_jax.network import CONSISTENCY_LOSSES, NEG_INF

Array = jax.Array

__all__ = ["CONSISTENCY_LOSSES", "contrastive_consistency", "cross_entropy_with_z_loss", "symmetric_kl"]


def cross_entropy_with_z_loss(logits: Array, targets: Array, *, z_loss: float) -> tuple[Array, Array]:
    """Token-level cross entropy plus t5x's z-loss (keeps log Z near 0, which stabilises bfloat16 training).

    logits: float32[..., vocab], targets: int32[...] -> (total loss [...], z-loss part [...]).
    """
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    z = z_loss * jnp.square(log_z)
    return log_z - target_logit + z, z


def symmetric_kl(logits_a: Array, logits_b: Array) -> Array:
    """1/2 [KL(p_a || p_b) + KL(p_b || p_a)] per position: float32[..., vocab] x 2 -> float32[...], >= 0.

    Uses the identity 1/2 sum_v (p_a - p_b)(log p_a - log p_b): every term is >= 0 (log is increasing), so
    rounding can never make the sum negative, and columns masked in both passes contribute exactly 0.
    """
    log_a = jax.nn.log_softmax(logits_a.astype(jnp.float32), axis=-1)
    log_b = jax.nn.log_softmax(logits_b.astype(jnp.float32), axis=-1)
    return 0.5 * jnp.sum((jnp.exp(log_a) - jnp.exp(log_b)) * (log_a - log_b), axis=-1)


def contrastive_consistency(states_a: Array, states_b: Array, valid: Array, *, temperature: float = 1.0) -> Array:
    """NCI's Eq. 5 per position: float32[batch, length].

    states_a, states_b: [batch, length, embed], the decoder's final states of the two passes (what the output layer
    reads); valid: bool[batch, length], the positions with a target. At each position t, the 2 * batch states are
    compared by scaled dot product <z, z'> / (embed * temperature) (NCI scales states by embed^-1/2 before their dot
    product); each state's positive is the other pass of the same example, its negatives are every other valid state
    of that position in both passes (itself excluded). The value at (i, t) is the mean of the two directions'
    cross entropies; invalid positions are 0. A position with one valid example has no negative: its value is 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    batch, _, embed = states_a.shape
    z = jnp.concatenate([states_a, states_b], axis=0).astype(jnp.float32)  # [2B, L, d]
    ok = jnp.concatenate([valid, valid], axis=0)  # [2B, L]
    sim = jnp.einsum("itd,jtd->tij", z, z) / (embed * temperature)  # [L, 2B, 2B]
    rows = jnp.arange(2 * batch)
    allowed = ok.T[:, None, :] & (rows[:, None] != rows[None, :])[None]  # [L, 2B (query), 2B (candidate)]
    sim = jnp.where(allowed, sim, NEG_INF)
    positive = (rows + batch) % (2 * batch)  # the other pass of the same example
    positive_sim = jnp.take_along_axis(sim, jnp.broadcast_to(positive[None, :, None], sim.shape[:2] + (1,)),
                                       axis=-1)[..., 0]
    per_state = jax.nn.logsumexp(sim, axis=-1) - positive_sim  # [L, 2B]
    per_state = jnp.where(ok.T, per_state, 0.0)
    return (0.5 * (per_state[:, :batch] + per_state[:, batch:])).T  # [B, L]
