"""End-to-end runs of all-MiniLM-L6-v2 as shipped: the zero-shot dense run ranks as its cosine, and a GDR run on
its corpus index starts its query tower as that run's query encoder. One file, so that both read one run (a
module fixture: the suite's workers take whole files)."""
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.data.readers import open_dataset


@pytest.fixture(scope="module")
def minilm_zero_shot_run(spm_data_dir, tmp_path_factory) -> pathlib.Path:
    """The model dir of a dense run of all-MiniLM-L6-v2 as shipped (TRAIN_STEPS=0) on `spm_data_dir`: its checkpoint
    of step 0 and its dev ranking (run.dev.0.trec, 5 documents a query). Both tests here read it, neither trains
    it further."""
    import gin
    from gr_jax import train as train_main
    model_dir = tmp_path_factory.mktemp("minilm") / "zero"
    gin.clear_config()
    try:
        train_main.main(["--gin_file=dense/minilm.gin", f"--gin.DATA_DIR={spm_data_dir}",
                         f"--gin.MODEL_DIR={model_dir}", "--gin.TRAIN_STEPS=0",
                         "--gin.training.EvalConfig.ranking_depth=5"])
    finally:
        gin.clear_config()
    return model_dir


def test_zero_shot_minilm_ranks_as_sentence_transformers_cosine(minilm_zero_shot_run, spm_data_dir):
    """TRAIN_STEPS=0: all-MiniLM-L6-v2 as shipped; its ranking is the cosine ranking of `load_minilm()`'s
    embeddings (checked against sentence-transformers in test_minilm.py)."""
    from gr_jax.encoders import load_minilm
    from gr_jax.evaluation import read_trec_run
    model_dir = minilm_zero_shot_run
    run = read_trec_run(model_dir / "run.dev.0.trec")
    dataset = open_dataset(spm_data_dir)
    docids, texts = zip(*dataset.collection())
    queries = list(dataset.queries("dev"))
    encoder = load_minilm()
    similarity = encoder([text for _, text in queries]) @ encoder(list(texts)).T
    for (qid, _), row in zip(queries, similarity):
        assert [d for d, _ in run[qid]] == [docids[i] for i in np.argsort(-row, kind="stable")[:5]]
        np.testing.assert_allclose([s for _, s in run[qid]], np.sort(row)[::-1][:5], rtol=1e-4, atol=1e-5)
    assert (model_dir / "checkpoints" / "0").is_dir()  # the zero-shot model is a run like any other


def test_minilm_query_tower_starts_as_the_query_encoder_of_the_dense_run_that_encoded_the_documents(
        spm_data_dir, minilm_zero_shot_run, tmp_path):
    import gin
    from gr_jax import gin_utils
    from gr_jax.dense.model import QUERY
    from gr_jax.search import restore_retriever
    from gr_jax.tools import gdr_index
    from gr_jax.training import EvalConfig
    dense_dir = minilm_zero_shot_run  # MiniLM as shipped (TRAIN_STEPS=0), the run checked above
    gin.clear_config()
    # The dense run's retriever encodes the collection into its index/0 (as gr_jax.tools.dense_index does); the
    # same retriever, its query encoder compiled once, is the reference below.
    _, dense = restore_retriever(str(dense_dir), settings=EvalConfig())
    assert dense.index().directory == dense_dir / "index" / "0"
    gin.clear_config()
    gdr_index.main(["build", "--index_dir", str(dense_dir / "index" / "0"), "--branching", "2,2",
                    "--out_dir", str(tmp_path / "gidx")])
    gin.clear_config()
    gin_utils.parse_gin(gin_files=["gdr/minilm.gin", "models/t5_1_1/tiny.gin"],
                        bindings=[f"MODEL_DIR = '{tmp_path / 'gdr'}'", f"DATA_DIR = '{spm_data_dir}'",
                                  f"GDR_INDEX = '{tmp_path / 'gidx'}'", "TRAIN_STEPS = 1", "QUERY_LENGTH = 16",
                                  "BATCH_SIZE = 8", "TRAIN_QUERY_TOWER = False", "WARMUP_STEPS = 0",
                                  "network.T5Config.num_encoder_layers = 1", "network.T5Config.num_decoder_layers = 1"])
    built = gin.query_parameter("%EXPERIMENT").scoped_configurable_fn().build()
    state = built.init_state()
    texts = ["sourdough bread", "kimchi"]
    before = jax.device_get(state.params)
    # One program on one device (op by op on the 8-device mesh, MiniLM's ops each compile and run 8 times).
    ours = np.asarray(jax.jit(built.model.query_vectors)(before, jnp.asarray(built.tokenizer(texts, length=16).ids)))
    np.testing.assert_allclose(ours, dense.encode(texts, side=QUERY), atol=2e-5)
    # A frozen tower stays as loaded through training (no update, no weight decay); the bridge learns. One step shows
    # both: with WARMUP_STEPS = 0 its learning rate is the peak, so AdamW's decoupled weight decay would move every
    # tower weight in it, as the update moves the bridge.
    state, _ = built.trainer.train_step(state, built.batch_source.batch(1), jax.random.PRNGKey(0))
    after = jax.device_get(state.params)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before["tower"]), jax.tree.leaves(after["tower"])))
    assert not np.array_equal(before["bridge"]["kernel"], after["bridge"]["kernel"])
