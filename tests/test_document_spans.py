"""tools/document_spans: in-domain pseudo-queries cut from a collection's documents."""
import json

import pytest

from gr_jax.data.readers import read_queries
from gr_jax.tools import document_spans as tool

DOCUMENTS = {
    "d1": "Apples are red. Pears are green!  Is a plum purple? Yes.",
    "d2": "Too short.",
    "d3": "one two three four five six",
}


@pytest.fixture
def data_dir(tmp_path):
    (tmp_path / "collection.tsv").write_text("".join(f"{d}\t{t}\n" for d, t in DOCUMENTS.items()))
    return tmp_path


def test_sentences_of_enough_words_are_the_candidates():
    assert tool.candidate_spans(DOCUMENTS["d1"], min_words=3, window_words=None) == [
        ("s0", "Apples are red."), ("s1", "Pears are green!"), ("s2", "Is a plum purple?")]
    assert tool.candidate_spans(DOCUMENTS["d2"], min_words=3, window_words=None) == []


def test_windows_slide_one_word_at_a_time():
    assert tool.candidate_spans(DOCUMENTS["d3"], min_words=2, window_words=4) == [
        ("w0", "one two three four"), ("w1", "two three four five"), ("w2", "three four five six")]
    # A document shorter than one window is one window, unless it is shorter than min_words.
    assert tool.candidate_spans("a b c", min_words=2, window_words=4) == [("w0", "a b c")]
    assert tool.candidate_spans("a", min_words=2, window_words=4) == []


def test_every_document_gives_its_spans_and_the_counts_say_who_gave_fewer(data_dir, tmp_path, capsys):
    out = tmp_path / "spans.tsv"
    report = tool.main(["--data_dir", str(data_dir), "--out", str(out), "--per_document", "2", "--min_words", "3"])
    assert json.loads(capsys.readouterr().out) == report
    rows = list(read_queries(out))
    # d1 has three candidates (two drawn, in sentence order), d2 none, d3 one sentence of six words.
    assert [qid for qid, _ in rows][2:] == ["d3.s0"]
    assert len(rows) == 3 and {qid for qid, _ in rows[:2]} < {"d1.s0", "d1.s1", "d1.s2"}
    assert rows[0][0] < rows[1][0]
    assert dict(rows)["d3.s0"] == DOCUMENTS["d3"]
    assert report | {"data_dir": None, "out": None} == {
        "data_dir": None, "out": None, "unit": "sentence", "per_document": 2, "min_words": 3, "seed": 0,
        "documents": 3, "pseudo_queries": 3, "documents_without_a_span": 1, "documents_with_fewer_spans": 1}


def test_the_draw_is_seeded(data_dir, tmp_path):
    def draw(seed):
        out = tmp_path / f"spans.{seed}.tsv"
        tool.document_spans(data_dir=str(data_dir), out=str(out), window_words=2, min_words=2, seed=seed)
        return list(read_queries(out))

    assert draw(0) == draw(0)
    assert len({tuple(draw(seed)) for seed in range(8)}) > 1


@pytest.mark.parametrize("flags, message", [
    (["--per_document", "0"], "--per_document must be >= 1"),
    (["--min_words", "0"], "--min_words must be >= 1"),
    (["--window_words", "2", "--min_words", "3"], r"--window_words \(2\) must be >= --min_words \(3\)"),
])
def test_bad_settings_are_refused(data_dir, tmp_path, flags, message):
    out = tmp_path / "spans.tsv"
    with pytest.raises(ValueError, match=message):
        tool.document_spans(data_dir=str(data_dir), out=str(out), **{
            flag.lstrip("-"): int(value) for flag, value in zip(flags[::2], flags[1::2])})
    assert not out.exists()
