"""Docid tables: the target token sequence of every document identifier.

Generative retrieval decodes a docid as a token sequence; a `DocidTable` fixes that sequence for every
document (row `i` of `tokens` is docid `docids[i]`), so that training targets, the decoding trie
(`gr_jax.docids.trie.Trie.build(table.tokens, ...)`) and the mapping of decoded sequences back to docids all
agree. Each row is the docid's tokens, then EOS, then PAD up to the table width `L`:

    docid "7301"  ->  [3, 10, 6, 4, 1, 0, 0]      (digit tokens, EOS=1, PAD=0)

Content tokens may be any id but PAD and EOS (a PAD inside a docid would end it early when the row is
trimmed, an EOS would make it a prefix of itself). Two docids with the same sequence are refused
(a collision would make the decoded document ambiguous), as are sequences longer than a model's target
length (`check_fits`): nothing is silently truncated.

The scheme that produces the sequences is separate from the table (`gr_jax.docids.schemes`: naive, atomic,
semantic, 2D semantic, each one module); every scheme produces the same `DocidTable`.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import pathlib
from collections.abc import Sequence

import numpy as np

from gr_jax.data.readers import DataFormatError, write_tsv
from gr_jax.vocabulary import EOS_ID, PAD_ID

PathLike = str | os.PathLike

# Rows checked at a time, so that validating 8.8M docids needs tens of MB of temporaries, not GBs.
_CHECK_CHUNK = 1 << 20


def sequence_lengths(tokens: np.ndarray) -> np.ndarray:
    """Length of each row up to and including its first EOS, or 0 if it has none.

    tokens: int[n, L] -> int32[n]
    """
    lengths = np.empty(tokens.shape[0], np.int32)
    for start in range(0, tokens.shape[0], _CHECK_CHUNK):
        is_eos = tokens[start:start + _CHECK_CHUNK] == EOS_ID
        lengths[start:start + _CHECK_CHUNK] = np.where(is_eos.any(axis=1), is_eos.argmax(axis=1) + 1, 0)
    return lengths


def first_row_problem(tokens: np.ndarray) -> tuple[int, str, int] | None:
    """(first malformed row, what is wrong with it, number of malformed rows), or None if all are well formed.

    A well-formed row is `c_1 .. c_m EOS PAD ... PAD` with m >= 1 and no c_j in {PAD, EOS}.
    """
    positions = np.arange(tokens.shape[1])
    first, reason, count = None, "", 0
    for start in range(0, tokens.shape[0], _CHECK_CHUNK):
        chunk = tokens[start:start + _CHECK_CHUNK]
        lengths = sequence_lengths(chunk)
        checks = {
            f"no EOS ({EOS_ID})": lengths == 0,
            "no token before EOS": lengths == 1,
            "a negative token id": (chunk < 0).any(axis=1),
            f"PAD ({PAD_ID}) before EOS": ((positions < lengths[:, None] - 1) & (chunk == PAD_ID)).any(axis=1),
            f"a token other than PAD ({PAD_ID}) after EOS":
                ((positions >= lengths[:, None]) & (chunk != PAD_ID)).any(axis=1),
        }
        bad = np.logical_or.reduce(list(checks.values()))
        count += int(bad.sum())
        if first is None and count:
            i = int(np.argmax(bad))
            first, reason = start + i, next(message for message, check in checks.items() if check[i])
    return None if first is None else (first, reason, count)


def first_collision(tokens: np.ndarray) -> tuple[int, int, int] | None:
    """(row a, row b > a, number of equal adjacent pairs) for two identical rows of `tokens`, or None.

    Sorts the rows as fixed-width byte strings: O(N log N) memcmp, no Python loop over 8.8M rows.
    """
    if tokens.shape[0] < 2:
        return None
    rows = np.ascontiguousarray(tokens).view(np.dtype((np.void, tokens.dtype.itemsize * tokens.shape[1]))).ravel()
    order = np.argsort(rows, kind="stable")
    same = rows[order[1:]] == rows[order[:-1]]
    if not same.any():
        return None
    j = int(np.argmax(same))
    return int(order[j]), int(order[j + 1]), int(same.sum())


@dataclasses.dataclass(frozen=True, eq=False)
class DocidTable:
    """The target token sequence of every docid.

    docids: N unique docid strings.
    tokens: int32[N, L]; row i is docid i's tokens, EOS, then PAD (see the module docstring).
    """

    docids: tuple[str, ...]
    tokens: np.ndarray

    def __post_init__(self):
        docids = tuple(self.docids)
        tokens = np.asarray(self.tokens)
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"tokens must be an integer matrix [num_docids, length], got "
                             f"{tokens.dtype}{list(tokens.shape)}")
        if len(docids) != tokens.shape[0]:
            raise ValueError(f"{len(docids)} docids but {tokens.shape[0]} token rows")
        if not all(isinstance(d, str) for d in docids):
            raise TypeError("docids must be strings")
        if tokens.size and tokens.max() > np.iinfo(np.int32).max:
            raise ValueError("token ids must fit in int32")
        tokens = np.ascontiguousarray(tokens, dtype=np.int32).view()  # a read-only view; the caller's flags stay
        tokens.setflags(write=False)
        object.__setattr__(self, "docids", docids)
        object.__setattr__(self, "tokens", tokens)
        self._check_docids_unique()
        problem = first_row_problem(tokens)
        if problem is not None:
            i, reason, count = problem
            raise ValueError(f"docid {docids[i]!r} (row {i}) has a malformed token row {tokens[i].tolist()}: "
                             f"{reason}; {count} malformed row(s) in all")
        self._check_no_collisions()

    def _check_docids_unique(self) -> None:
        if len(set(self.docids)) != len(self.docids):
            seen: dict[str, int] = {}
            for i, docid in enumerate(self.docids):
                if docid in seen:
                    raise ValueError(f"duplicate docid {docid!r} (rows {seen[docid]} and {i})")
                seen[docid] = i

    def _check_no_collisions(self) -> None:
        """Two docids with one token sequence would make a decoded sequence ambiguous: refuse them."""
        collision = first_collision(self.tokens)
        if collision is not None:
            a, b, count = collision
            raise ValueError(f"docids {self.docids[a]!r} (row {a}) and {self.docids[b]!r} (row {b}) have the same "
                             f"token sequence {self.tokens[a, :self.lengths[a]].tolist()} (a collision); "
                             f"{count} colliding pair(s) in all")

    def __len__(self) -> int:
        return len(self.docids)

    @property
    def max_length(self) -> int:
        """Length of the longest sequence, EOS included (what a target length must hold)."""
        return int(self.lengths.max(initial=0))

    @functools.cached_property
    def lengths(self) -> np.ndarray:
        """int32[N]: each sequence's length, EOS included."""
        return sequence_lengths(self.tokens)

    def check_fits(self, target_length: int) -> None:
        """Raises if any docid's sequence (EOS included) is longer than `target_length` (never truncated)."""
        too_long = np.flatnonzero(self.lengths > target_length)
        if too_long.size:
            i = int(too_long[0])
            raise ValueError(f"docid {self.docids[i]!r} needs {int(self.lengths[i])} target tokens (EOS included) but "
                             f"the target length is {target_length}; {too_long.size} docid(s) do not fit, the longest "
                             f"needs {self.max_length}")

    @functools.cached_property
    def _index_by_sequence(self) -> dict[bytes, int]:
        """Trimmed int32 sequence bytes -> row; built on the first lookup."""
        return {row[:n].tobytes(): i for i, (row, n) in enumerate(zip(self.tokens, self.lengths.tolist()))}

    def index_of(self, tokens: Sequence[int] | np.ndarray) -> int | None:
        """Row of the docid whose sequence is `tokens` up to its first EOS, or None.

        `tokens` is a decoded sequence (EOS included, anything after it ignored, e.g. PAD); a sequence
        without EOS or not in the table gives None. The first call builds a dict over all docids (about
        100 bytes each); on device, `gr_jax.docids.trie.Trie.leaf_indices` maps whole batches of beams instead.
        """
        tokens = np.asarray(tokens)
        if tokens.ndim != 1:
            raise ValueError(f"expected one token sequence, got shape {list(tokens.shape)}")
        eos = np.flatnonzero(tokens == EOS_ID)
        if not eos.size:
            return None
        return self._index_by_sequence.get(tokens[:eos[0] + 1].astype(np.int32).tobytes())

    def token_range(self) -> tuple[int, int]:
        """[start, stop) of the content token ids (EOS and PAD aside): what an atomic or PAWA output layer covers.

        Atomic: [vocab_size, vocab_size + N); semantic2d: the appended (position, value) tokens; naive and
        semantic: the span of the digit pieces inside the vocabulary.
        """
        tokens = self.tokens[self.tokens > max(EOS_ID, PAD_ID)]
        if not tokens.size:
            raise ValueError("the docid table has no docid tokens (every row is only EOS)")
        return int(tokens.min()), int(tokens.max()) + 1

    def content_tokens(self) -> np.ndarray:
        """int[k]: the distinct content token ids (PAD and EOS aside), sorted.

        A scatter into a presence mask (O(N L), no sort of MS MARCO's 100M tokens).
        """
        present = np.zeros(max(int(self.tokens.max(initial=0)), PAD_ID, EOS_ID) + 1, bool)
        present[self.tokens.ravel()] = True
        present[[PAD_ID, EOS_ID]] = False
        return np.flatnonzero(present)

    @functools.cached_property
    def _sorted_docids(self) -> tuple[np.ndarray, np.ndarray]:
        """(docids as a sorted unicode array, their rows): built on the first `rows_of` (8.8M MS MARCO pids: ~300
        MB and a few seconds, a third of a dict's memory)."""
        names = np.asarray(self.docids, dtype=str)
        order = np.argsort(names, kind="stable")
        return names[order], order

    def rows_of(self, docids: Sequence[str]) -> np.ndarray:
        """int64[len(docids)]: the row of each docid, -1 for a docid not in the table."""
        names, order = self._sorted_docids
        wanted = np.asarray(list(docids), dtype=str)
        if not wanted.size or not names.size:
            return np.full(wanted.shape, -1, np.int64)
        position = np.minimum(np.searchsorted(names, wanted), names.size - 1)
        return np.where(names[position] == wanted, order[position], -1).astype(np.int64)

    def __contains__(self, docid: object) -> bool:
        return isinstance(docid, str) and self.rows_of([docid])[0] >= 0

    def row_of(self, docid: str) -> int | None:
        """The row of `docid`, or None when it is no docid of the table (see `rows_of`)."""
        row = int(self.rows_of([docid])[0])
        return None if row < 0 else row

    def lookup(self, tokens: Sequence[int] | np.ndarray) -> str | None:
        """The docid whose sequence is `tokens` (see `index_of`), or None if it is not a valid docid."""
        i = self.index_of(tokens)
        return None if i is None else self.docids[i]

    def save(self, path: PathLike) -> None:
        """Writes `docid \\t space-separated token ids` lines (EOS included, PAD omitted)."""
        write_tsv(path, ((docid, " ".join(map(str, row[:n].tolist())))
                         for docid, row, n in zip(self.docids, self.tokens, self.lengths.tolist())))

    @classmethod
    def load(cls, path: PathLike) -> DocidTable:
        """Reads a table written by `save`; malformed lines raise `DataFormatError` naming `path:line`."""
        path = pathlib.Path(path)
        docids: list[str] = []
        sequences: list[list[int]] = []
        first_line: dict[str, int] = {}
        with open(path, "rb") as f:
            for line_number, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as e:
                    raise DataFormatError.at(path, line_number,
                                             f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
                fields = line.split("\t")
                if len(fields) != 2 or not fields[0]:
                    raise DataFormatError.at(path, line_number, "expected `docid \\t space-separated token ids`")
                docid, text = fields
                try:
                    sequence = [int(t) for t in text.split()]
                except ValueError:
                    raise DataFormatError.at(path, line_number, f"token ids must be integers, got {text!r}") from None
                if len(sequence) < 2 or sequence[-1] != EOS_ID or any(t in (PAD_ID, EOS_ID) or not 0 <= t < 2**31
                                                                      for t in sequence[:-1]):
                    raise DataFormatError.at(path, line_number, f"expected content token ids in [0, 2**31) other than "
                                             f"PAD={PAD_ID} and EOS={EOS_ID}, then EOS={EOS_ID}; got {text!r}")
                if docid in first_line:
                    raise DataFormatError.at(path, line_number,
                                             f"duplicate docid {docid!r} (first on line {first_line[docid]})")
                first_line[docid] = line_number
                docids.append(docid)
                sequences.append(sequence)
        tokens = _pad_sequences(sequences)
        collision = first_collision(tokens)
        if collision is not None:
            a, b, _ = collision
            raise DataFormatError.at(path, first_line[docids[b]],
                                     f"docid {docids[b]!r} has the same token sequence as docid {docids[a]!r} on "
                                     f"line {first_line[docids[a]]} (a collision)")
        return cls(docids=tuple(docids), tokens=tokens)


def _pad_sequences(sequences: Sequence[Sequence[int]]) -> np.ndarray:
    """Right-pads token lists with PAD into int32[len(sequences), longest]."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    flat = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int32, count=int(lengths.sum()))
    return scatter_rows(flat, lengths, width=int(lengths.max(initial=0)))


def scatter_rows(flat: np.ndarray, lengths: np.ndarray, *, width: int) -> np.ndarray:
    """Concatenated rows `flat` with per-row `lengths` -> int32[len(lengths), width], PAD-filled.

    Column by column, so the temporaries are O(rows), not O(tokens) index arrays.
    """
    out = np.full((lengths.size, width), PAD_ID, dtype=np.int32)
    starts = np.cumsum(lengths) - lengths
    for column in range(width):
        rows = np.flatnonzero(lengths > column)
        out[rows, column] = flat[starts[rows] + column]
    return out


@dataclasses.dataclass(frozen=True)
class ExtendedDocidTable:
    """A docid table whose content tokens are new ids appended after a vocabulary of `vocab_size` ids.

    The model's embedding and output layers need `model_vocab_size = vocab_size + num_extra_tokens` rows (as
    `DocidSpace.model_vocab_size`); docid tokens lie in [vocab_size, model_vocab_size) (EOS stays the vocabulary's).
    """

    table: DocidTable
    vocab_size: int
    num_extra_tokens: int

    @property
    def model_vocab_size(self) -> int:
        return self.vocab_size + self.num_extra_tokens


def appended_tokens_problem(table: DocidTable, *, vocab_size: int) -> str | None:
    """Why `table` is not one whose docid tokens are appended after a vocabulary of `vocab_size` pieces (2D
    semantic, codebook ids), or None: the `DocidScheme.check` of such schemes."""
    inside = table.content_tokens()
    inside = inside[inside < vocab_size]
    if inside.size:
        return (f"it holds token ids {inside[:5].tolist()} inside the vocabulary of {vocab_size} pieces, but its "
                f"docid tokens must be appended after it (made with another vocabulary?)")
    return None


def check_appended_vocab_size(vocab_size: int, num_extra_tokens: int) -> None:
    """A vocabulary that docid tokens can be appended after: it holds PAD and EOS, and the total fits int32."""
    if vocab_size <= max(PAD_ID, EOS_ID):
        raise ValueError(f"vocab_size must be > {max(PAD_ID, EOS_ID)} (PAD and EOS are vocabulary ids), got "
                         f"{vocab_size}")
    if vocab_size + num_extra_tokens > np.iinfo(np.int32).max:
        raise ValueError(f"vocab_size {vocab_size} + {num_extra_tokens} docid tokens does not fit in int32")
