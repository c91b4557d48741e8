"""The relevance score S of a dual encoder: what the model trains, the corpus index searches and the retriever ranks
by, one function so that all three agree."""
import jax
import jax.numpy as jnp

Array = jax.Array


def scores(queries: Array, documents: Array) -> Array:
    """S for every (query, document) pair: single vectors [nq, d] x [nd, d] -> [nq, nd]; multi-vector
    [nq, lq, d] x [nd, ld, d] -> [nq, nd], MaxSim (padding vectors are zero, and a zero query vector adds 0)."""
    if queries.ndim == 2:
        return queries @ documents.T
    similarity = jnp.einsum("qid,njd->qnij", queries, documents)
    return similarity.max(axis=-1).sum(axis=-1)
