"""GDR's cluster ids (Yuan et al. 2024, "memory-friendly CIDs"): a fixed number of document clusters named by
hierarchical k-means paths.

A semantic docid names one document; a cluster id names a group of them. The number of clusters is fixed by
configuration (`branching`, e.g. (16, 8): at most 128 clusters) whatever the corpus size, so the generative model
memorises which cluster answers a query, and dense vectors pick the documents inside it: the paper's "the total
number of clusters is determined by the memory volume rather than the corpus size".

Building (`build_cluster_ids`): k-means (faiss, seeded per node as `gr_jax.docids.kmeans` does) into branching[0]
clusters, then each of them into branching[1], and so on. A node with at most branching[level] documents is not
split (all its documents take digit 0): k-means cannot fit more centroids than points, and a cluster per document
is what GDR avoids. Every path has the full depth, so every cluster id has the same length. Only non-empty leaves
are clusters, numbered 0..K-1 in lexicographic path order (their inverted-list numbers in `gr_jax.gdr.index`).
The first level may instead be given (`groups`: a category per document from another view of the corpus, e.g.
WordNet's lexicographer files or a web page's site), k-means splitting each group below it: the cluster decoder
then learns something the dense vectors that rank inside a cluster do not already hold.

Cluster ids as tokens (`cluster_id_table`): each level's digit in the vocabulary's digit pieces, fixed width
len(str(branching[level] - 1)), then EOS (the `semantic` docid scheme's spelling), in a `DocidTable` whose docids
are cluster names ("c3-17"), so the docid trie, the heads and constrained beam search decode clusters unchanged.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Sequence
from typing import Optional

import numpy as np
import tqdm

from gr_jax.data.readers import DataFormatError
from gr_jax.docids.kmeans import check_embeddings, kmeans_labels, node_seed
from gr_jax.docids.table import DocidTable
from gr_jax.vocabulary import EOS_ID, PAD_ID

PathLike = str | os.PathLike
_CHUNK = 65_536  # rows reduced at a time by `leaf_centroids`


@dataclasses.dataclass(frozen=True, eq=False)
class ClusterIds:
    """The clusters of a corpus (see the module docstring).

    branching: clusters per level (each >= 2). paths: int32[K, depth], each cluster's digits, lexicographically
    sorted and unique. assignment: int32[N], the cluster of each document row.
    """
    branching: tuple[int, ...]
    paths: np.ndarray
    assignment: np.ndarray

    def __post_init__(self):
        branching = tuple(int(b) for b in self.branching)
        if not branching or min(branching) < 2:
            raise ValueError(f"branching must be one or more clusters per level, each >= 2, got {branching}")
        paths = np.ascontiguousarray(self.paths, np.int32)
        assignment = np.ascontiguousarray(self.assignment, np.int32)
        if paths.ndim != 2 or paths.shape[1] != len(branching) or not len(paths):
            raise ValueError(f"paths must be int[num_clusters >= 1, {len(branching)}], got {list(paths.shape)}")
        if (paths < 0).any() or (paths >= np.asarray(branching)).any():
            raise ValueError(f"a cluster path has a digit outside [0, branching) for branching {branching}")
        if len(paths) > 1:
            keys = np.ravel_multi_index(paths.T, branching)
            if not (np.diff(keys) > 0).all():
                raise ValueError("cluster paths must be unique and in lexicographic order")
        if assignment.ndim != 1 or (assignment < 0).any() or (assignment >= len(paths)).any():
            raise ValueError(f"assignment must be int[num_documents] with values in [0, {len(paths)})")
        object.__setattr__(self, "branching", branching)
        object.__setattr__(self, "paths", paths)
        object.__setattr__(self, "assignment", assignment)

    @property
    def num_clusters(self) -> int:
        return len(self.paths)

    def __len__(self) -> int:
        """The number of documents."""
        return len(self.assignment)

    @property
    def names(self) -> tuple[str, ...]:
        """Cluster names, "c" and the path's digits joined by "-" (c3-17)."""
        return tuple("c" + "-".join(map(str, path)) for path in self.paths.tolist())

    def sizes(self) -> np.ndarray:
        """int64[K]: the documents of each cluster."""
        return np.bincount(self.assignment, minlength=self.num_clusters)

    def members(self) -> tuple[np.ndarray, np.ndarray]:
        """(offsets int64[K + 1], rows int64[N]): cluster c's document rows are rows[offsets[c]:offsets[c + 1]],
        ascending (CSR; no Python object per document)."""
        rows = np.argsort(self.assignment, kind="stable").astype(np.int64)
        offsets = np.zeros(self.num_clusters + 1, np.int64)
        np.cumsum(self.sizes(), out=offsets[1:])
        return offsets, rows

    def with_documents(self, assignment: np.ndarray) -> ClusterIds:
        """These clusters with more documents, of clusters `assignment` int[M], appended as rows N..N+M-1."""
        return ClusterIds(branching=self.branching, paths=self.paths,
                          assignment=np.concatenate([self.assignment, np.asarray(assignment, np.int32)]))

    def save(self, path: PathLike) -> None:
        """An .npz of branching, paths and assignment (written under a temporary name, then renamed)."""
        path = pathlib.Path(path)
        tmp = path.with_name(f".{path.name}.tmp.npz")
        np.savez(tmp, branching=np.asarray(self.branching, np.int32), paths=self.paths, assignment=self.assignment)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: PathLike) -> ClusterIds:
        path = pathlib.Path(path)
        try:
            with np.load(path) as f:
                fields = {name: f[name] for name in ("branching", "paths", "assignment")}
        except (OSError, KeyError, ValueError) as e:
            raise DataFormatError(f"{path}: not a cluster-id file (branching, paths, assignment): {e}") from None
        try:
            return cls(branching=tuple(fields["branching"].tolist()), paths=fields["paths"],
                       assignment=fields["assignment"])
        except ValueError as e:
            raise DataFormatError(f"{path}: {e}") from None


def build_cluster_ids(*, embeddings: np.ndarray, branching: Sequence[int], seed: int = 0, niter: int = 20,
                      nredo: int = 1, sample_above: int = 1_000_000, sample_size: int = 100_000,
                      groups: Optional[np.ndarray] = None, show_progress: bool = False) -> ClusterIds:
    """Fixed-depth hierarchical k-means clusters of the rows of `embeddings` float[N, dim] (an array or a read-only
    memmap); see the module docstring. Deterministic for a given `seed`; the k-means settings are those of
    `gr_jax.docids.semantic_ids.build_semantic_ids`. groups: int[N] in [0, branching[0]), the first level's digit
    of each row, given instead of k-means (every group must hold a document)."""
    branching = tuple(int(b) for b in branching)
    if not branching or min(branching) < 2:
        raise ValueError(f"branching must be one or more clusters per level, each >= 2, got {branching}")
    check_embeddings(embeddings)
    n = embeddings.shape[0]
    if groups is not None:
        groups = np.asarray(groups)
        if groups.shape != (n,) or groups.dtype.kind not in "iu":
            raise ValueError(f"groups must be int[{n}], one per document, got {groups.dtype}{list(groups.shape)}")
        if (groups < 0).any() or (groups >= branching[0]).any() or np.unique(groups).size != branching[0]:
            raise ValueError(f"groups must use each of 0..{branching[0] - 1} (the first level's {branching[0]} "
                             f"clusters), got values {np.unique(groups).tolist()[:12]}")
    path = np.zeros((n, len(branching)), np.int32)
    stack: list[tuple[np.ndarray, tuple[int, ...]]] = [(np.arange(n, dtype=np.int64), ())]
    with tqdm.tqdm(total=n, desc="cluster ids", unit="doc", disable=not show_progress, leave=False) as bar:
        while stack:
            members, node = stack.pop()
            level = len(node)
            if level == len(branching):
                bar.update(members.size)
                continue
            k = branching[level]
            if level == 0 and groups is not None:
                labels = groups[members].astype(np.int32)
            elif members.size <= k:
                labels = np.zeros(members.size, np.int32)
            else:
                labels, _ = kmeans_labels(embeddings, members, k=k, seed=node_seed(seed, node), niter=niter,
                                          nredo=nredo, sample_above=sample_above, sample_size=sample_size)
            path[members, level] = labels
            counts = np.bincount(labels, minlength=k)
            children = np.split(members[np.argsort(labels, kind="stable")], np.cumsum(counts)[:-1])
            stack.extend((child, (*node, digit)) for digit, child in enumerate(children) if child.size)
    keys = np.ravel_multi_index(path.T, branching)
    leaves, assignment = np.unique(keys, return_inverse=True)
    paths = np.stack(np.unravel_index(leaves, branching), axis=1).astype(np.int32)
    return ClusterIds(branching=branching, paths=paths, assignment=assignment.astype(np.int32))


def leaf_centroids(vectors: np.ndarray, assignment: np.ndarray, *, num_clusters: int) -> np.ndarray:
    """float32[K, dim]: the mean of each cluster's rows of `vectors` float[N, dim] (array or memmap), reduced in
    chunks in float64. A cluster without documents is an error (it has no centroid)."""
    if len(vectors) != len(assignment):
        raise ValueError(f"{len(vectors)} vectors but {len(assignment)} cluster assignments")
    sums = np.zeros((num_clusters, vectors.shape[1]), np.float64)
    for start in range(0, len(vectors), _CHUNK):
        clusters = np.asarray(assignment[start:start + _CHUNK])
        order = np.argsort(clusters, kind="stable")
        present, first = np.unique(clusters[order], return_index=True)
        sums[present] += np.add.reduceat(np.asarray(vectors[start:start + _CHUNK], np.float64)[order], first, axis=0)
    counts = np.bincount(assignment, minlength=num_clusters)
    if (counts == 0).any():
        raise ValueError(f"cluster {int(np.argmin(counts))} has no document: no centroid")
    return (sums / counts[:, None]).astype(np.float32)


def cluster_id_table(clusters: ClusterIds, *, digit_tokens: Sequence[int]) -> DocidTable:
    """The clusters' names and token sequences (see the module docstring): int32[K, sum of level widths + 1].
    digit_tokens: the ids of "0".."9" (`gr_jax.docids.schemes.semantic.digit_token_ids`)."""
    from gr_jax.docids.schemes.semantic import digits_of
    digit_ids = np.asarray(digit_tokens, np.int64)
    if digit_ids.shape != (10,) or len(set(digit_ids.tolist())) != 10 or np.isin(digit_ids, (PAD_ID, EOS_ID)).any():
        raise ValueError(f"digit_tokens must be 10 distinct token ids other than PAD/EOS, got {digit_ids.tolist()}")
    widths = [len(str(k - 1)) for k in clusters.branching]
    tokens = np.full((clusters.num_clusters, sum(widths) + 1), EOS_ID, np.int32)
    column = 0
    for level, width in enumerate(widths):
        for digit in digits_of(clusters.paths[:, level].astype(np.int64), width):
            tokens[:, column] = digit_ids[digit]
            column += 1
    return DocidTable(docids=clusters.names, tokens=tokens)
