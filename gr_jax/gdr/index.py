"""GDR's document side: every document's dense vector in the inverted list of its cluster, searched inside the
clusters the generative model recalls, and extended with new documents without training.

A `ClusteredIndex` is a faiss `IndexIVFFlat` over inner products whose inverted lists are the GDR clusters
(`gr_jax.gdr.clusters`) and whose coarse quantizer holds the clusters' centroids (the mean of their documents'
vectors). The generative model replaces the quantizer at search time: `search` takes each query's recalled clusters
and their log-probabilities, and scores every document of those clusters by

    score(q, d) = S_intra(q, d) / temperature + cluster_weight * log p(CID(d) | q)

(GDR-style: the paper names a "score combination" without its form). Within one cluster the second term is a
constant, so the exact top-k of the combined score is the merge of each recalled cluster's top-k by S_intra: one
`search_preassigned` call per recalled rank, batched over the queries (C++ threads), then a top-k of b * k
candidates per query. cluster_weight = 0 ranks the recalled clusters' documents by S_intra alone.

New documents (`with_documents`) go to the cluster of the nearest centroid (L2, the quantizer; k-means' own
assignment rule), so the docid space grows without rebuilding the trie of cluster ids or training.

On disk (`save` / `load`, written by `python -m gr_jax.tools.gdr_index`):

    {dir}/manifest.json            the base corpus index (a dense run's `index/{step}` dir), its encoder, the
                                   clusters' settings and source, the number of added documents
    {dir}/clusters.npz             `ClusterIds` of every document (base rows first, then added ones)
    {dir}/centroids.npy            float32[K, dim], in the documents' vector space
    {dir}/added.embeddings.npy     float32[M, dim] and bytes[M] docids of the documents added since (absent: none)
    {dir}/added.docids.npy

The base vectors and docids are read (memory-mapped) from the dense index directory the manifest names, never
copied; its docids digest is checked on every load.
"""
from __future__ import annotations

import functools
import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from gr_jax.data.readers import DataFormatError
from gr_jax.dense import index as dense_index
from gr_jax.data.string_arrays import SortedKeys
from gr_jax.docids.kmeans import import_faiss
from gr_jax.gdr.clusters import ClusterIds, leaf_centroids

PathLike = str | os.PathLike
MANIFEST = "manifest.json"
CLUSTERS = "clusters.npz"
CENTROIDS = "centroids.npy"
ADDED_EMBEDDINGS = "added.embeddings.npy"
ADDED_DOCIDS = "added.docids.npy"
_ADD_CHUNK = 65_536  # vectors added to the faiss index at a time


def _faiss():
    return import_faiss()


def _as_bytes(docids: Sequence[str] | np.ndarray) -> np.ndarray:
    docids = np.asarray(docids)
    return docids if docids.dtype.kind == "S" else np.asarray([d.encode("utf-8") for d in docids.tolist()], bytes)


class ClusteredIndex:
    """The documents GDR ranks (see the module docstring).

    base_docids: bytes[N] and base_vectors: float32[N, dim] (a memmap of a dense index); added_docids: bytes[M] and
    added_vectors: float32[M, dim]; clusters: the `ClusterIds` of all N + M rows; centroids: float32[K, dim];
    manifest: where the base comes from and which encoder made it.
    """

    def __init__(self, *, base_docids: np.ndarray, base_vectors: np.ndarray, clusters: ClusterIds,
                 centroids: np.ndarray, manifest: dict, added_docids: Optional[np.ndarray] = None,
                 added_vectors: Optional[np.ndarray] = None, directory: Optional[pathlib.Path] = None):
        dim = base_vectors.shape[1]
        added_docids = np.zeros((0,), "S1") if added_docids is None else _as_bytes(added_docids)
        added_vectors = np.zeros((0, dim), np.float32) if added_vectors is None else added_vectors
        where = directory / MANIFEST if directory is not None else "the clustered index"
        if base_vectors.ndim != 2 or added_vectors.ndim != 2 or added_vectors.shape[1] != dim:
            raise ValueError(f"{where}: document vectors must be [n, dim] with one dim, got "
                             f"{list(base_vectors.shape)} and {list(added_vectors.shape)}")
        if len(base_docids) != len(base_vectors) or len(added_docids) != len(added_vectors):
            raise ValueError(f"{where}: {len(base_docids)} + {len(added_docids)} docids for {len(base_vectors)} + "
                             f"{len(added_vectors)} vectors")
        if len(clusters) != len(base_docids) + len(added_docids):
            raise ValueError(f"{where}: the cluster ids cover {len(clusters)} documents, the index holds "
                             f"{len(base_docids) + len(added_docids)}: a cluster file of another corpus?")
        if centroids.shape != (clusters.num_clusters, dim):
            raise ValueError(f"{where}: centroids of shape {list(centroids.shape)} for {clusters.num_clusters} "
                             f"clusters of {dim}-dimensional vectors")
        self.base_docids = base_docids
        self.base_vectors = base_vectors
        self.added_docids = added_docids
        self.added_vectors = np.asarray(added_vectors, np.float32)
        self.clusters = clusters
        self.centroids = np.ascontiguousarray(centroids, np.float32)
        self.manifest = manifest
        self.directory = directory

    @classmethod
    def from_corpus_index(cls, corpus_index: dense_index.CorpusIndex, *, clusters: ClusterIds,
                          clusters_source: dict) -> ClusteredIndex:
        """`corpus_index`'s documents (a saved dense index) in `clusters` (built over any vectors of the same rows:
        `clusters_source` says which); centroids in `corpus_index`'s vector space."""
        if corpus_index.multi_vector or corpus_index.directory is None:
            raise ValueError("GDR needs a saved single-vector corpus index (a dense run's model_dir/index/{step})")
        if len(clusters) != len(corpus_index):
            raise ValueError(f"{len(clusters)} cluster assignments for the {len(corpus_index)} documents of "
                             f"{corpus_index.directory}")
        centroids = leaf_centroids(corpus_index.embeddings, clusters.assignment, num_clusters=clusters.num_clusters)
        manifest = {"base": {"directory": str(corpus_index.directory.resolve()),
                             "documents": len(corpus_index),
                             "docids_sha1": dense_index.docids_digest(corpus_index.docids)},
                    "corpus": corpus_index.manifest.get("corpus", {}),
                    "encoder": corpus_index.manifest.get("encoder", {}),
                    "clusters": {"branching": list(clusters.branching), "num_clusters": clusters.num_clusters,
                                 "source": clusters_source},
                    "added": 0}
        return cls(base_docids=corpus_index.docids, base_vectors=corpus_index.embeddings, clusters=clusters,
                   centroids=centroids, manifest=manifest)

    # --- Documents ---

    def __len__(self) -> int:
        return len(self.base_docids) + len(self.added_docids)

    @property
    def dim(self) -> int:
        return int(self.base_vectors.shape[1])

    @property
    def encoder(self) -> dict:
        """The document encoder's fingerprint (the base dense index's `encoder`: model_dir, step, config_sha1, ...)."""
        return self.manifest.get("encoder", {})

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        """float32[*rows.shape, dim]: the vectors of document `rows` (base or added); row -1 gives zeros."""
        rows = np.asarray(rows, np.int64)
        flat = rows.reshape(-1)
        out = np.zeros((flat.size, self.dim), np.float32)
        base = (flat >= 0) & (flat < len(self.base_docids))
        if base.any():
            wanted = flat[base]
            order = np.argsort(wanted, kind="stable")  # ascending reads of the memmap
            gathered = np.empty((wanted.size, self.dim), np.float32)
            gathered[order] = self.base_vectors[wanted[order]]
            out[base] = gathered
        added = flat >= len(self.base_docids)
        if added.any():
            out[added] = self.added_vectors[flat[added] - len(self.base_docids)]
        return out.reshape(rows.shape + (self.dim,))

    def docid_strings(self, rows: np.ndarray) -> list[str]:
        n = len(self.base_docids)
        return [(self.base_docids[r] if r < n else self.added_docids[r - n]).decode("utf-8")
                for r in np.asarray(rows).tolist()]

    @functools.cached_property
    def _keys(self) -> SortedKeys:
        return SortedKeys.of(np.concatenate([self.base_docids.astype(bytes), self.added_docids.astype(bytes)]))

    def rows_of(self, docids: Sequence[str] | np.ndarray) -> np.ndarray:
        """int64[len(docids)]: each docid's row, -1 for a document the index does not hold."""
        return self._keys.rows_of(_as_bytes(docids))

    def __contains__(self, docid: object) -> bool:
        return isinstance(docid, str) and self.rows_of([docid])[0] >= 0

    # --- Search ---

    @functools.cached_property
    def ivf(self) -> Any:
        """The faiss IndexIVFFlat (inner product) holding every vector in its cluster's list, ids = rows."""
        faiss = _faiss()
        from faiss.contrib.ivf_tools import add_preassigned
        quantizer = faiss.IndexFlatL2(self.dim)
        quantizer.add(self.centroids)
        index = faiss.IndexIVFFlat(quantizer, self.dim, self.clusters.num_clusters, faiss.METRIC_INNER_PRODUCT)
        n = len(self.base_docids)
        for vectors, offset in ((self.base_vectors, 0), (self.added_vectors, n)):
            for start in range(0, len(vectors), _ADD_CHUNK):
                chunk = np.ascontiguousarray(vectors[start:start + _ADD_CHUNK], np.float32)
                rows = np.arange(offset + start, offset + start + len(chunk), dtype=np.int64)
                add_preassigned(index, chunk, self.clusters.assignment[rows].astype(np.int64), ids=rows)
        return index

    def assign(self, vectors: np.ndarray) -> np.ndarray:
        """int32[n]: the cluster of the nearest centroid (L2) of each vector float32[n, dim]."""
        self._check_dim(vectors)
        _, nearest = self.ivf.quantizer.search(np.ascontiguousarray(vectors, np.float32), 1)
        return nearest[:, 0].astype(np.int32)

    def _check_dim(self, vectors: np.ndarray) -> None:
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            where = self.directory / MANIFEST if self.directory is not None else "the clustered index"
            raise ValueError(f"{where}: vectors of shape {list(vectors.shape[1:])} cannot be scored against "
                             f"{self.dim}-dimensional document vectors (an index of another encoder?)")

    def search(self, queries: np.ndarray, *, clusters: np.ndarray, cluster_log_probs: np.ndarray, k: int,
               temperature: float, cluster_weight: float) -> tuple[np.ndarray, np.ndarray]:
        """The k best documents of each query's recalled clusters by the combined score (module docstring).

        queries: float32[n, dim]; clusters: int[n, b], recalled cluster numbers (-1: an empty beam, skipped);
        cluster_log_probs: float[n, b]. Returns (scores float32[n, k], rows int64[n, k]) best first, rows -1 and
        scores -inf past the documents the clusters hold.
        """
        self._check_dim(queries)
        clusters = np.asarray(clusters, np.int64)
        if clusters.shape != np.shape(cluster_log_probs) or clusters.shape[0] != len(queries):
            raise ValueError(f"clusters {list(clusters.shape)} and cluster_log_probs "
                             f"{list(np.shape(cluster_log_probs))} must both be [{len(queries)}, beams]")
        if k < 1 or temperature <= 0:
            raise ValueError(f"k must be >= 1 and temperature > 0, got {k} and {temperature}")
        queries = np.ascontiguousarray(queries, np.float32)
        index = self.ivf
        index.nprobe = 1
        n, beams = clusters.shape
        scores = np.full((n, beams * k), -np.inf, np.float64)
        rows = np.full((n, beams * k), -1, np.int64)
        for j in range(beams):
            found, found_rows = index.search_preassigned(queries, k, clusters[:, j:j + 1], None)
            keep = found_rows >= 0
            combined = found.astype(np.float64) / temperature + cluster_weight * np.asarray(
                cluster_log_probs, np.float64)[:, j:j + 1]
            scores[:, j * k:(j + 1) * k] = np.where(keep, combined, -np.inf)
            rows[:, j * k:(j + 1) * k] = np.where(keep, found_rows, -1)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        top_scores = np.take_along_axis(scores, order, axis=1)
        top_rows = np.take_along_axis(rows, order, axis=1)
        if top_rows.shape[1] < k:
            pad = k - top_rows.shape[1]
            top_rows = np.pad(top_rows, ((0, 0), (0, pad)), constant_values=-1)
            top_scores = np.pad(top_scores, ((0, 0), (0, pad)), constant_values=-np.inf)
        return top_scores.astype(np.float32), np.where(np.isfinite(top_scores), top_rows, -1)

    # --- New documents ---

    def with_documents(self, *, docids: Sequence[str], vectors: np.ndarray) -> ClusteredIndex:
        """This index with `docids` (new, distinct) and their vectors float32[m, dim] added, each in the cluster of
        its nearest centroid. A docid the index already holds, or one given twice, is an error: nothing changes."""
        vectors = np.asarray(vectors, np.float32)
        self._check_dim(vectors)
        names = _as_bytes(list(docids))
        if len(names) != len(vectors):
            raise ValueError(f"{len(names)} docids for {len(vectors)} vectors")
        unique, counts = np.unique(names, return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"document {unique[np.argmax(counts)].decode()!r} is given {counts.max()} times")
        present = self.rows_of(names) >= 0
        if present.any():
            raise ValueError(f"document {names[np.argmax(present)].decode()!r} is already in the index (row "
                             f"{int(self.rows_of(names[present][:1])[0])}); {int(present.sum())} of the {len(names)} "
                             "new documents are")
        assignment = self.assign(vectors)
        manifest = dict(self.manifest, added=len(self.added_docids) + len(names))
        return ClusteredIndex(base_docids=self.base_docids, base_vectors=self.base_vectors,
                              clusters=self.clusters.with_documents(assignment), centroids=self.centroids,
                              manifest=manifest, added_docids=np.concatenate([self.added_docids.astype(bytes), names]),
                              added_vectors=np.concatenate([self.added_vectors, vectors]))

    # --- On disk ---

    def save(self, directory: PathLike) -> ClusteredIndex:
        """Writes the clusters, centroids, added documents and (last, so a directory with one is complete) the
        manifest to `directory`; returns the index placed there."""
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.clusters.save(directory / CLUSTERS)
        _save_npy(directory / CENTROIDS, self.centroids)
        if len(self.added_docids):
            _save_npy(directory / ADDED_EMBEDDINGS, self.added_vectors)
            _save_npy(directory / ADDED_DOCIDS, self.added_docids.astype(bytes))
        else:
            for name in (ADDED_EMBEDDINGS, ADDED_DOCIDS):
                (directory / name).unlink(missing_ok=True)
        tmp = directory / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(self.manifest, indent=1))
        os.replace(tmp, directory / MANIFEST)
        copy = object.__new__(ClusteredIndex)
        copy.__dict__.update({k: v for k, v in self.__dict__.items() if k not in ("ivf", "_keys")},
                             directory=directory)
        return copy

    @classmethod
    def load(cls, directory: PathLike) -> ClusteredIndex:
        """Reads an index written by `save`; files that do not belong together are a `DataFormatError`."""
        directory = pathlib.Path(directory)
        manifest_path = directory / MANIFEST
        if not manifest_path.is_file():
            raise FileNotFoundError(f"{manifest_path} is missing: {directory} holds no GDR clustered index (build one "
                                    "with python -m gr_jax.tools.gdr_index)")
        manifest = json.loads(manifest_path.read_text())
        base_dir = pathlib.Path(manifest["base"]["directory"])
        base = dense_index.CorpusIndex.load(base_dir, expect=lambda m, p: None)
        digest = dense_index.docids_digest(base.docids)
        if digest != manifest["base"]["docids_sha1"] or len(base) != manifest["base"]["documents"]:
            raise DataFormatError(f"{manifest_path}: its base corpus index {base_dir} now holds other documents "
                                  f"({len(base)}, docids sha1 {digest}; built from {manifest['base']['documents']}, "
                                  f"{manifest['base']['docids_sha1']}): rebuild the clustered index")
        if base.manifest.get("encoder") != manifest.get("encoder"):
            raise DataFormatError(f"{manifest_path}: the vectors of {base_dir} come from another encoder "
                                  f"({base.manifest.get('encoder')}) than the one it was built from "
                                  f"({manifest.get('encoder')}): rebuild the clustered index")
        clusters = ClusterIds.load(directory / CLUSTERS)
        added = int(manifest.get("added", 0))
        added_docids = added_vectors = None
        if added:
            added_docids, added_vectors = np.load(directory / ADDED_DOCIDS), np.load(directory / ADDED_EMBEDDINGS)
            if len(added_docids) != added or len(added_vectors) != added:
                raise DataFormatError(f"{manifest_path}: {added} added documents, but {directory / ADDED_DOCIDS} "
                                      f"holds {len(added_docids)} and {directory / ADDED_EMBEDDINGS} "
                                      f"{len(added_vectors)}")
        try:
            return cls(base_docids=base.docids, base_vectors=base.embeddings, clusters=clusters,
                       centroids=np.load(directory / CENTROIDS), manifest=manifest, added_docids=added_docids,
                       added_vectors=added_vectors, directory=directory)
        except ValueError as e:
            raise DataFormatError(str(e)) from None


def _save_npy(path: pathlib.Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.tmp.npy")
    np.save(tmp, array)
    os.replace(tmp, path)
