"""Streaming readers for retrieval datasets in the official MS MARCO and BEIR file layouts.

Why streaming: the MS MARCO passage collection has 8.8M lines; callers (tokenisation, BM25 indexing,
vocabulary training) consume passages one at a time, so the readers never hold all text in memory.
Queries and qrels are small (at most ~1M lines) and qrels are returned as a dict in the
`{qid: {docid: relevance}}` form that pytrec_eval and ir_measures consume directly.

Layouts (`open_dataset` detects which one a directory holds):

MS MARCO passage::

    collection.tsv          pid \\t passage
    queries.{split}.tsv     qid \\t query                 (split: train, dev, eval, dev.small, ...)
    qrels.{split}.tsv       qid \\t 0 \\t pid \\t rel       (TREC qrels; any whitespace also accepted)

BEIR::

    corpus.jsonl            {"_id": ..., "title": ..., "text": ...}
    queries.jsonl           {"_id": ..., "text": ...}
    qrels/{split}.tsv       header "query-id corpus-id score", then qid \\t docid \\t score

Malformed input raises `DataFormatError` naming `path:line`; nothing is silently cut or dropped.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, Optional

import numpy as np

PathLike = str | os.PathLike

logger = logging.getLogger(__name__)

_MSMARCO_COLLECTION = "collection.tsv"
_BEIR_CORPUS = "corpus.jsonl"
_BEIR_QUERIES = "queries.jsonl"
_BEIR_QRELS_DIR = "qrels"
_BEIR_QRELS_HEADER = ("query-id", "corpus-id", "score")

_MSMARCO_EXPECTED = "MS MARCO layout: collection.tsv, queries.{split}.tsv, qrels.{split}.tsv"
_BEIR_EXPECTED = "BEIR layout: corpus.jsonl, queries.jsonl, qrels/{split}.tsv"

TRAIN_SPLIT = "train"
# The one setting that names a run's evaluation split: every family's gin binds its dataset's `eval_split` to the
# macro, and the tools that read a model dir take the split from the run's config.gin.
EVAL_SPLIT_SETTING = "--gin.EVAL_SPLIT"


class DataFormatError(ValueError):
    """Malformed dataset input; the message starts with `path:line:` and says what was expected.

    Raise it as `DataFormatError(f"{path}:{line}: ...")` or, equivalently, `DataFormatError.at(path, line, ...)`.
    """

    @classmethod
    def at(cls, path: PathLike, line: int, message: str) -> "DataFormatError":
        return cls(f"{os.fspath(path)}:{line}: {message}")


def read_lines(path: PathLike, *, start_line: int = 1,
               stop_line: Optional[int] = None) -> Iterator[tuple[int, str]]:
    """Yields (1-based line number, line without its `\\n` / `\\r\\n`), from `start_line` up to `stop_line`
    (exclusive; None: the end).

    The file is read in binary and split on `\\n` only: a stray `\\r` inside a passage must not split it
    into two records the way text-mode universal newlines would. Decoding errors name the line. Lines before
    `start_line` are skipped by counting line ends in blocks of bytes (`line_offset`), not decoded.
    """
    with open(path, "rb") as f:
        if start_line > 1:
            f.seek(line_offset(f, start_line))
        for line_number, raw in enumerate(f, start=start_line):
            if stop_line is not None and line_number >= stop_line:
                return
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataFormatError.at(path, line_number, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
            if line.endswith("\n"):
                line = line[:-1]
                if line.endswith("\r"):
                    line = line[:-1]
            yield line_number, line


def shard_rows(num_rows: int, *, shard_index: int, num_shards: int) -> tuple[int, int]:
    """[start, stop): shard `shard_index` of `num_shards` of `num_rows` rows in file order, contiguous and balanced
    (sizes differ by at most one), so a process's share of a collection is a range of its lines, read without the
    others (`RetrievalDataset.collection(rows=...)`)."""
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index={shard_index} must be in [0, num_shards={num_shards})")
    return num_rows * shard_index // num_shards, num_rows * (shard_index + 1) // num_shards


_SCAN_BYTES = 16 << 20  # bytes scanned at a time for line ends


def line_offset(f: Any, line: int) -> int:
    """The byte offset where 1-based `line` starts in the binary file `f` (the file's size if it has fewer lines):
    its line ends counted a block at a time (C-speed `bytes.count`/`find`, no decoding)."""
    f.seek(0)
    offset, to_skip = 0, line - 1
    while to_skip:
        block = f.read(_SCAN_BYTES)
        if not block:
            return offset
        ends = block.count(b"\n")
        if ends < to_skip:
            offset, to_skip = offset + len(block), to_skip - ends
            continue
        position = -1
        for _ in range(to_skip):
            position = block.find(b"\n", position + 1)
        return offset + position + 1
    return offset


class DistinctIds:
    """Checks that the ids of a stream are distinct while holding 16 bytes per id (its 64-bit hash and line number
    in numpy arrays), not a set of the ids: 8.8M MS MARCO pids take 141 MB, not ~0.8 GB of str objects. Equal hashes
    are confirmed on the ids themselves, which `finish` re-reads; a duplicate is reported at the end of the pass,
    naming the line of the first id seen twice."""

    _CHUNK = 65_536

    def __init__(self, *, path: PathLike, id_name: str):
        self.path, self.id_name = path, id_name
        self._hashes: list[np.ndarray] = []
        self._lines: list[np.ndarray] = []
        self._pending: list[tuple[int, int]] = []

    def add(self, item_id: str, line_number: int) -> None:
        self._pending.append((hash(item_id), line_number))
        if len(self._pending) == self._CHUNK:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            pending = np.array(self._pending, np.int64)
            self._hashes.append(pending[:, 0])
            self._lines.append(pending[:, 1])
            self._pending = []

    def finish(self, id_at: Callable[[Sequence[int]], dict[int, str]]) -> None:
        """Raises `DataFormatError` for the first id seen twice; `id_at(lines)` re-reads the ids of given lines."""
        self._flush()
        if not self._hashes:
            return
        hashes, lines = np.concatenate(self._hashes), np.concatenate(self._lines)
        order = np.argsort(hashes, kind="stable")
        same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
        if not same.size:
            return
        candidates = sorted({int(x) for x in lines[order[same]]} | {int(x) for x in lines[order[same + 1]]})
        ids = id_at(candidates)
        first_line: dict[str, int] = {}
        for line_number in candidates:  # in file order: the first repeat is the one reported
            item_id = ids[line_number]
            if item_id in first_line:
                raise DataFormatError.at(self.path, line_number, f"duplicate {self.id_name} {item_id!r}")
            first_line[item_id] = line_number


def _id_text_tsv_line(line: str, *, path: PathLike, line_number: int, id_name: str, text_name: str,
                      empty_text: Optional[str] = None) -> tuple[str, str]:
    """One `id \\t text` line; `empty_text`: why a blank text is an error (None: it is allowed)."""
    columns = line.split("\t")
    if len(columns) != 2:
        raise DataFormatError.at(
            path, line_number,
            f"expected 2 tab-separated columns ({id_name} \\t {text_name}), found {len(columns)}"
            + (" (a tab inside the text is not allowed)" if len(columns) > 2 else ""))
    item_id, text = columns
    check_id(item_id, path=path, line_number=line_number, id_name=id_name)
    if empty_text is not None and not text.strip():
        raise DataFormatError.at(path, line_number, empty_text.format(item_id=item_id))
    return item_id, text


def check_id(item_id: str, *, path: PathLike, line_number: int, id_name: str) -> None:
    """Every rule an id must meet for every later stage: not empty, and no whitespace anywhere (TREC runs and
    qrels separate their columns by whitespace, so `a 6` could be read but never written back)."""
    if not item_id.strip():
        raise DataFormatError.at(path, line_number, f"empty {id_name} {item_id!r}")
    if any(c.isspace() for c in item_id):
        raise DataFormatError.at(path, line_number, f"{id_name} {item_id!r} contains whitespace: TREC runs and qrels "
                                 f"separate their columns by whitespace")


def _read_id_text_tsv(path: PathLike, *, id_name: str, text_name: str, start_line: int = 1,
                      stop_line: Optional[int] = None, empty_text: Optional[str] = None) -> Iterator[tuple[str, str]]:
    """Shared body of `read_collection` / `read_queries` / `read_document_labels`: exactly two tab-separated
    columns, ids distinct (among the lines read)."""
    distinct = DistinctIds(path=path, id_name=id_name)

    def ids_at(lines: Sequence[int]) -> dict[int, str]:
        wanted = set(lines)
        return {n: line.split("\t", 1)[0] for n, line in read_lines(path, start_line=min(wanted), stop_line=max(
            wanted) + 1) if n in wanted}

    for line_number, line in read_lines(path, start_line=start_line, stop_line=stop_line):
        item_id, text = _id_text_tsv_line(line, path=path, line_number=line_number, id_name=id_name,
                                          text_name=text_name, empty_text=empty_text)
        distinct.add(item_id, line_number)
        yield item_id, text
    distinct.finish(ids_at)


def read_collection(path: PathLike, *, start_line: int = 1,
                    stop_line: Optional[int] = None) -> Iterator[tuple[str, str]]:
    """Streams `(pid, passage)` from an MS MARCO `collection.tsv` (`pid \\t passage`), from `start_line` up to
    `stop_line` (exclusive; default: every line).

    Duplicate pids are detected with `DistinctIds` (16 bytes a pid; reported when the pass ends): the only state kept
    while streaming; the passages themselves are never kept.
    """
    return _read_id_text_tsv(path, id_name="pid", text_name="passage", start_line=start_line, stop_line=stop_line)


def read_queries(path: PathLike) -> Iterator[tuple[str, str]]:
    """Streams `(qid, query)` from an MS MARCO `queries.{split}.tsv` (`qid \\t query`); qids must be unique."""
    return _read_id_text_tsv(path, id_name="qid", text_name="query",
                             empty_text="query {item_id!r} is empty: nothing to train on or rank with")


def read_document_labels(path: PathLike) -> Iterator[tuple[str, str]]:
    """Streams `(docid, label)` from `docid \\t label` lines (a category per document, e.g. GDR's given first
    cluster level); docids must be unique, a label not empty."""
    return _read_id_text_tsv(path, id_name="docid", text_name="label",
                             empty_text="document {item_id!r} has an empty label")


def _add_qrel(qrels: dict[str, dict[str, int]], *, path: PathLike, line_number: int, qid: str, docid: str,
              relevance: str) -> None:
    check_id(qid, path=path, line_number=line_number, id_name="query id")
    check_id(docid, path=path, line_number=line_number, id_name="document id")
    try:
        rel = int(relevance)
    except ValueError:
        raise DataFormatError.at(path, line_number, f"relevance must be an integer, got {relevance!r}") from None
    judged = qrels.setdefault(qid, {})
    if docid in judged:
        raise DataFormatError.at(path, line_number, f"duplicate judgement for query {qid!r}, document {docid!r}")
    judged[docid] = rel


def read_qrels(path: PathLike) -> dict[str, dict[str, int]]:
    """Reads TREC qrels (`qid 0 docid rel`, tab- or whitespace-separated) into `{qid: {docid: rel}}`.

    A (qid, docid) pair judged twice is an error rather than a silent last-one-wins overwrite.
    """
    qrels: dict[str, dict[str, int]] = {}
    for line_number, line in read_lines(path):
        columns = line.split()
        if len(columns) != 4:
            raise DataFormatError.at(path, line_number,
                                     f"expected 4 columns (qid 0 docid relevance), found {len(columns)}")
        qid, _, docid, relevance = columns
        _add_qrel(qrels, path=path, line_number=line_number, qid=qid, docid=docid, relevance=relevance)
    return qrels


def _jsonl_record(line: str, *, path: PathLike, line_number: int) -> dict:
    if not line.strip():
        raise DataFormatError.at(path, line_number, "empty line; expected one JSON object per line")
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataFormatError.at(path, line_number, f"invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(record, dict):
        raise DataFormatError.at(path, line_number, f"expected a JSON object, got {type(record).__name__}")
    return record


def _read_jsonl(path: PathLike, *, start_line: int = 1, stop_line: Optional[int] = None
                ) -> Iterator[tuple[int, dict]]:
    for line_number, line in read_lines(path, start_line=start_line, stop_line=stop_line):
        yield line_number, _jsonl_record(line, path=path, line_number=line_number)


def _jsonl_string(record: dict, key: str, *, path: PathLike, line_number: int, required: bool) -> str:
    value = record.get(key)
    if value is None:
        if required:
            raise DataFormatError.at(path, line_number, f"missing field {key!r}")
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataFormatError.at(path, line_number, f"field {key!r} must be a string, got {type(value).__name__}")
    return str(value)


def _beir_id_text(record: dict, *, path: PathLike, line_number: int, with_title: bool) -> tuple[str, str]:
    item_id = _jsonl_string(record, "_id", path=path, line_number=line_number, required=True)
    check_id(item_id, path=path, line_number=line_number, id_name="'_id'")
    text = _jsonl_string(record, "text", path=path, line_number=line_number, required=True)
    if not with_title and not text.strip():
        raise DataFormatError.at(path, line_number, f"query {item_id!r} is empty: nothing to train on or rank with")
    if with_title:
        title = _jsonl_string(record, "title", path=path, line_number=line_number, required=False)
        if title:
            text = f"{title} {text}"
    return item_id, text


def _read_beir_id_text(path: PathLike, *, with_title: bool, start_line: int = 1,
                       stop_line: Optional[int] = None) -> Iterator[tuple[str, str]]:
    distinct = DistinctIds(path=path, id_name="'_id'")

    def ids_at(lines: Sequence[int]) -> dict[int, str]:
        wanted = set(lines)
        return {n: _beir_id_text(record, path=path, line_number=n, with_title=False)[0] for n, record in
                _read_jsonl(path, start_line=min(wanted), stop_line=max(wanted) + 1) if n in wanted}

    for line_number, record in _read_jsonl(path, start_line=start_line, stop_line=stop_line):
        item_id, text = _beir_id_text(record, path=path, line_number=line_number, with_title=with_title)
        distinct.add(item_id, line_number)
        yield item_id, text
    distinct.finish(ids_at)


def read_beir_corpus(path: PathLike, *, start_line: int = 1,
                     stop_line: Optional[int] = None) -> Iterator[tuple[str, str]]:
    """Streams `(docid, text)` from a BEIR `corpus.jsonl`; text is `title + " " + text` when the title is non-empty.
    `start_line`, `stop_line`: as `read_collection`'s."""
    return _read_beir_id_text(path, with_title=True, start_line=start_line, stop_line=stop_line)


def read_beir_queries(path: PathLike) -> Iterator[tuple[str, str]]:
    """Streams `(qid, text)` from a BEIR `queries.jsonl` (all splits' queries in one file)."""
    return _read_beir_id_text(path, with_title=False)


def read_beir_qrels(path: PathLike) -> dict[str, dict[str, int]]:
    """Reads a BEIR `qrels/{split}.tsv` (header `query-id corpus-id score`) into `{qid: {docid: score}}`."""
    qrels: dict[str, dict[str, int]] = {}
    for line_number, line in read_lines(path):
        columns = line.split("\t") if "\t" in line else line.split()
        if line_number == 1:
            if tuple(c.strip() for c in columns) != _BEIR_QRELS_HEADER:
                raise DataFormatError.at(path, line_number,
                                         f"expected the header {' '.join(_BEIR_QRELS_HEADER)!r}, found {line!r}")
            continue
        if len(columns) != 3:
            raise DataFormatError.at(path, line_number,
                                     f"expected 3 columns (query-id corpus-id score), found {len(columns)}")
        qid, docid, score = (c.strip() for c in columns)
        _add_qrel(qrels, path=path, line_number=line_number, qid=qid, docid=docid, relevance=score)
    return qrels


@dataclasses.dataclass(frozen=True)
class RetrievalDataset:
    """A retrieval dataset directory in the MS MARCO or BEIR layout; use `open_dataset` to create one.

    Every accessor re-reads its file, so `collection()` can be streamed several times (e.g. once for the
    vocabulary, once for tokenisation) without keeping passages in memory.
    """

    data_dir: pathlib.Path
    layout: Literal["msmarco", "beir"]

    @property
    def collection_path(self) -> pathlib.Path:
        return self.data_dir / (_MSMARCO_COLLECTION if self.layout == "msmarco" else _BEIR_CORPUS)

    def _queries_path(self, split: str) -> pathlib.Path:
        if self.layout == "msmarco":
            return self.data_dir / f"queries.{split}.tsv"
        return self.data_dir / _BEIR_QUERIES

    def _qrels_path(self, split: str) -> pathlib.Path:
        if self.layout == "msmarco":
            return self.data_dir / f"qrels.{split}.tsv"
        return self.data_dir / _BEIR_QRELS_DIR / f"{split}.tsv"

    def splits(self) -> tuple[str, ...]:
        """The splits present in the directory: MS MARCO `queries.{split}.tsv` files, or BEIR `qrels/{split}.tsv`."""
        if self.layout == "msmarco":
            names = [p.name[len("queries."):-len(".tsv")] for p in self.data_dir.glob("queries.*.tsv")]
        else:
            qrels_dir = self.data_dir / _BEIR_QRELS_DIR
            names = [p.stem for p in qrels_dir.glob("*.tsv")] if qrels_dir.is_dir() else []
        return tuple(sorted(names))

    def _require(self, path: pathlib.Path, what: str) -> pathlib.Path:
        if not path.is_file():
            expected = _MSMARCO_EXPECTED if self.layout == "msmarco" else _BEIR_EXPECTED
            raise FileNotFoundError(
                f"{what}: {path} does not exist. {self.data_dir} holds the {expected}; "
                f"splits found there: {list(self.splits()) or 'none'}")
        return path

    def judged_splits(self) -> tuple[str, ...]:
        """The splits that have both queries and qrels: those a run can be evaluated on."""
        return tuple(split for split in self.splits()
                     if self._queries_path(split).is_file() and self._qrels_path(split).is_file())

    def require_split(self, split: str, *, setting: Optional[str] = EVAL_SPLIT_SETTING) -> None:
        """The one check of a split's files that every reader of queries and qrels runs (`queries`, `qrels`): when
        `split`'s queries or qrels are missing, a `FileNotFoundError` names the missing file, the splits this data
        dir has, and the `setting` that picks another (`--gin.EVAL_SPLIT` by default; a tool's own flag, e.g.
        bm25's `--split`; none for the training split, which has no alternative). Call it before any work."""
        for path in (self._queries_path(split), self._qrels_path(split)):
            self._require_split_file(path, split, setting=setting)

    def _require_split_file(self, path: pathlib.Path, split: str, *, setting: Optional[str]) -> pathlib.Path:
        if path.is_file():
            return path
        if self.layout == "beir" and path.name == _BEIR_QUERIES:  # every split's queries: the layout is incomplete
            return self._require(path, "queries")
        if split == TRAIN_SPLIT and setting == EVAL_SPLIT_SETTING:
            setting = None
        judged = self.judged_splits()
        message = f"{path} does not exist; this data dir has splits: {', '.join(judged) or 'none'}"
        others = [s for s in judged if s not in (split, TRAIN_SPLIT)]
        if setting is not None and len(others) == 1:
            message += f"; set {setting}={others[0]}"
        elif setting is not None and others:
            message += f"; set {setting} to one of {', '.join(others)}"
        elif setting is not None:
            message += (f"; it has none to evaluate on besides {TRAIN_SPLIT!r}: add one (e.g. "
                        f"{self._qrels_path('dev').relative_to(self.data_dir)}) or set {setting}={TRAIN_SPLIT}")
        raise FileNotFoundError(message)

    def collection(self, *, rows: Optional[tuple[int, int]] = None) -> Iterator[tuple[str, str]]:
        """Streams `(docid, text)` for every document, or for the documents of rows [start, stop) (0-based, in file
        order): the lines before them are skipped unread (`read_lines`), those after them not read at all."""
        path = self._require(self.collection_path, "document collection")
        lines = {} if rows is None else {"start_line": rows[0] + 1, "stop_line": rows[1] + 1}
        return read_collection(path, **lines) if self.layout == "msmarco" else read_beir_corpus(path, **lines)

    def document(self, line_number: int, *, line: str) -> tuple[str, str]:
        """`(docid, text)` of one line of the collection (1-based `line_number`, for messages)."""
        path = self.collection_path
        if self.layout == "msmarco":
            return _id_text_tsv_line(line, path=path, line_number=line_number, id_name="pid", text_name="passage")
        return _beir_id_text(_jsonl_record(line, path=path, line_number=line_number), path=path,
                             line_number=line_number, with_title=True)

    def queries(self, split: str, *, setting: Optional[str] = EVAL_SPLIT_SETTING) -> Iterator[tuple[str, str]]:
        """Streams `(qid, text)` for the queries of `split` (`setting`: see `require_split`).

        BEIR keeps all queries in one file; a split's queries are those its qrels name (as BEIR's own loader
        does). Qrels naming queries absent from `queries.jsonl` are counted in a logged warning.
        """
        path = self._require_split_file(self._queries_path(split), split, setting=setting)
        if self.layout == "msmarco":
            return read_queries(path)
        return self._beir_split_queries(path, wanted=set(self.qrels(split, setting=setting)),
                                        qrels_path=self._qrels_path(split))

    @staticmethod
    def _beir_split_queries(path: pathlib.Path, *, wanted: set[str],
                            qrels_path: pathlib.Path) -> Iterator[tuple[str, str]]:
        found = 0
        for qid, text in read_beir_queries(path):
            if qid in wanted:
                found += 1
                yield qid, text
        if found < len(wanted):
            logger.warning("%d queries named in %s are missing from %s", len(wanted) - found, qrels_path, path)

    def qrels(self, split: str, *, setting: Optional[str] = EVAL_SPLIT_SETTING) -> dict[str, dict[str, int]]:
        """Relevance judgements `{qid: {docid: rel}}` of `split` (`setting`: see `require_split`)."""
        path = self._require_split_file(self._qrels_path(split), split, setting=setting)
        return read_qrels(path) if self.layout == "msmarco" else read_beir_qrels(path)

    def check_qrels(self, split: str, *, docids: Container[str] | None = None,
                    qrels: Mapping[str, Mapping[str, int]] | None = None) -> int:
        """Counts the judgements of `split` (`qrels` when the caller read them already, e.g. only some queries')
        naming documents not in `docids` (a set or any container; default: the collection's ids).

        Returns the count and logs `N qrels name unknown documents` when it is non-zero: such judgements
        can never be retrieved, so they cap recall; this is worth knowing but not worth failing for.
        """
        known = docids if docids is not None else {docid for docid, _ in self.collection()}
        qrels = self.qrels(split) if qrels is None else qrels
        unknown = sum(1 for judged in qrels.values() for docid in judged if docid not in known)
        if unknown:
            total = sum(len(judged) for judged in qrels.values())
            logger.warning("%d qrels name unknown documents (of %d judgements in %s)", unknown, total,
                            self._qrels_path(split))
        return unknown

    def check_judged_queries(self, split: str, *, qrels: Mapping[str, Mapping[str, int]], qids: Container[str]) -> int:
        """Counts the queries judged in `split`'s `qrels` that its queries file (`qids`) lacks: they are never
        ranked. Logs the count when it is non-zero; every tool that scores a split (training's labeled pairs,
        the evaluators, BM25) reports it the same way."""
        missing = sum(1 for qid in qrels if qid not in qids)
        if missing:
            logger.warning("%d of the %d queries judged in %s are missing from the queries file: never ranked",
                           missing, len(qrels), self._qrels_path(split))
        return missing


def open_dataset(data_dir: PathLike) -> RetrievalDataset:
    """Opens `data_dir`, detecting the MS MARCO (`collection.tsv`) or BEIR (`corpus.jsonl`) layout."""
    data_dir = pathlib.Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"dataset directory {data_dir} does not exist; expected the {_MSMARCO_EXPECTED} "
                                f"or the {_BEIR_EXPECTED}")
    if (data_dir / _MSMARCO_COLLECTION).is_file():
        return RetrievalDataset(data_dir=data_dir, layout="msmarco")
    if (data_dir / _BEIR_CORPUS).is_file():
        return RetrievalDataset(data_dir=data_dir, layout="beir")
    found = sorted(p.name for p in data_dir.iterdir())
    raise FileNotFoundError(f"{data_dir} holds neither the {_MSMARCO_EXPECTED} nor the {_BEIR_EXPECTED}; "
                            f"found: {found or 'nothing'}")


def write_tsv(path: PathLike, rows: Iterable[Sequence[str | int]]) -> int:
    """Writes tab-separated rows (the MS MARCO layout) and returns the number of rows written.

    Fields containing a tab or line break are refused, since the readers would split them; the file is
    written to a temporary name and renamed, so a failed write never leaves a truncated file behind.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_name = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    count = 0
    try:
        with open(tmp_name, "w", encoding="utf-8", newline="\n") as f:
            for count, row in enumerate(rows, start=1):
                fields = []
                for field in row:
                    if isinstance(field, bool) or not isinstance(field, (str, int)):
                        raise DataFormatError.at(path, count, f"field {field!r} must be a str or int")
                    field = str(field)
                    if any(c in field for c in "\t\n\r"):
                        raise DataFormatError.at(path, count, f"field {field!r} contains a tab or line break")
                    fields.append(field)
                f.write("\t".join(fields) + "\n")
        os.replace(tmp_name, path)
    except BaseException:
        tmp_name.unlink(missing_ok=True)
        raise
    return count



def write_qrels(path: PathLike, judgements: Iterable[tuple[str, str, int]]) -> int:
    """Writes `(qid, docid, relevance)` judgements as TREC qrels (`qid 0 docid rel`, what `read_qrels` reads) and
    returns the number written."""
    return write_tsv(path, ((qid, "0", docid, str(relevance)) for qid, docid, relevance in judgements))

class DocumentLookup:
    """The texts of documents by position in the collection, without streaming it again for each lookup.

    The first lookup records the byte offset of every line (one pass; int64 per document: 70 MB for MS MARCO's
    8.8M passages); later lookups read only the wanted lines. For interactive search, where each query needs the
    texts of ten documents.
    """

    def __init__(self, dataset: RetrievalDataset):
        self.dataset = dataset
        self._offsets: np.ndarray | None = None

    def _line_offsets(self) -> np.ndarray:
        if self._offsets is None:
            path = self.dataset.collection_path
            starts = [np.zeros(1, np.int64)]
            position = 0
            with open(path, "rb") as f:
                while chunk := f.read(1 << 24):
                    starts.append(np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10).astype(np.int64) + position + 1)
                    position += len(chunk)
            offsets = np.concatenate(starts)
            self._offsets = offsets[offsets < position]  # no line starts at the end of the file
        return self._offsets

    def texts(self, rows: Sequence[int]) -> list[tuple[str, str]]:
        """`(docid, text)` of the documents at 0-based positions `rows` of the collection."""
        offsets = self._line_offsets()
        out = []
        with open(self.dataset.collection_path, "rb") as f:
            for row in rows:
                if not 0 <= row < len(offsets):
                    raise IndexError(f"document {row} of a collection of {len(offsets)} lines")
                f.seek(int(offsets[row]))
                line = f.readline().decode("utf-8").rstrip("\n").rstrip("\r")
                out.append(self.dataset.document(int(row) + 1, line=line))
        return out
