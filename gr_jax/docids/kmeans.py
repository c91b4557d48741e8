"""The seeded faiss k-means that the k-means docids (semantic ids, codebook ids) and GDR's clusters share.

Every split is one faiss k-means (k-means++ initialisation, seeded per node by `node_seed`, deterministic); a cluster
of more than `sample_above` documents has its centroids fit on a `sample_size` sample before all of them are
assigned. Rows are gathered `_CHUNK` at a time, so an embedding matrix may be a memory-mapped .npy.
"""
from __future__ import annotations

import os

import numpy as np

# Rows gathered / assigned / checked at a time: bounds temporaries to ~100 MB for 384-dim float32 vectors.
_CHUNK = 65_536


def node_seed(seed: int, path: tuple[int, ...]) -> np.random.SeedSequence:
    """A seed per cluster from its path, so each split is reproducible whatever order the tree is built in."""
    return np.random.SeedSequence([seed, len(path), *path])


def _rows(embeddings: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """float32[len(rows), dim], C-contiguous (what faiss takes), for ascending unique `rows`.

    All rows of an in-memory float32 matrix (the root of a collection below `sample_above`) are used in
    place: no copy of the whole matrix.
    """
    everything = rows.size == embeddings.shape[0] and rows[0] == 0 and rows[-1] == rows.size - 1
    if (everything and type(embeddings) is np.ndarray and embeddings.dtype == np.float32
            and embeddings.flags.c_contiguous):
        return embeddings
    return np.ascontiguousarray(embeddings[rows], dtype=np.float32)


def import_faiss():
    """faiss, imported on first use, with its OpenMP threads sleeping rather than spinning when idle.

    faiss bundles its own libgomp, which reads OMP_WAIT_POLICY when faiss is first imported. Thousands of
    small k-means runs with the default (spinning) policy are 5x slower as soon as anything else runs on
    the cores (measured on a shared 2-core host); a caller's own setting is kept.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import faiss

    return faiss


def kmeans_labels(embeddings: np.ndarray, members: np.ndarray, *, k: int, seed: np.random.SeedSequence, niter: int,
                   nredo: int, sample_above: int, sample_size: int) -> tuple[np.ndarray, bool]:
    """(int32[len(members)] cluster of each member, whether the centroids were fit on a sample)."""
    faiss = import_faiss()

    sampled = members.size > sample_above
    if sampled:
        rng = np.random.default_rng(seed)
        fit_rows = members[np.sort(rng.choice(members.size, size=sample_size, replace=False))]
    else:
        fit_rows = members
    fit = _rows(embeddings, fit_rows)
    kmeans = faiss.Kmeans(
        fit.shape[1], k, niter=niter, nredo=nredo, seed=int(seed.generate_state(1)[0] & 0x7FFFFFFF),
        init_method=faiss.ClusteringInitMethod_KMEANS_PLUS_PLUS,
        max_points_per_centroid=1 << 24,  # faiss would otherwise subsample to 256 points per centroid
        min_points_per_centroid=1,  # small clusters are expected near the leaves: no warning
        verbose=False)
    kmeans.train(fit)
    del fit
    index = faiss.IndexFlatL2(kmeans.d)
    index.add(kmeans.centroids)
    labels = np.empty(members.size, np.int32)
    for start in range(0, members.size, _CHUNK):
        _, assigned = index.search(_rows(embeddings, members[start:start + _CHUNK]), 1)
        labels[start:start + _CHUNK] = assigned[:, 0]
    return labels, sampled


def check_embeddings(embeddings: np.ndarray) -> None:
    if embeddings.ndim != 2 or embeddings.shape[0] < 1 or embeddings.shape[1] < 1:
        raise ValueError(f"embeddings must be a non-empty matrix [num_documents, dim], got shape "
                         f"{list(embeddings.shape)}")
    if not np.issubdtype(embeddings.dtype, np.floating):
        raise ValueError(f"embeddings must be floating point, got {embeddings.dtype}")
    for start in range(0, embeddings.shape[0], _CHUNK):
        finite = np.isfinite(embeddings[start:start + _CHUNK]).all(axis=1)
        if not finite.all():
            row = start + int(np.argmin(finite))
            raise ValueError(f"embedding row {row} has a NaN or infinite value (k-means would put it anywhere)")
