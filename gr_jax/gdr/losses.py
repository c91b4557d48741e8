"""GDR's training objective: the cluster id's likelihood plus a contrastive loss inside and across clusters.

Per query q with positive document d+ (GDR-style: the paper file gives the terms, not their exact form):

    L_inter(q) = -log p(CID(d+) | q)                   the cluster id's sequence NLL (+ t5x's z-loss per token)
                                                       or, with soft targets (a teacher's ranking, `gr_jax.gdr.data`),
                                                       the cross entropy against them at each position
    L_intra(q) = -log  e^{s+} / (e^{s+} + sum_{N_r} e^{s} + w * sum_{N_a} e^{s}),     s = S(q, d) / tau
    L(q)       = inter_weight * L_inter(q) + intra_weight * L_intra(q)

N_r, the inter-cluster negatives, are the other queries' positives in the global batch (in-batch negatives; a
candidate that is q's own positive document again is masked out); N_a, the cluster-adaptive negatives, are
documents sampled from d+'s own cluster (`gr_jax.gdr.data`), weighted by w = `cluster_negative_weight` (> 1:
"weighted to emphasise intra-cluster discrimination"). Document vectors are the frozen encoder's (memorising-free:
new documents need only an encoding), so only the query side learns from L_intra.

The loss is a sum over queries reported as an average per query (`gr_jax.metrics`), so the trainer's update is
that of the mean of L(q). Metrics, each per query: loss, inter_loss, intra_loss, z_loss, sequence_accuracy (queries
whose cluster id is predicted exactly, teacher-forced), intra_correct (queries whose positive scores above every
candidate), candidates.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from gr_jax import losses
from gr_jax.metrics import AnyMetric, Average
from gr_jax.network import NEG_INF

Array = jax.Array


def _replicated(x: Array) -> Array:
    """All-gathers `x` over the 'data' mesh axis (a no-op outside a mesh), as the dual encoder's candidates."""
    return nn.with_logical_constraint(x, (None,) * x.ndim)


@dataclasses.dataclass(frozen=True)
class GdrLoss:
    """See the module docstring."""
    inter_weight: float = 1.0
    intra_weight: float = 1.0
    cluster_negative_weight: float = 2.0
    in_batch_negatives: bool = True
    z_loss: float = 1e-4

    def __post_init__(self):
        if self.inter_weight < 0 or self.intra_weight < 0 or self.inter_weight + self.intra_weight == 0:
            raise ValueError(f"inter_weight and intra_weight must be >= 0 and not both 0, got {self.inter_weight} "
                             f"and {self.intra_weight}")
        if not self.cluster_negative_weight > 0:
            raise ValueError(f"cluster_negative_weight must be > 0, got {self.cluster_negative_weight}")

    def intra_logits(self, *, query_vectors: Array, positive_vectors: Array, positive_rows: Array,
                     negative_vectors: Array, negative_rows: Array, temperature: float) -> tuple[Array, Array]:
        """(logits float32[B, C], competing bool[B, C]) of L_intra: C = B in-batch candidates (query i's positive
        is column i) then M cluster negatives per query, log(w) already added to the latter.

        query_vectors, positive_vectors: float32[B, d]; positive_rows: int32[B]; negative_vectors: [B, M, d];
        negative_rows: int32[B, M], -1 for an empty slot."""
        batch = query_vectors.shape[0]
        candidates = _replicated(positive_vectors.astype(jnp.float32))
        candidate_rows = _replicated(positive_rows)
        in_batch = query_vectors @ candidates.T / temperature  # [B, B_global]
        rows = jnp.arange(batch)
        is_positive = jnp.arange(in_batch.shape[1])[None, :] == rows[:, None]
        same_document = candidate_rows[None, :] == positive_rows[:, None]
        in_batch_ok = is_positive | (~same_document & self.in_batch_negatives)
        cluster = jnp.einsum("bd,bmd->bm", query_vectors, negative_vectors.astype(jnp.float32)) / temperature
        cluster = cluster + jnp.log(self.cluster_negative_weight)
        cluster_ok = (negative_rows >= 0) & (negative_rows != positive_rows[:, None])
        return (jnp.concatenate([in_batch, cluster], axis=1),
                jnp.concatenate([in_batch_ok, cluster_ok], axis=1))

    def __call__(self, *, outputs: losses.Outputs, query_vectors: Array, positive_vectors: Array,
                 positive_rows: Array, negative_vectors: Array, negative_rows: Array,
                 temperature: float) -> tuple[Array, dict[str, AnyMetric]]:
        """(summed loss, metrics); `outputs` is the teacher-forced pass over the cluster ids."""
        token_loss, z = losses.target_cross_entropy(outputs, z_loss=self.z_loss)
        weights = outputs.weights
        inter = jnp.sum(token_loss * weights, axis=-1)  # [B]
        has_target = (jnp.sum(weights, axis=-1) > 0).astype(jnp.float32)
        correct_tokens = (jnp.argmax(outputs.logits, axis=-1) == outputs.columns) | (weights == 0)
        logits, competing = self.intra_logits(
            query_vectors=query_vectors, positive_vectors=positive_vectors, positive_rows=positive_rows,
            negative_vectors=negative_vectors, negative_rows=negative_rows, temperature=temperature)
        masked = jnp.where(competing, logits, NEG_INF)
        positive = jnp.take_along_axis(logits, jnp.arange(logits.shape[0])[:, None], axis=1)[:, 0]
        intra = jax.nn.logsumexp(masked, axis=-1) - positive
        intra_correct = (jnp.argmax(masked, axis=-1) == jnp.arange(logits.shape[0])).astype(jnp.float32)
        per_query = (self.inter_weight * inter + self.intra_weight * intra) * has_target
        queries, loss = jnp.sum(has_target), jnp.sum(per_query)
        metrics: dict[str, AnyMetric] = {name: Average(total=total, count=queries) for name, total in (
            ("loss", loss),
            ("inter_loss", jnp.sum(inter * has_target)),
            ("intra_loss", jnp.sum(intra * has_target)),
            ("z_loss", jnp.sum(jnp.sum(z * weights, axis=-1) * has_target)),
            ("sequence_accuracy", jnp.sum(jnp.all(correct_tokens, axis=-1) * has_target)),
            ("intra_correct", jnp.sum(intra_correct * has_target)),
            ("candidates", jnp.sum(jnp.sum(competing, axis=-1) * has_target)))}
        return loss, metrics
