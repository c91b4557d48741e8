"""gr_jax.tools.bm25: BM25 scores against the Lucene formula, doc2query expansion, D2Q files, and the CLI end to end."""
import json
import logging
import math

import pytest

from gr_jax.data.d2q import read_d2q_file
from gr_jax.data.readers import DataFormatError
from gr_jax.evaluation import read_trec_run, retrieval_metrics, scored_to_ranked
from gr_jax.tools.bm25 import bm25_run, main

DOCUMENTS = [
    ("d1", "Paris is the capital and largest city of France."),
    ("d2", "Running shoes are designed for runners who run long distances."),
    ("d3", "The banana is an elongated, edible fruit produced by flowering plants."),
    ("d4", "Photosynthesis converts light energy into chemical energy in plants."),
    ("d5", "The stock market fell sharply on Monday after the announcement."),
]


def test_obviously_matching_document_ranks_first():
    queries = [
        ("q_france", "what is the capital of France"),
        ("q_shoes", "best shoe for running"),  # matches "Running shoes" only through the stemmer
        ("q_plants", "how do plants make chemical energy from light"),
    ]
    run = bm25_run(documents=DOCUMENTS, queries=queries, k=3)
    assert [ranking[0][0] for ranking in run.values()] == ["d1", "d2", "d4"]
    for ranking in run.values():
        scores = [score for _, score in ranking]
        assert scores == sorted(scores, reverse=True) and all(score > 0 for score in scores)
        assert len(ranking) <= 3


def test_scores_follow_the_lucene_bm25_formula():
    # No stopwords, no stemming changes to term counts: document lengths are the word counts.
    documents = [("a", "apple banana apple"), ("b", "banana cherry"), ("c", "cherry date elderberry fig")]
    k1, b = 1.2, 0.6
    run = bm25_run(documents=documents, queries=[("q", "apple cherry")], k=10, k1=k1, b=b)

    num_docs, avg_len = 3, (3 + 2 + 4) / 3
    tokens = {docid: text.split() for docid, text in documents}

    def idf(term):
        df = sum(term in words for words in tokens.values())
        return math.log(1 + (num_docs - df + 0.5) / (df + 0.5))

    def score(docid):
        words = tokens[docid]
        total = 0.0
        for term in ("apple", "cherry"):
            tf = words.count(term)
            total += idf(term) * tf / (tf + k1 * (1 - b + b * len(words) / avg_len))
        return total

    expected = sorted(((docid, score(docid)) for docid in tokens), key=lambda pair: -pair[1])
    assert [docid for docid, _ in run["q"]] == [docid for docid, _ in expected] == ["a", "b", "c"]
    assert [s for _, s in run["q"]] == pytest.approx([s for _, s in expected], rel=1e-5)


def test_unmatched_documents_and_stopword_queries_return_nothing():
    run = bm25_run(documents=DOCUMENTS, queries=[("q_banana", "banana"), ("q_stop", "what is the")], k=100)
    assert run == {"q_banana": [("d3", pytest.approx(run["q_banana"][0][1]))], "q_stop": []}


def test_equal_scores_keep_collection_order():
    documents = [("z", "same words here"), ("a", "same words here"), ("m", "other text")]
    run = bm25_run(documents=documents, queries=[("q", "same words")], k=2)
    assert [docid for docid, _ in run["q"]] == ["z", "a"]
    assert run["q"][0][1] == run["q"][1][1]


def test_expansion_makes_an_unmatched_document_retrievable():
    queries = [("q_zebra", "where do zebras live")]
    assert bm25_run(documents=DOCUMENTS, queries=queries) == {"q_zebra": []}
    expansions = {"d5": ["zebra habitat", "where do zebras live in africa"], "d1": []}
    run = bm25_run(documents=DOCUMENTS, queries=queries, expansions=expansions)
    assert [docid for docid, _ in run["q_zebra"]] == ["d5"]


def test_bad_inputs():
    with pytest.raises(ValueError, match="not in the collection"):
        bm25_run(documents=DOCUMENTS, queries=[("q", "x")], expansions={"d9": ["query"]})
    with pytest.raises(TypeError, match="sequence of queries"):
        bm25_run(documents=DOCUMENTS, queries=[("q", "x")], expansions={"d1": "a string"})
    with pytest.raises(ValueError, match="document id 'd1' occurs twice"):
        bm25_run(documents=DOCUMENTS + [("d1", "again")], queries=[("q", "x")])
    with pytest.raises(ValueError, match="query id 'q' occurs twice"):
        bm25_run(documents=DOCUMENTS, queries=[("q", "x"), ("q", "y")])
    with pytest.raises(ValueError, match="collection is empty"):
        bm25_run(documents=[], queries=[("q", "x")])


def test_read_d2q_file_accepts_both_layouts(tmp_path):
    docids = ["7", "3", "11"]
    per_line = tmp_path / "per_passage.txt"
    per_line.write_text("who is seven\twhat is seven\n\neleven facts\n")
    by_pid = tmp_path / "by_pid.tsv"
    by_pid.write_text("7\twho is seven\n11\televen facts\n7\twhat is seven\n")
    assert read_d2q_file(by_pid, docids_in_order=docids) == {"7": ["who is seven", "what is seven"],
                                                              "11": ["eleven facts"]}
    assert read_d2q_file(per_line, docids_in_order=docids) == {"7": ["who is seven", "what is seven"], "3": [],
                                                                "11": ["eleven facts"]}


@pytest.mark.parametrize(
    "content, message",
    [
        ("a\nb\n", r"per_passage\.txt:2: the file ends after 2 lines but the collection has 3"),
        ("a\nb\nc\nd\n", r"per_passage\.txt:4: more lines than the 3 passages"),
        ("a\tb\n\t\nc\n", r"per_passage\.txt:2: empty query"),
        ("7\tq\n3\n", r"per_passage\.txt:2: expected 'pid<TAB>query'"),
        ("7\tq\n99\tq\n", r"per_passage\.txt:2: pid '99' is not in the collection"),
        ("7\tq\n3\t \n", r"per_passage\.txt:2: empty query for pid '3'"),
        ("", r"per_passage\.txt:1: the doc2query file is empty"),
    ],
)
def test_read_d2q_file_errors_name_path_and_line(tmp_path, content, message):
    path = tmp_path / "per_passage.txt"
    path.write_text(content)
    with pytest.raises(DataFormatError, match=message):
        read_d2q_file(path, docids_in_order=["7", "3", "11"])


def _write_msmarco_layout(data_dir):
    data_dir.mkdir()
    (data_dir / "collection.tsv").write_text("".join(f"{docid}\t{text}\n" for docid, text in DOCUMENTS))
    (data_dir / "queries.dev.tsv").write_text(
        "101\tcapital city of france\n102\tshoes for running\n103\twhere do zebras live\n"
    )
    (data_dir / "qrels.dev.tsv").write_text("101\t0\td1\t1\n102\t0\td2\t1\n103\t0\td5\t1\n")


def test_cli_end_to_end(tmp_path, capsys):
    data_dir = tmp_path / "data"
    _write_msmarco_layout(data_dir)
    run_file = tmp_path / "bm25.dev.trec"
    metrics = main(["--data_dir", str(data_dir), "--split", "dev", "--run_file", str(run_file), "--k", "3"])
    printed = json.loads(capsys.readouterr().out.strip())
    # 101 and 102 find their passage first; 103 shares no term with d5 and scores 0.
    assert printed["system"] == "bm25" and printed["split"] == "dev"
    assert printed["MRR@10"] == pytest.approx(2 / 3) and printed["num_queries"] == 3
    assert printed == {"system": "bm25", "split": "dev", **metrics}
    qrels = {"101": {"d1": 1}, "102": {"d2": 1}, "103": {"d5": 1}}
    assert retrieval_metrics(run=scored_to_ranked(read_trec_run(run_file)), qrels=qrels) == metrics

    d2q_file = tmp_path / "d2q.tsv"
    d2q_file.write_text("d5\twhere do zebras live\nd5\tzebra habitat\n")
    main(["--data_dir", str(data_dir), "--split", "dev", "--d2q_file", str(d2q_file)])
    printed = json.loads(capsys.readouterr().out.strip())
    assert printed["system"] == "bm25_d2q" and printed["MRR@10"] == pytest.approx(1.0)


def test_cli_bad_input_ends_with_one_line_naming_file_and_line(tmp_path, capsys):
    data_dir = tmp_path / "data"
    _write_msmarco_layout(data_dir)
    with open(data_dir / "collection.tsv", "a") as f:
        f.write("d2\ta second passage with the id of the second one\n")
    lines = (data_dir / "collection.tsv").read_text().splitlines()
    with pytest.raises(SystemExit) as exit_info:
        main(["--data_dir", str(data_dir), "--split", "dev"])
    assert exit_info.value.code == f"error: {data_dir / 'collection.tsv'}:{len(lines)}: duplicate pid 'd2'"
    assert capsys.readouterr().out == ""  # no metrics printed for a collection that is wrong


def test_cli_counts_judgements_of_unknown_documents_in_a_warning(tmp_path, capsys, caplog):
    data_dir = tmp_path / "data"
    _write_msmarco_layout(data_dir)
    with open(data_dir / "qrels.dev.tsv", "a") as f:
        f.write("101\t0\tnot_in_the_collection\t1\n")
    with caplog.at_level(logging.WARNING):
        metrics = main(["--data_dir", str(data_dir), "--split", "dev"])
    assert [r.getMessage() for r in caplog.records if "unknown documents" in r.getMessage()] == [
        f"1 qrels name unknown documents (of 4 judgements in {data_dir / 'qrels.dev.tsv'})"]
    assert metrics["Recall@100"] == pytest.approx((1 / 2 + 1 + 0) / 3)  # the unknown document is never retrieved
