"""T5.1.1 whose encoder is a pretrained dual-encoder tower: how pretrained knowledge reaches a generative model here.

    input tokens (the tower's own vocabulary) -> tower -> states [B, L, hidden] -> bridge (linear) -> [B, L, emb_dim]
                                                                               -> T5.1.1 decoder + head

No pretrained T5 exists offline; all-MiniLM-L6-v2 does (`gr_jax.dense.towers.MiniLMTower`). Its token states reach
the T5 decoder's cross-attention through a linear bridge to the decoder's width, for every head and docid scheme:
the decoding machinery (prefill, incremental decoding, constrained beam search, `score_docids`) reads only
`encode`. GDR's network (`gr_jax.gdr.model`) is this one plus a query vector. Without a tower it is
`network.Transformer` exactly (the same parameters and outputs): users with T5 checkpoints keep the T5 encoder.

Parameters: the tower's under `tower/`, the bridge's under `bridge/`, the decoder's and head's as T5's; the T5
encoder's are never created when a tower encodes.
"""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from gr_jax import network
from gr_jax.dense.towers import Tower

Array = jax.Array


class TowerEncoderTransformer(network.Transformer):
    """`network.Transformer` with `encoder_tower` (None: T5's own encoder) as its encoder. train_tower=False stops
    gradients at the tower's states: no backward pass through it (the family freezes its parameters:
    `Trainer(frozen=)`)."""
    encoder_tower: Optional[Tower] = None
    train_tower: bool = True

    def setup(self):
        super().setup()
        if self.encoder_tower is not None:
            self.tower = self.encoder_tower.module()
            self.bridge = nn.Dense(self.config.emb_dim, dtype=self.config.dtype, name="bridge")

    @property
    def encoder_width(self) -> int:
        """The width of `encoder_states`: the tower's hidden size, or the T5 width."""
        return self.config.emb_dim if self.encoder_tower is None else self.encoder_tower.hidden_size

    def encoder_states(self, encoder_input_tokens: Array, *, enable_dropout: bool = False) -> Array:
        """int32[B, L] -> the encoder's own states [B, L, encoder_width] (the T5 encoder's, or the tower's)."""
        if self.encoder_tower is None:
            return super().encode(encoder_input_tokens, enable_dropout=enable_dropout)
        states = self.tower.token_states(encoder_input_tokens, encoder_input_tokens > 0, not enable_dropout)
        return states if self.train_tower else jax.lax.stop_gradient(states)

    def bridged(self, states: Array) -> Array:
        """Encoder states [B, L, encoder_width] -> what the decoder cross-attends to, [B, L, emb_dim]."""
        return states if self.encoder_tower is None else self.bridge(states.astype(jnp.float32))

    def encode(self, encoder_input_tokens: Array, *, enable_dropout: bool = False) -> Array:
        return self.bridged(self.encoder_states(encoder_input_tokens, enable_dropout=enable_dropout))
