"""Paired significance tests against brute force and the hand formula; per-query metrics against their means."""
import itertools
import json
import math
import shutil

import numpy as np
import pytest
import scipy.stats

from gr_jax.data.readers import open_dataset
from gr_jax.evaluation import per_query_metrics, retrieval_metrics, write_trec_run
from gr_jax.significance import paired_p_value
from gr_jax.tools import compare

from conftest import FIXTURES

A = np.array([1.0, 0.5, 0.0, 1.0, 1 / 3, 0.25, 1.0])
B = np.array([0.5, 0.5, 0.1, 0.0, 1.0, 0.0, 0.2])


def test_fisher_randomisation_equals_every_sign_flip_enumerated():
    d = A - B
    flips = [np.mean(np.array(signs) * d) for signs in itertools.product((1, -1), repeat=len(d))]
    expected = np.mean(np.abs(flips) >= abs(d.mean()) - 1e-12)  # 2**7 = 128 <= permutations: scipy is exact
    assert paired_p_value(A, B, permutations=1000) == pytest.approx(expected, abs=1e-12)
    assert 0.2 < expected < 1  # not a degenerate case
    assert paired_p_value(A, A) == 1.0


def test_student_equals_the_paired_t_formula():
    d = A - B
    t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    assert paired_p_value(A, B, test="student") == pytest.approx(2 * scipy.stats.t.sf(abs(t), len(d) - 1), rel=1e-9)
    with pytest.raises(ValueError, match="one non-zero length"):
        paired_p_value(A, B[:3])


def test_per_query_metrics_by_hand_and_their_means():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1, "c": 1}, "q3": {"z": 1}}
    run = {"q1": ["x", "a"], "q2": ["c", "y", "b"], "q3": ["x"]}
    per_query = per_query_metrics(run=run, qrels=qrels, ks=(1, 2))
    np.testing.assert_allclose(per_query["MRR@10"], [0.5, 1.0, 0.0])
    np.testing.assert_allclose(per_query["Recall@2"], [1.0, 0.5, 0.0])
    metrics = retrieval_metrics(run=run, qrels=qrels, ks=(1, 2))
    assert all(metrics[name] == pytest.approx(values.mean()) for name, values in per_query.items())


def test_compare_tool_reports_each_run_and_every_pair(tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(FIXTURES / "tasks", data)
    qrels = open_dataset(data).qrels("dev")
    docids = [docid for docid, _ in open_dataset(data).collection()]
    relevant = {qid: [d for d, rel in judged.items() if rel > 0] for qid, judged in qrels.items()}
    runs = {"good": {q: [(d, 1.0)] for q, ds in relevant.items() for d in ds[:1]},
            "poor": {q: [(docids[0], 1.0)] for q in qrels}}
    for name, run in runs.items():
        write_trec_run(tmp_path / f"{name}.trec", run, tag=name)
    report = compare.main(["--data_dir", str(data), "--run", "good", str(tmp_path / "good.trec"),
                           "--run", "poor", str(tmp_path / "poor.trec"), "--run", "same", str(tmp_path / "good.trec")])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == report
    assert report["metrics"]["good"] == retrieval_metrics(run=runs["good"], qrels=qrels)
    p = report["p_values"]
    assert p["good"]["same"] == 1.0 and p["good"]["poor"] == p["poor"]["good"] < 1.0
