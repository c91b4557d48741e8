"""all-MiniLM-L6-v2 in Flax against sentence-transformers' own embeddings (tests/fixtures/minilm/README.md)."""
import json
import pathlib

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from gr_jax.encoders import Encoder
from gr_jax.encoders import minilm

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "minilm"

try:
    MODEL_DIR = minilm.default_model_dir()
except minilm.MiniLMNotInstalledError as e:
    pytest.skip(f"{e} (the Makefile installs it)", allow_module_level=True)


@pytest.fixture(scope="module")
def reference() -> tuple[list[str], list[int], np.ndarray]:
    meta = json.loads((FIXTURES / "sentences.json").read_text())
    return meta["sentences"], meta["token_counts"], np.load(FIXTURES / "embeddings.npy")


@pytest.fixture(scope="module")
def encoder() -> minilm.MiniLMEncoder:
    return minilm.load_minilm(batch_size=4)


def test_embeddings_match_sentence_transformers(encoder, reference):
    sentences, _, expected = reference
    embedded = encoder(sentences)
    assert embedded.dtype == np.float32 and embedded.shape == (6, 384)
    np.testing.assert_allclose(embedded, expected, atol=2e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(embedded, axis=1), 1.0, atol=1e-5)
    assert isinstance(encoder, Encoder) and encoder.dim == 384


def test_tokens_are_truncated_at_256_as_in_sentence_transformers(encoder, reference):
    sentences, token_counts, _ = reference
    assert [len(ids) for ids in encoder.tokenize(sentences)] == token_counts  # 170 > tokenizer.json's 128; 256
    ids = encoder.tokenize(["  Hello, World!  "])[0]
    assert ids[0] == 101 and ids[-1] == 102 and ids == encoder.tokenize(["hello , world !"])[0]


def test_batching_order_and_padding_do_not_change_embeddings(encoder, reference):
    sentences, _, expected = reference
    order = [4, 0, 3, 5, 1, 2, 0]  # repeated text, long texts mixed with short ones
    one_batch = minilm.load_minilm(batch_size=16, length_buckets=(256,))(sentences)
    np.testing.assert_allclose(encoder([sentences[i] for i in order]), expected[order], atol=2e-5, rtol=0)
    np.testing.assert_allclose(one_batch, expected, atol=2e-5, rtol=0)
    assert encoder([]).shape == (0, 384)


def test_bad_text_input(encoder):
    with pytest.raises(TypeError, match="not one string"):
        encoder("a sentence")
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        encoder(["a", 3])


def test_bucket_lengths_and_arguments(encoder):
    assert encoder.length_buckets == (32, 64, 128, 256)
    assert minilm.load_minilm(max_length=100, length_buckets=(16, 128, 512)).length_buckets == (16, 100)
    with pytest.raises(ValueError, match=r"max_length must be in \[2, 512\]"):
        minilm.load_minilm(max_length=600)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        minilm.load_minilm(batch_size=0)


def test_the_loader_refuses_unknown_missing_or_misshapen_tensors(tmp_path):
    config = minilm.BertConfig.from_json(MODEL_DIR / "config.json")
    weights = load_file(str(MODEL_DIR / "model.safetensors"))
    # Every tensor but the unused ones is consumed: a missing or renamed one is an error.
    missing = dict(weights)
    del missing["encoder.layer.3.output.dense.bias"]
    save_file(missing, str(tmp_path / "missing.safetensors"))
    with pytest.raises(ValueError, match="missing tensor 'encoder.layer.3.output.dense.bias'"):
        minilm.params_from_safetensors(tmp_path / "missing.safetensors", config=config)
    extra = dict(weights, **{"encoder.layer.6.output.dense.bias": weights["pooler.dense.bias"]})
    save_file(extra, str(tmp_path / "extra.safetensors"))
    with pytest.raises(ValueError, match=r"does not know: \['encoder.layer.6.output.dense.bias'\]"):
        minilm.params_from_safetensors(tmp_path / "extra.safetensors", config=config)
    positions = weights["embeddings.position_embeddings.weight"]
    misshapen = dict(weights, **{"embeddings.position_embeddings.weight": positions[:300]})
    save_file(misshapen, str(tmp_path / "misshapen.safetensors"))
    with pytest.raises(ValueError, match=r"\['embeddings'\]\['position'\]\['embedding'\] has shape \[300, 384\]"):
        minilm.params_from_safetensors(tmp_path / "misshapen.safetensors", config=config)


def test_config_refuses_other_bert_variants(tmp_path):
    raw = json.loads((MODEL_DIR / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(raw, hidden_act="relu")))
    with pytest.raises(ValueError, match=r"unsupported BERT variant \{'hidden_act': 'relu'\}"):
        minilm.BertConfig.from_json(tmp_path / "config.json")
    with pytest.raises(minilm.MiniLMNotInstalledError, match="missing model.safetensors, tokenizer.json"):
        minilm.load_minilm(model_dir=tmp_path)
