"""Training losses of a dual encoder over the candidates of a batch (`DualEncoderModel.candidate_scores`).

A loss gets logits float32[B, C] (S / tau of each query against every candidate of the global batch; query i's
positive is candidate i), each candidate's owner int32[C] (the query whose positive or hard negative it is) and the
candidates that may compete bool[B, C], and returns a summed loss with its metrics (`gr_jax.metrics`); the trainer
divides the gradient by the loss's count (the number of queries), so the update is that of the mean over queries.

  * `SampledSoftmax`: `gr_vs_dense_limitations.txt` Eq. 2, -log P(d+ | q; N(q)) with the local softmax of Eq. 1
    over the positive and N(q): the query's own K hard negatives, plus (`in_batch_negatives`) every other query's
    positive and negatives (DPR's in-batch negatives).
A new objective (a lambda-weighted softmax, GDR's cluster-weighted negatives) is one new class here.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol

import jax
import jax.numpy as jnp

from gr_jax.metrics import AnyMetric, Average
from gr_jax.network import NEG_INF

Array = jax.Array


class DenseLoss(Protocol):
    def __call__(self, *, logits: Array, owner: Array, valid: Array) -> tuple[Array, dict[str, AnyMetric]]: ...


@dataclasses.dataclass(frozen=True)
class SampledSoftmax:
    """Eq. 2 (see the module docstring). Metrics (`gr_jax.metrics`), each an average per query: loss;
    candidates (the number each query's softmax ran over); sequence_accuracy (queries whose positive scored
    highest: in-batch top-1 accuracy); log_z_k (log Z_K, the local normaliser of Eq. 8, in units of S / tau)."""
    in_batch_negatives: bool = True

    def competing(self, *, owner: Array, valid: Array) -> Array:
        """bool[B, C]: the candidates in each query's softmax, N(q) and its positive."""
        batch, num_candidates = valid.shape
        query = jnp.arange(batch)
        competing = valid & ((owner[None, :] == query[:, None]) | self.in_batch_negatives)
        return competing | (jnp.arange(num_candidates)[None, :] == query[:, None])  # the positive always

    def log_normalizer(self, *, logits: Array, owner: Array, valid: Array) -> Array:
        """float32[B]: log Z_K of each query (Eq. 8 over `competing`), in units of S / tau."""
        return jax.nn.logsumexp(jnp.where(self.competing(owner=owner, valid=valid), logits, NEG_INF), axis=-1)

    def __call__(self, *, logits: Array, owner: Array, valid: Array) -> tuple[Array, dict[str, AnyMetric]]:
        batch, num_candidates = logits.shape
        query = jnp.arange(batch)
        competing = self.competing(owner=owner, valid=valid)
        masked = jnp.where(competing, logits, NEG_INF)
        log_z_k = jax.nn.logsumexp(masked, axis=-1)
        positive = jnp.take_along_axis(logits, query[:, None], axis=-1)[:, 0]
        per_query = log_z_k - positive
        correct = (jnp.argmax(masked, axis=-1) == query).astype(jnp.float32)
        queries, loss = jnp.float32(batch), jnp.sum(per_query)
        metrics: dict[str, AnyMetric] = {
            "loss": Average(total=loss, count=queries),
            "sequence_accuracy": Average(total=jnp.sum(correct), count=queries),
            "candidates": Average(total=jnp.sum(competing.astype(jnp.float32)), count=queries),
            "log_z_k": Average(total=jnp.sum(log_z_k), count=queries),
        }
        return loss, metrics
