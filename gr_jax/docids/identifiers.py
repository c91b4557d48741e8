"""Which identifier strings name each document: one (its docid) for the docid schemes, several for n-gram ids.

Metrics over documents that score identifier strings (CGL's L(q, d), `gr_jax.scaling.cgl`) read this instead of
assuming one docid-table row per document. Cai et al.'s code averages the generation loss over all identifier
strings of a document; for n-gram ids those are its distinct span windows.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

from gr_jax.docids.table import DocidTable


@dataclasses.dataclass(frozen=True, eq=False)
class DocumentIdentifiers:
    """docids: every retrievable document; document i's identifier strings are the docid-table rows
    `rows[offsets[i]:offsets[i + 1]]` (int64, at least one per document)."""
    docids: tuple[str, ...]
    offsets: np.ndarray  # int64[N + 1]
    rows: np.ndarray  # int64[offsets[-1]]

    def __post_init__(self):
        counts = np.diff(self.offsets)
        if len(self.offsets) != len(self.docids) + 1 or self.offsets[0] != 0 or self.offsets[-1] != len(self.rows):
            raise ValueError(f"offsets must be [0, ..., {len(self.rows)}] with {len(self.docids) + 1} entries")
        if (counts < 1).any():
            missing = [self.docids[i] for i in np.flatnonzero(counts < 1)[:5]]
            raise ValueError(f"every document needs an identifier string; none for {missing}")

    @classmethod
    def one_each(cls, table: DocidTable) -> DocumentIdentifiers:
        """Each row of the docid table is a document named by that one row."""
        return cls(docids=tuple(table.docids), offsets=np.arange(len(table) + 1, dtype=np.int64),
                   rows=np.arange(len(table), dtype=np.int64))

    @classmethod
    def from_lists(cls, docids: Sequence[str], rows: Sequence[np.ndarray]) -> DocumentIdentifiers:
        """Document i is named by the table rows `rows[i]`."""
        lengths = np.asarray([len(r) for r in rows], np.int64)
        flat = np.concatenate([np.asarray(r, np.int64) for r in rows]) if len(rows) else np.zeros(0, np.int64)
        return cls(docids=tuple(docids), offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                   rows=flat)

    def __len__(self) -> int:
        return len(self.docids)

    def rows_of(self, document: int) -> np.ndarray:
        return self.rows[self.offsets[document]:self.offsets[document + 1]]

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {docid: i for i, docid in enumerate(self.docids)}

    def documents_of(self, docids: Sequence[str]) -> np.ndarray:
        """int64[len(docids)]: each docid's document index, -1 where it is not a document here."""
        return np.asarray([self._index.get(d, -1) for d in docids], np.int64)
