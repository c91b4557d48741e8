"""Texts held in one numpy array of variable-width strings (`numpy.dtypes.StringDType`), not a Python object each.

Why: a Python str costs ~50 bytes beside its characters, and a list of them one more pointer each; an 8.8M-passage
run's docids (and GDR's tens of millions of synthetic queries) would otherwise take GBs of objects on every host.
A StringDType array stores short strings inline (16 bytes each) and longer ones in one arena; its elements read
back as str.
"""
from __future__ import annotations

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
