"""Each seqio preprocessor of gr_jax.data.preprocessors, checked with seqio.test_utils.assert_dataset."""

import numpy as np
import pytest
import seqio
import sentencepiece as spm
import tensorflow as tf
from seqio.test_utils import assert_dataset

from gr_jax.data import preprocessors
from gr_jax.data.readers import read_collection
from gr_jax.docids import DocidTable
from gr_jax.vocabulary import EOS_ID, train_sentencepiece

from conftest import FIXTURES

FIXTURE_DATA = FIXTURES / "tasks"
# Rows: docid tokens + EOS, PAD after; lengths 3, 5 and 2 (EOS included).
TABLE = DocidTable(docids=("d7", "d12", "x"),
                   tokens=np.array([[5, 6, 1, 0, 0], [9, 8, 7, 6, 1], [4, 1, 0, 0, 0]], np.int32))


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory):
    texts = [text for _, text in read_collection(FIXTURE_DATA / "collection.tsv")]
    path = train_sentencepiece(texts=texts, model_path=tmp_path_factory.mktemp("vocab") / "spm.model",
                               vocab_size=320)
    return seqio.SentencePieceVocabulary(str(path), extra_ids=0)


def _dataset(examples):
    return tf.data.Dataset.from_generator(
        lambda: iter(examples),
        output_signature={key: tf.TensorSpec(shape=np.shape(value) if not isinstance(value, str) else (),
                                             dtype=tf.string if isinstance(value, str) else tf.int32)
                          for key, value in examples[0].items()})


def test_docid_targets_are_the_table_rows_without_padding():
    ds = _dataset([{"docid": "d12", "inputs": "q1"}, {"docid": "x", "inputs": "q2"}, {"docid": "d7", "inputs": "q3"}])
    assert_dataset(preprocessors.docid_targets(ds, docid_table=TABLE), [
        {"docid": "d12", "inputs": "q1", "targets": [9, 8, 7, 6, 1]},
        {"docid": "x", "inputs": "q2", "targets": [4, 1]},
        {"docid": "d7", "inputs": "q3", "targets": [5, 6, 1]},
    ], expected_dtypes={"targets": tf.int32})


def test_docid_targets_fails_on_an_unknown_docid_naming_it():
    ds = preprocessors.docid_targets(_dataset([{"docid": "d7"}, {"docid": "nope"}]), docid_table=TABLE)
    with pytest.raises(tf.errors.InvalidArgumentError, match="nope"):
        list(ds.as_numpy_iterator())


def test_tokenize_inputs_matches_sentencepiece_without_eos_or_copies(vocabulary):
    texts = ["Kimchi is a Korean side dish", "miso soup 4420"]
    ds = _dataset([{"docid": "a", "inputs": texts[0]}, {"docid": "b", "inputs": texts[1]}])
    output_features = {"inputs": seqio.Feature(vocabulary, add_eos=True),
                       "targets": seqio.Feature(vocabulary, add_eos=False)}
    reference = spm.SentencePieceProcessor(model_file=vocabulary.sentencepiece_model_file)
    expected = reference.encode(texts)
    assert all(EOS_ID not in ids for ids in expected)
    assert_dataset(preprocessors.tokenize_inputs(ds, output_features), [
        {"docid": "a", "inputs": expected[0]},
        {"docid": "b", "inputs": expected[1]},
    ], expected_dtypes={"inputs": tf.int32})


def test_trim_inputs_and_append_eos_keeps_first_tokens_and_leaves_targets():
    vocab = seqio.PassThroughVocabulary(size=100, eos_id=EOS_ID)
    output_features = {"inputs": seqio.Feature(vocab, add_eos=True), "targets": seqio.Feature(vocab, add_eos=False)}
    ds = tf.data.Dataset.from_generator(
        lambda: iter([
            {"inputs": [10, 11], "targets": [5, 6, 7, 8, 9, 10, 1]},
            {"inputs": [10, 11, 12, 13], "targets": [5, 1]},
            {"inputs": [10, 11, 12, 13, 14, 15, 16], "targets": [7, 1]},
        ]),
        output_signature={"inputs": tf.TensorSpec([None], tf.int32), "targets": tf.TensorSpec([None], tf.int32)})
    assert_dataset(preprocessors.trim_inputs_and_append_eos(ds, output_features, input_length=5), [
        {"inputs": [10, 11, 1], "targets": [5, 6, 7, 8, 9, 10, 1]},  # targets longer than 5: untouched
        {"inputs": [10, 11, 12, 13, 1], "targets": [5, 1]},
        {"inputs": [10, 11, 12, 13, 1], "targets": [7, 1]},           # first input_length - 1 tokens + EOS
    ])


@pytest.mark.parametrize("sequence_length", [None, {"inputs": 8, "targets": 4}, {"inputs": 9, "targets": 6},
                                             {"inputs": 8, "targets": None}])
def test_require_feature_lengths_passes_examples_through(sequence_length):
    examples = [{"docid": "a", "inputs": "x"}, {"docid": "b", "inputs": "y"}]
    ds = preprocessors.require_feature_lengths(_dataset(examples), sequence_length,
                                               minimum={"inputs": 8, "targets": 4}, provider_name="t")
    assert_dataset(ds, examples)


@pytest.mark.parametrize("sequence_length,short", [({"inputs": 7, "targets": 4}, "inputs: asked 7 < registered 8"),
                                                   ({"inputs": 8, "targets": 3}, "targets: asked 3 < registered 4")])
def test_require_feature_lengths_refuses_shorter_lengths(sequence_length, short):
    with pytest.raises(ValueError, match=f"'my.task'.*{short}"):
        preprocessors.require_feature_lengths(_dataset([{"inputs": "x"}]), sequence_length,
                                              minimum={"inputs": 8, "targets": 4}, provider_name="my.task")


def test_cache_in_memory_reads_the_input_once_over_several_epochs():
    reads = []

    def examples():
        reads.append(1)
        yield from ({"docid": f"d{i}", "inputs": [i, 1]} for i in range(3))

    ds = tf.data.Dataset.from_generator(examples, output_signature={"docid": tf.TensorSpec((), tf.string),
                                                                    "inputs": tf.TensorSpec([None], tf.int32)})
    expected = [{"docid": f"d{i}", "inputs": [i, 1]} for i in range(3)]
    assert_dataset(preprocessors.cache_in_memory(ds).repeat(3), expected * 3)
    assert len(reads) == 1
    assert_dataset(ds.repeat(3), expected * 3)
    assert len(reads) == 4  # without the cache every epoch reads again


# --- DaQ: random windows of each document ---------------------------------------------------------------------

PASS_THROUGH = seqio.PassThroughVocabulary(size=1000, eos_id=EOS_ID)
FEATURES = {"inputs": seqio.Feature(PASS_THROUGH, add_eos=True), "targets": seqio.Feature(PASS_THROUGH, add_eos=False)}
LONG = list(range(100, 120))  # 20 tokens: with windows of 5, offsets 0..15


def _documents(docs):
    """{"docid", "inputs": int32[n] (tokens, no EOS), "targets": int32[2]} examples."""
    return tf.data.Dataset.from_generator(
        lambda: iter([{"docid": docid, "inputs": np.array(tokens, np.int32), "targets": np.array([7, EOS_ID], np.int32)}
                      for docid, tokens in docs]),
        output_signature={"docid": tf.TensorSpec((), tf.string), "inputs": tf.TensorSpec([None], tf.int32),
                          "targets": tf.TensorSpec([2], tf.int32)})


def _chunks(docs, **kwargs):
    args = dict(num_chunks=10, input_length=6, seed=0) | kwargs
    return list(preprocessors.daq_chunks(_documents(docs), FEATURES, **args).as_numpy_iterator())


def _offset(window, tokens):
    """The offset of `window` in `tokens` (brute force), or None."""
    matches = [o for o in range(len(tokens) - len(window) + 1) if tokens[o:o + len(window)] == window]
    return matches[0] if matches else None


def test_daq_chunks_are_windows_of_the_document_plus_eos_with_features_copied():
    examples = _chunks([("long", LONG), ("other", list(range(300, 340)))])
    assert [e["docid"] for e in examples] == [b"long"] * 10 + [b"other"] * 10  # num_chunks per document, in order
    for example, tokens in zip(examples, [LONG] * 10 + [list(range(300, 340))] * 10):
        inputs = example["inputs"].tolist()
        assert len(inputs) == 6 and inputs[-1] == EOS_ID  # input_length - 1 tokens + EOS
        assert _offset(inputs[:-1], tokens) is not None
        assert example["targets"].tolist() == [7, EOS_ID]
    offsets = {_offset(e["inputs"].tolist()[:-1], LONG) for e in examples[:10]}
    assert len(offsets) > 3  # random offsets, not always the first window


def test_daq_chunks_of_short_documents_are_the_whole_document():
    expected = [{"docid": "short", "inputs": [5, 6, 7, EOS_ID], "targets": [7, EOS_ID]}] * 3 + \
               [{"docid": "exact", "inputs": [8, 9, 10, 11, 12, EOS_ID], "targets": [7, EOS_ID]}] * 3 + \
               [{"docid": "empty", "inputs": [EOS_ID], "targets": [7, EOS_ID]}] * 3
    ds = preprocessors.daq_chunks(_documents([("short", [5, 6, 7]), ("exact", [8, 9, 10, 11, 12]), ("empty", [])]),
                                  FEATURES, num_chunks=3, input_length=6, seed=0)
    assert_dataset(ds, expected)


def test_daq_chunks_depend_on_seed_and_docid_only():
    alone = _chunks([("long", LONG)])
    among_others = _chunks([("a", list(range(50))), ("long", LONG), ("b", LONG)])
    inputs = lambda examples: [e["inputs"].tolist() for e in examples]  # noqa: E731
    assert inputs(among_others[10:20]) == inputs(alone)  # stateless: position in the stream does not matter
    assert inputs(_chunks([("long", LONG)])) == inputs(alone)  # reproducible
    assert inputs(among_others[20:30]) != inputs(alone)  # another docid, other offsets
    assert inputs(_chunks([("long", LONG)], seed=1)) != inputs(alone)  # another seed, other offsets


def test_daq_chunk_offsets_cover_every_window_about_uniformly():
    examples = _chunks([("long", LONG)], num_chunks=1600)
    counts = np.bincount([_offset(e["inputs"].tolist()[:-1], LONG) for e in examples], minlength=16)
    assert counts.shape == (16,)  # no offset past the last full window
    # 1600 draws over 16 offsets: 100 expected each (binomial sd 9.7); the seed is fixed, so this cannot flake.
    assert counts.min() >= 60 and counts.max() <= 140, counts


@pytest.mark.parametrize("kwargs,message", [({"num_chunks": 0}, "num_chunks"), ({"input_length": 1}, "input_length"),
                                            ({"seed": -1}, "seed")])
def test_daq_chunks_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _chunks([("long", LONG)], **kwargs)


# --- D2Q: k of each passage's synthetic queries --------------------------------------------------------------

def _passages(passages):
    return tf.data.Dataset.from_generator(
        lambda: iter([{"docid": docid, "queries": np.array(queries, dtype=object).reshape(-1)}
                      for docid, queries in passages]),
        output_signature={"docid": tf.TensorSpec((), tf.string), "queries": tf.TensorSpec([None], tf.string)})


def _selected(passages, **kwargs):
    args = dict(queries_per_passage=2, selection="random", seed=0) | kwargs
    return [(e["docid"].decode(), e["inputs"].decode())
            for e in preprocessors.select_synthetic_queries(_passages(passages), **args).as_numpy_iterator()]


def test_select_first_synthetic_queries():
    ds = preprocessors.select_synthetic_queries(
        _passages([("a", ["a1", "a2", "a3"]), ("b", ["b1"]), ("c", []), ("d", ["d1", "d2"])]),
        queries_per_passage=2, selection="first", seed=0)
    assert_dataset(ds, [{"docid": "a", "inputs": "a1"}, {"docid": "a", "inputs": "a2"}, {"docid": "b", "inputs": "b1"},
                        {"docid": "d", "inputs": "d1"}, {"docid": "d", "inputs": "d2"}])


def test_select_random_synthetic_queries_is_a_seeded_subset_in_file_order():
    queries = [f"q{i}" for i in range(6)]
    passages = [(f"p{j}", queries) for j in range(300)]
    selected = _selected(passages, queries_per_passage=3)
    by_passage = {}
    for docid, query in selected:
        by_passage.setdefault(docid, []).append(query)
    assert len(by_passage) == 300
    for kept in by_passage.values():
        assert len(kept) == 3 and kept == sorted(kept, key=queries.index)  # 3 distinct queries, in file order
    # Every query is kept about half the time (900 picks over 6 queries: 150 expected each, sd 8.7).
    counts = np.bincount([queries.index(q) for _, q in selected], minlength=6)
    assert counts.min() >= 110 and counts.max() <= 190, counts
    assert len({tuple(kept) for kept in by_passage.values()}) == 20  # all C(6, 3) subsets occur
    assert _selected(passages[7:8], queries_per_passage=3) == [("p7", q) for q in by_passage["p7"]]  # stateless
    assert _selected(passages, queries_per_passage=3) == selected  # reproducible
    assert _selected(passages, queries_per_passage=3, seed=1) != selected


def test_select_random_keeps_all_queries_of_short_passages():
    assert _selected([("a", ["a1", "a2"]), ("b", ["b1"])], queries_per_passage=5) == \
        [("a", "a1"), ("a", "a2"), ("b", "b1")]


@pytest.mark.parametrize("kwargs,message", [({"queries_per_passage": 0}, "queries_per_passage"),
                                            ({"selection": "best"}, "selection"), ({"seed": 2**63}, "seed")])
def test_select_synthetic_queries_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _selected([("a", ["a1"])], **kwargs)


SENTINEL = 900  # sentinel ids 900, 901, ... (after the PassThroughVocabulary's "pieces" in these tests)


def _corrupted(docs, **kwargs):
    args = dict(window=10, sentinel_start=SENTINEL, seed=0) | kwargs
    return list(preprocessors.span_corruption(_documents(docs), FEATURES, **args).as_numpy_iterator())


def _uncorrupt(inputs, targets):
    """The original piece, brute force: each sentinel of the inputs replaced by the tokens after it in the targets."""
    assert inputs[-1] == targets[-1] == EOS_ID
    spans, current = {}, None
    for token in targets[:-1]:
        if token >= SENTINEL:
            current = token
            spans[current] = []
        else:
            spans[current].append(token)
    return [t for token in inputs[:-1] for t in (spans[token] if token >= SENTINEL else [token])], spans


@pytest.mark.parametrize("input_length, target_length, window", [(64, 16, 69), (512, 114, 563), (8, 8, 6)])
def test_span_corruption_window_is_the_longest_that_fits(input_length, target_length, window):
    # 64/16: 69 tokens -> 10 noise in 3 spans (4 if the rotation splits one): inputs 69 - 10 + 4 + 1 = 64,
    # targets 10 + 4 + 1 = 15; at 70 tokens (round(10.5) = 10, 3 spans) inputs would be 65 in the split case.
    # T5's 512/114 -> 568 leaves no room for a split span: here 563 (84 noise, 28 spans; 564 gives 85 noise and
    # targets 85 + 29 + 1 = 115).
    assert preprocessors.span_corruption_window(input_length=input_length, target_length=target_length) == window
    worst = lambda n: preprocessors.span_corruption_counts(n, noise_density=0.15, mean_noise_span_length=3.0)  # noqa
    noise, spans = worst(window)
    assert window - noise + spans + 2 <= input_length and noise + spans + 2 <= target_length
    noise, spans = worst(window + 1)
    assert window + 1 - noise + spans + 2 > input_length or noise + spans + 2 > target_length


def test_span_corruption_inputs_and_targets_rebuild_every_token_of_the_document():
    docs = [("long", list(range(100, 125))), ("one", [5]), ("two", [6, 7])]
    examples = _corrupted(docs)
    assert [e["docid"] for e in examples] == [b"long"] * 3 + [b"one", b"two"]  # ceil(25 / 10) pieces, then 1, 1
    pieces = [list(range(100, 110)), list(range(110, 120)), list(range(120, 125)), [5], [6, 7]]
    for example, piece in zip(examples, pieces):
        inputs, targets = example["inputs"].tolist(), example["targets"].tolist()
        rebuilt, spans = _uncorrupt(inputs, targets)
        assert rebuilt == piece
        noise, num_spans = preprocessors.span_corruption_counts(len(piece), noise_density=0.15,
                                                                mean_noise_span_length=3.0)
        assert sum(map(len, spans.values())) == noise  # e.g. 10 tokens: round(1.5) = 2 noise tokens
        assert num_spans <= len(spans) <= num_spans + 1  # a rotation may split a span in two
        assert list(spans) == list(range(SENTINEL, SENTINEL + len(spans)))  # numbered in order
        assert all(spans.values())  # no empty span
        assert [t for t in inputs if t >= SENTINEL] == list(spans)
    assert examples[3]["inputs"].tolist() == [SENTINEL, EOS_ID] and examples[3]["targets"].tolist() == [SENTINEL, 5,
                                                                                                       EOS_ID]


def test_span_corruption_depends_on_seed_docid_and_piece_only():
    doc = list(range(100, 160))
    alone = [e["inputs"].tolist() for e in _corrupted([("d", doc)])]
    among = [e["inputs"].tolist() for e in _corrupted([("x", doc), ("d", doc)])]
    assert among[6:] == alone and among[:6] != alone  # stateless, keyed by the docid
    assert [e["inputs"].tolist() for e in _corrupted([("d", doc)], seed=3)] != alone
    assert len({tuple(x) for x in alone}) == 6  # each piece its own spans


def test_span_corruption_places_spans_all_over_the_piece():
    examples = _corrupted([(f"d{i}", list(range(100, 110))) for i in range(200)])
    first_noise = [next(i for i, (a, b) in enumerate(zip(e["inputs"].tolist(), range(100, 110))) if a != b)
                   for e in examples]
    # Two noise tokens among 10 (a span at 9 wraps around to 0): without the rotation every span would be last.
    assert set(first_noise) == set(range(9))


def test_span_corruption_bad_arguments():
    with pytest.raises(ValueError, match="window"):
        _corrupted([("d", [5])], window=0)
    with pytest.raises(ValueError, match="noise_density"):
        preprocessors.span_corruption_window(input_length=64, target_length=16, noise_density=1.5)
    with pytest.raises(ValueError, match="no window fits"):
        preprocessors.span_corruption_window(input_length=2, target_length=2)
