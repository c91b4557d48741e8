"""A GDR model as a retriever: the generative stage recalls clusters, the dense stage ranks their documents.

Per batch of queries, one compiled function (per number of beams) encodes the queries once, decodes the `num_beams`
best cluster ids through the trie of cluster ids (constrained beam search, exact log-probabilities) and computes
the query vectors r_q; the host then scores every document of the recalled clusters in the clustered index
(`gr_jax.gdr.index.ClusteredIndex.search`: S_intra / tau + cluster_weight * log p(cluster | q), exact top-k).
Decoded sequences become cluster numbers on the device (`Trie.leaf_indices`: the cluster table's rows are the
cluster numbers), so the host work is O(batch * beams) plus the index search.

Rankings carry no rank-1 probability: the combined score is no normalised distribution over documents.
"""
from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import tqdm
from jax.sharding import Mesh

from gr_jax import partitioning
from gr_jax.dense.towers import Tokenizer
from gr_jax.docids import DocidSpace
from gr_jax.gdr.index import ClusteredIndex
from gr_jax.gdr.model import GdrModel
from gr_jax.retrievers import Ranking


class GdrRetriever:
    """`gr_jax.retrievers.Retriever` over a GDR model (see the module docstring).

    cluster_space: the cluster ids as a docid space (its table's row i is cluster i of `index`); num_beams: the
    clusters recalled per query; cluster_weight: the weight of log p(cluster | q) in the combined score.
    """

    def __init__(self, *, model: GdrModel, params: Any, cluster_space: DocidSpace, index: ClusteredIndex,
                 tokenizer: Tokenizer, input_length: int, mesh: Mesh, param_shardings: Any, batch_size: int = 32,
                 num_beams: int = 10, cluster_weight: float = 0.0,
                 rules: partitioning.LogicalAxisRules = partitioning.LOGICAL_AXIS_RULES, show_progress: bool = False):
        if batch_size < 1 or num_beams < 1:
            raise ValueError(f"batch_size and num_beams must be positive, got {batch_size} and {num_beams}")
        if len(cluster_space) != index.clusters.num_clusters:
            raise ValueError(f"the trie holds {len(cluster_space)} cluster ids, the clustered index "
                             f"{index.clusters.num_clusters} clusters: a cluster file that does not match the trie")
        if index.dim != model.document_dim:
            raise ValueError(f"the model's query vectors have {model.document_dim} dimensions, the clustered index's "
                             f"documents {index.dim}: an index of another encoder?")
        self.model = model
        self.params = params
        self.cluster_space = cluster_space
        self.index = index
        self.tokenizer = tokenizer
        self.input_length = input_length
        self.mesh = mesh
        self.rules = rules
        self.param_shardings = param_shardings
        self.batch_size = partitioning.data_axis_multiple(batch_size, mesh)
        self.num_beams = min(num_beams, len(cluster_space))
        self.cluster_weight = cluster_weight
        self.show_progress = show_progress
        self.batch_sharding = partitioning.batch_sharding(mesh)
        self._compiled: dict[int, Any] = {}  # num_beams -> executable; shared by `with_params` copies

    def with_params(self, params: Any) -> GdrRetriever:
        copy = object.__new__(GdrRetriever)
        copy.__dict__.update(self.__dict__, params=params)
        return copy

    def _predict_impl(self, params, tokens: jax.Array, trie, *, num_beams: int):
        """tokens int32[batch, input_length] -> (clusters int32[batch, beams] (-1: no cluster),
        log-probabilities float32[batch, beams], query vectors float32[batch, dim])."""
        result, query_vectors = self.model.recall_batch(params, tokens, num_beams=num_beams,
                                                        max_decode_len=self.cluster_space.table.max_length, trie=trie)
        batch, beams, length = result.sequences.shape
        clusters = trie.leaf_indices(result.sequences.reshape(batch * beams, length)).reshape(batch, beams)
        return clusters, result.scores, query_vectors

    def _executable(self, params, tokens: jax.Array) -> tuple[Any, float]:
        if self.num_beams in self._compiled:
            return self._compiled[self.num_beams], 0.0
        start = time.perf_counter()
        predict = jax.jit(functools.partial(self._predict_impl, num_beams=self.num_beams),
                          in_shardings=(self.param_shardings, self.batch_sharding, None),
                          out_shardings=partitioning.host_readable_sharding(self.mesh))
        executable = predict.lower(params, tokens, self.cluster_space.trie).compile()
        self._compiled[self.num_beams] = executable
        return executable, time.perf_counter() - start

    def recall(self, queries: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float]:
        """(clusters int32[n, beams], their log-probabilities float32[n, beams], query vectors float32[n, dim],
        seconds, compile seconds): the generative stage and r_q of every query."""
        tokens = self.tokenizer(list(queries), length=self.input_length).ids.astype(np.int32)
        params = jax.device_put(self.params, self.param_shardings)
        clusters, scores, vectors = [], [], []
        compile_seconds = 0.0
        bar = tqdm.tqdm(total=len(queries), desc="recalling clusters", unit="query", leave=False,
                        disable=not self.show_progress)
        start = time.perf_counter()
        with partitioning.partitioning_context(mesh=self.mesh, rules=self.rules):
            for chunk, real in partitioning.padded_batches(tokens, self.batch_size):  # padding rows: outputs dropped
                chunk = jax.device_put(chunk, self.batch_sharding)
                predict, seconds = self._executable(params, chunk)
                compile_seconds += seconds
                found, log_probs, query_vectors = jax.device_get(predict(params, chunk, self.cluster_space.trie))
                clusters.append(found[:real])
                scores.append(log_probs[:real])
                vectors.append(query_vectors[:real])
                bar.update(real)
        bar.close()
        seconds = time.perf_counter() - start - compile_seconds
        dim = self.model.document_dim
        if not clusters:
            return (np.zeros((0, self.num_beams), np.int32), np.zeros((0, self.num_beams), np.float32),
                    np.zeros((0, dim), np.float32), seconds, compile_seconds)
        return np.concatenate(clusters), np.concatenate(scores), np.concatenate(vectors), seconds, compile_seconds

    def rank(self, queries: Sequence[str], *, k: int) -> Ranking:
        """The `k` best documents of each query's recalled clusters by the combined score (see `Ranking`)."""
        if k < 1:
            raise ValueError(f"k must be positive, got {k}")
        clusters, log_probs, vectors, seconds, compile_seconds = self.recall(queries)
        start = time.perf_counter()
        clusters = np.where(np.isfinite(log_probs), clusters, -1)  # an empty beam recalls nothing
        scores, rows = self.index.search(vectors, clusters=clusters, cluster_log_probs=np.nan_to_num(log_probs),
                                         k=k, temperature=self.model.temperature, cluster_weight=self.cluster_weight)
        ids, kept_scores = [], []
        for query_scores, query_rows in zip(scores, rows):
            keep = query_rows >= 0
            ids.append(self.index.docid_strings(query_rows[keep]))
            kept_scores.append(query_scores[keep].astype(float).tolist())
        return Ranking(ids=ids, scores=kept_scores, seconds=seconds + time.perf_counter() - start,
                       compile_seconds=compile_seconds)
