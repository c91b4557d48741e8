"""The atomic head whose columns are the documents' vectors (gr_jax/heads/document_vectors.py): its logits and
ranking against numpy, its vectors given at initialisation and kept fixed (or trained), its gin file."""
import gin
import jax
import numpy as np
import optax
import pytest

from gr_jax import gin_utils
from gr_jax import partitioning
from gr_jax.heads.document_vectors import DocumentVectorHead
from gr_jax.models import EncoderDecoderModel
from gr_jax.network import Transformer
from gr_jax.trainer import Trainer

from test_variants import MICRO, _batch

NUM_DOCS, START, DIM = 200, 128, 12


@pytest.fixture(scope="module")
def vectors_path(tmp_path_factory):
    vectors = np.random.default_rng(0).normal(size=(NUM_DOCS, DIM)).astype(np.float32)
    path = tmp_path_factory.mktemp("vectors") / "embeddings.npy"
    np.save(path, vectors)
    return path


def _trainer(head, *, optimizer=None):
    model = EncoderDecoderModel(config=MICRO, head=head)  # the encoder embeds the 128 ids below the docid tokens
    mesh = partitioning.make_mesh(data=2, model=4)  # the 'model' axis splits the 256 columns
    return model, Trainer(model=model, optimizer=optimizer or optax.adamw(1e-2, weight_decay=0.1), mesh=mesh,
                          input_length=6, target_length=2, batch_size=8, frozen=model.frozen_parameters)


def _state(model, trainer):
    return trainer.init_state(jax.random.PRNGKey(0), given=model.pretrained_params(
        abstract=trainer.abstract_state.params))


def test_vectors_are_given_and_logits_and_ranking_are_the_projected_dot_products(vectors_path):
    head = DocumentVectorHead(vectors_path=str(vectors_path), docid_vocab_start=START, docid_vocab_size=NUM_DOCS)
    model, trainer = _trainer(head)
    state = _state(model, trainer)
    params = jax.device_get(state.params)
    vectors = np.load(vectors_path)
    assert params["docid_vectors"].shape == (DIM, 256)  # 200 columns padded to a multiple of 128
    np.testing.assert_array_equal(params["docid_vectors"][:, :NUM_DOCS], vectors.T)
    np.testing.assert_array_equal(params["docid_vectors"][:, NUM_DOCS:], 0.0)
    assert tuple(trainer.state_shardings.params["docid_vectors"].spec) == (None, "model")
    queries = np.random.default_rng(1).integers(3, 100, (4, 6)).astype(np.int32)
    states = np.asarray(model.module.apply({"params": params}, queries, method=Transformer.start_states))
    expected = states @ params["docid_projection"] @ vectors.T  # [4, 200]
    log_probs = expected - np.log(np.exp(expected - expected.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - expected.max(1, keepdims=True)
    with trainer.sharding_context():
        result = jax.jit(lambda p, q: head.rank(model, p, q, num_results=5, max_decode_len=2))(state.params, queries)
    top = np.argsort(-expected, axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(np.asarray(result.sequences)[:, :, 0], top + START)
    np.testing.assert_allclose(np.asarray(result.scores), np.take_along_axis(log_probs, top, 1), rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("train_vectors", [False, True])
def test_the_vectors_stay_as_given_unless_trained(vectors_path, train_vectors):
    head = DocumentVectorHead(vectors_path=str(vectors_path), docid_vocab_start=START, docid_vocab_size=NUM_DOCS,
                              train_vectors=train_vectors)
    model, trainer = _trainer(head)
    assert model.frozen_parameters == (None if train_vectors else "(?:docid_vectors(/value)?)")
    state = _state(model, trainer)
    before = jax.device_get(state.params)
    rng = np.random.default_rng(2)
    batch = _batch(rng.integers(3, 100, (8, 6)), np.stack([START + rng.integers(0, NUM_DOCS, 8), np.ones(8)], 1))
    for _ in range(3):
        state, _ = trainer.train_step(state, batch, jax.random.PRNGKey(1))
    after = jax.device_get(state.params)
    assert not np.allclose(after["docid_projection"], before["docid_projection"])
    changed = not np.array_equal(after["docid_vectors"], before["docid_vectors"])
    assert changed == train_vectors  # frozen: neither the gradient nor AdamW's weight decay reaches them


def test_bad_vectors_are_refused(vectors_path, tmp_path):
    with pytest.raises(ValueError, match="needs vectors_path"):
        DocumentVectorHead(docid_vocab_start=START, docid_vocab_size=NUM_DOCS)
    head = DocumentVectorHead(vectors_path=str(vectors_path), docid_vocab_start=START, docid_vocab_size=NUM_DOCS + 1)
    model = EncoderDecoderModel(config=MICRO, head=head)
    with pytest.raises(ValueError, match=r"200 document vectors for 201 atomic docids"):
        model.pretrained_params(abstract={"docid_vectors": jax.ShapeDtypeStruct((DIM, 256), np.float32)})
    flat = tmp_path / "flat.npy"
    np.save(flat, np.zeros(NUM_DOCS, np.float32))
    with pytest.raises(ValueError, match=r"must be \[documents, dim\], got shape \(200,\)"):
        _ = DocumentVectorHead(vectors_path=str(flat), docid_vocab_start=START, docid_vocab_size=NUM_DOCS).vector_dim


def test_gin_file_configures_the_head(vectors_path):
    gin.clear_config()
    try:
        gin_utils.parse_gin(gin_files=["runs/train.gin", "models/t5_1_1/tiny.gin", "encoders/minilm.gin",
                                       "decoders/atomic_document_vectors.gin"],
                            bindings=["MODEL_DIR = '/tmp/unused'", "DATASET_NAME = 'x'", "DATA_DIR = '/tmp/unused'",
                                      "TRAIN_STEPS = 1", f"DOCUMENT_VECTORS = '{vectors_path}'"])
        head = gin.query_parameter("%HEAD").scoped_configurable_fn()
        assert head == DocumentVectorHead(vectors_path=str(vectors_path)) and head.vector_dim == DIM
        assert gin.query_parameter("%DOCID_SCHEME") == "atomic"
    finally:
        gin.clear_config()
