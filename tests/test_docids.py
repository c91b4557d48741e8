"""DocidTable and naive docids: hand-computed tables, refused inputs, TSV round trip, lookup."""
import types

import numpy as np
import pytest

from gr_jax.data.readers import DataFormatError
from gr_jax.docids import DocidSpace, DocidTable
from gr_jax.docids import table as table_module
from gr_jax.docids.schemes.naive import naive_docid_table
from gr_jax.vocabulary import EOS_ID


def digit_encode(text: str) -> list[int]:
    """Toy vocabulary: digit c -> id 3 + c, letters a-z -> 13 + position."""
    return [3 + int(c) if c.isdigit() else 13 + ord(c) - ord("a") for c in text]


def test_naive_table_hand_computed():
    table = naive_docid_table(docids=["7301", "5", "42"], encode=digit_encode)
    assert table.docids == ("7301", "5", "42")
    np.testing.assert_array_equal(table.tokens, [[10, 6, 3, 4, 1], [8, 1, 0, 0, 0], [7, 5, 1, 0, 0]])
    assert table.tokens.dtype == np.int32
    assert table.max_length == 5
    np.testing.assert_array_equal(table.lengths, [5, 2, 3])


def test_naive_table_batched_encoder_matches_per_docid_encoder():
    rng = np.random.default_rng(0)
    docids = [str(x) for x in rng.permutation(200_000)[:150_000]]  # more than one encode chunk
    per_docid = naive_docid_table(docids=docids, encode=digit_encode)
    batched = naive_docid_table(docids=iter(docids), encode=lambda texts: [digit_encode(t) for t in texts],
                                batched=True)
    assert batched.docids == per_docid.docids
    np.testing.assert_array_equal(batched.tokens, per_docid.tokens)
    for i in rng.integers(0, len(docids), 50):  # brute force: the row is the docid's digits then EOS
        expected = digit_encode(docids[i]) + [1]
        np.testing.assert_array_equal(per_docid.tokens[i, :len(expected)], expected)
        assert not per_docid.tokens[i, len(expected):].any()


def test_naive_table_refuses_bad_encodings():
    with pytest.raises(ValueError, match="'' encodes to no tokens"):
        naive_docid_table(docids=["1", ""], encode=digit_encode)
    with pytest.raises(ValueError, match=r"'b' encodes to \[1\].*EOS"):
        naive_docid_table(docids=["a", "b"], encode=lambda s: [1] if s == "b" else [5])
    with pytest.raises(ValueError, match="returned 1 sequences for 2"):
        naive_docid_table(docids=["1", "2"], encode=lambda texts: [[5]], batched=True)


def test_duplicate_docids_and_collisions_are_refused():
    with pytest.raises(ValueError, match=r"duplicate docid '12' \(rows 0 and 2\)"):
        naive_docid_table(docids=["12", "3", "12"], encode=digit_encode)
    # An encoder that drops leading zeros maps "07" and "7" to one sequence: a collision, named.
    with pytest.raises(ValueError,
                       match=r"docids '7' \(row 1\) and '07' \(row 2\) have the same token sequence \[10, 1\]"):
        naive_docid_table(docids=["5", "7", "07"], encode=lambda s: digit_encode(s.lstrip("0")))


def test_malformed_rows_are_refused():
    with pytest.raises(ValueError, match="no EOS"):
        DocidTable(docids=("a",), tokens=np.array([[5, 6]]))
    with pytest.raises(ValueError, match="PAD .* before EOS"):
        DocidTable(docids=("a",), tokens=np.array([[5, 0, 1]]))
    with pytest.raises(ValueError, match="other than PAD .* after EOS"):
        DocidTable(docids=("a",), tokens=np.array([[5, 1, 7]]))
    with pytest.raises(ValueError, match="no token before EOS"):
        DocidTable(docids=("a",), tokens=np.array([[1, 0]]))
    with pytest.raises(ValueError, match="2 docids but 1 token rows"):
        DocidTable(docids=("a", "b"), tokens=np.array([[5, 1]]))


def test_check_fits_names_first_offending_docid():
    table = naive_docid_table(docids=["1", "123", "12345", "9999"], encode=digit_encode)
    table.check_fits(6)  # "12345" + EOS is exactly 6 tokens
    with pytest.raises(ValueError, match=r"docid '123' needs 4 target tokens .* target length is 3; 3 docid\(s\)"):
        table.check_fits(3)


def test_lookup_maps_decoded_sequences_back():
    docids = ["7301", "5", "42", "4", "420"]
    table = naive_docid_table(docids=docids, encode=digit_encode)
    for i, docid in enumerate(docids):
        row = table.tokens[i]
        assert table.lookup(row) == docid
        assert table.index_of(row) == i
        assert table.lookup(np.concatenate([row, [0, 0, 0]])) == docid  # longer decode length
        assert table.lookup(list(row[:table.lengths[i]])) == docid  # trimmed, as a list
    assert table.lookup([7, 5, 1, 9, 9]) == "42"  # anything after EOS is ignored
    assert table.lookup([7, 5]) is None  # no EOS: not a complete docid
    assert table.lookup([7, 6, 1]) is None  # "43" is not a docid
    assert table.lookup([]) is None


def test_lookup_of_prefix_docids():
    table = naive_docid_table(docids=["4", "42", "420"], encode=digit_encode)
    assert table.lookup([7, 1, 0]) == "4"
    assert table.lookup([7, 5, 1]) == "42"
    assert table.lookup([7, 5, 3, 1]) == "420"
    assert table.lookup([7, 5, 3]) is None


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    docids = [f"doc-{x}" for x in rng.permutation(5000)] + ["naïve id with spaces"]
    table = naive_docid_table(docids=docids, encode=lambda s: [3 + (ord(c) % 500) for c in s])
    path = tmp_path / "docids.tsv"
    table.save(path)
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first == docids[0] + "\t" + " ".join(map(str, table.tokens[0, :table.lengths[0]])), first
    loaded = DocidTable.load(path)
    assert loaded.docids == table.docids
    np.testing.assert_array_equal(loaded.tokens, table.tokens)


@pytest.mark.parametrize("content, line, message", [
    ("a\t5 1\nb 6 1\n", 2, "expected `docid"),
    ("a\t5 1\nb\t6 x 1\n", 2, "must be integers"),
    ("a\t5 1\nb\t6 7\n", 2, "then EOS=1"),
    ("a\t5 1\nb\t6 0 7 1\n", 2, "other than PAD=0 and EOS=1"),
    ("a\t5 1\nb\t6 1\na\t7 1\n", 3, "duplicate docid 'a' .first on line 1."),
    ("a\t5 1\nb\t6 1\nc\t5 1\n", 3, "docid 'c' has the same token sequence as docid 'a' on line 1"),
])
def test_load_errors_name_path_and_line(tmp_path, content, line, message):
    path = tmp_path / "bad.tsv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataFormatError, match=f"bad.tsv:{line}: .*{message}"):
        DocidTable.load(path)


def test_load_reads_blocks_vectorised_and_line_by_line_alike(tmp_path, monkeypatch):
    """Small blocks, so that lines in save's exact form (parsed with numpy) and lines outside it (a long or non-ASCII
    docid, CRLF, runs of spaces: parsed line by line) fall in different blocks: the table is the one a plain
    line-by-line reading gives, and an error deep in the file names its line."""
    monkeypatch.setattr(table_module, "_BLOCK_BYTES", 64)
    rng = np.random.default_rng(3)
    lines, expected = [], {}
    for i in range(400):
        docid = (f"p{i}" if i % 7 else f"{'x' * 70}{i}") + ("é" if i % 11 == 0 else "")
        sequence = [int(t) for t in rng.integers(2, 5000, int(rng.integers(1, 6)))] + [1]
        separator = "  " if i % 13 == 0 else " "
        ending = "\r\n" if i % 17 == 0 else "\n"
        lines.append(f"{docid}\t{separator.join(map(str, sequence))}{ending}")
        expected[docid] = sequence
    path = tmp_path / "docids.tsv"
    path.write_bytes("".join(lines).encode("utf-8"))
    loaded = DocidTable.load(path)
    assert loaded.docids == list(expected)
    for row, sequence in enumerate(expected.values()):
        assert loaded.tokens[row, :loaded.lengths[row]].tolist() == sequence
    vectorised = sum(table_module._parse_block(line.encode()) is not None for line in lines)
    assert 0 < vectorised < len(lines)  # both readers were used
    np.testing.assert_array_equal(loaded.rows_of(list(expected)[::-1]), np.arange(400)[::-1])

    bad = lines[:301] + ["q\t5 0 1\n"] + lines[301:]
    path.write_bytes("".join(bad).encode("utf-8"))
    with pytest.raises(DataFormatError, match="docids.tsv:302: .*other than PAD=0"):
        DocidTable.load(path)
    again = lines + [lines[250].replace("\r\n", "\n").split("\t")[0] + "\t77 1\n"]
    path.write_bytes("".join(again).encode("utf-8"))
    with pytest.raises(DataFormatError, match="docids.tsv:401: duplicate docid .*first on line 251"):
        DocidTable.load(path)


def test_docids_are_a_string_array_that_reads_as_a_tuple():
    table = DocidTable(docids=iter(["b", "a", "é", "c"]), tokens=np.array([[5, 1], [6, 1], [7, 1], [8, 1]]))
    assert table.docids == ("b", "a", "é", "c") and table.docids == ["b", "a", "é", "c"] and table.docids != ("b",)
    assert table.docids[2] == "é" and type(table.docids[2]) is str and table.docids.index("c") == 3
    assert table.docids[1:3] == ("a", "é") and list(table.docids) == ["b", "a", "é", "c"]
    assert not table.docids.array.flags.writeable
    np.testing.assert_array_equal(table.rows_of(["é", "c", "cc", "a" * 9]), [2, 3, -1, -1])
    with pytest.raises(TypeError, match="strings"):
        DocidTable(docids=["a", 5], tokens=np.array([[5, 1], [6, 1]]))
    with pytest.raises(ValueError, match="differ only in trailing NUL"):
        DocidTable(docids=["a", "a\x00"], tokens=np.array([[5, 1], [6, 1]]))


def test_save_refuses_docids_with_tabs(tmp_path):
    table = DocidTable(docids=("a\tb",), tokens=np.array([[5, 1]]))
    with pytest.raises(DataFormatError, match="tab or line break"):
        table.save(tmp_path / "x.tsv")
    assert not (tmp_path / "x.tsv").exists()


def test_rows_of_maps_docids_to_rows_and_unknown_ones_to_minus_one():
    table = naive_docid_table(docids=["12", "3", "100", "07"], encode=digit_encode)
    np.testing.assert_array_equal(table.rows_of(["3", "07", "x", "12", "100", ""]), [1, 3, -1, 0, 2, -1])
    assert table.row_of("100") == 2 and table.row_of("1") is None
    assert "07" in table and "7" not in table and 7 not in table
    assert table.rows_of([]).shape == (0,)


def test_docid_space_sizes_the_model_vocabulary_and_builds_its_trie_once():
    table = naive_docid_table(docids=["12", "3", "907"], encode=digit_encode)  # tokens 4 5 | 6 | 12 3 10, EOS
    space = DocidSpace.from_table(table, scheme="naive", text_vocab_size=20, reserved_tokens=3)
    assert (space.text_vocab_size, space.model_vocab_size, space.docid_token_range) == (20, 23, (3, 13))
    assert space.trie is space.trie and space.trie.vocab_size == 23  # built once, on first use
    assert len(space) == 3
    appended = DocidSpace.from_table(DocidTable(docids=("a", "b"), tokens=np.array([[30, 1], [41, 1]])),
                                     scheme="atomic", text_vocab_size=20, reserved_tokens=3)
    assert appended.model_vocab_size == 42  # the appended docid tokens need more than the reserved ids
    with pytest.raises(ValueError, match="holds no docids"):
        DocidSpace.from_table(DocidTable(docids=(), tokens=np.zeros((0, 2), np.int32)), scheme="x",
                              text_vocab_size=20)


def test_a_new_scheme_is_one_registered_class(tmp_path):
    """A scheme defined anywhere registers by name and loads like the built-in ones (and is cached like them)."""
    from gr_jax import docids
    from gr_jax.data.readers import open_dataset
    from gr_jax.docids.scheme import SCHEMES

    @docids.register_scheme
    class Reversed(docids.DocidScheme):
        name = "test_reversed"

        def build(self, *, dataset, vocabulary):
            return naive_docid_table(docids=[d for d, _ in dataset.collection()],
                                     encode=lambda d: digit_encode(d[::-1]))

    try:
        (tmp_path / "collection.tsv").write_text("12\tone two\n345\tthree\n")
        (tmp_path / "spm.model").write_text("stands in for the vocabulary file: only its time is read")
        vocabulary = types.SimpleNamespace(vocab_size=20)
        space = docids.load_docid_space(dataset=open_dataset(tmp_path), scheme="test_reversed", vocabulary=vocabulary,
                                        vocabulary_path=tmp_path / "spm.model")
        assert space.scheme == "test_reversed" and space.table.lookup(digit_encode("21") + [EOS_ID]) == "12"
        assert docids.DocidTable.load(tmp_path / "docids.test_reversed.tsv").docids == ("12", "345")
        with pytest.raises(ValueError, match="unknown docid scheme 'nope'"):
            docids.get_scheme("nope")
    finally:
        del SCHEMES["test_reversed"]
