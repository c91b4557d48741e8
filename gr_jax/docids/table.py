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
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast, overload

import numpy as np
from numpy.dtypes import StringDType

from gr_jax.data.readers import DataFormatError, write_tsv
from gr_jax.data.string_arrays import CHUNK, SortedKeys, string_array
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


def lookup_keys(names: np.ndarray) -> np.ndarray:
    """The docids `names` (a StringDType array) as fixed-width UTF-8 bytes, the form in which a table sorts and
    searches them: numpy's `searchsorted` over StringDType arrays reads past its buffers when the needles and the
    sorted docids are different arrays (numpy/numpy#31533, unfixed in the pinned 2.4.6), bytes arrays are safe.
    Bytes order UTF-8 text as its code points, as str does."""
    if not names.size:
        return np.zeros(names.shape, "S1")
    try:  # ASCII docids (MS MARCO pids, WordNet synsets) cast directly
        return names.astype(f"S{max(int(np.strings.str_len(names).max()), 1)}")
    except UnicodeEncodeError:
        return np.strings.encode(names, "utf-8")


class _DuplicateDocid(ValueError):
    def __init__(self, message: str, *, rows: tuple[int, int]):
        super().__init__(message)
        self.rows = rows


class _Collision(ValueError):
    def __init__(self, message: str, *, rows: tuple[int, int]):
        super().__init__(message)
        self.rows = rows


def first_duplicate(names: np.ndarray, *, order: np.ndarray | None = None) -> tuple[int, int] | None:
    """(a, b): the first row b (in row order) whose name an earlier row a holds, or None if all are distinct.

    names: a 1-D string array; order: its stable argsort, if already made. One sort, no set or dict of the names.
    """
    if names.shape[0] < 2:
        return None
    order = np.argsort(names, kind="stable") if order is None else order
    ordered = names[order]
    same = ordered[1:] == ordered[:-1]
    if not same.any():
        return None
    # Within a run of equal names the rows ascend (stable sort): the run's first pair is (its first row, its second).
    starts = np.flatnonzero(same & np.concatenate([[True], ~same[:-1]]))
    k = starts[np.argmin(order[starts + 1])]
    return int(order[k]), int(order[k + 1])


class DocidNames(Sequence[str]):
    """The docids of a table, in order: a sequence of str held in one `gr_jax.data.string_arrays` array, not a Python
    object per docid (8.8M MS MARCO pids: 141 MB, against ~570 MB as a tuple of str). Reads as a tuple of str
    (indexing, iteration, `==` with a tuple or list); `array` is the read-only array for vectorised work."""

    __slots__ = ("array",)
    array: np.ndarray

    def __init__(self, docids: Iterable[str] | np.ndarray):
        if isinstance(docids, DocidNames):
            array = docids.array
        elif isinstance(docids, np.ndarray) and isinstance(docids.dtype, StringDType):
            array = docids.view()
        else:
            try:
                array = string_array(docids)  # an iterator: a chunk at a time, never a list of every docid
            except TypeError:
                raise TypeError("docids must be strings") from None
        if array.ndim != 1:
            raise ValueError(f"docids must be one-dimensional, got shape {list(array.shape)}")
        array.setflags(write=False)
        self.array = array

    def __len__(self) -> int:
        return self.array.shape[0]

    @overload
    def __getitem__(self, index: int | np.integer) -> str: ...

    @overload
    def __getitem__(self, index: slice | np.ndarray) -> DocidNames: ...

    def __getitem__(self, index):
        if isinstance(index, (slice, np.ndarray)):
            return DocidNames(self.array[index])
        return str(self.array[index])

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self), CHUNK):  # a chunk of str objects at a time, not a list of every docid
            yield from self.array[start:start + CHUNK].tolist()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DocidNames):
            return bool(np.array_equal(self.array, other.array))
        if isinstance(other, (tuple, list)):
            return len(other) == len(self) and all(a == b for a, b in zip(self.array.tolist(), other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to tuples, which hash otherwise

    def __repr__(self) -> str:
        shown = ", ".join(repr(d) for d in self.array[:5].tolist())
        return f"DocidNames([{shown}{', ...' if len(self) > 5 else ''}], {len(self)} docids)"


@dataclasses.dataclass(frozen=True, eq=False)
class DocidTable:
    """The target token sequence of every docid.

    docids: N unique docid strings (any sequence of str; kept as `DocidNames`).
    tokens: int32[N, L]; row i is docid i's tokens, EOS, then PAD (see the module docstring).
    """

    docids: Sequence[str] | np.ndarray  # a `DocidNames` once constructed
    tokens: np.ndarray

    def __post_init__(self):
        docids = DocidNames(self.docids)
        tokens = np.asarray(self.tokens)
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"tokens must be an integer matrix [num_docids, length], got "
                             f"{tokens.dtype}{list(tokens.shape)}")
        if len(docids) != tokens.shape[0]:
            raise ValueError(f"{len(docids)} docids but {tokens.shape[0]} token rows")
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

    def utf8_docids(self) -> np.ndarray:
        """S[N]: the docids as fixed-width UTF-8 bytes (`lookup_keys`), e.g. for a TensorFlow string tensor, which
        takes them without a Python str per docid."""
        return lookup_keys(self._names)

    @property
    def _names(self) -> np.ndarray:
        """The docids' string array."""
        return cast(DocidNames, self.docids).array

    def _check_docids_unique(self) -> None:
        """Refuses a docid on two rows (and two that only trailing NULs tell apart: their search keys are equal); the
        sorted keys are kept for `rows_of`."""
        keys = lookup_keys(self._names)
        lookup = SortedKeys.of(keys)
        duplicate = first_duplicate(keys, order=lookup.order)
        if duplicate is not None:
            a, b = duplicate
            raise _DuplicateDocid(f"duplicate docid {self.docids[b]!r} (rows {a} and {b})" if self.docids[a] ==
                                  self.docids[b] else f"docids {self.docids[a]!r} (row {a}) and {self.docids[b]!r} "
                                  f"(row {b}) differ only in trailing NUL characters", rows=(a, b))
        self.__dict__["_lookup"] = lookup  # the cached property, filled

    def _check_no_collisions(self) -> None:
        """Two docids with one token sequence would make a decoded sequence ambiguous: refuse them."""
        collision = first_collision(self.tokens)
        if collision is not None:
            a, b, count = collision
            raise _Collision(f"docids {self.docids[a]!r} (row {a}) and {self.docids[b]!r} (row {b}) have the same "
                             f"token sequence {self.tokens[a, :self.lengths[a]].tolist()} (a collision); "
                             f"{count} colliding pair(s) in all", rows=(a, b))

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
    def _lookup(self) -> SortedKeys:
        """The docids' `lookup_keys` sorted, made when the table is checked (8.8M MS MARCO pids: 62 MB of keys and 70
        MB of rows, no dict)."""
        return SortedKeys.of(lookup_keys(self._names))

    def rows_of(self, docids: Sequence[str]) -> np.ndarray:
        """int64[len(docids)]: the row of each docid, -1 for a docid not in the table."""
        return self._lookup.rows_of(lookup_keys(DocidNames(docids).array))

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
        """Reads a table written by `save`; malformed lines raise `DataFormatError` naming `path:line`.

        The file is parsed in line-aligned blocks with numpy (`_parse_block`: the docids into a string array, the
        token ids into one flat array), so no Python object is made per line: 8.8M docids take about the table's
        own memory. A block holding a line outside `save`'s exact form is read line by line instead, which also
        accepts what the format allows beyond it (runs of spaces, CRLF) and names the first malformed line.
        """
        path = pathlib.Path(path)
        names, lengths, flats = [], [], []
        first_line = 1
        with open(path, "rb") as f:
            for block in _line_blocks(f):
                parsed = _parse_block(block) or _parse_lines(path, block, first_line=first_line)
                names.append(parsed[0])
                lengths.append(parsed[1])
                flats.append(parsed[2])
                first_line += parsed[1].size
        docids = np.concatenate(names) if names else np.array([], dtype=StringDType())
        row_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        tokens = scatter_rows(np.concatenate(flats) if flats else np.zeros(0, np.int32), row_lengths,
                              width=int(row_lengths.max(initial=0)))
        try:
            return cls(docids=docids, tokens=tokens)
        except _DuplicateDocid as e:
            raise DataFormatError.at(path, e.rows[1] + 1, f"duplicate docid {str(docids[e.rows[1]])!r} (first on "
                                     f"line {e.rows[0] + 1})") from None
        except _Collision as e:
            a, b = e.rows
            raise DataFormatError.at(path, b + 1, f"docid {str(docids[b])!r} has the same token sequence as docid "
                                     f"{str(docids[a])!r} on line {a + 1} (a collision)") from None


_BLOCK_BYTES = 4 << 20  # a table file is parsed this much at a time: tens of MB of temporaries at any size
_FAST_DOCID_BYTES = 64  # longer docids are parsed line by line (a fixed-width byte matrix would be mostly padding)


def _line_blocks(f: Any) -> Iterator[bytes]:
    """The bytes of a binary file in blocks of about `_BLOCK_BYTES`, each ending at a line end (or the file's)."""
    while True:
        block = f.read(_BLOCK_BYTES)
        if not block:
            return
        if not block.endswith(b"\n"):
            block += f.readline()
        yield block


def _parse_block(block: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(docids StringDType[n], token counts int64[n], token ids int32[sum]) of the n lines of `block` when every one
    is exactly as `DocidTable.save` writes it (`docid \\t ids \\n`, ids single-space separated, the last EOS, no
    PAD or EOS before it, each < 2**31); None otherwise (`_parse_lines` then reads the block and says what is wrong).
    Vectorised over the block's bytes: no Python object per line."""
    if not block.endswith(b"\n"):
        block += b"\n"
    b = np.frombuffer(block, np.uint8)
    ends = np.flatnonzero(b == ord("\n"))
    n = ends.size
    tabs = np.flatnonzero(b == ord("\t"))
    starts = np.concatenate([[0], ends[:-1] + 1])
    if tabs.size != n or (b == ord("\r")).any() or not ((starts <= tabs) & (tabs < ends)).all():
        return None  # not one tab in every line, or CRLF line ends
    docid_bytes = tabs - starts
    if (docid_bytes <= 0).any() or docid_bytes.max() > _FAST_DOCID_BYTES or (ends - tabs < 2).any():
        return None
    mark = np.zeros(b.size + 1, np.int8)
    mark[tabs + 1], mark[ends] = 1, -1
    in_ids = np.cumsum(mark[:-1], dtype=np.int8).astype(bool)
    digit = (b >= ord("0")) & (b <= ord("9"))
    space = b == ord(" ")
    if (in_ids & ~digit & ~space).any():
        return None
    spaces = np.flatnonzero(in_ids & space)
    if not (digit[spaces - 1] & digit[spaces + 1]).all():  # a space between two digits: no run, none at the ends
        return None
    is_start = in_ids & digit & ~np.concatenate([[False], digit[:-1]])
    is_last = in_ids & digit & ~np.concatenate([digit[1:], [False]])
    id_starts, id_ends = np.flatnonzero(is_start), np.flatnonzero(is_last) + 1
    digits = id_ends - id_starts
    if (digits > 10).any():
        return None
    values = np.zeros(id_starts.size, np.int64)
    for k in range(10):  # one pass per digit position keeps the temporaries O(ids)
        more = digits > k
        values = np.where(more, values * 10 + b[np.minimum(id_starts + k, b.size - 1)] - ord("0"), values)
    started = np.cumsum(is_start, dtype=np.int64)
    counts = started[ends] - started[tabs]  # the ids between a line's tab and its end
    last = np.cumsum(counts) - 1
    inner = np.ones(values.size, bool)
    inner[last] = False
    if ((counts < 2).any() or (values[last] != EOS_ID).any() or (values >= 2**31).any()
            or ((values[inner] == PAD_ID) | (values[inner] == EOS_ID)).any()):
        return None
    width = int(docid_bytes.max())
    columns = np.arange(width)
    in_docid = columns < docid_bytes[:, None]
    matrix = np.where(in_docid, b[np.minimum(starts[:, None] + columns, b.size - 1)], 0).astype(np.uint8)
    if (matrix[np.arange(n), docid_bytes - 1] == 0).any():
        return None  # a docid ending in NUL, which fixed-width bytes would drop
    try:  # the cast decodes UTF-8, strictly
        names = np.ascontiguousarray(matrix).view(f"S{width}").ravel().astype(StringDType())
    except UnicodeDecodeError:
        return None
    return names, counts, values.astype(np.int32)


def _parse_lines(path: pathlib.Path, block: bytes, *, first_line: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_parse_block`'s result for a block read line by line (its first line is `first_line` of `path`); a malformed
    line raises `DataFormatError` naming it."""
    docids: list[str] = []
    sequences: list[list[int]] = []
    lines = block.split(b"\n")
    for line_number, raw in enumerate(lines[:-1] if block.endswith(b"\n") else lines, start=first_line):
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as e:
            raise DataFormatError.at(path, line_number, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
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
        docids.append(docid)
        sequences.append(sequence)
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    flat = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int32, count=int(lengths.sum()))
    return np.array(docids, dtype=StringDType()), lengths, flat


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
