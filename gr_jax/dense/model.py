"""A dual encoder (DPR; `gr_vs_dense_limitations.txt` Eqs. 1-2) and its multi-vector variant (ColBERT v1's MaxSim,
the paper's MVDR), as a model the project's `Trainer` trains like the generative one.

    S(q, d) = e_q . e_d                              (single vector: pooled tower states, optionally projected)
    S(q, d) = sum_i max_j e_{q,i} . e_{d,j}          (multi-vector: one vector per real token, MaxSim)
    P(d | q; N) = exp(S(q, d) / tau) / sum_{d' in {d} u N(q)} exp(S(q, d') / tau)        (Eq. 1, local softmax)

Towers (`gr_jax.dense.towers`) give per-token states; an optional 2-layer ReLU projection maps them to dimension r
(the paper's low-rank experiments: rank(S) <= r, or <= L_q r for MaxSim); vectors are L2-normalised unless
`normalize=False` (then S is a raw inner product). Query and document sides share one tower and projection, or
have their own (`shared=False`, DPR's two encoders).

Training batches (`gr_jax.dense.data`): each query's positive and K hard negatives. The candidates of a query are
every positive and negative of the *global* batch (in-batch negatives, `in_batch_negatives=True`) or only its own
(K + 1). The candidate embeddings are gathered over the 'data' mesh axis (a sharding constraint to replicated: an
all-gather on a sharded mesh), so the softmax of every query runs over the whole global batch whatever the number
of devices. A candidate that is the query's positive document again (the same document row elsewhere in the batch)
and empty negative slots (row -1) are masked out; other relevant documents of a query are not known to the batch
and count as negatives, as in DPR.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Optional, cast

import flax.linen as nn
import jax
import jax.numpy as jnp

from gr_jax.dense import losses as dense_losses
from gr_jax.dense.similarity import scores
from gr_jax.dense.towers import Tower
from gr_jax.encoders.minilm import l2_normalize, mean_pool

Array = jax.Array
Batch = Mapping[str, Array]

QUERY, DOCUMENT = "query", "document"


@dataclasses.dataclass(frozen=True)
class DualEncoderConfig:
    """What a dual encoder is (gin: `gin_configs/dense/*.gin`).

    tower: the text network (`MiniLMTower`, `T5EncoderTower`); shared: one tower (and projection) for queries and
    documents, else two of the same spec with their own parameters. projection_dim: r of a 2-layer ReLU projection
    (hidden width `projection_hidden_dim`, default the tower's); None keeps the tower's width. multi_vector:
    MaxSim over per-token vectors instead of one pooled vector. pooling: how a single vector is read from the
    tower's states [n, length, hidden] and mask [n, length]: `mean_pool` (sentence-transformers') or
    `last_token_pool` (a causal tower's, as Qwen3-Embedding). normalize: unit vectors (cosine scores).
    temperature: tau of Eq. 1, in training and in the probabilities the retriever reports.
    """
    tower: Tower
    pooling: Callable[[Array, Array], Array] = mean_pool
    shared: bool = True
    projection_dim: Optional[int] = None
    projection_hidden_dim: Optional[int] = None
    multi_vector: bool = False
    normalize: bool = True
    temperature: float = 0.05

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.projection_dim is not None and self.projection_dim < 1:
            raise ValueError(f"projection_dim must be >= 1 or None, got {self.projection_dim}")

    @property
    def dim(self) -> int:
        """The dimension of the vectors that are scored."""
        return self.projection_dim or self.tower.hidden_size


def last_token_pool(states: Array, mask: Array) -> Array:
    """states float[n, length, dim], mask bool[n, length] -> float[n, dim]: the state of each row's last real token
    (right- or left-padded rows alike); a row with no real token gives the zero vector."""
    length = mask.shape[1]
    last = length - 1 - jnp.argmax(mask[:, ::-1], axis=1)
    picked = jnp.take_along_axis(states, last[:, None, None], axis=1)[:, 0]
    return jnp.where(mask.any(axis=1)[:, None], picked, 0.0)


class Projection(nn.Module):
    """Dense -> ReLU -> Dense: the paper's 2-layer non-linear projection to the target dimension."""
    hidden_dim: int
    dim: int

    @nn.compact
    def __call__(self, x: Array) -> Array:
        return nn.Dense(self.dim, name="output")(nn.relu(nn.Dense(self.hidden_dim, name="hidden")(x)))


class DualEncoderNetwork(nn.Module):
    """Both sides of a dual encoder; `encode(ids, mask, side=...)` gives the vectors that are scored."""
    config: DualEncoderConfig

    def setup(self):
        cfg = self.config
        projection = (lambda: Projection(cfg.projection_hidden_dim or cfg.tower.hidden_size, cfg.projection_dim)
                      ) if cfg.projection_dim else (lambda: None)
        if cfg.shared:
            self.tower = cfg.tower.module()
            self.projection = projection()
        else:
            self.query_tower = cfg.tower.module()
            self.document_tower = cfg.tower.module()
            self.query_projection = projection()
            self.document_projection = projection()

    def _side(self, side: str):
        if side not in (QUERY, DOCUMENT):
            raise ValueError(f"side must be {QUERY!r} or {DOCUMENT!r}, got {side!r}")
        if self.config.shared:
            return self.tower, self.projection
        return (self.query_tower, self.query_projection) if side == QUERY else (self.document_tower,
                                                                                 self.document_projection)

    def encode(self, ids: Array, mask: Array, *, side: str, deterministic: bool = True) -> Array:
        """ids int32[n, length], mask bool[n, length] -> float32[n, dim] (single vector) or float32[n, length, dim]
        (multi-vector; padding tokens are zero vectors, so they never win a MaxSim)."""
        tower, projection = self._side(side)
        states = tower.token_states(ids, mask, deterministic).astype(jnp.float32)
        if not self.config.multi_vector:
            states = self.config.pooling(states, mask)
        if projection is not None:
            states = projection(states)
        if self.config.normalize:
            states = l2_normalize(states)
        if self.config.multi_vector:
            states = jnp.where(mask[..., None], states, 0.0)
        return states

    def __call__(self, query_ids, query_mask, document_ids, document_mask, *, deterministic: bool = True):
        return (self.encode(query_ids, query_mask, side=QUERY, deterministic=deterministic),
                self.encode(document_ids, document_mask, side=DOCUMENT, deterministic=deterministic))


def _replicated(x: Array) -> Array:
    """All-gathers `x` over the 'data' mesh axis (a no-op outside a mesh): every device sees every candidate."""
    return nn.with_logical_constraint(x, (None,) * x.ndim)


@dataclasses.dataclass(frozen=True)
class DualEncoderModel:
    """The dual encoder as the trainer and the retriever see it (cf. `gr_jax.models.EncoderDecoderModel`).

    Its inputs are queries (the trainer's `input_length`) and documents (`target_length`).
    """
    config: DualEncoderConfig
    loss: dense_losses.DenseLoss = dense_losses.SampledSoftmax()

    @property
    def module(self) -> DualEncoderNetwork:
        return DualEncoderNetwork(self.config)

    def init(self, rng: Array, *, input_length: int, target_length: int, batch_size: int = 1) -> Mapping[str, Any]:
        """Variables of both sides (boxed where the towers annotate logical axes); use under jax.eval_shape."""
        q = jnp.ones((batch_size, input_length), jnp.int32)
        d = jnp.ones((batch_size, target_length), jnp.int32)
        return self.module.init({"params": rng, "dropout": rng}, q, q > 0, d, d > 0)

    def pretrained_tower_params(self, *, abstract: Any) -> dict[str, Any]:
        """Each tower's pretrained weights by its parameter subtree's name (`Tower.load_params`), shaped and placed
        as `abstract` (the model's abstract parameters): `Trainer.init_state`'s `given`. A tower without pretrained
        weights is absent (it starts from its initialiser), as is everything else (the projections)."""
        names = ("tower",) if self.config.shared else ("query_tower", "document_tower")
        loaded = {name: self.config.tower.load_params(abstract=abstract[name]) for name in names}
        return {name: params for name, params in loaded.items() if params is not None}

    def encode(self, params, ids: Array, mask: Array, *, side: str) -> Array:
        """Vectors of one side without dropout (see `DualEncoderNetwork.encode`)."""
        # Without `mutable`, apply returns the output alone (flax types it as maybe (output, state)).
        return cast(Array, self.module.apply({"params": params}, ids, mask, side=side,
                                             method=DualEncoderNetwork.encode))

    def candidate_scores(self, params, batch: Batch, dropout_rng: Optional[Array]) -> tuple[Array, Array, Array]:
        """(logits float32[B, C], candidate owner int32[C], valid bool[B, C]) of a training batch: S / tau of every
        query against the C = B (1 + K) positives and negatives of the global batch (see the module docstring)."""
        deterministic = dropout_rng is None
        # Each side its own dropout key: with one key, query i and candidate i (its positive) would draw the same
        # mask, a pattern the model can learn to match instead of the texts.
        keys = {} if dropout_rng is None else dict(zip((QUERY, DOCUMENT), jax.random.split(dropout_rng)))

        def encode(ids, mask, side):
            return self.module.apply({"params": params}, ids, mask, side=side, deterministic=deterministic,
                                     method=DualEncoderNetwork.encode,
                                     rngs=None if deterministic else {"dropout": keys[side]})

        queries = encode(batch["query_ids"], batch["query_mask"], QUERY)
        batch_size = queries.shape[0]
        negative_ids = batch["negative_ids"]
        num_negatives = negative_ids.shape[1]
        doc_ids = jnp.concatenate([batch["document_ids"], negative_ids.reshape((-1,) + negative_ids.shape[2:])])
        doc_mask = jnp.concatenate([batch["document_mask"],
                                    batch["negative_mask"].reshape((-1,) + negative_ids.shape[2:])])
        candidates = _replicated(encode(doc_ids, doc_mask, DOCUMENT))  # [C, (length,) dim]
        rows = _replicated(jnp.concatenate([batch["document_row"], batch["negative_row"].reshape(-1)]))
        owner = jnp.concatenate([jnp.arange(batch_size), jnp.repeat(jnp.arange(batch_size), num_negatives)])
        logits = scores(queries, candidates) / self.config.temperature
        logits = nn.with_logical_constraint(logits, ("batch", None))
        is_positive = jnp.arange(logits.shape[1])[None, :] == jnp.arange(batch_size)[:, None]
        duplicate = (rows[None, :] == batch["document_row"][:, None]) & ~is_positive
        valid = (rows[None, :] >= 0) & ~duplicate
        return logits, owner, valid

    def loss_fn(self, params, batch: Batch, dropout_rng: Optional[Array]) -> tuple[Array, dict]:
        """(summed loss, its metrics) over the batch's queries (`gr_jax.dense.losses`)."""
        logits, owner, valid = self.candidate_scores(params, batch, dropout_rng)
        return self.loss(logits=logits, owner=owner, valid=valid)
