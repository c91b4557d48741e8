"""Hierarchical k-means ids (DSI, NCI's semantic docids) over document embeddings.

**Semantic ids** (DSI, Tay et al. 2022; NCI, Wang et al. 2022): documents are embedded, clustered into k
groups by k-means, and every group with more than c documents is clustered again, recursively; a
document's id is the path of cluster digits from the root to its leaf, then its position in the leaf:

    path (3, 0, 7), leaf position 42   ->   semantic id 3-0-7-42

Documents with similar embeddings share id prefixes, which is what lets a seq2seq model generalise from
indexed documents to their neighbours. The recursion is iterative (an explicit stack of index arrays),
every split is one faiss k-means (`gr_jax.docids.kmeans`: seeded, deterministic), and a cluster with more
than `sample_above` documents (1M) has its centroids fit on a `sample_size` (100k) sample before all its documents are
assigned. Memory is the embedding matrix (an array or a memory-mapped .npy) plus a float32 copy of the
cluster being split (the root is fit on a sample above 1M, and used in place below when it is an
in-memory float32 matrix), plus a few int32 per document.
k-means cannot split identical vectors (all of them land in one cluster): such a cluster is split by
position (k equal runs in document order), so every id is unique and the recursion always ends.

The ids become target tokens in the docid schemes `gr_jax.docids.schemes.semantic` (the vocabulary's digit
pieces) and `gr_jax.docids.schemes.semantic2d` (NCI's (position, value) tokens appended after the vocabulary).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import tqdm

from gr_jax.docids.kmeans import check_embeddings, kmeans_labels, node_seed
from gr_jax.docids.table import first_collision

_NO_DIGIT = -1


@dataclasses.dataclass(frozen=True)
class SemanticIdStats:
    """Balance diagnostics of a semantic id tree (printed as JSON by `gr_jax.tools.semantic_ids`).

    depth_histogram: number of cluster levels -> number of documents at that depth.
    position_splits: clusters k-means could not separate (identical vectors), split by position instead.
    sampled_fits: clusters whose centroids were fit on a sample (more than `sample_above` documents).
    collisions: documents whose id equals another's; always 0 (checked), reported for the record.
    """

    num_documents: int
    num_leaves: int
    num_internal_nodes: int
    largest_leaf: int
    max_depth: int
    depth_histogram: dict[int, int]
    position_splits: int
    sampled_fits: int
    collisions: int

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "depth_histogram": {str(d): n for d, n in self.depth_histogram.items()}}


@dataclasses.dataclass(frozen=True, eq=False)
class SemanticIds:
    """Each document's semantic id as arrays (row i: document i of the embedding matrix).

    path: int32[N, max_depth]: the cluster digit (0..k-1) at each level, -1 past the document's depth.
    depth: int32[N]: number of cluster levels (0 when the whole collection fits in one leaf).
    leaf_position: int32[N]: position (0..c-1) in its leaf, in document order.
    """

    path: np.ndarray
    depth: np.ndarray
    leaf_position: np.ndarray
    k: int
    c: int
    stats: SemanticIdStats

    def __len__(self) -> int:
        return self.depth.shape[0]

    @classmethod
    def from_ids(cls, ids: Sequence[Sequence[int]], *, k: int, c: int) -> SemanticIds:
        """Semantic ids given as sequences `(digit_1, ..., digit_m, leaf_position)`, e.g. read from a file.

        For ids made elsewhere (NCI's released ids, test fixtures); the digits must be in [0, k), the leaf
        positions in [0, c), and no two ids equal. Stats count each distinct path as one leaf.
        """
        if k < 2 or c < 1:
            raise ValueError(f"need k >= 2 and c >= 1, got k={k}, c={c}")
        if not len(ids):
            raise ValueError("no semantic ids")
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        if (lengths < 1).any():
            raise ValueError(f"semantic id {int(np.argmax(lengths < 1))} is empty (it needs at least a leaf position)")
        max_depth = int(lengths.max()) - 1
        path = np.full((len(ids), max_depth), _NO_DIGIT, np.int32)
        leaf_position = np.empty(len(ids), np.int32)
        for row, sequence in enumerate(ids):
            *digits, leaf = sequence
            path[row, :len(digits)] = digits
            leaf_position[row] = leaf
        depth = (lengths - 1).astype(np.int32)
        inside = np.arange(max_depth)[None, :] < depth[:, None]
        bad_digit = (inside & ((path < 0) | (path >= k))).any(axis=1) | (leaf_position < 0) | (leaf_position >= c)
        if bad_digit.any():
            row = int(np.argmax(bad_digit))
            raise ValueError(f"semantic id {row} {tuple(ids[row])}: cluster digits must be in [0, {k}) and the leaf "
                             f"position in [0, {c})")
        collision = first_collision(_codes(path=path, depth=depth, leaf_position=leaf_position))
        if collision is not None:
            raise ValueError(f"semantic ids {collision[0]} and {collision[1]} are equal: {tuple(ids[collision[0]])}")
        stats = _tree_stats(path=path, depth=depth, position_splits=0, sampled_fits=0)
        return cls(path=path, depth=depth, leaf_position=leaf_position, k=k, c=c, stats=stats)

    @property
    def max_depth(self) -> int:
        return self.path.shape[1]

    def id_of(self, row: int) -> tuple[int, ...]:
        """Document `row`'s id: its cluster digits, then its leaf position."""
        return (*self.path[row, :self.depth[row]].tolist(), int(self.leaf_position[row]))

    def codes(self) -> np.ndarray:
        """int32[N, max_depth + 1]: each id (digits, then leaf position) left-aligned, -1 after it."""
        return _codes(path=self.path, depth=self.depth, leaf_position=self.leaf_position)


def _codes(*, path: np.ndarray, depth: np.ndarray, leaf_position: np.ndarray) -> np.ndarray:
    codes = np.concatenate([path, np.full((depth.shape[0], 1), _NO_DIGIT, np.int32)], axis=1)
    codes[np.arange(depth.shape[0]), depth] = leaf_position
    return codes


def _unique_rows(rows: np.ndarray) -> tuple[int, int]:
    """(number of distinct rows, size of the most frequent one) of an int32 matrix with >= 1 row."""
    if rows.shape[1] == 0:
        return 1, rows.shape[0]
    _, counts = np.unique(rows, axis=0, return_counts=True)
    return counts.size, int(counts.max())


def _tree_stats(*, path: np.ndarray, depth: np.ndarray, position_splits: int, sampled_fits: int) -> SemanticIdStats:
    """Diagnostics from the ids alone: a leaf is a distinct path, an internal node a distinct proper prefix."""
    num_leaves, largest_leaf = _unique_rows(path)  # path is -1 past each depth, so a path row is its leaf
    num_internal = sum(_unique_rows(path[depth > level, :level])[0] for level in range(path.shape[1])
                       if (depth > level).any())
    histogram = np.bincount(depth)
    return SemanticIdStats(
        num_documents=int(depth.shape[0]), num_leaves=num_leaves, num_internal_nodes=num_internal,
        largest_leaf=largest_leaf, max_depth=path.shape[1],
        depth_histogram={d: int(count) for d, count in enumerate(histogram) if count},
        position_splits=position_splits, sampled_fits=sampled_fits, collisions=0)


def _position_split(size: int, k: int) -> np.ndarray:
    """int32[size]: k equal runs in document order (each run strictly smaller than `size` when size > 1)."""
    return (np.arange(size, dtype=np.int64) * k // size).astype(np.int32)


def build_semantic_ids(
    *,
    embeddings: np.ndarray,
    k: int = 10,
    c: int = 100,
    seed: int = 0,
    niter: int = 20,
    nredo: int = 1,
    sample_above: int = 1_000_000,
    sample_size: int = 100_000,
    show_progress: bool = False,
) -> SemanticIds:
    """Hierarchical k-means ids of the rows of `embeddings` (see the module docstring).

    embeddings: float[N, dim], an array or a read-only `np.memmap` (only clusters being split are copied).
    k: clusters per level (>= 2); c: most documents per leaf (>= 1).
    niter: Lloyd iterations per split (k-means++ initialisation).
    nredo: k-means runs per split (different initialisations), the lowest-error one kept: k-means++ can
      start two centroids in one true cluster and merge two others (about 1 run in 10 for 3 well-separated
      groups); each extra run costs as much as the first.
    sample_above / sample_size: a cluster of more than `sample_above` documents is fit on `sample_size`
      of them (uniformly, seeded), then all are assigned to the nearest centroid.
    Deterministic for a given `seed` (each cluster's seed derives from `seed` and its path).
    """
    if k < 2:
        raise ValueError(f"k (clusters per level) must be >= 2, got {k}")
    if c < 1:
        raise ValueError(f"c (documents per leaf) must be >= 1, got {c}")
    if niter < 1 or nredo < 1:
        raise ValueError(f"niter and nredo must be >= 1, got niter={niter}, nredo={nredo}")
    if not k <= sample_size <= sample_above:
        raise ValueError(f"need k <= sample_size <= sample_above, got k={k}, sample_size={sample_size}, "
                         f"sample_above={sample_above}")
    check_embeddings(embeddings)
    n = embeddings.shape[0]
    path = np.full((n, 8), _NO_DIGIT, np.int32)
    depth = np.zeros(n, np.int32)
    leaf_position = np.zeros(n, np.int32)
    num_leaves = num_internal = largest_leaf = position_splits = sampled_fits = max_depth = 0
    stack: list[tuple[np.ndarray, tuple[int, ...]]] = [(np.arange(n, dtype=np.int64), ())]
    with tqdm.tqdm(total=n, desc="semantic ids", unit="doc", disable=not show_progress, leave=False) as bar:
        while stack:
            members, node = stack.pop()
            level = len(node)
            if members.size <= c:
                depth[members] = level
                leaf_position[members] = np.arange(members.size, dtype=np.int32)
                num_leaves += 1
                largest_leaf = max(largest_leaf, members.size)
                max_depth = max(max_depth, level)
                bar.update(members.size)
                continue
            num_internal += 1
            if members.size <= k:  # more than c but too few to fit k centroids: one document per cluster
                labels, sampled = _position_split(members.size, k), False
            else:
                labels, sampled = kmeans_labels(embeddings, members, k=k, seed=node_seed(seed, node), niter=niter,
                                                 nredo=nredo, sample_above=sample_above, sample_size=sample_size)
            counts = np.bincount(labels, minlength=k)
            if np.count_nonzero(counts) < 2:  # k-means put everything in one cluster (identical vectors)
                labels = _position_split(members.size, k)
                counts = np.bincount(labels, minlength=k)
                position_splits += 1
            sampled_fits += sampled
            if level >= path.shape[1]:
                path = np.concatenate([path, np.full_like(path, _NO_DIGIT)], axis=1)
            path[members, level] = labels
            children = np.split(members[np.argsort(labels, kind="stable")], np.cumsum(counts)[:-1])
            for digit in reversed(range(k)):  # digit 0's subtree is built first
                if children[digit].size:
                    stack.append((children[digit], (*node, digit)))
    path = path[:, :max_depth].copy()
    collision = first_collision(_codes(path=path, depth=depth, leaf_position=leaf_position))
    if collision is not None:  # a bug, not bad input: every leaf numbers its own documents 0..size-1
        raise AssertionError(f"documents {collision[0]} and {collision[1]} got the same semantic id")
    histogram = np.bincount(depth)
    stats = SemanticIdStats(
        num_documents=n, num_leaves=num_leaves, num_internal_nodes=num_internal, largest_leaf=largest_leaf,
        max_depth=max_depth, depth_histogram={d: int(count) for d, count in enumerate(histogram) if count},
        position_splits=position_splits, sampled_fits=sampled_fits, collisions=0)
    return SemanticIds(path=path, depth=depth, leaf_position=leaf_position, k=k, c=c, stats=stats)
