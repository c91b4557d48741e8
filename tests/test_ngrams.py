"""n-gram (span) identifiers: windows and span selection by hand and by sampling, the span index against brute
force, document aggregation by hand, the training examples, and a micro run through the entry points."""
import json
import shutil

import numpy as np
import pytest

from gr_jax.data.readers import open_dataset
from gr_jax.ngrams.experiment import NgramData, ngram_examples
from gr_jax.ngrams.index import SpanIndex, aggregate_documents, build_span_index
from gr_jax.ngrams.spans import document_windows, select_starts, start_weights
from gr_jax.vocabulary import EOS_ID

DOCS = {"d0": "the cat sat on the mat", "d1": "a dog sat on the mat", "d2": "the cat"}


class WordVocabulary:
    """One id per word (from 3): what the span index needs of a SentencePiece vocabulary."""
    eos_id = 1  # T5's, as `gr_jax.vocabulary.encode_inputs` appends it

    def __init__(self):
        self.ids = {}

    def encode(self, text):
        return [self.ids.setdefault(word, 3 + len(self.ids)) for word in text.split()]


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "collection.tsv").write_text("".join(f"{k}\t{v}\n" for k, v in DOCS.items()))
    (d / "queries.train.tsv").write_text("q1\tcat on a mat\nq2\tdog\n")
    (d / "qrels.train.tsv").write_text("q1\t0\td0\t1\nq2\t0\td1\t1\nq2\t0\td2\t0\n")
    return d


def test_windows_and_start_weights_by_hand():
    words = "the cat sat on the mat".split()
    assert document_windows(words, width=3) == [["the", "cat", "sat"], ["cat", "sat", "on"], ["sat", "on", "the"],
                                                ["on", "the", "mat"], ["the", "mat"], ["mat"]]
    weights = start_weights("Sat on the rug", words)
    assert weights[2] == 1.0  # "sat on the" is one of the query's 3-grams (lower-cased)
    assert weights[0] < weights[2] and weights.shape == (6,)
    assert start_weights("cat", ["cat"]) == pytest.approx([1.0])  # shorter than 3 words: one gram each


def test_span_starts_follow_the_softmax_of_their_weights():
    words = "the cat sat on the mat".split()
    p = np.exp(start_weights("sat on the rug", words))
    p /= p.sum()
    draws = select_starts("sat on the rug", words, num_spans=40_000, rng=np.random.default_rng(0))
    np.testing.assert_allclose(np.bincount(draws, minlength=6) / 40_000, p, atol=0.01)
    sharp = select_starts("sat on the rug", words, num_spans=2000, rng=np.random.default_rng(0), temperature=0.01)
    assert (sharp == 2).all()


def test_the_span_index_against_brute_force(data_dir, tmp_path):
    vocabulary = WordVocabulary()
    index = build_span_index(open_dataset(data_dir), vocabulary=vocabulary, width=3)
    windows = {}
    for row, text in enumerate(DOCS.values()):
        for window in document_windows(text.split(), width=3):
            windows.setdefault(" ".join(window), set()).add(row)
    assert len(index.table) == len(windows)
    decode = {v: k for k, v in vocabulary.ids.items()}
    for j in range(len(index.table)):
        tokens = index.table.tokens[j]
        text = " ".join(decode[t] for t in tokens[:list(tokens).index(EOS_ID)])
        assert set(index.documents_of(j).tolist()) == windows[text]
    for row, text in enumerate(DOCS.values()):
        spans = [index.table.tokens[j] for j in index.windows_of(row)]
        assert len(spans) == len(text.split())
        assert [decode[t] for t in spans[0] if t > EOS_ID] == text.split()[:3]
    # "the cat" ends d2 and starts d0's window "the cat sat": different windows; "on the mat" is in d0 and d1.
    index.save(tmp_path / "i.npz")
    loaded = SpanIndex.load(tmp_path / "i.npz")
    np.testing.assert_array_equal(loaded.table.tokens, index.table.tokens)
    assert loaded.docids == ("d0", "d1", "d2") and loaded.width == 3
    np.testing.assert_array_equal(loaded.doc_rows, index.doc_rows)
    with pytest.raises(FileNotFoundError, match="gr_jax.tools.ngram_index"):
        SpanIndex.load(tmp_path / "missing.npz")


def test_documents_are_ranked_by_the_probability_of_the_spans_they_contain(data_dir):
    index = build_span_index(open_dataset(data_dir), vocabulary=WordVocabulary(), width=3)
    by_text = {}
    for row, text in enumerate(DOCS.values()):
        for start, j in enumerate(index.windows_of(row).tolist()):
            by_text[" ".join(text.split()[start:start + 3])] = j
    spans = [by_text["on the mat"], by_text["the cat"], by_text["a dog sat"]]
    rows, scores = aggregate_documents(spans, np.log([0.5, 0.3, 0.1]), index=index, k=3)
    # d0 and d1 contain "on the mat" (0.5); d2 "the cat" (0.3); d1 also "a dog sat" (0.1).
    assert rows == [1, 0, 2] and scores == pytest.approx([0.6, 0.5, 0.3])
    assert aggregate_documents(spans, np.log([0.5, 0.3, 0.1]), index=index, k=1)[0] == [1]


def test_training_examples_are_spans_of_the_judged_document(data_dir):
    vocabulary = WordVocabulary()
    index = build_span_index(open_dataset(data_dir), vocabulary=vocabulary, width=3)
    data = NgramData(name="t", data_dir=str(data_dir), width=3, num_spans=4, input_length=8, target_length=5)
    examples = ngram_examples(data=data, index=index, vocabulary=vocabulary)
    assert len(examples) == 2 * 4 + 3 * 4  # two judged pairs (grade 0 is not), three documents indexed
    assert (examples.weights == 1).all()
    for i, row in enumerate([0] * 4 + [1] * 4 + [0] * 4 + [1] * 4 + [2] * 4):
        own = {tuple(index.table.tokens[j]) for j in index.windows_of(row)}
        assert tuple(examples.targets[i, :index.table.tokens.shape[1]]) in own
        assert (examples.targets[i, index.table.tokens.shape[1]:] == 0).all()
    assert examples.inputs[0, :5].tolist() == vocabulary.encode("cat on a mat") + [EOS_ID]
    again = ngram_examples(data=data, index=index, vocabulary=vocabulary)
    np.testing.assert_array_equal(again.targets, examples.targets)  # seeded


def test_a_micro_ngram_run(spm_data_dir, tmp_path):
    import gin
    from gr_jax import train as train_main
    from gr_jax.tools import ngram_index
    data = tmp_path / "data"
    shutil.copytree(spm_data_dir, data)
    summary = ngram_index.main(["--data_dir", str(data), "--width", "4"])
    assert summary["distinct_windows"] <= summary["words"] and summary["trie_states"] > summary["distinct_windows"]
    model_dir = tmp_path / "run"
    gin.clear_config()
    train_main.main(["--gin_file=runs/train.gin", "--gin_file=ngrams/train.gin", "--gin_file=models/t5_1_1/tiny.gin",
                     "--gin.TRAIN_STEPS=2", f"--gin.DATA_DIR='{data}'", f"--gin.MODEL_DIR='{model_dir}'",
                     "--gin.DATASET_NAME='ngram_fixture'", "--gin.INPUT_LENGTH=16", "--gin.SPAN_WIDTH=4",
                     f"--gin.TARGET_LENGTH={summary['tokens_per_window']['max'] + 1}", "--gin.BATCH_SIZE=8",
                     "--gin.network.T5Config.num_encoder_layers=1", "--gin.network.T5Config.num_decoder_layers=1",
                     "--gin.training.EvalConfig.num_beams=4", "--gin.training.EvalConfig.batch_size=8",
                     "--gin.training.EvalConfig.ranking_depth=6"])
    final = json.loads((model_dir / "final_metrics.json").read_text())
    assert np.isfinite(final["train/loss"]) and 0 <= final["eval/Recall@5"] <= 1
    # CGL over documents named by their span windows (the mean loss over each document's distinct windows).
    from gr_jax import cgl as cgl_main
    gin.clear_config()
    cgl_main.main(["--gin_file", str(model_dir / "config.gin"), "--gin.CGL_SPLIT='dev'", "--gin.CGL_NEGATIVES=4"])
    result = json.loads((model_dir / "cgl.dev.2.json").read_text())
    assert result["identifier_strings_per_document"]["mean"] > 1 and result["num_queries"] > 0
    assert 0 < result["cgl"] < 1
    with pytest.raises(SystemExit, match="ngrams.w7.npz"):
        gin.clear_config()
        train_main.main(["--gin_file=runs/train.gin", "--gin_file=ngrams/train.gin",
                         "--gin_file=models/t5_1_1/tiny.gin", "--gin.TRAIN_STEPS=2", f"--gin.DATA_DIR='{data}'",
                         f"--gin.MODEL_DIR='{tmp_path / 'other'}'", "--gin.DATASET_NAME='ngram_fixture2'",
                         "--gin.SPAN_WIDTH=7"])
