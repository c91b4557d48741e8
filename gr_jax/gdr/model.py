"""The GDR model: one query encoder feeding a cluster-id decoder and a query vector (Yuan et al. 2024, Sec. 3).

    query tokens -> query encoder -> states [B, L, width] --(bridge)--> T5 decoder + head -> cluster id tokens
                                                      \\--> mean pool -> (projection) -> L2 norm -> r_q [B, dim]

The query encoder is the T5.1.1 encoder of `config` (as the paper, which starts from T5-base), or a dual-encoder
tower (`gr_jax.dense.towers`, e.g. all-MiniLM-L6-v2) whose states reach the T5 decoder's cross-attention through a
linear bridge to the decoder's width: with no pretrained T5 offline, that is how pretrained knowledge reaches the
generative stage. r_q is scored against the frozen document vectors of `gr_jax.gdr.index` (dimension
`document_dim`): a tower of that width is used as is (so a tower initialised from the dense run that encoded the
documents starts out as its query encoder), any other width goes through a learned projection.

`GdrNetwork` is `gr_jax.network.Transformer` with the encoder swapped and a query-vector method, so the decoding
machinery (prefill, incremental decoding, constrained beam search, `score_docids`) is the generative model's own.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, cast

import flax.linen as nn
import jax
import jax.numpy as jnp

from gr_jax import decoding
from gr_jax import network
from gr_jax.docids.trie import Trie
from gr_jax.encoders.minilm import l2_normalize, mean_pool
from gr_jax.gdr.losses import GdrLoss
from gr_jax.models import EncoderDecoderModel
from gr_jax.tower_encoder import TowerEncoderTransformer

Array = jax.Array
Batch = Mapping[str, Array]


class GdrNetwork(TowerEncoderTransformer):
    """T5.1.1 with an optional tower as its encoder (`TowerEncoderTransformer`), and the query vector r_q (see the
    module docstring)."""
    document_dim: int = 0

    def setup(self):
        super().setup()
        if self.document_dim < 1:
            raise ValueError(f"document_dim must be >= 1, got {self.document_dim}")
        needs_projection = self.encoder_tower is None or self.encoder_width != self.document_dim
        self.query_projection = nn.Dense(self.document_dim, name="query_projection") if needs_projection else None

    def query_vector(self, states: Array, encoder_input_tokens: Array) -> Array:
        """r_q float32[B, document_dim], unit length, from the encoder's states [B, L, width]."""
        pooled = mean_pool(states.astype(jnp.float32), encoder_input_tokens > 0)
        if self.query_projection is not None:
            pooled = self.query_projection(pooled)
        return l2_normalize(pooled)

    def query_vectors(self, encoder_input_tokens: Array) -> Array:
        return self.query_vector(self.encoder_states(encoder_input_tokens), encoder_input_tokens)

    def recall_context(self, encoder_input_tokens: Array, *, max_decode_len: int
                       ) -> tuple[network.DecodeContext, Array]:
        """One encoding for both stages at inference: (the decoder's prefill, r_q float32[B, document_dim])."""
        states = self.encoder_states(encoder_input_tokens)
        context = self.prefill_encoded(self.bridged(states), encoder_input_tokens > 0, max_decode_len=max_decode_len)
        return context, self.query_vector(states, encoder_input_tokens)

    def train_outputs(self, encoder_input_tokens: Array, decoder_input_tokens: Array, *,
                      enable_dropout: bool = False) -> tuple[Array, Array, Array]:
        """One pass of both stages over one encoding: (logits, decoder states, r_q)."""
        states = self.encoder_states(encoder_input_tokens, enable_dropout=enable_dropout)
        logits, decoder_states = self.decode(self.bridged(states), encoder_input_tokens, decoder_input_tokens,
                                             enable_dropout=enable_dropout, return_states=True)
        return logits, decoder_states, self.query_vector(states, encoder_input_tokens)


@dataclasses.dataclass(frozen=True)
class GdrModel(EncoderDecoderModel):
    """The GDR network and its loss, as the trainer and the GDR retriever see it. `config` is the T5.1.1 of the
    cluster decoder (and of the query encoder when `encoder_tower` is None); `head` (standard or PAWA) decodes the
    cluster ids. temperature: tau of S_intra, in training and in the retriever's combined score.

    Batches: encoder_input_tokens int32[B, input_length]; decoder_input/target_tokens, decoder_loss_weights
    [B, target_length] (the positive's cluster id); positive_row int32[B], positive_vector float32[B, dim];
    negative_rows int32[B, M] (-1: empty), negative_vectors float32[B, M, dim] (`gr_jax.gdr.data`).
    The query encoder is `encoder_tower` when set (`EncoderDecoderModel`'s, with `train_encoder_tower`).
    """
    document_dim: int = 384
    temperature: float = 0.05
    gdr_loss: GdrLoss = GdrLoss()

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        super().__post_init__()
        if self.head.ranks_in_one_pass:
            head = type(self.head)
            raise ValueError(f"GDR decodes cluster ids by beam search through their trie; the head "
                             f"{head.__module__}.{head.__qualname__} ranks in one pass: use the standard or the pawa "
                             "head")

    @property
    def module(self) -> GdrNetwork:
        return GdrNetwork(self.config, head=self.head, encoder_tower=self.encoder_tower,
                          train_tower=self.train_encoder_tower, document_dim=self.document_dim)

    def init(self, rng: Array, *, input_length: int, target_length: int, batch_size: int = 1) -> Mapping[str, Any]:
        enc = jnp.ones((batch_size, input_length), jnp.int32)
        dec = jnp.ones((batch_size, target_length), jnp.int32)
        return self.module.init({"params": rng, "dropout": rng}, enc, dec, method=GdrNetwork.train_outputs)

    def loss_fn(self, params, batch: Batch, dropout_rng: Optional[Array]) -> tuple[Array, dict]:
        rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
        # Without `mutable`, flax's apply returns the output alone (it types it as maybe (output, state)): so here.
        logits, states, query_vectors = cast(tuple[Array, Array, Array], self.module.apply(
            {"params": params}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
            enable_dropout=dropout_rng is not None, rngs=rngs, method=GdrNetwork.train_outputs))
        return self.gdr_loss(outputs=self.teacher_forced_outputs(logits, states, batch), query_vectors=query_vectors,
                             positive_vectors=batch["positive_vector"], positive_rows=batch["positive_row"],
                             negative_vectors=batch["negative_vectors"], negative_rows=batch["negative_rows"],
                             temperature=self.temperature)

    def query_vectors(self, params, encoder_input_tokens: Array) -> Array:
        """r_q float32[B, document_dim] without dropout."""
        return cast(Array, self.module.apply({"params": params}, encoder_input_tokens,
                                             method=GdrNetwork.query_vectors))

    def recall_batch(self, params, encoder_input_tokens: Array, *, num_beams: int, max_decode_len: int,
                     trie: Trie) -> tuple[decoding.BeamSearchResult, Array]:
        """Both stages' query side from one encoding: the `num_beams` best cluster ids (constrained beam search, as
        `predict_batch`) and r_q float32[B, document_dim]."""
        context, query_vectors = cast(tuple[network.DecodeContext, Array], self.module.apply(
            {"params": params}, encoder_input_tokens, max_decode_len=max_decode_len,
            method=GdrNetwork.recall_context))
        result = self.beam_search_from(params, context, num_beams=num_beams, max_decode_len=max_decode_len, trie=trie)
        return result, query_vectors
