"""DocidTable and naive docids: hand-computed tables, refused inputs, TSV round trip, lookup."""
import numpy as np
import pytest

from gr_jax.data.readers import DataFormatError
from gr_jax.docids import DocidTable, naive_docid_table


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


def test_save_refuses_docids_with_tabs(tmp_path):
    table = DocidTable(docids=("a\tb",), tokens=np.array([[5, 1]]))
    with pytest.raises(DataFormatError, match="tab or line break"):
        table.save(tmp_path / "x.tsv")
    assert not (tmp_path / "x.tsv").exists()
