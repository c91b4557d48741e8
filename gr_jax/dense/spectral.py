"""The low-rank bottleneck of bilinear dense retrieval (`gr_vs_dense_limitations.txt` Cor. 3.3, App. D, Eq. 14):
a dual encoder of dimension r scores with S = Q D^T, rank(S) <= r, so the best any of them can do at approximating a
target relevance matrix S* in Frobenius norm leaves the spectral tail sum_{i > r} sigma_i(S*)^2."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def relevance_matrix(*, qrels: Mapping[str, Mapping[str, int]], qids: Sequence[str],
                     docids: Sequence[str]) -> np.ndarray:
    """float64[len(qids), len(docids)]: 1 where the query judges the document relevant (>= 1), else 0."""
    column = {docid: j for j, docid in enumerate(docids)}
    matrix = np.zeros((len(qids), len(docids)))
    for i, qid in enumerate(qids):
        for docid, relevance in qrels.get(qid, {}).items():
            if relevance >= 1 and docid in column:
                matrix[i, column[docid]] = 1.0
    return matrix


def spectral_tail(matrix: np.ndarray, ranks: Sequence[int]) -> dict[int, float]:
    """r -> sum_{i > r} sigma_i^2 / sum_i sigma_i^2: the share of ||S*||_F^2 no rank-r matrix captures (Eq. 14)."""
    squared = np.linalg.svd(np.asarray(matrix, np.float64), compute_uv=False) ** 2
    total = squared.sum()
    if total == 0:
        raise ValueError("the relevance matrix is all zeros")
    return {int(r): float(squared[int(r):].sum() / total) for r in ranks}
