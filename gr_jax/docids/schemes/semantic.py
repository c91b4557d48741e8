"""Semantic docids (DSI): the hierarchical k-means path of a document in the vocabulary's digit pieces, then EOS.

Every level is written with `len(str(k - 1))` digits and the leaf position with `len(str(c - 1))`
(3-0-7-42 -> "3 0 7 4 2" for k=10, c=100), so a T5 vocabulary and its output layer are reused unchanged and
the fixed widths make the digit string decodable. The ids come from `gr_jax.docids.semantic_ids.build_semantic_ids`
over an encoder's embeddings: an offline job (`python -m gr_jax.tools.semantic_ids --scheme semantic`, with `--k`,
`--c`, `--seed`, `--nredo`) that writes the table file.
"""
from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence

import numpy as np

from gr_jax.docids.scheme import PrebuiltScheme, PrebuiltTable, option, register_scheme
from gr_jax.docids.semantic_ids import SemanticIds, build_semantic_ids
from gr_jax.docids.table import DocidTable, ExtendedDocidTable
from gr_jax.vocabulary import EOS_ID, PAD_ID, UNK_ID

DIGITS = "0123456789"


@dataclasses.dataclass(frozen=True)
class SemanticSettings:
    """The hierarchical k-means of the semantic schemes (`build_semantic_ids`)."""

    k: int = option(10, "clusters per level")
    c: int = option(100, "most documents per leaf")
    seed: int = option(0, "k-means seed")
    nredo: int = option(1, "k-means runs per split, the best kept (each run costs the same)")


class SemanticIdScheme(PrebuiltScheme[SemanticSettings]):
    """A scheme whose table is made from hierarchical k-means ids (`gr_jax.docids.semantic_ids`)."""

    settings_type = SemanticSettings

    def from_embeddings(self, *, docids, embeddings, vocabulary, settings, show_progress=False) -> PrebuiltTable:
        ids = build_semantic_ids(embeddings=embeddings, k=settings.k, c=settings.c, seed=settings.seed,
                                 nredo=settings.nredo, show_progress=show_progress)
        return PrebuiltTable(extended=self.from_semantic_ids(docids=docids, ids=ids, vocabulary=vocabulary),
                             diagnostics=ids.stats.to_json())

    @abc.abstractmethod
    def from_semantic_ids(self, *, docids: Sequence[str], ids: SemanticIds, vocabulary) -> ExtendedDocidTable:
        """The table of `ids` (row i names document `docids[i]`) in this scheme's tokens."""


@register_scheme
class SemanticScheme(SemanticIdScheme):
    name = "semantic"
    description = "hierarchical k-means ids in the vocabulary's digit pieces (DSI)"

    def from_semantic_ids(self, *, docids, ids, vocabulary) -> ExtendedDocidTable:
        table = semantic_docid_table(docids=docids, ids=ids, digit_tokens=digit_token_ids(vocabulary))
        return ExtendedDocidTable(table=table, vocab_size=vocabulary.vocab_size, num_extra_tokens=0)

    def check(self, table, *, vocabulary, rows) -> str | None:
        digits = digit_token_ids(vocabulary)
        other = np.setdiff1d(table.content_tokens(), digits)
        if other.size:
            return (f"it holds token ids {other[:5].tolist()} that are not the vocabulary's digit pieces {digits} "
                    f"(made with another vocabulary?)")
        return None


def digit_token_ids(vocabulary) -> list[int]:
    """The ids of the pieces "0".."9" (no word-boundary marker) of a SentencePiece vocabulary (seqio's or the
    processor itself). `gr_jax.vocabulary.train_sentencepiece` always has them (digits are split one per piece)."""
    processor = getattr(vocabulary, "tokenizer", vocabulary)
    ids = [processor.piece_to_id(digit) for digit in DIGITS]
    missing = [digit for digit, i in zip(DIGITS, ids) if i in (UNK_ID, PAD_ID, EOS_ID) or processor.is_unknown(i)]
    if missing:
        raise ValueError(f"the vocabulary has no piece for digit(s) {missing}; semantic docids need the ten digit "
                         "pieces (train it with `python -m gr_jax.tools.make_vocab`)")
    return ids


def check_docids(docids: Sequence[str], n: int) -> tuple[str, ...]:
    docids = tuple(docids)
    if len(docids) != n:
        raise ValueError(f"{len(docids)} docids for {n} semantic ids")
    return docids


def digits_of(values: np.ndarray, width: int) -> list[np.ndarray]:
    """The `width` decimal digits of each value, most significant first."""
    return [(values // 10 ** (width - 1 - j)) % 10 for j in range(width)]


def semantic_docid_table(*, docids: Sequence[str], ids: SemanticIds, digit_tokens: Sequence[int]) -> DocidTable:
    """Semantic ids as the vocabulary's digit tokens (fixed-width fields: see the module docstring), then EOS.

    docids: row i names document i of `ids`; digit_tokens: the token id of "0".."9" (`digit_token_ids`).
    tokens: int32[N, max_depth * len(str(k - 1)) + len(str(c - 1)) + 1].
    """
    docids = check_docids(docids, len(ids))
    digit_ids = np.asarray(digit_tokens, dtype=np.int64)
    if (digit_ids.shape != (10,) or len(set(digit_ids.tolist())) != 10
            or np.isin(digit_ids, (PAD_ID, EOS_ID)).any() or (digit_ids < 0).any()):
        raise ValueError(f"digit_tokens must be 10 distinct token ids other than PAD/EOS, got {digit_ids.tolist()}")
    level_width, leaf_width = len(str(ids.k - 1)), len(str(ids.c - 1))
    n = len(ids)
    tokens = np.full((n, ids.max_depth * level_width + leaf_width + 1), PAD_ID, np.int32)
    for level in range(ids.max_depth):
        rows = np.flatnonzero(ids.depth > level)
        for j, digit in enumerate(digits_of(ids.path[rows, level], level_width)):
            tokens[rows, level * level_width + j] = digit_ids[digit]
    all_rows = np.arange(n)
    leaf_start = ids.depth.astype(np.int64) * level_width
    for j, digit in enumerate(digits_of(ids.leaf_position, leaf_width)):
        tokens[all_rows, leaf_start + j] = digit_ids[digit]
    tokens[all_rows, leaf_start + leaf_width] = EOS_ID
    return DocidTable(docids=docids, tokens=tokens)
