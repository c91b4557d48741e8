"""Codebook docids (RIPOR-style, `gr_jax.docids.codebook_ids`): L residual k-means codes of N values as new tokens.

Position-specific tokens (default): code c at level l is `vocab_size + l * N + c`, so each level has its own N
tokens (L x N appended); shared tokens: code c is `vocab_size + c` at every level (N appended). A document whose
codes another shares gets a collision position after them, `vocab_size + (L x N or N) + j`; then EOS. Built
offline from the collection's embeddings by `python -m gr_jax.tools.semantic_ids --scheme codebook` (its `--levels`,
`--codes`, `--shared_codes`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from gr_jax.docids.codebook_ids import CodebookIds, build_codebook_ids
from gr_jax.docids.scheme import PrebuiltScheme, PrebuiltTable, option, register_scheme
from gr_jax.docids.schemes.semantic import check_docids
from gr_jax.docids.table import (DocidTable, ExtendedDocidTable, appended_tokens_problem,
                                 check_appended_vocab_size)
from gr_jax.vocabulary import EOS_ID, PAD_ID


@dataclasses.dataclass(frozen=True)
class CodebookSettings:
    """The residual k-means of the codebook scheme (`build_codebook_ids`) and its token layout."""

    levels: int = option(8, "residual k-means levels")
    codes: int = option(256, "codes per level")
    shared_codes: bool = option(False, "one set of code tokens for every level, not one per level")
    seed: int = option(0, "k-means seed")


@register_scheme
class CodebookScheme(PrebuiltScheme[CodebookSettings]):
    name = "codebook"
    description = "residual k-means codes appended after the vocabulary (RIPOR-style)"
    settings_type = CodebookSettings

    def from_embeddings(self, *, docids, embeddings, vocabulary, settings, show_progress=False) -> PrebuiltTable:
        ids = build_codebook_ids(embeddings=embeddings, levels=settings.levels, num_codes=settings.codes,
                                 seed=settings.seed, show_progress=show_progress)
        extended = codebook_docid_table(docids=docids, ids=ids, vocab_size=vocabulary.vocab_size,
                                        shared_codes=settings.shared_codes)
        return PrebuiltTable(extended=extended, diagnostics=ids.stats.to_json())

    def check(self, table, *, vocabulary, rows) -> str | None:
        return appended_tokens_problem(table, vocab_size=vocabulary.vocab_size)


def codebook_docid_table(*, docids: Sequence[str], ids: CodebookIds, vocab_size: int,
                         shared_codes: bool = False) -> ExtendedDocidTable:
    """tokens int32[N, L + 2] (codes, the collision position or EOS, then EOS or PAD); see the module docstring."""
    docids = check_docids(docids, len(ids))
    levels, num_codes = ids.levels, ids.num_codes
    code_tokens = num_codes if shared_codes else levels * num_codes
    num_extra_tokens = code_tokens + ids.max_collisions
    check_appended_vocab_size(vocab_size, num_extra_tokens)
    offsets = 0 if shared_codes else np.arange(levels, dtype=np.int64) * num_codes
    tokens = np.full((len(ids), levels + 2), PAD_ID, np.int64)
    tokens[:, :levels] = vocab_size + offsets + ids.codes.astype(np.int64)
    colliding = ids.collision >= 0
    tokens[colliding, levels] = vocab_size + code_tokens + ids.collision[colliding]
    tokens[colliding, levels + 1] = EOS_ID
    tokens[~colliding, levels] = EOS_ID
    if not colliding.any():
        tokens = tokens[:, :levels + 1]
    return ExtendedDocidTable(table=DocidTable(docids=docids, tokens=tokens.astype(np.int32)), vocab_size=vocab_size,
                              num_extra_tokens=num_extra_tokens)
