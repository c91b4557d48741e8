"""Readers for the NQ and TriviaQA releases of NCI (Wang et al. 2022, github.com/solidsea98/Neural-Corpus-Indexer-NCI).

NCI's NQ (109,739 Wikipedia documents, called NQ320k there and NQ100k by Pradeep et al. 2023) and TriviaQA
corpora are the small-corpus benchmarks of the generative retrieval literature. NCI's notebooks
(Data_process/NQ_dataset/NQ_dataset_Process.ipynb, Data_process/trivia_dataset/Trivia_dataset_Process.ipynb)
write them as below; `convert_nci` turns a directory of them into our MS MARCO layout (collection.tsv,
queries.{train,dev}.tsv, qrels.{train,dev}.tsv, summary.json) read by `gr_jax.data.readers.open_dataset`.

NQ::

    NQ_doc_content.tsv        docid \\t \\t \\t text \\t \\t \\t en      raw '\\t'.join; text = title+abstract+content
    nq_train_doc_newid.tsv    query \\t example_id \\t docid \\t semantic id [\\t ...]      pandas to_csv (CSV quoting)
    nq_dev_doc_newid.tsv      same, one row per query
    nq_title_abs.tsv          title abstract \\t example_id \\t docid \\t semantic id     pandas; one row per query

TriviaQA::

    Trivia_doc_content.tsv    original id \\t docid \\t title \\t content \\t title+content   raw
    train.tsv                 query \\t original id \\t docid \\t semantic id [\\t ...]    raw; one row per (query, doc)
    dev.tsv                   query \\t original ids \\t docids \\t semantic ids            raw; comma-separated lists
    trivia_title_cont.tsv     title content \\t original id \\t docid \\t semantic id      pandas

docids are NCI's integer "random ids" (column `oldid`/`randomid` in NCI's code: one per distinct title); the
semantic ids are ignored. NQ qids are NQ's example ids; TriviaQA queries have no id in NCI's files, so a split's
distinct query texts are numbered `train-0`, `train-1`, ... in order of first appearance, and the rows of one
query text are merged into one query with several relevant documents (as NCI's own dict does). TriviaQA's
test.tsv is not read: NCI's notebook writes it with the dev questions (`df_val['query']`) paired with the test
documents.

Documents come from the content files (full text) when present; `corpus="title_abs"` (or a directory without
them) uses nq_title_abs.tsv / trivia_title_cont.tsv instead, which NCI's released data includes: for NQ that is
title + abstract only and has one row per query, so a docid's first row is its document (NCI keeps the first
row of each title) and later rows are counted, not written.

Quoting: files NCI wrote with pandas are read with CSV rules (quoted fields, doubled quotes); files it wrote
with a raw '\\t'.join are split on tabs, so a question starting with '"' keeps its quotes. Any malformed row
raises `DataFormatError` naming `path:line`.

    python -m gr_jax.tools.nci --nci_dir Data_process/NQ_dataset --out_dir data/nq100k [--dataset nq|trivia]
        [--corpus auto|content|title_abs] [--overwrite]
"""
from __future__ import annotations

import csv
import dataclasses
import filecmp
import json
import logging
import os
import pathlib
import re
import tempfile
from collections.abc import Iterator, Mapping
from typing import Literal

from gr_jax.data.readers import DataFormatError, PathLike, read_lines, write_tsv

Dataset = Literal["nq", "trivia"]
CorpusSource = Literal["auto", "content", "title_abs"]
SPLITS = ("train", "dev")
OUTPUT_FILES = ("collection.tsv", "queries.train.tsv", "queries.dev.tsv", "qrels.train.tsv", "qrels.dev.tsv",
                "summary.json")

_DOCID = re.compile(r"\d+")
_PANDAS_FLOAT_DOCID = re.compile(r"(\d+)\.0")  # An int column pandas turned into floats (it held a NaN).
_NQ_EXAMPLE_ID = re.compile(r"-?\d+")
_FORBIDDEN = ("\t", "\n", "\r")

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class NciLayout:
    """File names of one NCI dataset directory."""

    content_file: str
    title_file: str
    split_files: Mapping[str, str]
    content_columns: int


LAYOUTS: Mapping[str, NciLayout] = {
    "nq": NciLayout(content_file="NQ_doc_content.tsv", title_file="nq_title_abs.tsv",
                    split_files={"train": "nq_train_doc_newid.tsv", "dev": "nq_dev_doc_newid.tsv"},
                    content_columns=7),
    "trivia": NciLayout(content_file="Trivia_doc_content.tsv", title_file="trivia_title_cont.tsv",
                        split_files={"train": "train.tsv", "dev": "dev.tsv"}, content_columns=5),
}


@dataclasses.dataclass
class CorpusCounts:
    """What `read_corpus` saw besides the documents it yielded."""

    rows: int = 0
    repeated_docid_rows: int = 0  # Title-file rows naming an earlier docid (not written).
    empty_documents: int = 0


@dataclasses.dataclass(frozen=True)
class NciQuery:
    """One query of a split with its relevant docids; `line` is the file line that first named it."""

    qid: str
    text: str
    docids: tuple[str, ...]
    line: int


def detect_dataset(nci_dir: PathLike) -> Dataset:
    """"nq" or "trivia", from the files present in `nci_dir` (its query files and a document file)."""
    nci_dir = pathlib.Path(nci_dir)
    found = [name for name, layout in LAYOUTS.items()
             if all((nci_dir / f).is_file() for f in layout.split_files.values())
             and ((nci_dir / layout.content_file).is_file() or (nci_dir / layout.title_file).is_file())]
    if len(found) == 1:
        return found[0]  # type: ignore[return-value]
    if found:
        raise ValueError(f"{nci_dir} holds both the NCI NQ and TriviaQA files; pass the dataset explicitly")
    expected = "; ".join(f"{name}: {' and '.join(layout.split_files.values())}, with {layout.content_file} or "
                         f"{layout.title_file}" for name, layout in LAYOUTS.items())
    present = sorted(p.name for p in nci_dir.iterdir()) if nci_dir.is_dir() else "nothing (not a directory)"
    raise FileNotFoundError(f"{nci_dir} holds neither NCI layout ({expected}); found: {present}")


def _read_raw_rows(path: pathlib.Path) -> Iterator[tuple[int, list[str]]]:
    """Rows of a file NCI wrote with '\\t'.join: split on tabs, no quoting."""
    for line_number, line in read_lines(path):
        if "\r" in line:
            raise DataFormatError.at(path, line_number, "carriage return inside a row")
        yield line_number, line.split("\t")


def _read_pandas_rows(path: pathlib.Path) -> Iterator[tuple[int, list[str]]]:
    """Rows of a file NCI wrote with `DataFrame.to_csv(sep='\\t')`: fields holding a tab, quote or line break
    are quoted and their quotes doubled (csv.QUOTE_MINIMAL). Yields (first line of the row, fields)."""
    line_number = 1
    try:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.reader(f, delimiter="\t", quotechar='"', doublequote=True, strict=True)
            for row in reader:
                yield line_number, row
                line_number = reader.line_num + 1
    except csv.Error as e:
        raise DataFormatError.at(path, line_number, f"malformed CSV-quoted row ({e})") from None
    except UnicodeDecodeError as e:
        raise DataFormatError.at(path, line_number, f"not valid UTF-8 ({e.reason})") from None


def _text(value: str, *, what: str, path: pathlib.Path, line: int, allow_empty: bool = False) -> str:
    if not value.strip() and not allow_empty:
        raise DataFormatError.at(path, line, f"empty {what}")
    if any(c in value for c in _FORBIDDEN):
        raise DataFormatError.at(path, line, f"{what} contains a tab or line break: {value[:80]!r}")
    return value


def _docid(value: str, *, path: pathlib.Path, line: int) -> str:
    value = value.strip()
    if _DOCID.fullmatch(value):
        return str(int(value))
    match = _PANDAS_FLOAT_DOCID.fullmatch(value)
    if match:
        return str(int(match.group(1)))
    raise DataFormatError.at(path, line, f"expected an integer NCI docid, found {value!r}")


def _columns(row: list[str], *, expected: int, exact: bool, path: pathlib.Path, line: int, names: str) -> None:
    if len(row) < expected or (exact and len(row) != expected):
        raise DataFormatError.at(path, line, f"expected {'' if exact else 'at least '}{expected} tab-separated "
                                             f"columns ({names}), found {len(row)}")


def read_corpus(nci_dir: PathLike, *, dataset: Dataset, source: CorpusSource = "auto",
                counts: CorpusCounts | None = None) -> Iterator[tuple[str, str]]:
    """Streams `(docid, text)` from the content file (full text) or the title file (see the module docstring).

    A docid repeated in the content file is an error; in the title file (one row per query for NQ) its first
    row is the document and later rows are skipped, counted in `counts` and logged.
    """
    counts = counts if counts is not None else CorpusCounts()
    nci_dir = pathlib.Path(nci_dir)
    layout = LAYOUTS[dataset]
    content_path, title_path = nci_dir / layout.content_file, nci_dir / layout.title_file
    if source == "auto":
        source = "content" if content_path.is_file() else "title_abs"
    path = content_path if source == "content" else title_path
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; NCI's {dataset} corpus is {layout.content_file} (full text) "
                                f"or {layout.title_file}")
    seen: set[str] = set()
    if source == "content":
        names = ("docid, '', '', text, '', '', language" if dataset == "nq"
                 else "original id, docid, title, content, title+content")
        for line, row in _read_raw_rows(path):
            counts.rows += 1
            _columns(row, expected=layout.content_columns, exact=True, path=path, line=line, names=names)
            if dataset == "nq":
                docid, text = _docid(row[0], path=path, line=line), row[3]
            else:
                docid, text = _docid(row[1], path=path, line=line), f"{row[2]} {row[3]}"
            if docid in seen:
                raise DataFormatError.at(path, line, f"duplicate docid {docid!r}")
            seen.add(docid)
            counts.empty_documents += not text.strip()
            yield docid, _text(text, what="document text", path=path, line=line, allow_empty=True)
    else:
        for line, row in _read_pandas_rows(path):
            counts.rows += 1
            _columns(row, expected=3, exact=False, path=path, line=line, names="text, original id, docid, ...")
            docid = _docid(row[2], path=path, line=line)
            if docid in seen:
                counts.repeated_docid_rows += 1
                continue
            seen.add(docid)
            counts.empty_documents += not row[0].strip()
            yield docid, _text(row[0], what="document text", path=path, line=line, allow_empty=True)
        if counts.repeated_docid_rows:
            logger.info("%s: %d rows repeat an earlier docid (NCI keeps the first row of each title); skipped",
                        path, counts.repeated_docid_rows)


def read_queries(nci_dir: PathLike, *, dataset: Dataset, split: str) -> list[NciQuery]:
    """The queries of `split` ("train" or "dev") with their relevant docids, in file order."""
    return _read_split(nci_dir, dataset=dataset, split=split)[0]


def _read_split(nci_dir: PathLike, *, dataset: Dataset, split: str) -> tuple[list[NciQuery], int]:
    """`read_queries` and the number of rows read."""
    layout = LAYOUTS[dataset]
    if split not in layout.split_files:
        raise ValueError(f"NCI's {dataset} release has the splits {list(layout.split_files)}, not {split!r}")
    path = pathlib.Path(nci_dir) / layout.split_files[split]
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; NCI's {dataset} {split} queries are {path.name}")
    if dataset == "nq":
        return _read_nq_queries(path)
    return _read_trivia_queries(path, split=split)


def _read_nq_queries(path: pathlib.Path) -> tuple[list[NciQuery], int]:
    queries: dict[str, NciQuery] = {}
    rows = 0
    for line, row in _read_pandas_rows(path):
        rows += 1
        _columns(row, expected=3, exact=False, path=path, line=line, names="query, example_id, docid, semantic id")
        text = _text(row[0], what="query", path=path, line=line)
        qid = row[1].strip()
        if not _NQ_EXAMPLE_ID.fullmatch(qid):
            raise DataFormatError.at(path, line, f"expected an integer NQ example_id, found {row[1]!r}")
        if qid in queries:
            raise DataFormatError.at(path, line, f"duplicate example_id {qid!r} (first on line {queries[qid].line})")
        queries[qid] = NciQuery(qid=qid, text=text, docids=(_docid(row[2], path=path, line=line),), line=line)
    return list(queries.values()), rows


def _read_trivia_queries(path: pathlib.Path, *, split: str) -> tuple[list[NciQuery], int]:
    by_text: dict[str, NciQuery] = {}
    rows = 0
    for line, row in _read_raw_rows(path):
        rows += 1
        _columns(row, expected=3, exact=False, path=path, line=line, names="query, original ids, docids, semantic ids")
        text = _text(row[0], what="query", path=path, line=line)
        original_ids, docids = row[1].split(","), [_docid(d, path=path, line=line) for d in row[2].split(",")]
        if len(original_ids) != len(docids):
            raise DataFormatError.at(path, line, f"{len(original_ids)} original ids but {len(docids)} docids; "
                                                 "expected parallel comma-separated lists")
        query = by_text.get(text)
        if query is None:
            by_text[text] = NciQuery(qid=f"{split}-{len(by_text)}", text=text,
                                     docids=tuple(dict.fromkeys(docids)), line=line)
        else:
            by_text[text] = dataclasses.replace(query, docids=tuple(dict.fromkeys(query.docids + tuple(docids))))
    return list(by_text.values()), rows


def _install_outputs(built: pathlib.Path, out_dir: pathlib.Path, *, overwrite: bool) -> None:
    changed = [name for name in OUTPUT_FILES
               if (out_dir / name).exists() and not filecmp.cmp(built / name, out_dir / name, shallow=False)]
    if changed and not overwrite:
        raise FileExistsError(f"{out_dir} already holds a different dataset ({', '.join(changed)} differ); "
                              "pass --overwrite to replace it")
    for name in OUTPUT_FILES:
        os.replace(built / name, out_dir / name)


def convert_nci(
    *,
    nci_dir: PathLike,
    out_dir: PathLike,
    dataset: Dataset | None = None,
    corpus: CorpusSource = "auto",
    overwrite: bool = False,
) -> dict:
    """Writes the NCI release in `nci_dir` to `out_dir` in the MS MARCO layout; returns its summary.

    Every docid a query file names must be in the corpus (else `DataFormatError` at that query's line): a
    mismatch means files from different NCI runs were mixed. Row counts, merged duplicate rows and coverage
    (the fraction of documents with a training query, Pradeep et al.'s Table 1) go to summary.json.
    """
    nci_dir = pathlib.Path(nci_dir)
    dataset = dataset or detect_dataset(nci_dir)
    if dataset not in LAYOUTS:
        raise ValueError(f"dataset must be one of {list(LAYOUTS)}, got {dataset!r}")
    layout = LAYOUTS[dataset]
    source = corpus if corpus != "auto" else ("content" if (nci_dir / layout.content_file).is_file() else "title_abs")
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict = {
        "dataset": f"NCI {'NQ (NQ100k/NQ320k)' if dataset == 'nq' else 'TriviaQA'} release",
        "nci_dir": str(nci_dir),
        "corpus_file": layout.content_file if source == "content" else layout.title_file,
    }
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
        built = pathlib.Path(tmp)
        docids: set[str] = set()
        counts = CorpusCounts()

        def documents() -> Iterator[tuple[str, str]]:
            for docid, text in read_corpus(nci_dir, dataset=dataset, source=source, counts=counts):
                docids.add(docid)
                yield docid, text

        summary["documents"] = write_tsv(built / "collection.tsv", documents())
        summary["corpus_rows"] = counts.rows
        summary["corpus_rows_repeating_a_docid"] = counts.repeated_docid_rows
        summary["empty_documents"] = counts.empty_documents
        for split in SPLITS:
            queries, rows = _read_split(nci_dir, dataset=dataset, split=split)
            split_path = nci_dir / layout.split_files[split]
            for query in queries:
                unknown = [d for d in query.docids if d not in docids]
                if unknown:
                    raise DataFormatError.at(split_path, query.line,
                                             f"docid(s) {unknown} are not in {summary['corpus_file']}")
            write_tsv(built / f"queries.{split}.tsv", ((q.qid, q.text) for q in queries))
            judgements = write_tsv(built / f"qrels.{split}.tsv", ((q.qid, 0, d, 1) for q in queries for d in q.docids))
            relevant = {d for q in queries for d in q.docids}
            summary[split] = {"file": layout.split_files[split], "rows": rows, "queries": len(queries),
                              "judgements": judgements, "documents_with_query": len(relevant)}
        summary["train_coverage"] = summary["train"]["documents_with_query"] / max(summary["documents"], 1)
        (built / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        _install_outputs(built, out_dir, overwrite=overwrite)
    return summary
