"""T5.1.1's output layer: the untied projection `logits_dense` [embed, vocab] at every decoder position."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from gr_jax.heads.base import OutputHead, register_head
from gr_jax.network import BATCH, EMBED, LENGTH, VOCAB, fan_in_init, logical_param

Array = jax.Array


@register_head("standard")
class StandardHead(OutputHead):

    def setup(self):
        cfg = self.config
        self.logits_dense = logical_param(self, "logits_dense", fan_in_init(1),
                                          (cfg.emb_dim, self.logits_vocab_size(cfg)), (EMBED, VOCAB), cfg.param_dtype)

    def project(self, states: Array) -> Array:
        """states [..., embed] -> float32 logits [..., logits_vocab_size]."""
        logits = jnp.einsum("...d,dv->...v", states, self.logits_dense.astype(self.config.dtype))
        return nn.with_logical_constraint(logits.astype(jnp.float32), (BATCH, LENGTH, VOCAB)[-logits.ndim:])

    def __call__(self, states, *, embedded, encoded, cross_mask, deterministic):
        del embedded, encoded, cross_mask, deterministic
        return self.project(states)

    def step(self, states, *, embedded, position, cache, context, cross_mask):
        del embedded, position, cache, context, cross_mask
        return self.project(states)[:, 0], ()
