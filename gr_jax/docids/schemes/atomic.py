"""Atomic docids (DSI): one new token per document, `vocab_size + row`, then EOS.

Rows are `[vocab_size + i, EOS]`: the EOS keeps the `DocidTable` contract, so the trie, beam search and training
targets work unchanged (the second step is forced). A model with the atomic head decodes one step instead and
ranks documents by its docid columns (`gr_jax.heads.atomic`).
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from gr_jax.docids.scheme import DocidScheme, register_scheme
from gr_jax.docids.table import DocidNames, DocidTable, ExtendedDocidTable, check_appended_vocab_size
from gr_jax.vocabulary import EOS_ID


@register_scheme
class AtomicScheme(DocidScheme):
    name = "atomic"
    description = "one new token per document (DSI)"

    def build(self, *, dataset, vocabulary) -> DocidTable:
        return atomic_docid_table(docids=(docid for docid, _ in dataset.collection()),
                                  vocab_size=vocabulary.vocab_size).table

    def check(self, table, *, vocabulary, rows) -> str | None:
        """Row i is `[vocab_size + i, EOS]`: a table made with another vocabulary size fails."""
        expected = np.stack([vocabulary.vocab_size + rows, np.full(rows.shape, EOS_ID)], axis=1)
        if table.tokens.shape[1] != 2 or not np.array_equal(table.tokens[rows], expected):
            return f"its rows are not [{vocabulary.vocab_size} + row, EOS] (made with another vocabulary size?)"
        return None


def atomic_docid_table(*, docids: Iterable[str], vocab_size: int) -> ExtendedDocidTable:
    """Document i (in `docids` order) is the single new token `vocab_size + i`, then EOS; num_extra_tokens = N."""
    docids = DocidNames(docids)  # a string array, read a chunk at a time
    check_appended_vocab_size(vocab_size, len(docids))
    tokens = np.empty((len(docids), 2), np.int32)
    tokens[:, 0] = vocab_size + np.arange(len(docids), dtype=np.int64)
    tokens[:, 1] = EOS_ID
    return ExtendedDocidTable(table=DocidTable(docids=docids, tokens=tokens), vocab_size=vocab_size,
                              num_extra_tokens=len(docids))
