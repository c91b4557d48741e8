"""Ranking metrics of SToICaL (Rozonoyer et al., Sec. 5) over a scored candidate set per query.

Each query has n_q gold documents in gold order (rank 1 first) and one sampled negative; a model scores all
n_q + 1 (the length-normalised mean token log-probability, `length_normalised`). Arrays are padded to the
largest list: scores float[Q, N + 1] with the gold documents in columns 0..n_q - 1 (gold order), the negative in
column N, and `valid` bool[Q, N] marking the real gold columns.

    CVR          a query violates its constraint when any gold document scores below the negative
    nDCG         gains log(n_q + 1), log(n_q), ..., log 2 for gold ranks 1..n_q, 0 for the negative; the candidates
                 ranked by score (ties: gold order, the negative last), discounts 1 / log2(1 + position)
    R@k          |gold top k  intersect  predicted top k| / k, the predicted ranking over all n_q + 1 candidates;
                 only queries with n_q >= k count (the paper leaves k > n_q open; `num_queries` says how many did)
"""
from __future__ import annotations

import numpy as np


def length_normalised(log_likelihood: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The paper's score: mean token log-probability, float[...] (from `EncoderDecoderModel.score_candidates`)."""
    return np.asarray(log_likelihood, np.float64) / np.asarray(positions, np.float64)


def _check(scores: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scores, valid = np.asarray(scores, np.float64), np.asarray(valid, bool)
    if scores.ndim != 2 or valid.shape != (scores.shape[0], scores.shape[1] - 1):
        raise ValueError(f"scores must be [Q, N + 1] and valid [Q, N], got {scores.shape} and {valid.shape}")
    counts = valid.sum(axis=1)
    if not (counts >= 1).all() or not all(valid[i, :c].all() for i, c in enumerate(counts)):
        raise ValueError("every query needs >= 1 gold document, in the first columns")
    return scores, valid


def constraint_violation_rate(scores, valid) -> float:
    scores, valid = _check(scores, valid)
    below = (scores[:, :-1] < scores[:, -1:]) & valid
    return float(below.any(axis=1).mean())


def _predicted_order(scores: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Candidate columns per query best first (invalid columns last); ties keep gold order, the negative after."""
    keyed = np.where(np.concatenate([valid, np.ones((len(scores), 1), bool)], axis=1), scores, -np.inf)
    return np.argsort(-keyed, axis=1, kind="stable")


def ndcg(scores, valid) -> float:
    scores, valid = _check(scores, valid)
    n = valid.sum(axis=1)
    width = scores.shape[1]
    columns = np.arange(width)
    gold = columns[None, :-1] < n[:, None]
    gains = np.where(gold, np.log(np.where(gold, n[:, None] + 1 - columns[None, :-1], 1)), 0.0)
    gains = np.concatenate([gains, np.zeros((len(scores), 1))], axis=1)  # the negative
    discounts = 1.0 / np.log2(np.arange(2, width + 2))
    order = _predicted_order(scores, valid)
    dcg = (np.take_along_axis(gains, order, axis=1) * discounts).sum(axis=1)
    ideal = (gains * discounts).sum(axis=1)  # gold order is the ideal one: gains fall with the column
    return float((dcg / ideal).mean())


def set_overlap_recall(scores, valid, *, k: int) -> tuple[float, int]:
    """(mean R@k over queries with n_q >= k, that number of queries)."""
    scores, valid = _check(scores, valid)
    n = valid.sum(axis=1)
    keep = n >= k
    if not keep.any():
        return float("nan"), 0
    order = _predicted_order(scores[keep], valid[keep])[:, :k]
    hits = (order < k).sum(axis=1)  # predicted top-k columns that are gold top-k (columns 0..k-1)
    return float((hits / k).mean()), int(keep.sum())
