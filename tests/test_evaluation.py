"""gr_jax.evaluation against ir-measures (pytrec_eval), a hand-computed example, and TREC run round trips."""
import math
import os
import stat

import ir_measures
import numpy as np
import pytest
from ir_measures import RR, R, nDCG

from gr_jax.data.readers import DataFormatError
from gr_jax.evaluation import (
    ranked_docids,
    read_trec_run,
    retrieval_metrics,
    scored_to_ranked,
    write_trec_run,
)

KS = (1, 3, 5, 10, 20, 100)


def _random_qrels_and_run(seed: int, *, num_queries: int = 60, pool: int = 300):
    """Graded qrels (0..3, several relevant docs, some queries with none) and a scored run with distinct scores,
    every qrels query present with a non-empty ranking (so that pytrec_eval, which skips queries absent from the
    run, averages over the same queries as we do). Rankings are 1..150 long, in shuffled list order."""
    rng = np.random.default_rng(seed)
    qrels, run = {}, {}
    for q in range(num_queries):
        judged = rng.choice(pool, size=int(rng.integers(1, 8)), replace=False)
        qrels[f"q{q}"] = {f"d{d}": int(rng.integers(0, 4)) for d in judged}
        # The ~30 first ranks mix the judged docs with random ones, so that hits occur at all cutoffs.
        head = rng.permutation(np.concatenate([judged, rng.choice(pool, size=25, replace=False)]))
        tail = rng.choice(pool, size=150, replace=False)
        docids = list(dict.fromkeys(f"d{d}" for d in np.concatenate([head, tail])))
        docids = docids[: int(rng.integers(1, 151))]
        scores = rng.permutation(len(docids)).astype(float) + rng.random()  # distinct
        run[f"q{q}"] = list(zip(docids, scores.tolist()))
    # A run query absent from the qrels: ignored by both.
    run["unjudged"] = [("d0", 1.0)]
    return qrels, run


@pytest.mark.parametrize("seed", range(5))
def test_matches_ir_measures_on_random_runs(seed):
    qrels, run = _random_qrels_and_run(seed)
    measures = [RR @ 10, nDCG @ 10] + [R @ k for k in KS]
    reference = ir_measures.calc_aggregate(measures, qrels, {q: dict(r) for q, r in run.items()})

    ours_scored = retrieval_metrics(run=run, qrels=qrels, ks=KS)
    ours_ranked = retrieval_metrics(run=scored_to_ranked(run), qrels=qrels, ks=KS)
    assert ours_scored == ours_ranked
    assert ours_scored["num_queries"] == len(qrels)
    assert ours_scored["MRR@10"] == pytest.approx(reference[RR @ 10], abs=1e-12)
    assert ours_scored["nDCG@10"] == pytest.approx(reference[nDCG @ 10], abs=1e-12)  # graded gains 0..3
    for k in KS:
        assert ours_scored[f"Recall@{k}"] == pytest.approx(reference[R @ k], abs=1e-12)
    # The random data must exercise the metrics (not all zeros / ones).
    assert 0.05 < ours_scored["MRR@10"] < 0.95
    assert ours_scored["Recall@1"] < ours_scored["Recall@20"] < ours_scored["Recall@100"]


def test_hand_computed_example():
    qrels = {
        # Relevant "a" at rank 2 once the duplicated "x" is counted once; top-1 "x" is not a valid docid.
        "q1": {"a": 1},
        # Two relevant ("n" judged non-relevant): "b" at rank 1; "c" at rank 6 after removing the second "y".
        "q2": {"b": 1, "c": 2, "n": 0},
        # Missing from the run: scores 0 and has no top-1 output.
        "q3": {"e": 1},
        # Relevant at rank 11: outside MRR@10 and Recall@10, inside Recall@20.
        "q5": {"r": 1},
        # Empty ranking: like a missing query.
        "q6": {"f": 1},
    }
    run = {
        "q1": ["x", "x", "a"],
        "q2": ["b", "y", "y", "u", "v", "w", "c"],
        "q4": ["a"],  # not in qrels: ignored
        "q5": [f"p{i}" for i in range(10)] + ["r", "p10"],
        "q6": [],
    }
    valid = {"a", "b", "c", "u", "v", "w", "y", "r"} | {f"p{i}" for i in range(11)}
    metrics = retrieval_metrics(run=run, qrels=qrels, valid_docids=valid, ks=(1, 5, 10, 20))
    assert metrics == pytest.approx(
        {
            "MRR@10": (1 / 2 + 1 + 0 + 0 + 0) / 5,
            "Recall@1": (0 + 1 / 2 + 0 + 0 + 0) / 5,
            "Recall@5": (1 + 1 / 2 + 0 + 0 + 0) / 5,
            "Recall@10": (1 + 1 + 0 + 0 + 0) / 5,
            "Recall@20": (1 + 1 + 0 + 1 + 0) / 5,
            # Gains are grades: q2's "c" (grade 2) at rank 6, its ideal order c, b.
            "nDCG@10": (1 / math.log2(3) + (1 + 2 / math.log2(7)) / (2 + 1 / math.log2(3))) / 5,
            "num_queries": 5,
            # Top-1 outputs of q1, q2, q5: only "x" is invalid.
            "invalid_docid_rate": 1 / 3,
        },
        abs=1e-12,
    )


def test_query_without_relevant_documents_counts_as_zero():
    qrels = {"q1": {"a": 1}, "q2": {"b": 0}}
    run = {"q1": ["a"], "q2": ["b"]}
    metrics = retrieval_metrics(run=run, qrels=qrels, ks=(1,))
    assert metrics["MRR@10"] == 0.5 and metrics["Recall@1"] == 0.5
    assert "invalid_docid_rate" not in metrics


def test_invalid_docid_rate_is_nan_without_outputs():
    metrics = retrieval_metrics(run={"q1": []}, qrels={"q1": {"a": 1}}, valid_docids={"a"}, ks=(1,))
    assert math.isnan(metrics["invalid_docid_rate"])


def test_bad_arguments():
    with pytest.raises(ValueError, match="ks"):
        retrieval_metrics(run={}, qrels={"q": {"a": 1}}, ks=(0, 5))
    with pytest.raises(ValueError, match="qrels is empty"):
        retrieval_metrics(run={"q": ["a"]}, qrels={})


def test_ranked_docids_orders_scored_rankings_and_keeps_first_occurrence():
    assert ranked_docids(["b", "a", "b", "c", "a"]) == ["b", "a", "c"]
    # By descending score; ties keep list order; the lower-scored copy of "b" is dropped.
    assert ranked_docids([("a", 1.0), ("b", 2.0), ("c", 1.0), ("b", 0.5)]) == ["b", "a", "c"]
    assert ranked_docids([]) == []


def test_trec_round_trip_matches_ir_measures_reader(tmp_path):
    _, run = _random_qrels_and_run(7, num_queries=20)
    run["ties"] = [("t2", 0.5), ("t1", 0.5), ("t0", -1.25), ("t3", 3.0)]
    path = tmp_path / "run.trec"
    write_trec_run(path, run, tag="my_system")

    lines = path.read_text().splitlines()
    assert lines[0].split()[1] == "Q0" and lines[0].split()[3] == "1" and lines[0].split()[5] == "my_system"
    back = read_trec_run(path)
    expected = {q: sorted(r, key=lambda pair: -pair[1]) for q, r in run.items()}  # stable: ties keep order
    assert back == expected
    assert back["ties"] == [("t3", 3.0), ("t2", 0.5), ("t1", 0.5), ("t0", -1.25)]
    # ir-measures reads the same (qid, docid, score) triples from our file.
    reference = {(r.query_id, r.doc_id): r.score for r in ir_measures.read_trec_run(str(path))}
    assert reference == {(q, d): s for q, ranking in run.items() for d, s in ranking}


def test_read_trec_run_orders_by_score_then_rank(tmp_path):
    path = tmp_path / "run.trec"
    path.write_text("q1 Q0 a 3 1.0 t\nq1 Q0 b 1 2.0 t\nq1 Q0 c 2 1.0 t\nq2 0 z 1 -0.5 t\n")
    assert read_trec_run(path) == {"q1": [("b", 2.0), ("c", 1.0), ("a", 1.0)], "q2": [("z", -0.5)]}


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("q1 Q0 b 2 0.5", "expected 6"),
        ("q1 Q0 b two 0.5 t", "rank 'two' is not an integer"),
        ("q1 Q0 b 2 high t", "score 'high' is not a number"),
        ("q1 Q0 b 2 nan t", "not finite"),
        ("q1 Q0 a 2 0.5 t", "docid 'a' appears twice"),
    ],
)
def test_read_trec_run_errors_name_path_and_line(tmp_path, bad_line, message):
    path = tmp_path / "bad.trec"
    path.write_text(f"q1 Q0 a 1 1.0 t\n{bad_line}\nq1 Q0 c 3 0.1 t\n")
    with pytest.raises(DataFormatError, match=rf"bad\.trec:2: .*{message}"):
        read_trec_run(path)


def test_a_trec_run_has_the_mode_of_any_new_file(tmp_path):
    """Written through a private temporary file (mode 0600), the run kept that mode; it is shared as any file is."""
    previous = os.umask(0o027)
    try:
        write_trec_run(tmp_path / "run.trec", {"q": [("d", 1.0)]}, tag="t")
        (tmp_path / "plain").write_text("")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "run.trec").stat().st_mode) == stat.S_IMODE((tmp_path / "plain").stat().st_mode)
    assert stat.S_IMODE((tmp_path / "run.trec").stat().st_mode) == 0o640


@pytest.mark.parametrize(
    "run, tag, message",
    [
        ({"q1": [("a", 1.0), ("a", 0.5)]}, "t", "appears twice"),
        ({"q1": [("a b", 1.0)]}, "t", "whitespace"),
        ({"q 1": [("a", 1.0)]}, "t", "whitespace"),
        ({"q1": [("a", 1.0)]}, "my tag", "whitespace"),
        ({"q1": [("a", float("inf"))]}, "t", "non-finite"),
    ],
)
def test_write_trec_run_rejects_unwritable_runs(tmp_path, run, tag, message):
    path = tmp_path / "out.trec"
    with pytest.raises(ValueError, match=message):
        write_trec_run(path, run, tag=tag)
    assert list(tmp_path.iterdir()) == []  # no partial file, no temporary left behind
