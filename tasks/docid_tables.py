"""Docid schemes and each data dir's docid table file (`{data_dir}/docids.{scheme}.tsv`).

`DOCID_SCHEMES` is the one place that lists schemes; a scheme is a function (dataset, vocabulary) -> DocidTable:

* `naive` (DSI): the collection's own ids tokenised by the vocabulary (digits one per piece).
* `atomic` (DSI): one new token per document, `vocab_size + row`, then EOS (`gr_jax.semantic_ids`).
* `semantic` / `semantic2d` (DSI / NCI): hierarchical k-means over MiniLM embeddings of the collection, as the
  vocabulary's digit tokens / as (position, value) tokens appended after the vocabulary. Clustering 8.8M
  embeddings is an offline job (`python -m tools.semantic_ids`) that writes the table file; registering
  only loads and checks it, and names that command when the file is missing or does not fit the vocabulary.

Tables that are cheap to build (naive, atomic) are cached in the same file: building one means reading every
docid of the collection (8.8M for MS MARCO), which every process registering the dataset (each host, each
eval job) would otherwise repeat. The cache is rebuilt when the collection or the vocabulary file is newer
than it, or when a spot check of a few rows against the current vocabulary disagrees (a different
`spm.model` that happens to be older). A read-only data dir gets an in-memory table and a warning.

Schemes with docid tokens beyond the vocabulary need a larger model output: `output_vocab_size`.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pathlib
from collections.abc import Callable

import numpy as np
import seqio

from gr_jax import semantic_ids
from gr_jax.data.readers import DataFormatError, RetrievalDataset
from gr_jax.docids import DocidTable, naive_docid_table
from gr_jax.vocabulary import EOS_ID, PAD_ID

logger = logging.getLogger(__name__)

_SPOT_CHECK_ROWS = 64


@dataclasses.dataclass(frozen=True)
class DocidScheme:
    """How a scheme makes a table from a dataset and vocabulary, and how a cached table is re-checked.

    `build(dataset, vocabulary)` makes (or, for prebuilt schemes, loads) the table.
    `cached`: whether `load_or_build_docid_table` keeps build's result in `docids.{scheme}.tsv`; False for
    schemes whose build reads that file (it is their input, made by a tool, never overwritten here).
    `spot_check(table, vocabulary, rows)` recomputes the given rows' sequences of a cached table; None for
    schemes whose rows cannot be recomputed cheaply (then only file times guard the cache).
    """

    build: Callable[[RetrievalDataset, seqio.SentencePieceVocabulary], DocidTable]
    cached: bool = True
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


def _build_atomic(dataset: RetrievalDataset, vocabulary: seqio.SentencePieceVocabulary) -> DocidTable:
    return semantic_ids.atomic_docid_table(docids=(docid for docid, _ in dataset.collection()),
                                           vocab_size=vocabulary.vocab_size).table


def _spot_check_atomic(table: DocidTable, vocabulary: seqio.SentencePieceVocabulary, rows: np.ndarray) -> bool:
    """Row i is `[vocab_size + i, EOS]`: a cache made with another vocabulary size fails."""
    expected = np.stack([vocabulary.vocab_size + rows, np.full(rows.shape, EOS_ID)], axis=1)
    return table.tokens.shape[1] == 2 and bool(np.array_equal(table.tokens[rows], expected))


def _content_tokens(table: DocidTable) -> np.ndarray:
    """The distinct content token ids of a table (PAD and EOS excluded), sorted.

    A scatter into a presence mask (O(N L), no sort of 100M MS MARCO tokens); semantic tables have small ids.
    """
    present = np.zeros(max(int(table.tokens.max(initial=0)), PAD_ID, EOS_ID) + 1, bool)
    present[table.tokens.ravel()] = True
    present[[PAD_ID, EOS_ID]] = False
    return np.flatnonzero(present)


def _digit_tokens_problem(table: DocidTable, vocabulary: seqio.SentencePieceVocabulary) -> str | None:
    digits = semantic_ids.digit_token_ids(vocabulary)
    other = np.setdiff1d(_content_tokens(table), digits)
    if other.size:
        return (f"it holds token ids {other[:5].tolist()} that are not the vocabulary's digit pieces {digits} "
                f"(made with another vocabulary?)")
    return None


def _appended_tokens_problem(table: DocidTable, vocabulary: seqio.SentencePieceVocabulary) -> str | None:
    inside = _content_tokens(table)
    inside = inside[inside < vocabulary.vocab_size]
    if inside.size:
        return (f"it holds token ids {inside[:5].tolist()} inside the vocabulary of {vocabulary.vocab_size} pieces, "
                f"but its docid tokens must be appended after it (made with another vocabulary?)")
    return None


def prebuilt_command(data_dir: str | os.PathLike, scheme: str) -> str:
    """The command that writes `{data_dir}/docids.{scheme}.tsv` for the prebuilt (semantic) schemes."""
    return f"python -m tools.semantic_ids --data_dir {data_dir} --scheme {scheme}"


def _load_prebuilt(
        dataset: RetrievalDataset,
        vocabulary: seqio.SentencePieceVocabulary,
        *,
        scheme: str,
        problem: Callable[[DocidTable, seqio.SentencePieceVocabulary], str | None],
) -> DocidTable:
    """Reads the table `tools.semantic_ids` wrote and checks its tokens against `vocabulary`."""
    path = docid_cache_path(dataset.data_dir, scheme)
    command = prebuilt_command(dataset.data_dir, scheme)
    if not path.is_file():
        raise FileNotFoundError(f"no {scheme} docid table at {path}: {scheme} docids come from k-means over the "
                                f"collection's embeddings, built offline by `{command}`")
    table = DocidTable.load(path)
    found = problem(table, vocabulary)
    if found is not None:
        raise ValueError(f"{path}: {found}; rebuild it with `{command}`")
    if path.stat().st_mtime_ns < dataset.collection_path.stat().st_mtime_ns:
        logger.warning("%s is older than %s: if the collection changed, rebuild it with `%s`", path,
                       dataset.collection_path, command)
    logger.info("docid table %s: %d docids (prebuilt)", path, len(table))
    return table


DOCID_SCHEMES: dict[str, DocidScheme] = {
    # DSI's naive string docids: the collection's own ids tokenised by the vocabulary (digits one per piece).
    "naive": DocidScheme(build=_build_naive, spot_check=_spot_check_naive),
    # DSI's atomic docids: one new output token per document.
    "atomic": DocidScheme(build=_build_atomic, spot_check=_spot_check_atomic),
    # DSI's semantic docids: the cluster path in the vocabulary's digit tokens.
    "semantic": DocidScheme(build=functools.partial(_load_prebuilt, scheme="semantic", problem=_digit_tokens_problem),
                            cached=False),
    # NCI's 2D semantic docids: (position, value) tokens appended after the vocabulary.
    "semantic2d": DocidScheme(build=functools.partial(_load_prebuilt, scheme="semantic2d",
                                                      problem=_appended_tokens_problem), cached=False),
}


def output_vocab_size(*, table: DocidTable, vocabulary: seqio.SentencePieceVocabulary) -> int:
    """Embedding / output rows a model needs for `table`'s targets: the vocabulary plus appended docid tokens."""
    return semantic_ids.output_vocab_size(table, vocab_size=vocabulary.vocab_size)


def docid_token_range(table: DocidTable) -> tuple[int, int]:
    """[start, stop) of the token ids the docids use, EOS and PAD aside: what an atomic or PAWA output layer covers.

    Atomic: [vocab_size, vocab_size + N); semantic2d: the appended (position, value) tokens; naive and semantic:
    the span of the digit pieces inside the vocabulary.
    """
    tokens = table.tokens[table.tokens > max(EOS_ID, PAD_ID)]
    if not tokens.size:
        raise ValueError("the docid table has no docid tokens (every row is only EOS)")
    return int(tokens.min()), int(tokens.max()) + 1


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
    another host never sees half a file). Prebuilt schemes (`cached=False`) read that file and never write it.
    """
    if scheme not in DOCID_SCHEMES:
        raise ValueError(f"unknown docid scheme {scheme!r}; known: {sorted(DOCID_SCHEMES)}")
    definition = DOCID_SCHEMES[scheme]
    if not definition.cached:
        return definition.build(dataset, vocabulary)
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
