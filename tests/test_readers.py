"""Tests of gr_jax.data.readers: MS MARCO and BEIR layouts, error messages naming path:line, write_tsv."""
import json
import logging
import pathlib

import ir_measures
import pytest

from gr_jax.data import readers
from gr_jax.data.readers import DataFormatError

SHARED_MSMARCO_MINI = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "msmarco_mini"


def _write_bytes(path: pathlib.Path, data: bytes) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------------------------------------- MS MARCO files


def test_read_collection_yields_every_passage_in_file_order(fixtures_dir):
    passages = list(readers.read_collection(fixtures_dir / "msmarco" / "collection.tsv"))
    assert [pid for pid, _ in passages] == [str(i) for i in range(12)]
    assert passages[4] == ("4", "Café au lait is coffee with hot milk added; in Europe it is served in a bowl, "
                                "the “French way”.")


def test_read_collection_keeps_carriage_returns_inside_text_and_strips_crlf(tmp_path):
    path = _write_bytes(tmp_path / "collection.tsv", b"1\tfirst\rline\r\n2\tsecond\n3\tno final newline")
    assert list(readers.read_collection(path)) == [("1", "first\rline"), ("2", "second"), ("3", "no final newline")]


def test_read_collection_streams_and_reports_the_malformed_line(tmp_path):
    path = _write_bytes(tmp_path / "collection.tsv", b"1\tone\n2\ttwo\n3\tthree\twith a tab\n4\tfour\n")
    passages = readers.read_collection(path)
    assert next(passages) == ("1", "one")  # Lazy: nothing past line 1 has been read or checked yet.
    assert next(passages) == ("2", "two")
    with pytest.raises(DataFormatError, match=rf"^{path}:3: expected 2 tab-separated columns .*found 3 .*tab inside"):
        next(passages)


@pytest.mark.parametrize(
    "content, line, message",
    [
        (b"1\tone\n2\n", 2, "expected 2 tab-separated columns"),
        (b"1\tone\n\ttwo\n", 2, "empty pid ''"),
        (b"1\tone\n 2\ttwo\n", 2, "pid ' 2' contains whitespace"),
        # Read, trained and evaluated, it failed only when the TREC run was written: now refused when read.
        (b"1\tone\na 6\ttwo\n", 2, "pid 'a 6' contains whitespace: TREC runs and qrels separate their columns"),
        (b"1\tone\n2\ttwo\n1\tagain\n", 3, "duplicate pid '1'"),
        (b"1\tone\n2\t\xff\xfe\n", 2, "not valid UTF-8"),
    ],
)
def test_read_collection_rejects_malformed_lines(tmp_path, content, line, message):
    path = _write_bytes(tmp_path / "collection.tsv", content)
    with pytest.raises(DataFormatError, match=rf"^{path}:{line}: {message}"):
        list(readers.read_collection(path))


def test_data_format_error_is_a_value_error_and_at_formats_path_and_line():
    error = DataFormatError.at(pathlib.Path("/d/x.tsv"), 7, "bad")
    assert isinstance(error, ValueError)
    assert str(error) == "/d/x.tsv:7: bad"


def test_read_queries_rejects_duplicate_qids(tmp_path, fixtures_dir):
    queries = list(readers.read_queries(fixtures_dir / "msmarco" / "queries.dev.tsv"))
    assert queries[1] == ("2002", "what is café au lait")
    path = _write_bytes(tmp_path / "queries.train.tsv", b"7\ta\n8\tb\n7\tc\n")
    with pytest.raises(DataFormatError, match=rf"^{path}:3: duplicate qid '7'"):
        list(readers.read_queries(path))
    # An empty query went into training and BM25 without a word (BM25 scored it 0).
    path = _write_bytes(tmp_path / "queries.dev.tsv", b"7\ta\n8\t  \n")
    with pytest.raises(DataFormatError, match=rf"^{path}:2: query '8' is empty: nothing to train on or rank with"):
        list(readers.read_queries(path))


def test_read_qrels_matches_ir_measures(fixtures_dir):
    path = fixtures_dir / "msmarco" / "qrels.train.tsv"
    expected: dict[str, dict[str, int]] = {}
    for qrel in ir_measures.read_trec_qrels(str(path)):
        expected.setdefault(qrel.query_id, {})[qrel.doc_id] = qrel.relevance
    assert readers.read_qrels(path) == expected
    assert readers.read_qrels(path)["1001"] == {"1": 1}


def test_read_qrels_accepts_any_whitespace_and_graded_relevance(tmp_path):
    path = _write_bytes(tmp_path / "qrels.dev.tsv", b"q1 0 d1 2\nq1\tQ0\td2\t0\nq2  0  d1  -1\n")
    assert readers.read_qrels(path) == {"q1": {"d1": 2, "d2": 0}, "q2": {"d1": -1}}


@pytest.mark.parametrize(
    "content, line, message",
    [
        (b"q1\t0\td1\t1\nq1\t0\td2\n", 2, "expected 4 columns"),
        (b"q1\t0\td1\tyes\n", 1, "relevance must be an integer, got 'yes'"),
        (b"q1\t0\td1\t1\nq1\t0\td1\t1\n", 2, "duplicate judgement for query 'q1', document 'd1'"),
    ],
)
def test_read_qrels_rejects_malformed_lines(tmp_path, content, line, message):
    path = _write_bytes(tmp_path / "qrels.dev.tsv", content)
    with pytest.raises(DataFormatError, match=rf"^{path}:{line}: {message}"):
        readers.read_qrels(path)


# ------------------------------------------------------------------------------------------------ BEIR files


def test_beir_corpus_joins_title_and_text(fixtures_dir):
    corpus = dict(readers.read_beir_corpus(fixtures_dir / "beir" / "corpus.jsonl"))
    assert corpus["doc0"] == ("Manhattan Project The Manhattan Project was a research and development undertaking "
                              "during World War II that produced the first nuclear weapons.")
    assert corpus["doc2"].startswith("A hoagie is")  # Empty title: the text alone, no leading space.
    assert corpus["doc3"] == "Café au lait is coffee with hot milk added."  # Missing title.
    assert list(corpus) == ["doc0", "doc1", "doc2", "doc3", "doc4"]


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"_id": "a", "text": "x"', "invalid JSON"),
        ('["a", "x"]', "expected a JSON object, got list"),
        ('{"title": "t", "text": "x"}', "missing field '_id'"),
        ('{"_id": "a", "title": "t"}', "missing field 'text'"),
        ('{"_id": "a", "text": ["x"]}', "field 'text' must be a string, got list"),
        ('{"_id": "d0", "text": "again"}', "duplicate '_id' 'd0'"),
        ("", "empty line"),
    ],
)
def test_beir_corpus_rejects_malformed_lines(tmp_path, line, message):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"_id": "d0", "text": "first"}) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=rf"^{path}:2: {message}"):
        list(readers.read_beir_corpus(path))


def test_beir_qrels_need_the_header(tmp_path, fixtures_dir):
    assert readers.read_beir_qrels(fixtures_dir / "beir" / "qrels" / "test.tsv") == {
        "q4": {"doc4": 2}, "q5": {"doc3": 1, "doc1": 0}}
    path = _write_bytes(tmp_path / "qrels" / "test.tsv", b"q1\tdoc1\t1\n")
    with pytest.raises(DataFormatError, match=rf"^{path}:1: expected the header 'query-id corpus-id score'"):
        readers.read_beir_qrels(path)
    path = _write_bytes(tmp_path / "qrels" / "dev.tsv", b"query-id\tcorpus-id\tscore\nq1\tdoc1\n")
    with pytest.raises(DataFormatError, match=rf"^{path}:2: expected 3 columns"):
        readers.read_beir_qrels(path)


# ------------------------------------------------------------------------------------------- RetrievalDataset


def test_open_dataset_msmarco_layout(fixtures_dir):
    dataset = readers.open_dataset(fixtures_dir / "msmarco")
    assert dataset.layout == "msmarco"
    assert dataset.splits() == ("dev", "train")
    assert sum(1 for _ in dataset.collection()) == 12
    assert [qid for qid, _ in dataset.queries("dev")] == ["2001", "2002", "2003", "2004"]
    assert dataset.qrels("train")["1004"] == {"2": 1}
    assert dataset.check_qrels("train") == 0
    assert dataset.check_qrels("dev") == 0


def test_open_dataset_beir_layout_selects_a_splits_queries_by_its_qrels(fixtures_dir):
    dataset = readers.open_dataset(fixtures_dir / "beir")
    assert dataset.layout == "beir"
    assert dataset.splits() == ("test", "train")
    assert list(dataset.queries("test")) == [("q4", "highest mountain on earth"), ("q5", "what is café au lait")]
    assert [qid for qid, _ in dataset.queries("train")] == ["q1", "q2", "q3"]
    assert dataset.qrels("train") == {"q1": {"doc1": 1}, "q2": {"doc0": 1}, "q3": {"doc2": 1}}
    assert dataset.check_qrels("test") == 0


def test_beir_queries_missing_from_queries_jsonl_are_counted(tmp_path, fixtures_dir, caplog):
    for name in ("corpus.jsonl", "queries.jsonl"):
        (tmp_path / name).write_bytes((fixtures_dir / "beir" / name).read_bytes())
    _write_bytes(tmp_path / "qrels" / "test.tsv", b"query-id\tcorpus-id\tscore\nq1\tdoc1\t1\nq9\tdoc1\t1\n")
    with caplog.at_level(logging.WARNING):
        assert [qid for qid, _ in readers.open_dataset(tmp_path).queries("test")] == ["q1"]
    assert "1 queries named in" in caplog.text


def test_check_qrels_counts_and_logs_unknown_documents(tmp_path, fixtures_dir, caplog):
    dataset = readers.open_dataset(fixtures_dir / "msmarco")
    with caplog.at_level(logging.WARNING):
        assert dataset.check_qrels("dev", docids={"4", "5"}) == 2
    assert "2 qrels name unknown documents (of 4 judgements" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert dataset.check_qrels("dev", docids=[str(i) for i in range(12)]) == 0
    assert caplog.text == ""


def test_judged_queries_missing_from_the_queries_file_are_counted_in_one_warning(fixtures_dir, caplog):
    """The one check that training's pairs, the evaluators and BM25 share (BM25 scored such queries 0 silently)."""
    dataset = readers.open_dataset(fixtures_dir / "msmarco")
    qrels = dataset.qrels("dev")
    qids = {qid for qid, _ in dataset.queries("dev")}
    with caplog.at_level(logging.WARNING):
        assert dataset.check_judged_queries("dev", qrels=qrels, qids=qids) == 0
        assert caplog.text == ""
        dropped = sorted(qrels)[0]
        assert dataset.check_judged_queries("dev", qrels=qrels, qids=qids - {dropped}) == 1
    assert f"1 of the {len(qrels)} queries judged in" in caplog.text
    assert "qrels.dev.tsv are missing from the queries file: never ranked" in caplog.text


def test_missing_files_raise_listing_what_was_expected(tmp_path, fixtures_dir):
    with pytest.raises(FileNotFoundError, match="does not exist; expected the MS MARCO layout"):
        readers.open_dataset(tmp_path / "nowhere")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"collection.tsv.*corpus.jsonl.*found: \['notes.txt'\]"):
        readers.open_dataset(tmp_path)
    dataset = readers.open_dataset(fixtures_dir / "msmarco")
    with pytest.raises(FileNotFoundError, match=r"queries.test.tsv does not exist; this data dir has splits: dev, "
                                                 r"train; set --gin.EVAL_SPLIT=dev$"):
        dataset.queries("test")
    with pytest.raises(FileNotFoundError, match=r"qrels.eval.tsv does not exist"):
        dataset.qrels("eval")


def test_splits_are_whatever_query_files_exist(tmp_path):
    _write_bytes(tmp_path / "collection.tsv", b"1\tone\n")
    for split in ("train", "dev.small", "eval"):
        _write_bytes(tmp_path / f"queries.{split}.tsv", b"1\tq\n")
    assert readers.open_dataset(tmp_path).splits() == ("dev.small", "eval", "train")


@pytest.mark.skipif(not SHARED_MSMARCO_MINI.is_dir(), reason="shared/data/msmarco_mini is not beside the repo")
def test_shared_msmarco_mini_reads_with_its_documented_counts():
    dataset = readers.open_dataset(SHARED_MSMARCO_MINI)
    assert dataset.splits() == ("dev", "train")
    assert sum(1 for _ in dataset.collection()) == 11_809
    assert sum(1 for _ in dataset.queries("train")) == 227
    assert len(dataset.qrels("dev")) == 313
    assert dataset.check_qrels("dev") == 0


# ---------------------------------------------------------------------------------------------------- write_tsv


def test_write_tsv_round_trips_through_the_readers(tmp_path):
    rows = [("07555863", "food, solid food; a kind of solid"), ("2", "Café “quoted”")]
    assert readers.write_tsv(tmp_path / "out" / "collection.tsv", rows) == 2
    assert list(readers.read_collection(tmp_path / "out" / "collection.tsv")) == rows
    assert readers.write_tsv(tmp_path / "qrels.dev.tsv", [("q1", 0, "d1", 1)]) == 1
    assert readers.read_qrels(tmp_path / "qrels.dev.tsv") == {"q1": {"d1": 1}}


@pytest.mark.parametrize("bad", ["a\tb", "a\nb", "a\rb"])
def test_write_tsv_refuses_separators_in_fields_and_leaves_no_partial_file(tmp_path, bad):
    path = tmp_path / "collection.tsv"
    path.write_text("1\told\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=rf"^{path}:2: field .* contains a tab or line break"):
        readers.write_tsv(path, [("1", "fine"), ("2", bad)])
    assert path.read_text(encoding="utf-8") == "1\told\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["collection.tsv"]


@pytest.mark.parametrize("layout", ["msmarco", "beir"])
def test_document_lookup_reads_documents_by_position(tmp_path, layout):
    from gr_jax.data.readers import DocumentLookup
    documents = [(f"d{i}", f"text of document {i}" + (" café" if i % 3 == 0 else "")) for i in range(50)]
    if layout == "msmarco":
        (tmp_path / "collection.tsv").write_text("".join(f"{d}\t{t}\r\n" if i == 7 else f"{d}\t{t}\n"
                                                         for i, (d, t) in enumerate(documents)), encoding="utf-8")
    else:
        (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n"
                                                       for d, t in documents), encoding="utf-8")
    dataset = readers.open_dataset(tmp_path)
    assert list(dataset.collection()) == documents
    lookup = DocumentLookup(dataset)
    rows = [49, 0, 7, 21, 7]
    assert lookup.texts(rows) == [documents[r] for r in rows]
    with pytest.raises(IndexError, match="document 50 of a collection of 50 lines"):
        lookup.texts([50])


def test_a_range_of_lines_is_read_as_plain_enumeration_reads_it(tmp_path, monkeypatch):
    """Lines skipped by counting line ends in small blocks (so a block boundary falls inside lines) are the lines a
    plain enumeration skips; the collection's rows [start, stop) are its documents start..stop-1."""
    monkeypatch.setattr(readers, "_SCAN_BYTES", 7)
    lines = [f"d{i}\t{'passage ' * (i % 5)}é {i}" for i in range(50)]
    path = _write_bytes(tmp_path / "data" / "collection.tsv", ("\n".join(lines) + "\n").encode())
    every = list(readers.read_lines(path))
    for start, stop in [(1, None), (2, 5), (17, 18), (49, 51), (51, None), (60, None), (30, 30)]:
        expected = [(n, line) for n, line in every if n >= start and (stop is None or n < stop)]
        assert list(readers.read_lines(path, start_line=start, stop_line=stop)) == expected, (start, stop)
    dataset = readers.open_dataset(tmp_path / "data")
    assert list(dataset.collection(rows=(10, 13))) == [tuple(line.split("\t")) for line in lines[10:13]]
    assert [docid for docid, _ in dataset.collection(rows=(45, 50))] == [f"d{i}" for i in range(45, 50)]


def test_duplicate_ids_are_found_by_hash_and_confirmed_on_the_ids(tmp_path, monkeypatch):
    """Every id hashing alike (a forced collision), distinct ids pass; a real duplicate is named at its line."""
    monkeypatch.setattr(readers, "hash", lambda _: 7, raising=False)
    path = _write_bytes(tmp_path / "collection.tsv", b"a\tone\nb\ttwo\nc\tthree\n")
    assert [pid for pid, _ in readers.read_collection(path)] == ["a", "b", "c"]
    path = _write_bytes(tmp_path / "collection.tsv", b"a\tone\nb\ttwo\nc\tthree\nb\tagain\na\tand again\n")
    with pytest.raises(DataFormatError, match=rf"^{path}:4: duplicate pid 'b'"):
        list(readers.read_collection(path))
