"""T5.1.1's output layer: the untied projection `logits_dense` [embed, vocab] at every decoder position.

gin: `HEAD = @standard.StandardHead()` (gin_configs/decoders/standard.gin; the default of every model). No settings
of its own: the vocabulary it covers is the network's (`T5Config.output_vocab_size`, else `vocab_size`).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Optional

import jax
import jax.numpy as jnp
from flax import linen as nn

from gr_jax.heads.base import HeadLayer, OutputHead
from gr_jax.network import BATCH, EMBED, LENGTH, VOCAB, T5Config, fan_in_init, logical_param

Array = jax.Array


class StandardLayer(HeadLayer):
    """`logits_dense` [embed, logits_vocab_size] applied to the decoder's states."""

    def setup(self):
        cfg = self.config
        self.logits_dense = logical_param(self, "logits_dense", fan_in_init(1),
                                          (cfg.emb_dim, self.head.logits_vocab_size(cfg)), (EMBED, VOCAB),
                                          cfg.param_dtype)

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class StandardHead(OutputHead):
    """T5.1.1's projection over the vocabulary (see the module docstring)."""

    # Declared as the base's: a subclass's layer (PAWA's) takes that subclass as its `head`.
    layer_class: ClassVar[type[HeadLayer]] = StandardLayer

    def lm_head_parameter(self, config: T5Config) -> Optional[str]:
        """`logits_dense`, when its columns are the input vocabulary's tokens (a pretrained lm_head's rows)."""
        return "logits_dense" if self.logits_vocab_size(config) == config.vocab_size else None

    def fresh_param_patterns(self, config: T5Config) -> tuple[str, ...]:
        """`logits_dense` when it covers another vocabulary than the input's: nothing pretrained to copy."""
        return (*super().fresh_param_patterns(config), *(() if self.lm_head_parameter(config) else (r"logits_dense",)))
