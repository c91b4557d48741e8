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


def free_embedding_recall(matrix: np.ndarray, *, rank: int, steps: int = 2000, learning_rate: float = 0.05,
                          seed: int = 0) -> float:
    """Recall@k (k = relevant documents per query) of the best rank-r scores S = Q D^T found by gradient descent.

    The dual encoder's loss with the towers taken away (LIMIT's "free embedding" optimisation): Q (float[n_q, r])
    and D (float[n_d, r]) are free parameters, trained with Adam on the softmax over the whole corpus averaged over
    each query's relevant documents. Any tower of dimension r produces such a Q and D, so this estimates the most a
    dual encoder of dimension r can reach, apart from a tower's capacity and training budget.
    matrix: float[n_q, n_d] of 0/1.
    """
    import jax
    import jax.numpy as jnp
    import optax
    target = jnp.asarray(matrix, jnp.float32)
    positives = target.sum(axis=1)
    if not bool(jnp.all(positives > 0)):
        raise ValueError("every query needs a relevant document")
    q_key, d_key = jax.random.split(jax.random.PRNGKey(seed))
    params = {"q": jax.random.normal(q_key, (matrix.shape[0], rank)) / np.sqrt(rank),
              "d": jax.random.normal(d_key, (matrix.shape[1], rank)) / np.sqrt(rank)}
    optimizer = optax.adam(learning_rate)

    def loss(p):
        log_probs = jax.nn.log_softmax(p["q"] @ p["d"].T, axis=1)
        return -jnp.mean((log_probs * target).sum(axis=1) / positives)

    def step(carry, _):
        p, state = carry
        updates, state = optimizer.update(jax.grad(loss)(p), state)
        return (optax.apply_updates(p, updates), state), None

    (params, _), _ = jax.lax.scan(step, (params, optimizer.init(params)), None, length=steps)
    scores = np.asarray(params["q"] @ params["d"].T)
    k = int(np.max(np.asarray(positives)))
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    hits = np.take_along_axis(np.asarray(matrix), top, axis=1).sum(axis=1)
    return float(np.mean(hits / np.asarray(positives)))
