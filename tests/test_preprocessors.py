"""Each seqio preprocessor of gr_jax.data.preprocessors, checked with seqio.test_utils.assert_dataset."""
import pathlib

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

FIXTURE_DATA = pathlib.Path(__file__).parent / "fixtures" / "tasks"
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
