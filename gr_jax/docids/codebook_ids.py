"""Codebook docids (RIPOR-style; Cai et al. 2025's "codebook" identifiers): residual k-means over document vectors.

Level 0 clusters the vectors into `num_codes` codes; each later level clusters what the previous levels left
(the residual x - sum of the chosen centroids) into `num_codes` codes again, so a document's `levels` codes
quantise its vector coarse to fine (residual quantisation, as RIPOR builds its ids from a dense encoder's
vectors). Each level's k-means is the semantic ids' seeded faiss k-means (`gr_jax.docids.kmeans.kmeans_labels`)
and its centroids are the means of the residuals assigned to each code.

Documents whose `levels` codes coincide cannot be told apart by them: each gets a collision index (0, 1, ... in
collection order among those documents), a last position that only they have, so the ids stay unique and
prefix-free (a unique path ends with EOS right after its codes; the colliding ones after the collision index).
The docid scheme (`gr_jax.docids.schemes.codebook`) writes codes as new tokens appended after the vocabulary.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import tqdm

from gr_jax.docids.kmeans import check_embeddings, kmeans_labels, node_seed


@dataclasses.dataclass(frozen=True)
class CodebookIds:
    """codes: int32[N, levels] in [0, num_codes); collision: int32[N], the collision index of a document whose
    codes another document shares, else -1; residual_norms: float64[levels + 1], the mean residual norm before
    level 0 (the vectors' own), after level 0, ..., after the last level."""
    codes: np.ndarray
    collision: np.ndarray
    num_codes: int
    residual_norms: np.ndarray

    def __post_init__(self):
        codes, collision = np.asarray(self.codes), np.asarray(self.collision)
        if codes.ndim != 2 or collision.shape != (codes.shape[0],):
            raise ValueError(f"codes must be [N, levels] and collision [N], got {codes.shape} and {collision.shape}")
        if codes.size and (codes.min() < 0 or codes.max() >= self.num_codes):
            raise ValueError(f"codes must lie in [0, {self.num_codes})")

    def __len__(self) -> int:
        return self.codes.shape[0]

    @property
    def levels(self) -> int:
        return self.codes.shape[1]

    @property
    def max_collisions(self) -> int:
        """The largest collision index + 1 (0 when every path is unique)."""
        return int(self.collision.max()) + 1 if len(self) else 0

    @property
    def stats(self) -> CodebookStats:
        colliding = int((self.collision >= 0).sum())
        return CodebookStats(documents=len(self), levels=self.levels, num_codes=self.num_codes,
                             unique_paths=len(self) - colliding + int((self.collision == 0).sum()),
                             colliding_documents=colliding, largest_collision_group=self.max_collisions,
                             residual_norm_by_level=tuple(float(v) for v in self.residual_norms))


@dataclasses.dataclass(frozen=True)
class CodebookStats:
    """Diagnostics of codebook ids: how many distinct code paths, how many documents needed a collision index, and
    how much of the vectors' norm each level quantised away."""
    documents: int
    levels: int
    num_codes: int
    unique_paths: int
    colliding_documents: int
    largest_collision_group: int
    residual_norm_by_level: tuple[float, ...]

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["residual_norm_by_level"] = [round(v, 6) for v in self.residual_norm_by_level]
        return out


def collision_indices(codes: np.ndarray) -> np.ndarray:
    """int32[N]: for each row of codes int[N, L], its index among the rows with the same codes (in row order) when
    there are several, else -1."""
    if not len(codes):
        return np.zeros(0, np.int32)
    _, inverse, counts = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(len(codes), np.int64)
    rank[order] = np.arange(len(codes)) - starts[inverse[order]]
    return np.where(counts[inverse] > 1, rank, -1).astype(np.int32)


def build_codebook_ids(*, embeddings: np.ndarray, levels: int, num_codes: int, seed: int = 0, niter: int = 20,
                       show_progress: bool = False) -> CodebookIds:
    """Residual k-means codes of `embeddings` float[N, dim] (see the module docstring)."""
    check_embeddings(embeddings)
    if levels < 1 or num_codes < 2:
        raise ValueError(f"levels must be >= 1 and num_codes >= 2, got {levels} and {num_codes}")
    n = embeddings.shape[0]
    if n < num_codes:
        raise ValueError(f"{n} documents cannot be split into {num_codes} codes: lower num_codes")
    residual = np.array(embeddings, dtype=np.float32, copy=True)
    members = np.arange(n)
    codes = np.empty((n, levels), np.int32)
    norms = [float(np.linalg.norm(residual, axis=1).mean())]
    for level in tqdm.trange(levels, desc="residual k-means", unit="level", disable=not show_progress):
        labels, _ = kmeans_labels(residual, members, k=num_codes, seed=node_seed(seed, (level,)), niter=niter,
                                  nredo=1, sample_above=n, sample_size=n)
        sums = np.zeros((num_codes, residual.shape[1]), np.float64)
        np.add.at(sums, labels, residual)
        counts = np.bincount(labels, minlength=num_codes)
        centroids = (sums / np.maximum(counts, 1)[:, None]).astype(np.float32)
        residual -= centroids[labels]
        codes[:, level] = labels
        norms.append(float(np.linalg.norm(residual, axis=1).mean()))
    return CodebookIds(codes=codes, collision=collision_indices(codes), num_codes=num_codes,
                       residual_norms=np.asarray(norms))
