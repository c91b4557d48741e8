"""Rank fusion (gr_jax.fusion, ranx): hand-computed RRF and interpolation, parameters chosen as a brute-force grid
over our own metric would choose them, the fused retriever, and the TREC-run tool."""
import itertools
import json

import pytest

from gr_jax.evaluation import retrieval_metrics, scored_to_ranked, write_trec_run
from gr_jax.fusion import Fusion
from gr_jax.retrievers import Ranking
from gr_jax.retrievers.fusion import FusedRetriever
from gr_jax.tools import fuse as fuse_tool

A = {"q1": [("d1", 9.0), ("d2", 5.0), ("d3", 1.0)], "q2": [("d4", 2.0), ("d5", 1.0)]}
B = {"q1": [("d3", 0.9), ("d1", 0.7)], "q3": [("d6", 0.5)]}


def test_rrf_is_the_sum_of_reciprocal_ranks():
    fused = Fusion(method="rrf", params={"k": 60}).fuse([A, B])
    assert list(fused) == ["q1", "q2", "q3"]  # the union of the runs' queries, in first appearance
    expected_q1 = {"d1": 1 / 61 + 1 / 62, "d3": 1 / 63 + 1 / 61, "d2": 1 / 62}
    assert [docid for docid, _ in fused["q1"]] == ["d1", "d3", "d2"]
    for docid, score in fused["q1"]:
        assert score == pytest.approx(expected_q1[docid], rel=1e-12)
    assert fused["q2"] == [("d4", pytest.approx(1 / 61)), ("d5", pytest.approx(1 / 62))]
    assert fused["q3"] == [("d6", pytest.approx(1 / 61))]


def test_interpolation_of_min_max_normalised_scores():
    fused = Fusion(method="wsum", norm="min-max", params={"weights": [0.25, 0.75]}).fuse([A, B], depth=2)
    # q1: A's scores 9, 5, 1 -> 1, .5, 0; B's .9, .7 -> 1, 0.
    assert fused["q1"] == [("d3", pytest.approx(0.75)), ("d1", pytest.approx(0.25))]  # d2: .125, cut by depth 2
    assert fused["q3"] == [("d6", pytest.approx(0.0))]  # one document: min == max, ranx's 0


def test_bad_fusions_are_refused():
    with pytest.raises(ValueError, match="not one of"):
        Fusion(method="average")
    with pytest.raises(ValueError, match="3 fusion weights for 2 runs"):
        Fusion(method="wsum", params={"weights": [0.2, 0.3, 0.5]}).fuse([A, B])
    with pytest.raises(ValueError, match="at least two runs"):
        Fusion().fuse([A])
    with pytest.raises(ValueError, match=r"'wsum' needs params=\{'weights': \[one per run\]\}"):
        Fusion(method="wsum").fuse([A, B])


def _split_runs():
    """Two systems on 6 queries: each ranks some relevant documents first and the rest second, behind a document
    of its own; the relevant one is high in both, so an even interpolation ranks every one first."""
    qrels = {f"q{i}": {f"r{i}": 1} for i in range(6)}
    first, second = {}, {}
    for i in range(6):
        relevant_first, own_first = [(f"r{i}", 1.0), (f"x{i}", 0.5)], [(f"x{i}", 1.0), (f"r{i}", 0.9)]
        relevant_second, own_second = [(f"r{i}", 1.0), (f"y{i}", 0.5)], [(f"y{i}", 1.0), (f"r{i}", 0.9)]
        first[f"q{i}"] = (relevant_first if i < 2 else own_first) + [("z", 0.0)]
        second[f"q{i}"] = (relevant_second if i in (2, 3) else own_second) + [("w", 0.0)]
    return qrels, [first, second]


def test_chosen_weights_are_the_best_of_the_grid_by_our_own_metric():
    qrels, runs = _split_runs()
    chosen = Fusion.chosen_on(qrels=qrels, runs=runs, method="wsum", metric="mrr@10")

    def mrr(weights):
        fused = Fusion(method="wsum", params={"weights": list(weights)}).fuse(runs)
        return retrieval_metrics(run=scored_to_ranked(fused), qrels=qrels)["MRR@10"]

    grid = [(a / 10, b / 10) for a, b in itertools.product(range(11), repeat=2)]
    best = max(mrr(weights) for weights in grid)
    assert best > max(mrr((1.0, 0.0)), mrr((0.0, 1.0)))  # the fusion beats each system alone
    assert mrr(chosen.params["weights"]) == pytest.approx(best)
    assert all(isinstance(w, float) for w in chosen.params["weights"])  # plain values, JSON-writable


class _FixedRetriever:
    def __init__(self, rankings):
        self.rankings = rankings
        self.asked = []

    def rank(self, queries, *, k):
        self.asked.append(k)
        ranked = [self.rankings[query][:k] for query in queries]
        return Ranking(ids=[[d for d, _ in r] for r in ranked], scores=[[s for _, s in r] for r in ranked],
                       invalid=frozenset(docid for r in ranked for docid, _ in r if docid == "bad"),
                       seconds=1.5)


def test_fused_retriever_ranks_as_the_fusion_of_its_members_rankings():
    first, second = _FixedRetriever(A), _FixedRetriever({**B, "q2": [("bad", 1.0)]})
    retriever = FusedRetriever(members=[first, second], fusion=Fusion(method="rrf", params={"k": 1}), depth=3)
    ranking = retriever.rank(["q1", "q2", "q1"], k=2)
    assert first.asked == second.asked == [3]
    # q1 with k=1: d1 1/2 + 1/3, d3 1/4 + 1/2, d2 1/3; q2: d4 and bad 1/2 each (equal scores: docid order), d5 1/3.
    assert ranking.ids == [["d1", "d3"], ["bad", "d4"], ["d1", "d3"]]
    assert ranking.scores[0] == pytest.approx([1 / 2 + 1 / 3, 1 / 4 + 1 / 2])
    assert ranking.invalid == {"bad"} and ranking.seconds == 3.0
    with pytest.raises(ValueError, match="deeper than the members' depth"):
        retriever.rank(["q1"], k=4)


def test_tool_chooses_on_one_split_and_scores_the_other(tmp_path, capsys):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    qrels, runs = _split_runs()
    (data_dir / "collection.tsv").write_text("".join(f"r{i}\trelevant {i}\n" for i in range(6)))
    for split in ("valid", "dev"):
        (data_dir / f"queries.{split}.tsv").write_text("".join(f"{q}\tquery {q}\n" for q in qrels))
        (data_dir / f"qrels.{split}.tsv").write_text("".join(f"{q}\t0\t{d}\t1\n" for q, j in qrels.items() for d in j))
    paths = {}
    for name, run in zip(("first", "second"), runs):
        paths[name] = tmp_path / f"{name}.trec"
        write_trec_run(paths[name], run, tag=name)
    systems = [["first", str(paths["first"]), str(paths["first"])],
               ["second", str(paths["second"]), str(paths["second"])]]
    run_file = tmp_path / "fused.dev.trec"
    report = fuse_tool.main(["--data_dir", str(data_dir), "--method", "wsum", "--run_file", str(run_file),
                             *itertools.chain.from_iterable(["--system", *system] for system in systems)])
    assert json.loads(capsys.readouterr().out) == report
    chosen = Fusion(method="wsum", params=report["fusion"]["params"])
    assert report["dev"]["fused"]["MRR@10"] == report["valid"]["fused"]["MRR@10"]  # the same runs on both splits
    assert report["dev"]["fused"]["MRR@10"] > max(report["dev"]["first"]["MRR@10"], report["dev"]["second"]["MRR@10"])
    assert retrieval_metrics(run=scored_to_ranked(chosen.fuse(runs)), qrels=qrels) == report["dev"]["fused"]
    assert run_file.is_file()
    with pytest.raises(SystemExit, match="error: --select_split and --split are both 'dev'"):
        fuse_tool.main(["--data_dir", str(data_dir), "--select_split", "dev", "--system", *systems[0],
                        "--system", *systems[1]])
