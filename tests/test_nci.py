"""Tests of gr_jax.data.nci on hand-written fixtures in NCI's NQ and TriviaQA release layouts (tests/fixtures/nci)."""
import json
import pathlib
import shutil

import pytest

from gr_jax.data import nci, readers
from gr_jax.tools import nci as nci_tool
from gr_jax.data.readers import DataFormatError

NQ_DOCS = {
    "0": "Let It BeLet It Be is a song by the English rock band the Beatles. It was released in March 1970.",
    "1": "Mount EverestMount Everest is Earth's highest mountain above sea level. Its elevation is 8,848.86 m.",
    "2": "Crème brûléeCrème brûlée is a dessert of rich custard topped with hardened caramelised sugar.",
    "3": 'Photosynthesis"Photosynthesis" is the process plants use to convert light into chemical energy.',
}
NQ_TRAIN = {
    "-1220107454853145579": 'who sang "let it be"',  # pandas wrote it as "who sang ""let it be""".
    "5225754983651766092": "how tall is mount everest",
    "8838716539218945006": "what is on top of creme brulee",
    "-4340755100872459608": "how do plants make food from light",
}
TRIVIA_DOCS = {
    "0": "the beatles The Beatles were an English rock band formed in Liverpool in 1960.",
    "1": "liverpool Liverpool is a city and metropolitan borough in Merseyside, England.",
    "2": "john lennon John Lennon was an English singer, songwriter and musician.",
    "3": "the great gatsby The Great Gatsby is a 1925 novel by F. Scott Fitzgerald.",
}


@pytest.fixture
def nq_dir(fixtures_dir) -> pathlib.Path:
    return fixtures_dir / "nci" / "nq"


@pytest.fixture
def trivia_dir(fixtures_dir) -> pathlib.Path:
    return fixtures_dir / "nci" / "trivia"


def _copy(src: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(src, tmp_path / src.name))


def _dataset(out: pathlib.Path) -> dict:
    dataset = readers.open_dataset(out)
    return {"collection": dict(dataset.collection()), "train": dict(dataset.queries("train")),
            "dev": dict(dataset.queries("dev")), "qrels_train": dataset.qrels("train"),
            "qrels_dev": dataset.qrels("dev")}


# ---------------------------------------------------------------------------------------------------- NQ


def test_nq_release_converts_to_the_msmarco_layout(nq_dir, tmp_path):
    summary = nci.convert_nci(nci_dir=nq_dir, out_dir=tmp_path / "out")
    got = _dataset(tmp_path / "out")
    assert got["collection"] == NQ_DOCS
    assert got["train"] == NQ_TRAIN
    assert got["dev"] == {"6915606477668963399": "when was let it be released",
                          "-3290814144789249484": "highest mountain on earth"}
    assert got["qrels_train"] == {"-1220107454853145579": {"0": 1}, "5225754983651766092": {"1": 1},
                                  "8838716539218945006": {"2": 1}, "-4340755100872459608": {"3": 1}}
    assert got["qrels_dev"] == {"6915606477668963399": {"0": 1}, "-3290814144789249484": {"1": 1}}
    assert list(got["train"]) == list(NQ_TRAIN)  # File order.
    assert (tmp_path / "out" / "qrels.dev.tsv").read_text() == (
        "6915606477668963399\t0\t0\t1\n-3290814144789249484\t0\t1\t1\n")
    assert summary["corpus_file"] == "NQ_doc_content.tsv"
    assert (summary["documents"], summary["corpus_rows"], summary["corpus_rows_repeating_a_docid"]) == (4, 4, 0)
    assert summary["train"] == {"file": "nq_train_doc_newid.tsv", "rows": 4, "queries": 4, "judgements": 4,
                                "documents_with_query": 4}
    assert summary["train_coverage"] == 1.0
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary


def test_nq_title_file_keeps_the_first_row_of_each_docid(nq_dir, tmp_path):
    summary = nci.convert_nci(nci_dir=nq_dir, out_dir=tmp_path / "out", corpus="title_abs")
    assert _dataset(tmp_path / "out")["collection"] == {
        "0": "let it be Let It Be is a song by the English rock band the Beatles.",
        "1": "mount everest Mount Everest is Earth's highest mountain above sea level.",
        "2": "creme brulee Crème brûlée is a dessert of rich custard.",
        "3": 'photosynthesis "Photosynthesis" is the process plants use to convert light.',  # CSV-unquoted.
    }
    assert (summary["corpus_file"], summary["corpus_rows"], summary["corpus_rows_repeating_a_docid"]) == (
        "nq_title_abs.tsv", 6, 2)


def test_nq_without_content_file_falls_back_to_the_title_file(nq_dir, tmp_path):
    nq_copy = _copy(nq_dir, tmp_path)
    (nq_copy / "NQ_doc_content.tsv").unlink()
    assert nci.detect_dataset(nq_copy) == "nq"
    assert nci.convert_nci(nci_dir=nq_copy, out_dir=tmp_path / "out")["corpus_file"] == "nq_title_abs.tsv"


# ---------------------------------------------------------------------------------------------------- TriviaQA


def test_trivia_release_merges_rows_of_one_question(trivia_dir, tmp_path):
    summary = nci.convert_nci(nci_dir=trivia_dir, out_dir=tmp_path / "out")
    got = _dataset(tmp_path / "out")
    assert got["collection"] == TRIVIA_DOCS
    assert got["train"] == {"train-0": "Which band did John Lennon found?",
                            "train-1": "In which city were the Beatles formed?",
                            "train-2": '"The Great Gatsby" was written by whom?'}  # Raw file: quotes kept.
    assert got["qrels_train"] == {"train-0": {"0": 1, "2": 1}, "train-1": {"1": 1}, "train-2": {"3": 1}}
    assert got["dev"] == {"dev-0": "Which Merseyside city was home to the Beatles?",
                          "dev-1": "Who wrote 'Imagine'?"}
    assert got["qrels_dev"] == {"dev-0": {"0": 1, "1": 1}, "dev-1": {"2": 1}}
    assert summary["train"] == {"file": "train.tsv", "rows": 5, "queries": 3, "judgements": 4,
                                "documents_with_query": 4}
    assert summary["dev"] == {"file": "dev.tsv", "rows": 2, "queries": 2, "judgements": 3, "documents_with_query": 3}
    assert summary["train_coverage"] == 1.0


def test_trivia_title_file_gives_the_same_documents(trivia_dir, tmp_path):
    nci.convert_nci(nci_dir=trivia_dir, out_dir=tmp_path / "content", corpus="content")
    nci.convert_nci(nci_dir=trivia_dir, out_dir=tmp_path / "title", corpus="title_abs")
    assert ((tmp_path / "content" / "collection.tsv").read_bytes()
            == (tmp_path / "title" / "collection.tsv").read_bytes())


def test_read_queries_api(trivia_dir):
    queries = nci.read_queries(trivia_dir, dataset="trivia", split="train")
    assert queries[0] == nci.NciQuery(qid="train-0", text="Which band did John Lennon found?", docids=("0", "2"),
                                      line=1)
    assert [q.line for q in queries] == [1, 3, 4]
    with pytest.raises(ValueError, match="not 'test'"):
        nci.read_queries(trivia_dir, dataset="trivia", split="test")


def test_coverage_counts_only_documents_with_a_training_query(trivia_dir, tmp_path):
    trivia_copy = _copy(trivia_dir, tmp_path)
    lines = (trivia_copy / "train.tsv").read_text().splitlines(keepends=True)
    (trivia_copy / "train.tsv").write_text("".join(lines[:3]))  # Documents 0, 2, 1 keep a training query.
    summary = nci.convert_nci(nci_dir=trivia_copy, out_dir=tmp_path / "out")
    assert summary["train"]["documents_with_query"] == 3
    assert summary["train_coverage"] == 0.75


# ----------------------------------------------------------------------------------------- detection, errors, CLI


def test_detect_dataset(nq_dir, trivia_dir, tmp_path):
    assert nci.detect_dataset(nq_dir) == "nq"
    assert nci.detect_dataset(trivia_dir) == "trivia"
    with pytest.raises(FileNotFoundError, match="nq_train_doc_newid.tsv"):
        nci.detect_dataset(tmp_path)


@pytest.mark.parametrize("dataset, file, line, replacement, message", [
    ("nq", "nq_train_doc_newid.tsv", 2, "how tall is mount everest\t5225754983651766092\t7\t2-0-7",
     r"nq_train_doc_newid\.tsv:2: docid\(s\) \['7'\] are not in NQ_doc_content\.tsv"),
    ("nq", "nq_train_doc_newid.tsv", 3, "what is on top\t8838716539218945006",
     r"nq_train_doc_newid\.tsv:3: expected at least 3"),
    ("nq", "nq_dev_doc_newid.tsv", 2, "highest mountain\tq17\t1\t2-0-7",
     r"nq_dev_doc_newid\.tsv:2: expected an integer NQ"),
    ("nq", "nq_dev_doc_newid.tsv", 2, "again\t6915606477668963399\t1\t2-0-7",
     r"nq_dev_doc_newid\.tsv:2: duplicate example_id"),
    ("nq", "nq_dev_doc_newid.tsv", 2, '"unclosed \tquote\t6\t1\t1', r"nq_dev_doc_newid\.tsv:2: malformed CSV"),
    ("nq", "NQ_doc_content.tsv", 3, "2\t\t\ttext\t\ten", r"NQ_doc_content\.tsv:3: expected 7 tab-separated"),
    ("nq", "NQ_doc_content.tsv", 4, "2\t\t\tdup\t\t\ten", r"NQ_doc_content\.tsv:4: duplicate docid '2'"),
    ("trivia", "dev.tsv", 1, "Which city?\t10,11\t0,x\t3-1,4-4",
     r"dev\.tsv:1: expected an integer NCI docid, found 'x'"),
    ("trivia", "dev.tsv", 2, "Who?\t12,13\t2\t5-0", r"dev\.tsv:2: 2 original ids but 1 docids"),
    ("trivia", "train.tsv", 5, "\t11\t1\t4-4", r"train\.tsv:5: empty query"),
    ("trivia", "Trivia_doc_content.tsv", 2, "11\tone\tliverpool\tx\tx",
     r"Trivia_doc_content\.tsv:2: expected an integer"),
])
def test_malformed_rows_name_file_and_line(nq_dir, trivia_dir, tmp_path, dataset, file, line, replacement, message):
    copy = _copy(nq_dir if dataset == "nq" else trivia_dir, tmp_path)
    lines = (copy / file).read_text(encoding="utf-8").splitlines()
    lines[line - 1] = replacement
    (copy / file).write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=message):
        nci.convert_nci(nci_dir=copy, out_dir=tmp_path / "out")
    assert not (tmp_path / "out" / "collection.tsv").exists()  # Nothing half-written.


def test_pandas_float_docids_are_read_as_integers(nq_dir, tmp_path):
    copy = _copy(nq_dir, tmp_path)
    text = (copy / "nq_dev_doc_newid.tsv").read_text().replace("\t0\t1-4-2", "\t0.0\t1-4-2")
    (copy / "nq_dev_doc_newid.tsv").write_text(text)
    nci.convert_nci(nci_dir=copy, out_dir=tmp_path / "out")
    assert readers.open_dataset(tmp_path / "out").qrels("dev")["6915606477668963399"] == {"0": 1}


def test_existing_different_dataset_needs_overwrite(nq_dir, trivia_dir, tmp_path):
    nci.convert_nci(nci_dir=nq_dir, out_dir=tmp_path / "out")
    nci.convert_nci(nci_dir=nq_dir, out_dir=tmp_path / "out")  # Same content: fine.
    with pytest.raises(FileExistsError, match="--overwrite"):
        nci.convert_nci(nci_dir=trivia_dir, out_dir=tmp_path / "out")
    nci.convert_nci(nci_dir=trivia_dir, out_dir=tmp_path / "out", overwrite=True)
    assert _dataset(tmp_path / "out")["collection"] == TRIVIA_DOCS


def test_cli(trivia_dir, tmp_path, capsys):
    summary = nci_tool.main(["--nci_dir", str(trivia_dir), "--out_dir", str(tmp_path / "out")])
    assert json.loads(capsys.readouterr().out) == {"out_dir": str(tmp_path / "out"), **summary}
    assert readers.open_dataset(tmp_path / "out").splits() == ("dev", "train")
    with pytest.raises(SystemExit, match="error: .*neither NCI layout"):
        nci_tool.main(["--nci_dir", str(tmp_path / "out"), "--out_dir", str(tmp_path / "again")])
