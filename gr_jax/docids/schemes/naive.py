"""Naive docids (DSI): each document's own id string, tokenised by the vocabulary (digits one per piece), then EOS.

    docid "7301"  ->  pieces "▁", "7", "3", "0", "1"  ->  [3, 10, 6, 4, 1, EOS]
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import cast

import numpy as np

from gr_jax.docids.scheme import DocidScheme, register_scheme
from gr_jax.docids.table import DocidNames, DocidTable, scatter_rows
from gr_jax.vocabulary import EOS_ID, PAD_ID

# Docids are encoded this many at a time (bounds the Python lists alive at once for 8.8M ids).
_ENCODE_CHUNK = 65_536

EncodeOne = Callable[[str], Sequence[int]]  # one docid -> its token ids
EncodeBatch = Callable[[list[str]], Sequence[Sequence[int]]]  # docids -> their token ids each


@register_scheme
class NaiveScheme(DocidScheme):
    name = "naive"
    description = "each document's own id string in the vocabulary's pieces (DSI)"

    def build(self, *, dataset, vocabulary) -> DocidTable:
        return naive_docid_table(docids=(docid for docid, _ in dataset.collection()),
                                 encode=vocabulary.tokenizer.encode, batched=True)

    def check(self, table, *, vocabulary, rows) -> str | None:
        """The given rows re-encoded with `vocabulary` must equal the stored ones."""
        expected = naive_docid_table(docids=[table.docids[i] for i in rows], encode=vocabulary.tokenizer.encode,
                                     batched=True)
        actual = table.tokens[rows]
        width = max(expected.tokens.shape[1], actual.shape[1])
        pad = lambda t: np.pad(t, ((0, 0), (0, width - t.shape[1])))  # noqa: E731
        if not np.array_equal(pad(expected.tokens), pad(actual)):
            return "its rows disagree with the vocabulary"
        return None


def naive_docid_table(
    *,
    docids: Iterable[str],
    encode: EncodeOne | EncodeBatch,
    batched: bool = False,
) -> DocidTable:
    """Naive docids (DSI): each document's own id string, tokenised by the vocabulary, then EOS.

    encode: str -> token ids, e.g. `seqio.SentencePieceVocabulary.encode`; with `batched=True`,
      list[str] -> list of token-id sequences, e.g. `sentencepiece.SentencePieceProcessor.encode`,
      which tokenises a whole chunk in C++ (one Python call per id costs ~3 us: ~30 s for 8.8M ids).
    Ids are read and encoded in chunks into flat arrays (the ids themselves into string arrays) and scattered into
    one preallocated matrix, so memory stays close to the final table: no Python object per docid outlives its
    chunk. An id that encodes to nothing, or to PAD/EOS, is an error.
    """
    name_chunks: list[np.ndarray] = []
    flat_chunks: list[np.ndarray] = []
    length_chunks: list[np.ndarray] = []
    remaining = iter(docids)
    while chunk := list(itertools.islice(remaining, _ENCODE_CHUNK)):
        name_chunks.append(DocidNames(chunk).array)  # checks they are str
        # `batched` says which of the two `encode` is (a callable's parameter types are not checkable at run time).
        encoded = (cast(EncodeBatch, encode)(list(chunk)) if batched
                   else [cast(EncodeOne, encode)(d) for d in chunk])
        if len(encoded) != len(chunk):
            raise ValueError(f"batched encode returned {len(encoded)} sequences for {len(chunk)} docids")
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(chunk))
        flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int64, count=int(lengths.sum()))
        empty = np.flatnonzero(lengths == 0)
        if empty.size:
            raise ValueError(f"docid {chunk[empty[0]]!r} encodes to no tokens")
        bad_token = (flat == PAD_ID) | (flat == EOS_ID) | (flat < 0) | (flat > np.iinfo(np.int32).max)
        if bad_token.any():
            i = int(np.searchsorted(np.cumsum(lengths), np.argmax(bad_token), side="right"))
            raise ValueError(f"docid {chunk[i]!r} encodes to {list(encoded[i])}, which contains PAD ({PAD_ID}), "
                             f"EOS ({EOS_ID}) or an id outside int32")
        flat_chunks.append(flat.astype(np.int32))
        length_chunks.append(lengths)
    lengths = np.concatenate(length_chunks) if length_chunks else np.zeros(0, np.int64)
    flat = np.concatenate(flat_chunks) if flat_chunks else np.zeros(0, np.int32)
    del flat_chunks
    tokens = scatter_rows(flat, lengths, width=int(lengths.max(initial=0)) + 1)
    tokens[np.arange(lengths.size), lengths] = EOS_ID
    return DocidTable(docids=np.concatenate(name_chunks) if name_chunks else DocidNames(()), tokens=tokens)
