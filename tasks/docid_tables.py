"""Docid schemes and the on-disk cache of each data dir's docid table (`{data_dir}/docids.{scheme}.tsv`).

Building a table means reading every docid of the collection (8.8M for MS MARCO) and tokenising it;
every process that registers the dataset (each host, each eval job) would otherwise repeat that. The
cache is rebuilt when the collection or the vocabulary file is newer than it, or when a spot check of
a few rows against the current vocabulary disagrees (a different `spm.model` that happens to be older).
A read-only data dir gets an in-memory table and a warning.

`DOCID_SCHEMES` is the one place that lists schemes; the semantic / 2D / atomic ones join it here.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
from collections.abc import Callable

import numpy as np
import seqio

from gr_jax.data.readers import DataFormatError, RetrievalDataset
from gr_jax.docids import DocidTable, naive_docid_table

logger = logging.getLogger(__name__)

_SPOT_CHECK_ROWS = 64


@dataclasses.dataclass(frozen=True)
class DocidScheme:
    """How a scheme builds a table from a dataset and vocabulary, and how a cached table is re-checked.

    `spot_check(table, vocabulary, rows)` recomputes the given rows' sequences; None for schemes whose
    rows cannot be recomputed cheaply (then only file times guard the cache).
    """

    build: Callable[[RetrievalDataset, seqio.SentencePieceVocabulary], DocidTable]
    spot_check: Callable[[DocidTable, seqio.SentencePieceVocabulary, np.ndarray], bool] | None = None


def _build_naive(dataset: RetrievalDataset, vocabulary: seqio.SentencePieceVocabulary) -> DocidTable:
    return naive_docid_table(docids=(docid for docid, _ in dataset.collection()),
                             encode=vocabulary.tokenizer.encode, batched=True)


def _spot_check_naive(table: DocidTable, vocabulary: seqio.SentencePieceVocabulary, rows: np.ndarray) -> bool:
    expected = naive_docid_table(docids=[table.docids[i] for i in rows], encode=vocabulary.tokenizer.encode,
                                 batched=True)
    actual = table.tokens[rows]
    width = max(expected.tokens.shape[1], actual.shape[1])
    pad = lambda t: np.pad(t, ((0, 0), (0, width - t.shape[1])))  # noqa: E731
    return bool(np.array_equal(pad(expected.tokens), pad(actual)))


DOCID_SCHEMES: dict[str, DocidScheme] = {
    # DSI's naive string docids: the collection's own ids tokenised by the vocabulary (digits one per piece).
    "naive": DocidScheme(build=_build_naive, spot_check=_spot_check_naive),
}


def docid_cache_path(data_dir: str | os.PathLike, scheme: str) -> pathlib.Path:
    return pathlib.Path(data_dir) / f"docids.{scheme}.tsv"


def _cache_is_fresh(cache: pathlib.Path, *, inputs: tuple[pathlib.Path, ...]) -> bool:
    if not cache.is_file():
        return False
    cache_time = cache.stat().st_mtime_ns
    return all(path.stat().st_mtime_ns <= cache_time for path in inputs)


def load_or_build_docid_table(
        *,
        dataset: RetrievalDataset,
        scheme: str,
        vocabulary: seqio.SentencePieceVocabulary,
        vocabulary_path: str | os.PathLike,
) -> DocidTable:
    """The dataset's docid table under `scheme`, from `{data_dir}/docids.{scheme}.tsv` when that is current.

    A stale, unreadable or disagreeing cache is rebuilt and rewritten (atomically: a concurrent reader on
    another host never sees half a file).
    """
    if scheme not in DOCID_SCHEMES:
        raise ValueError(f"unknown docid scheme {scheme!r}; known: {sorted(DOCID_SCHEMES)}")
    definition = DOCID_SCHEMES[scheme]
    cache = docid_cache_path(dataset.data_dir, scheme)
    if _cache_is_fresh(cache, inputs=(dataset.collection_path, pathlib.Path(vocabulary_path))):
        try:
            table = DocidTable.load(cache)
        except (DataFormatError, ValueError) as e:
            logger.warning("rebuilding the unreadable docid cache %s: %s", cache, e)
        else:
            rows = np.unique(np.linspace(0, len(table) - 1, num=min(_SPOT_CHECK_ROWS, len(table))).astype(np.int64))
            if definition.spot_check is None or not len(table) or definition.spot_check(table, vocabulary, rows):
                logger.info("docid table %s: %d docids (cached)", cache, len(table))
                return table
            logger.warning("rebuilding the docid cache %s: its rows disagree with the vocabulary %s", cache,
                           vocabulary_path)
    table = definition.build(dataset, vocabulary)
    try:
        table.save(cache)
    except OSError as e:
        logger.warning("could not cache the docid table at %s (%s); using it from memory", cache, e)
    else:
        logger.info("docid table %s: %d docids (built)", cache, len(table))
    return table
