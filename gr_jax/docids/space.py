"""A run's docid space: which token sequence names each document, and the token ids a model needs for them.

Built once per run (`load_docid_space`) and handed, as a value, to task registration (targets), the model builder
(vocabulary size, the docid token range of an atomic or PAWA head) and the retriever (the trie, docids back from
decoded sequences). Nothing is stashed in a module global and read back.

The table of a data dir lives in `{data_dir}/docids.{scheme}.tsv`. Schemes that are cheap to build (naive,
atomic) cache it there: building one means reading every docid of the collection (8.8M for MS MARCO), which every
process of a run (each host) would otherwise repeat. The cache is rebuilt when the collection or the vocabulary
file is newer than it, or when the scheme's check of a few rows against the current vocabulary fails (a
different `spm.model` that happens to be older). A read-only data dir gets an in-memory table and a warning.
Prebuilt schemes (k-means ids) read the file a tool wrote, check it, and never write it.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pathlib
from typing import TYPE_CHECKING

import numpy as np

from gr_jax.data.readers import DataFormatError
from gr_jax.docids.scheme import get_scheme
from gr_jax.docids.table import DocidTable
from gr_jax.docids.trie import Trie

if TYPE_CHECKING:
    import seqio

    from gr_jax.data.readers import RetrievalDataset

logger = logging.getLogger(__name__)

_CHECKED_ROWS = 64


@dataclasses.dataclass(frozen=True, eq=False)
class DocidSpace:
    """The docids of a run and the token ids around them.

    table: every document's docid and token sequence (EOS included).
    scheme: the name of the scheme that made the table (`gr_jax.docids.scheme.SCHEMES`).
    text_vocab_size: the SentencePiece pieces, the ids of the model's inputs.
    model_vocab_size: the ids the model embeds and predicts: the pieces, the ids reserved after them (span
      corruption sentinels) and any docid tokens appended after those (atomic, 2D semantic). Unpadded: the model
      builder rounds it up to a multiple that shards evenly.
    docid_token_range: [start, stop) of the docid content tokens (EOS aside): an atomic or PAWA head's columns.
    """

    table: DocidTable
    scheme: str
    text_vocab_size: int
    model_vocab_size: int
    docid_token_range: tuple[int, int]

    @classmethod
    def from_table(cls, table: DocidTable, *, scheme: str, text_vocab_size: int,
                   reserved_tokens: int = 0) -> DocidSpace:
        """The space of `table` over a vocabulary of `text_vocab_size` pieces with `reserved_tokens` ids after them."""
        if not len(table):
            raise ValueError("the docid table holds no docids")
        if text_vocab_size < 1 or reserved_tokens < 0:
            raise ValueError(f"text_vocab_size must be positive and reserved_tokens >= 0, got {text_vocab_size} and "
                             f"{reserved_tokens}")
        start, stop = table.token_range()  # PAD and EOS are pieces of the vocabulary: only docid tokens may pass it
        return cls(table=table, scheme=scheme, text_vocab_size=text_vocab_size,
                   model_vocab_size=max(text_vocab_size + reserved_tokens, stop), docid_token_range=(start, stop))

    @functools.cached_property
    def trie(self) -> Trie:
        """The trie of every docid (built on first use: 7 s and 212 MB for MS MARCO's 8.8M naive docids)."""
        return Trie.build(self.table.tokens, vocab_size=self.model_vocab_size)

    def __len__(self) -> int:
        return len(self.table)


def docid_table_path(data_dir: str | os.PathLike, scheme: str) -> pathlib.Path:
    return pathlib.Path(data_dir) / f"docids.{scheme}.tsv"


def load_docid_space(*, dataset: RetrievalDataset, scheme: str, vocabulary: seqio.SentencePieceVocabulary,
                     vocabulary_path: str | os.PathLike, reserved_tokens: int = 0) -> DocidSpace:
    """The docid space of `dataset` under `scheme` (see the module docstring for the table file)."""
    table = load_docid_table(dataset=dataset, scheme=scheme, vocabulary=vocabulary, vocabulary_path=vocabulary_path)
    if not len(table):
        raise ValueError(f"{dataset.collection_path} holds no documents")
    return DocidSpace.from_table(table, scheme=scheme, text_vocab_size=vocabulary.vocab_size,
                                 reserved_tokens=reserved_tokens)


def _checked_rows(table: DocidTable) -> np.ndarray:
    return np.unique(np.linspace(0, len(table) - 1, num=min(_CHECKED_ROWS, len(table))).astype(np.int64))


def load_docid_table(*, dataset: RetrievalDataset, scheme: str, vocabulary: seqio.SentencePieceVocabulary,
                     vocabulary_path: str | os.PathLike) -> DocidTable:
    """`{data_dir}/docids.{scheme}.tsv` when current, else the scheme's freshly built (and cached) table.

    A stale, unreadable or disagreeing cache is rebuilt and rewritten (atomically: a concurrent reader on another
    host never sees half a file). Prebuilt schemes read their file and never write it.
    """
    definition = get_scheme(scheme)
    path = docid_table_path(dataset.data_dir, scheme)

    def problem(table: DocidTable) -> str | None:
        return definition.check(table, vocabulary=vocabulary, rows=_checked_rows(table)) if len(table) else None

    if definition.prebuilt:
        command = definition.prebuilt_command(dataset.data_dir)
        if not path.is_file():
            raise FileNotFoundError(f"no {scheme} docid table at {path}: {scheme} docids are built offline by "
                                    f"`{command}`")
        table = DocidTable.load(path)
        found = problem(table)
        if found is not None:
            raise ValueError(f"{path}: {found}; rebuild it with `{command}`")
        if path.stat().st_mtime_ns < dataset.collection_path.stat().st_mtime_ns:
            logger.warning("%s is older than %s: if the collection changed, rebuild it with `%s`", path,
                           dataset.collection_path, command)
        logger.info("docid table %s: %d docids (prebuilt)", path, len(table))
        return table
    if _is_fresh(path, inputs=(dataset.collection_path, pathlib.Path(vocabulary_path))):
        try:
            table = DocidTable.load(path)
        except (DataFormatError, ValueError) as e:
            logger.warning("rebuilding the unreadable docid cache %s: %s", path, e)
        else:
            found = problem(table)
            if found is None:
                logger.info("docid table %s: %d docids (cached)", path, len(table))
                return table
            logger.warning("rebuilding the docid cache %s: %s (%s)", path, found, vocabulary_path)
    table = definition.build(dataset=dataset, vocabulary=vocabulary)
    try:
        table.save(path)
    except OSError as e:
        logger.warning("could not cache the docid table at %s (%s); using it from memory", path, e)
    else:
        logger.info("docid table %s: %d docids (built)", path, len(table))
    return table


def _is_fresh(cache: pathlib.Path, *, inputs: tuple[pathlib.Path, ...]) -> bool:
    if not cache.is_file():
        return False
    cache_time = cache.stat().st_mtime_ns
    return all(path.stat().st_mtime_ns <= cache_time for path in inputs)
