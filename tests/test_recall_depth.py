"""Recall@k only where the ranking depth fills k: 20 beams report no Recall@100 (it would equal Recall@20)."""
import logging

import pytest

from gr_jax import evaluation
from gr_jax.evaluator import RetrievalEvaluator
from gr_jax.retrievers import Ranking

DEPTH = 20
DOCIDS = [f"d{i}" for i in range(DEPTH)]
# q0: d0 at rank 1; q1: d5 at rank 6 and d50, never ranked; q2: d15 at rank 16, outside the top 10.
QRELS = {"q0": {"d0": 1}, "q1": {"d5": 1, "d50": 1}, "q2": {"d15": 1}}


class FixedRetriever:
    """Ranks d0, d1, ... for every query, `depth` of them (a retriever of `depth` beams, or a dense one's k)."""

    def __init__(self, depth: int):
        self.depth = depth
        self.calls = 0

    def rank(self, queries, *, k):
        self.calls += 1
        depth = min(k, self.depth)
        return Ranking(ids=[[f"d{i}" for i in range(depth)] for _ in queries],
                       scores=[[-float(i) for i in range(depth)] for _ in queries])


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "gr_jax.evaluation"]


def test_a_ranking_20_deep_reports_recall_at_1_and_10_only_and_warns_once(caplog):
    run = {qid: DOCIDS for qid in QRELS}
    with caplog.at_level(logging.WARNING):
        metrics = evaluation.retrieval_metrics(run=run, qrels=QRELS, ks=(1, 10, 100), depth=DEPTH)
    assert sorted(k for k in metrics if k.startswith("Recall@")) == ["Recall@1", "Recall@10"]
    assert metrics["Recall@1"] == pytest.approx((1 + 0 + 0) / 3)
    assert metrics["Recall@10"] == pytest.approx((1 + 1 / 2 + 0) / 3)
    assert metrics["MRR@10"] == pytest.approx((1 + 1 / 6 + 0) / 3)
    assert _warnings(caplog) == ["Recall@100 not reported: the rankings are at most 20 docids deep (the ranking "
                                 "depth: beams, ranking_depth or k), so it would only repeat Recall@20"]
    # Without a depth every cut-off is computed, and Recall@100 is Recall@20 of the same run: what was reported.
    unbounded = evaluation.retrieval_metrics(run=run, qrels=QRELS, ks=(1, 10, 20, 100))
    assert unbounded["Recall@100"] == unbounded["Recall@20"] == pytest.approx((1 + 1 / 2 + 1) / 3)


def test_fillable_ks():
    assert evaluation.fillable_ks((1, 5, 10, 20, 100), depth=20) == ((1, 5, 10, 20), (100,))
    assert evaluation.fillable_ks((1, 5, 10, 20, 100), depth=4) == ((1,), (5, 10, 20, 100))
    assert evaluation.fillable_ks((1, 100), depth=100) == ((1, 100), ())
    assert evaluation.fillable_ks((1, 100), depth=None) == ((1, 100), ())
    with pytest.raises(ValueError, match="depth must be >= 1"):
        evaluation.fillable_ks((1,), depth=0)


def test_the_evaluator_drops_the_cutoffs_deeper_than_its_k_with_one_warning_per_evaluation(caplog):
    queries = [(qid, f"query {qid}") for qid in QRELS]
    evaluator = RetrievalEvaluator(queries=queries, qrels=QRELS, k=DEPTH, ks=(1, 10, 100))
    retriever = FixedRetriever(DEPTH)
    with caplog.at_level(logging.WARNING):
        metrics, run = evaluator.evaluate(retriever)
    assert {k: v for k, v in metrics.items() if k.startswith("Recall@")} == {
        "Recall@1": pytest.approx(1 / 3), "Recall@10": pytest.approx(1.5 / 3)}
    assert all(len(ranking) == DEPTH for ranking in run.values())
    assert len(_warnings(caplog)) == 1 and "Recall@100 not reported" in _warnings(caplog)[0]
    with caplog.at_level(logging.WARNING):
        evaluator.evaluate(retriever)
    assert len(_warnings(caplog)) == 2 and retriever.calls == 2  # once per evaluation

    # The default cut-offs (1, 5, 10, 20, 100) from 20 beams: all but Recall@100.
    default = RetrievalEvaluator(queries=queries, qrels=QRELS, k=DEPTH)
    assert [k for k in default.evaluate(retriever)[0] if k.startswith("Recall@")] == [
        "Recall@1", "Recall@5", "Recall@10", "Recall@20"]


def test_a_retriever_100_deep_over_a_smaller_corpus_reports_recall_at_100(caplog):
    """A dense retriever's depth is its k: a corpus of 20 documents ranked 100 deep returns every document, so
    Recall@100 is filled (a short corpus, not a shallow ranking), and nothing is left out."""
    queries = [(qid, f"query {qid}") for qid in QRELS]
    evaluator = RetrievalEvaluator(queries=queries, qrels=QRELS, k=100, ks=(1, 10, 100))
    with caplog.at_level(logging.WARNING):
        metrics, _ = evaluator.evaluate(FixedRetriever(DEPTH))
    assert metrics["Recall@100"] == pytest.approx((1 + 1 / 2 + 1) / 3)
    assert _warnings(caplog) == []
