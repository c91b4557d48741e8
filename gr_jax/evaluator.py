"""Retrieval evaluation in big_vision's style: an evaluator holds a query set and its qrels, and scores whatever
retriever it is given (`gr_jax.retrievers.Retriever`: a generative model, a dense one, a hybrid).

The metrics are `gr_jax.evaluation.retrieval_metrics` (MRR@10, Recall@k, invalid top-1 docids) of the retriever's
top `k` (Recall@k for the cut-offs of `evaluation.DEFAULT_KS` up to `k`, the most docids a ranking holds: a
generative retriever's beams, a dense one's k; deeper, Recall@k would only repeat Recall@`k`), the Brier score of
each rank-1 probability the retriever reports (`Brier/{definition}`), plus its speed: queries_per_second (ranking
only, compilation excluded) and compile_seconds.
"""
from __future__ import annotations

from collections.abc import Container, Iterable, Sequence

from gr_jax import evaluation
from gr_jax.retrievers import Retriever

Run = dict[str, list[tuple[str, float]]]


class _AllDocidsBut(Container[str]):
    """The valid docids of a ranking as the complement of its invalid outputs' names: no set over the corpus."""

    def __init__(self, invalid_names: frozenset[str]):
        self.invalid_names = invalid_names

    def __contains__(self, docid: object) -> bool:
        return docid not in self.invalid_names


class RetrievalEvaluator:
    """Ranks the top `k` documents of every query with a retriever and scores the run against the qrels.

    queries: (qid, text) pairs, qids unique; qrels: qid -> {docid: relevance}; every query counts in the means
    (a query without relevant documents scores 0, see `retrieval_metrics`); k: the ranking depth (the retriever's
    beams or its k); ks: the Recall@k cut-offs, of which those deeper than `k` are left out, with a warning at each
    evaluation.
    """

    def __init__(self, *, queries: Iterable[tuple[str, str]], qrels: dict[str, dict[str, int]], k: int,
                 ks: Sequence[int] = evaluation.DEFAULT_KS):
        queries = list(queries)
        self.qids = [qid for qid, _ in queries]
        self.texts = [text for _, text in queries]
        if len(set(self.qids)) != len(self.qids):
            first: dict[str, int] = {}
            for i, qid in enumerate(self.qids):
                if qid in first:
                    raise ValueError(f"query id {qid!r} appears twice (queries {first[qid]} and {i}): the run "
                                     "would keep only one of them")
                first[qid] = i
        if k < 1:
            raise ValueError(f"k must be positive, got {k}")
        self.qrels = {qid: qrels.get(qid, {}) for qid in self.qids}
        self.k = k
        self.ks = tuple(ks)

    def evaluate(self, retriever: Retriever) -> tuple[dict[str, float], Run]:
        """(metrics, run): the metrics and the scored run `{qid: [(docid, score)]}`, best first."""
        ranking = retriever.rank(self.texts, k=self.k)
        run = ranking.run(self.qids)
        metrics = evaluation.retrieval_metrics(run=run, qrels=self.qrels, valid_docids=_AllDocidsBut(ranking.invalid),
                                               ks=self.ks, depth=self.k)
        for name, probabilities in ranking.top1_probability.items():
            metrics[f"Brier/{name}"] = evaluation.brier_score(
                run=run, qrels=self.qrels, probabilities=dict(zip(self.qids, probabilities)))
        metrics = dict(metrics, queries_per_second=len(self.qids) / max(ranking.seconds, 1e-9),
                       compile_seconds=ranking.compile_seconds)
        return metrics, run
