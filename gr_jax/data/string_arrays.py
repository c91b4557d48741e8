"""Texts held in one numpy array of variable-width strings (`numpy.dtypes.StringDType`), not a Python object each.

Why: a Python str costs ~50 bytes beside its characters, and a list of them one more pointer each; an 8.8M-passage
run's docids (and GDR's tens of millions of synthetic queries) would otherwise take GBs of objects on every host.
A StringDType array stores short strings inline (16 bytes each) and longer ones in one arena; its elements read
back as str.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable

import numpy as np
from numpy.dtypes import StringDType

CHUNK = 65_536  # texts converted at a time from an iterator


def string_array(texts: Iterable[str]) -> np.ndarray:
    """StringDType[n]: `texts` in order; an iterator (e.g. over a collection) is converted a chunk at a time, so no list
    of every text is made. A non-str element is a TypeError (numpy would silently turn it into its repr)."""
    if isinstance(texts, np.ndarray) and isinstance(texts.dtype, StringDType):
        return texts
    if isinstance(texts, (list, tuple)):
        return _checked(texts)
    remaining = iter(texts)
    chunks = [np.zeros(0, dtype=StringDType())]
    while chunk := list(itertools.islice(remaining, CHUNK)):
        chunks.append(_checked(chunk))
    return np.concatenate(chunks)


def _checked(texts: list[str] | tuple[str, ...]) -> np.ndarray:
    if not all(isinstance(t, str) for t in texts):
        raise TypeError("expected strings")
    return np.array(texts, dtype=StringDType())


@dataclasses.dataclass(frozen=True, eq=False)
class SortedKeys:
    """Byte-string keys (`S` arrays: docids as UTF-8) sorted once, so the rows of many keys are one binary search each
    instead of a dict of Python strings. `sorted`: the keys in order; `order`: the row of each."""

    sorted: np.ndarray
    order: np.ndarray

    @classmethod
    def of(cls, keys: np.ndarray) -> SortedKeys:
        order = np.argsort(keys, kind="stable")
        return cls(sorted=keys[order], order=order)

    def rows_of(self, wanted: np.ndarray) -> np.ndarray:
        """int64[len(wanted)]: each key's row, -1 where there is none. A key wider than the sorted ones is cut to their
        width by the search, then told apart by the comparison."""
        if not wanted.size or not self.sorted.size:
            return np.full(wanted.shape, -1, np.int64)
        position = np.minimum(np.searchsorted(self.sorted, wanted), self.sorted.size - 1)
        return np.where(self.sorted[position] == wanted, self.order[position], -1).astype(np.int64)
