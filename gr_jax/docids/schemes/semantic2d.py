"""2D semantic docids (NCI's "2D code"): value v at position p of a k-means id is the new token
`vocab_size + p * base + v` with `base = max(k, c)`, so the same digit at different depths is a different token;
the model's embedding and output grow by `(max_depth + 1) * base` tokens appended after the vocabulary. Built
offline with the semantic scheme's k-means and options (`python -m gr_jax.tools.semantic_ids --scheme semantic2d`).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gr_jax.docids.scheme import register_scheme
from gr_jax.docids.schemes.semantic import SemanticIdScheme, check_docids
from gr_jax.docids.semantic_ids import SemanticIds
from gr_jax.docids.table import (DocidTable, ExtendedDocidTable, appended_tokens_problem,
                                 check_appended_vocab_size)
from gr_jax.vocabulary import EOS_ID, PAD_ID


@register_scheme
class Semantic2DScheme(SemanticIdScheme):
    name = "semantic2d"
    description = "hierarchical k-means ids as NCI's (position, value) tokens appended after the vocabulary"

    def from_semantic_ids(self, *, docids, ids, vocabulary) -> ExtendedDocidTable:
        return semantic_2d_docid_table(docids=docids, ids=ids, vocab_size=vocabulary.vocab_size)

    def check(self, table, *, vocabulary, rows) -> str | None:
        return appended_tokens_problem(table, vocab_size=vocabulary.vocab_size)


def semantic_2d_docid_table(*, docids: Sequence[str], ids: SemanticIds, vocab_size: int) -> ExtendedDocidTable:
    """Position p < depth holds the level-p cluster digit, position `depth` the leaf position; then EOS.

    tokens: int32[N, max_depth + 2]; num_extra_tokens = (max_depth + 1) * base.
    """
    docids = check_docids(docids, len(ids))
    base = max(ids.k, ids.c)
    num_extra_tokens = (ids.max_depth + 1) * base
    check_appended_vocab_size(vocab_size, num_extra_tokens)
    codes = ids.codes().astype(np.int64)
    positions = np.arange(codes.shape[1], dtype=np.int64)
    tokens = np.where(codes >= 0, vocab_size + positions * base + codes, PAD_ID)
    tokens = np.concatenate([tokens, np.full((len(ids), 1), PAD_ID, np.int64)], axis=1)
    tokens[np.arange(len(ids)), ids.depth + 1] = EOS_ID
    return ExtendedDocidTable(table=DocidTable(docids=docids, tokens=tokens.astype(np.int32)), vocab_size=vocab_size,
                              num_extra_tokens=num_extra_tokens)
