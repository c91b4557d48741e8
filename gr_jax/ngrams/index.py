"""The span index of a corpus: every distinct window (`gr_jax.ngrams.spans`) as a token sequence, and the documents
that contain it. Built once per data dir and window width (`python -m gr_jax.tools.ngram_index`).

The distinct windows form a `DocidTable` (docid `s{j}` for window j, its SentencePiece tokens of the words joined by
one space, then EOS), so the project's trie, heads and constrained beam search decode spans as they decode docids:
only spans that occur in the corpus can be generated. `documents_of(j)` are the collection rows that contain
window j (CSR arrays). Stored as `{data_dir}/ngrams.w{width}.npz`.

Size: one window per word of the corpus before deduplication, each about width x 1.5 tokens, so the trie holds about
(corpus words x tokens per window) states at 12 bytes each: docs/scaling.md measures it on msmarco_mini and
extrapolates to 1M and 8.8M passages, where an FM-index over the token stream (MINDER / SEAL's choice: any
substring, O(corpus) memory) replaces it.
"""
from __future__ import annotations

import dataclasses
import logging
import pathlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from gr_jax.data.readers import RetrievalDataset
from gr_jax.docids.table import DocidTable
from gr_jax.ngrams.spans import document_windows, words_of
from gr_jax.vocabulary import EOS_ID

logger = logging.getLogger(__name__)


def index_path(data_dir: str | pathlib.Path, *, width: int) -> pathlib.Path:
    return pathlib.Path(data_dir) / f"ngrams.w{width}.npz"


@dataclasses.dataclass(frozen=True, eq=False)
class SpanIndex:
    """table: the distinct windows; doc_offsets int64[W + 1] and doc_rows int32[...]: the collection rows of the
    documents that contain window j are doc_rows[doc_offsets[j]:doc_offsets[j + 1]]; docids: the collection's, by
    row; width: words per window; window_starts int64[N + 1] and window_ids int32[...]: the windows of document r
    by start, window_ids[window_starts[r]:window_starts[r + 1]]."""
    table: DocidTable
    doc_offsets: np.ndarray
    doc_rows: np.ndarray
    docids: tuple[str, ...]
    width: int
    window_starts: np.ndarray
    window_ids: np.ndarray

    def documents_of(self, window: int) -> np.ndarray:
        return self.doc_rows[self.doc_offsets[window]:self.doc_offsets[window + 1]]

    def windows_of(self, row: int) -> np.ndarray:
        """int32[words of document `row`]: its window at every start."""
        return self.window_ids[self.window_starts[row]:self.window_starts[row + 1]]

    def save(self, path: str | pathlib.Path) -> None:
        np.savez(path, tokens=self.table.tokens, doc_offsets=self.doc_offsets, doc_rows=self.doc_rows,
                 docids=np.asarray(self.docids, dtype=object), width=self.width, window_starts=self.window_starts,
                 window_ids=self.window_ids)

    @classmethod
    def load(cls, path: str | pathlib.Path) -> SpanIndex:
        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no span index at {path}: build it with `python -m gr_jax.tools.ngram_index "
                                    f"--data_dir {path.parent} --width N`")
        with np.load(path, allow_pickle=True) as f:
            tokens = f["tokens"]
            table = DocidTable(docids=tuple(f"s{j}" for j in range(len(tokens))), tokens=tokens)
            return cls(table=table, doc_offsets=f["doc_offsets"], doc_rows=f["doc_rows"],
                       docids=tuple(str(d) for d in f["docids"]), width=int(f["width"]),
                       window_starts=f["window_starts"], window_ids=f["window_ids"])


def build_span_index(dataset: RetrievalDataset, *, vocabulary: Any, width: int) -> SpanIndex:
    """Every document's windows, tokenised, deduplicated (see the module docstring). An empty document is an error
    naming the collection file and line."""
    from gr_jax.data.readers import DataFormatError
    ids: dict[bytes, int] = {}
    sequences: list[list[int]] = []
    containing: list[list[int]] = []
    docids: list[str] = []
    window_ids: list[int] = []
    window_starts = [0]
    for row, (docid, text) in enumerate(dataset.collection()):
        words = words_of(text)
        if not words:
            raise DataFormatError.at(dataset.collection_path, row + 1, f"document {docid!r} has no words")
        docids.append(docid)
        for window in document_windows(words, width=width):
            tokens = list(vocabulary.encode(" ".join(window))) + [EOS_ID]
            key = np.asarray(tokens, np.int32).tobytes()
            j = ids.get(key)
            if j is None:
                j = ids[key] = len(sequences)
                sequences.append(tokens)
                containing.append([])
            if not containing[j] or containing[j][-1] != row:
                containing[j].append(row)
            window_ids.append(j)
        window_starts.append(len(window_ids))
    longest = max(len(s) for s in sequences)
    table_tokens = np.zeros((len(sequences), longest), np.int32)
    for j, sequence in enumerate(sequences):
        table_tokens[j, :len(sequence)] = sequence
    counts = np.asarray([len(c) for c in containing], np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    table = DocidTable(docids=tuple(f"s{j}" for j in range(len(sequences))), tokens=table_tokens)
    logger.info("span index: %d documents, %d windows of %d words, %d distinct (%d tokens at most)", len(docids),
                len(window_ids), width, len(sequences), longest)
    return SpanIndex(table=table, doc_offsets=offsets, doc_rows=np.concatenate([np.asarray(c, np.int32)
                                                                                 for c in containing]),
                     docids=tuple(docids), width=width, window_starts=np.asarray(window_starts, np.int64),
                     window_ids=np.asarray(window_ids, np.int32))


def aggregate_documents(span_ids: Iterable[int], span_scores: Iterable[float], *, index: SpanIndex,
                        k: int) -> tuple[list[int], list[float]]:
    """Documents ranked by the spans they contain: score(d) = sum of p(span | q) = exp(log-likelihood) over the
    distinct generated spans d contains (each span once, however often d repeats it); ties by the best span that
    reached d first. Returns (collection rows, scores), at most k, best first."""
    scores: dict[int, float] = {}
    for span, log_likelihood in zip(span_ids, span_scores):
        p = float(np.exp(log_likelihood))
        for row in index.documents_of(int(span)).tolist():
            scores[row] = scores.get(row, 0.0) + p  # dicts keep first-reached order: the tie-break
    ranked = sorted(scores.items(), key=lambda item: -item[1])[:k]
    return [row for row, _ in ranked], [score for _, score in ranked]
