"""Synthetic queries per passage (doc2query / docTTTTTquery): the D2Q representation and BM25 expansions.

Two file layouts are accepted, told apart by the first line (`detect_layout`):

* per passage (docTTTTTquery's predictions): line i holds the i-th passage's queries of the collection,
  tab-separated; an empty line means no queries. Exactly one line per passage.
* `pid \\t query`: one query per line; detected when the first line has two fields and its first field is a
  docid of the collection.

`iter_passage_queries` streams either layout one passage at a time, so a file of 8.8M passages x 80 queries
never sits in memory; `read_d2q_file` reads a whole file into a dict (for BM25 document expansion, which
needs every expansion anyway). Malformed input raises `DataFormatError` naming `path:line`.
"""
from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Literal

from gr_jax.data.readers import DataFormatError, read_lines

SELECTIONS = ("first", "random")  # which of a passage's synthetic queries: its first k, or a seeded subset

PathLike = str | os.PathLike

# The D2Q file of a data dir, unless told otherwise.
DEFAULT_FILENAME = "d2q.tsv"

Layout = Literal["per_passage", "pid_query"]
PER_PASSAGE: Layout = "per_passage"
PID_QUERY: Layout = "pid_query"


def detect_layout(path: PathLike, *, is_docid: Callable[[str], bool]) -> Layout:
    """`PID_QUERY` when the first line is `pid \\t query` with a known pid, else `PER_PASSAGE`."""
    for _, line in read_lines(path):
        fields = line.split("\t")
        return PID_QUERY if len(fields) == 2 and is_docid(fields[0]) else PER_PASSAGE
    raise DataFormatError.at(path, 1, "the doc2query file is empty")


def _pid_query_lines(path: PathLike, *, is_docid: Callable[[str], bool]) -> Iterator[tuple[int, str, str]]:
    """(line number, pid, query) of a `pid \\t query` file, each checked."""
    for line_number, line in read_lines(path):
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataFormatError.at(
                path, line_number,
                f"expected 'pid<TAB>query' (the layout of line 1), found {len(fields)} tab-separated fields")
        pid, query = fields
        if not is_docid(pid):
            raise DataFormatError.at(path, line_number, f"pid {pid!r} is not in the collection")
        if not query.strip():
            raise DataFormatError.at(path, line_number, f"empty query for pid {pid!r}")
        yield line_number, pid, query


def _per_passage_lines(path: PathLike, *, docids_in_order: Iterable[str],
                       passages: tuple[int, int] | None = None) -> Iterator[tuple[str, list[str]]]:
    """(docid, queries) for each line of a per-passage file, paired with the collection's docids in order; with
    `passages` (start, stop), only those passages' lines (0-based: the lines before them skipped unread, those after
    them not read), paired with `docids_in_order` holding theirs."""
    docids = iter(docids_in_order)
    first, stop = (0, None) if passages is None else passages
    line_number = first
    for line_number, line in read_lines(path, start_line=first + 1, stop_line=None if stop is None else stop + 1):
        docid = next(docids, None)
        if docid is None:
            raise DataFormatError.at(
                path, line_number,
                f"more lines than the {line_number - 1} passages of the collection (expected one line per passage "
                "in collection order, or 'pid<TAB>query' lines whose first pid is in the collection)")
        queries = line.split("\t") if line else []
        if any(not query.strip() for query in queries):
            raise DataFormatError.at(path, line_number, "empty query between tabs")
        yield docid, queries
    if line_number == 0:
        raise DataFormatError.at(path, 1, "the doc2query file is empty")
    remaining = sum(1 for _ in docids)
    if remaining:
        raise DataFormatError.at(
            path, line_number,
            f"the file ends after {line_number} lines but the collection has {line_number + remaining} passages "
            "(expected one line per passage, in collection order)")


def iter_passage_queries(
        path: PathLike,
        *,
        docids_in_order: Iterable[str],
        is_docid: Callable[[str], bool],
        passages: tuple[int, int] | None = None,
) -> Iterator[tuple[str, list[str]]]:
    """Streams `(docid, [query, ...])` per passage, in file order, one passage in memory at a time.

    docids_in_order: the collection's docids in order, consumed lazily and only by the per-passage layout
      (e.g. a generator over the collection file); every passage is yielded, an empty line as `[]`.
    passages: per-passage layout only: just the lines of passages [start, stop) (0-based), the lines before them
      skipped unread and those after them not read (a shard); docids_in_order then holds those passages' docids.
    is_docid: membership in the collection, for the `pid \\t query` layout; there a passage's lines must be
      consecutive (any pid order), and passages without lines are not yielded.

    A pid whose lines are not consecutive is an error naming both lines (sort the file by pid, or use
    `read_d2q_file`, which holds everything in memory and accepts any order).
    """
    layout = detect_layout(path, is_docid=is_docid)
    if layout == PER_PASSAGE:
        yield from _per_passage_lines(path, docids_in_order=docids_in_order, passages=passages)
        return
    if passages is not None:
        raise ValueError(f"{path}: a 'pid<TAB>query' file cannot be read by passage range (its lines are grouped "
                         "by pid, in any order); read it whole")
    first_line: dict[str, int] = {}  # pid -> line of its first query: the only state kept (pids, not queries)
    current: str | None = None  # the pid whose queries are being collected
    queries: list[str] = []
    for line_number, pid, query in _pid_query_lines(path, is_docid=is_docid):
        if pid != current:
            if pid in first_line:
                raise DataFormatError.at(
                    path, line_number,
                    f"pid {pid!r} already had its queries on lines {first_line[pid]}.. before pid {current!r}; "
                    "streaming needs each pid's lines to be consecutive (sort the file by pid)")
            if current is not None:
                yield current, queries
            current, queries = pid, []
            first_line[pid] = line_number
        queries.append(query)
    if current is not None:
        yield current, queries


def read_d2q_file(path: PathLike, *, docids_in_order: Sequence[str]) -> dict[str, list[str]]:
    """Synthetic queries per docid, `{docid: [query, ...]}` in file order, from either layout (see module doc).

    The `pid \\t query` lines may come in any order; the per-passage layout gives every passage an entry
    (`[]` for an empty line) and must have exactly `len(docids_in_order)` lines.
    """
    known = set(docids_in_order)
    if len(known) != len(docids_in_order):
        raise ValueError("docids_in_order contains a docid twice")
    if detect_layout(path, is_docid=known.__contains__) == PER_PASSAGE:
        return dict(_per_passage_lines(path, docids_in_order=docids_in_order))
    expansions: dict[str, list[str]] = {}
    for _, pid, query in _pid_query_lines(path, is_docid=known.__contains__):
        expansions.setdefault(pid, []).append(query)
    return expansions


def default_path(data_dir: PathLike) -> pathlib.Path:
    return pathlib.Path(data_dir) / DEFAULT_FILENAME
