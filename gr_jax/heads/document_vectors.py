"""Atomic docids whose output columns are the documents' vectors from an encoder (e.g. all-MiniLM-L6-v2's
embeddings of the collection): log p(docid | query) = softmax over docids of (decoder state . P) . v_docid.

DSI's atomic head learns one free column per document, so a document no training query names is reachable only
through what its indexing examples taught that column. Here column i is document i's vector v_i (float32[dim], fixed
by default), and the decoder learns only the projection P [embed, dim] that maps its start state into that space:
what it learns from queried documents carries over to every other one, as a dense retriever's query encoder does,
while retrieval stays the generative model's one decoding step over the whole corpus (`AtomicHead.rank`).

gin: `HEAD = @document_vectors.DocumentVectorHead()`, `document_vectors.DocumentVectorHead.vectors_path = '...'`
(gin_configs/decoders/atomic_document_vectors.gin): a .npy of float32[N, dim], row i the vector of the collection's
document i (the atomic docid order), e.g. `DATA_DIR/embeddings.minilm.npy` (`gr_jax.tools.semantic_ids` writes it).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.heads.atomic import AtomicHead, AtomicLayer
from gr_jax.heads.base import HeadLayer, masked_logits
from gr_jax.network import EMBED, KV, VOCAB, fan_in_init, logical_param

Array = jax.Array


class DocumentVectorLayer(AtomicLayer):
    """`docid_projection` [embed, dim] (learnt) and `docid_vectors` [dim, columns] (the documents' vectors, given
    at initialisation; padding columns zero and masked)."""

    if TYPE_CHECKING:
        head: DocumentVectorHead

    def setup(self):
        cfg, head = self.config, self.head
        self.docid_projection = logical_param(self, "docid_projection", fan_in_init(1),
                                              (cfg.emb_dim, head.vector_dim), (EMBED, KV), cfg.param_dtype)
        self.docid_vectors = logical_param(self, "docid_vectors", jax.nn.initializers.zeros,
                                           (head.vector_dim, head.columns()), (KV, VOCAB), cfg.param_dtype)

    def docid_logits(self, states: Array) -> Array:
        """states [..., embed] -> float32 logits over the docid columns [..., columns] (padding columns NEG_INF)."""
        _, size = self.head.docid_tokens()
        queries, kernel = self.head.ranking_operands({"docid_projection": self.docid_projection,
                                                      "docid_vectors": self.docid_vectors}, states)
        logits = jnp.einsum("...k,kv->...v", queries, kernel)
        return masked_logits(logits, jnp.arange(self.head.columns()) < size)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DocumentVectorHead(AtomicHead):
    """Settings: vectors_path (float32[N, dim] .npy, row i = the collection's document i); train_vectors (False:
    the vectors stay as given, no gradient and no optimizer update; True: fine-tuned with the rest); the docid
    token range (`OverDocidTokens`)."""

    layer_class: ClassVar[type[HeadLayer]] = DocumentVectorLayer
    vectors_path: str = ""
    train_vectors: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.vectors_path:
            raise ValueError("DocumentVectorHead needs vectors_path: a .npy of the documents' vectors")

    @property
    def vector_dim(self) -> int:
        shape = self._vectors().shape
        if len(shape) != 2:
            raise ValueError(f"{self.vectors_path}: document vectors must be [documents, dim], got shape {shape}")
        return int(shape[1])

    def _vectors(self) -> np.ndarray:
        return np.load(self.vectors_path, mmap_mode="r")

    def ranking_operands(self, params: Mapping[str, Any], states: Array) -> tuple[Array, Array]:
        """(queries [..., dim] = states . P, kernel [dim, columns]): the docid logits are queries . kernel."""
        vectors = params["docid_vectors"]
        if not self.train_vectors:
            vectors = jax.lax.stop_gradient(vectors)
        queries = jnp.einsum("...d,dk->...k", states, params["docid_projection"].astype(states.dtype))
        return queries, vectors.astype(states.dtype)

    def fresh_param_patterns(self, config):
        return (*super().fresh_param_patterns(config), r"docid_projection", r"docid_vectors")

    def frozen_param_pattern(self) -> Optional[str]:
        """The vectors unless trained ('/value': the leaf of its Flax box where the tree holds boxes)."""
        return None if self.train_vectors else "docid_vectors(/value)?"

    def pretrained_params(self, *, abstract: Mapping[str, Any]) -> dict[str, Any]:
        """`docid_vectors`: the file's rows as columns, padded with zero columns, placed on `abstract`'s sharding.
        The file must hold exactly one row per docid."""
        vectors = self._vectors()
        _, size = self.docid_tokens()
        if vectors.shape[0] != size:
            raise ValueError(f"{self.vectors_path}: {vectors.shape[0]} document vectors for {size} atomic docids "
                             f"(one row per document of the collection, in its order)")
        target = abstract["docid_vectors"]
        kernel = np.zeros(target.shape, target.dtype)
        kernel[:, :size] = np.asarray(vectors, np.float32).T
        return {"docid_vectors": jax.device_put(kernel, target.sharding)}
