"""A Hugging Face checkpoint's tokenizer.json as the run's vocabulary (`gr_jax.data.hf_tokenizer`): the tokenizer's
ids shifted past PAD and EOS, the same in Python and inside seqio's TensorFlow tasks, and what naive docids and the
seqio tasks are made of."""
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tokenizers

from gr_jax.data.hf_tokenizer import HFTokenizerVocabulary
from gr_jax.data.readers import open_dataset
from gr_jax.vocabulary import EOS_ID, PAD_ID, encode_inputs, load_vocabulary


@pytest.fixture(scope="module")
def vocabulary(hf_checkpoint_dir) -> HFTokenizerVocabulary:
    vocabulary = load_vocabulary(hf_checkpoint_dir / "tokenizer.json")
    assert isinstance(vocabulary, HFTokenizerVocabulary)
    return vocabulary


def test_ids_are_the_tokenizers_shifted_past_pad_and_eos(vocabulary, hf_checkpoint_dir):
    tokenizer = tokenizers.Tokenizer.from_file(str(hf_checkpoint_dir / "tokenizer.json"))
    text = "What is sourdough bread? Kimchi! 42"
    theirs = tokenizer.encode(text, add_special_tokens=False).ids
    assert min(theirs) <= 1  # '!' (byte-level id 0 before the special token's) is one of the ids 0 and 1 reserve
    assert list(vocabulary.encode(text)) == [i + 2 for i in theirs]
    # The tokenizer's post-processor (a BOS before every text) is not applied: the prompt template places the query.
    assert tokenizer.encode(text).ids[0] == tokenizer.token_to_id("<|bos|>")
    assert vocabulary.decode(vocabulary.encode(text)) == text
    rows = json.loads((hf_checkpoint_dir / "config.json").read_text())["vocab_size"]
    assert vocabulary.vocab_size == 2 + rows == 2 + tokenizer.get_vocab_size() + 16
    assert (vocabulary.pad_id, vocabulary.eos_id) == (PAD_ID, EOS_ID)
    # Decoding stops at EOS and drops PAD and ids past the tokenizer's (the checkpoint's padding rows, docid tokens).
    ids = list(vocabulary.encode("kimchi"))
    assert vocabulary.decode([*ids, PAD_ID, vocabulary.vocab_size - 1, EOS_ID, *ids]) == "kimchi"
    # A special token written in a prompt encodes as that token.
    assert list(vocabulary.encode("<|bos|>query"))[0] == tokenizer.token_to_id("<|bos|>") + 2


def test_tensorflow_encoding_equals_the_tokenizers(vocabulary, spm_data_dir):
    dataset = open_dataset(spm_data_dir)
    texts = [text for _, text in dataset.collection()] + [text for _, text in dataset.queries("train")]
    texts += ["", "  spaces  ", "ünïcödé 123"]
    for text in texts:  # eagerly, and in a tf.data graph as seqio's tasks run it
        ours = vocabulary.encode_tf(tf.constant(text)).numpy().tolist()
        assert ours == list(vocabulary.encode(text)), text
    in_graph = tf.data.Dataset.from_tensor_slices(texts).map(vocabulary.encode_tf)
    assert [ids.tolist() for ids in in_graph.as_numpy_iterator()] == [list(vocabulary.encode(t)) for t in texts]
    encoded = encode_inputs(texts[:3], vocabulary=vocabulary, input_length=8)
    assert encoded.shape == (3, 8) and (encoded[:, -1] == EOS_ID).all()  # the fixture's passages are long


def test_naive_docids_are_the_tokenizers_digits(vocabulary, spm_data_dir, tmp_path):
    from gr_jax.docids.space import load_docid_space
    shutil.copytree(spm_data_dir, tmp_path / "data")  # the table is cached beside the data
    dataset = open_dataset(tmp_path / "data")
    tokenizer_path = vocabulary.path
    space = load_docid_space(dataset=dataset, scheme="naive", vocabulary=vocabulary, vocabulary_path=tokenizer_path)
    assert space.text_vocab_size == vocabulary.vocab_size
    for docid, row in zip(space.table.docids[:5], space.table.tokens[:5]):
        content = row[:np.flatnonzero(row == EOS_ID)[0]].tolist()
        assert content == [vocabulary.encode(digit)[0] for digit in docid]  # one token per digit


def test_a_file_that_is_no_tokenizer_is_an_error_naming_it(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match=str(bad)):
        load_vocabulary(bad)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 3}))
    with pytest.raises(FileNotFoundError, match="missing.json"):
        load_vocabulary(tmp_path / "missing.json")
