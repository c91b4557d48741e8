"""The decoder-only family as a generative retriever (gr_jax.decoder_only.model, .experiment): the loss over the
query block and the docid tokens equals the loss of each example written as one unpadded sequence; the constrained
beam search ranks every docid as brute-force scoring does; a LoRA run from a Hugging Face checkpoint trains and
evaluates through the entry point; the Qwen3-0.6B size file has the published parameter counts."""
import json
import shutil

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax import gin_utils
from gr_jax.decoder_only.model import DecoderOnlyModel
from gr_jax.decoder_only.network import DecoderOnlyConfig, DecoderOnlyTransformer
from gr_jax.docids.trie import Trie
from gr_jax.run_dir import start_fingerprint
from gr_jax.vocabulary import EOS_ID

CONFIG = DecoderOnlyConfig(vocab_size=40, emb_dim=16, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=4,
                           mlp_dim=32, qk_norm=True)
# Two queries right-padded in a block of 6, docids of up to 3 tokens + EOS, targets padded to 5.
QUERIES = np.array([[7, 8, 9, EOS_ID, 0, 0], [11, 12, 13, 14, 15, EOS_ID]], np.int32)
TARGETS = np.array([[21, 22, EOS_ID, 0, 0], [23, 24, 25, EOS_ID, 0]], np.int32)


@pytest.fixture(scope="module")
def model_and_params():
    model = DecoderOnlyModel(config=CONFIG)
    params = nn.unbox(model.init(jax.random.PRNGKey(3), input_length=6, target_length=5)["params"])
    # Larger weights than the initialiser's, so the docids' scores differ well beyond rounding.
    params = jax.tree.map(lambda p: p * 3.0, params)
    return model, params


def _batch(queries, targets):
    return {"encoder_input_tokens": jnp.asarray(queries), "decoder_target_tokens": jnp.asarray(targets),
            "decoder_input_tokens": jnp.pad(jnp.asarray(targets)[:, :-1], ((0, 0), (1, 0)))}


_forward = jax.jit(lambda params, tokens: DecoderOnlyTransformer(CONFIG).apply({"params": params}, tokens))


def _unpadded_log_likelihood(params, query, target, *, prefix=(), suffix=()):
    """log p(target | query) with the example as one unpadded sequence [prefix, query tokens, suffix, 0, target
    tokens but the last], positions 0..n-1: what the padded block must compute."""
    query = [*prefix, *(int(t) for t in query if t), *suffix]
    target = [int(t) for t in target if t]
    tokens = jnp.asarray([query + [0] + target[:-1]], jnp.int32)
    logits = _forward(params, tokens)[0, len(query):]
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return float(sum(log_probs[i, token] for i, token in enumerate(target)))


def test_the_loss_reads_the_docid_tokens_after_each_querys_own_tokens(model_and_params):
    model, params = model_and_params
    batch = _batch(QUERIES, TARGETS)
    expected = [_unpadded_log_likelihood(params, q, t) for q, t in zip(QUERIES, TARGETS)]
    np.testing.assert_allclose(np.asarray(model.score_batch(params, batch)), expected, rtol=1e-5)
    # CGL's candidate scores: each query's two candidates, its own docid and the other's.
    candidates = jnp.asarray(np.stack([TARGETS, TARGETS[::-1]], axis=1))
    scores, scored = model.score_candidates(params, jnp.asarray(QUERIES), candidates)
    np.testing.assert_allclose(np.asarray(scores[:, 0]), expected, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(scores[:, 1]), [_unpadded_log_likelihood(params, q, t) for q, t in
                                                          zip(QUERIES, TARGETS[::-1])], rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(scored), [[3, 4], [4, 3]])
    loss, metrics = model.loss_fn(params, batch, None)
    # The summed loss is the targets' negative log-likelihood plus t5x's z-loss, over the 7 docid tokens.
    np.testing.assert_allclose(float(loss) - float(metrics["z_loss"].total), -sum(expected), rtol=1e-5)
    assert float(metrics["loss"].count) == (TARGETS > 0).sum() == 7


def test_a_prompt_template_wraps_every_query_in_training_scoring_and_decoding(model_and_params, spm_data_dir):
    """prefix [5, 6] and suffix [4]: the loss, the candidates' scores and the decoded docid's score (prefill +
    cached steps) are those of [5, 6, query, 4, docid] as one unpadded sequence."""
    import dataclasses

    from gr_jax.decoder_only.experiment import PromptTemplate
    from gr_jax.vocabulary import load_vocabulary
    _, params = model_and_params
    model = DecoderOnlyModel(config=CONFIG, prompt_prefix=(5, 6), prompt_suffix=(4,))
    expected = [_unpadded_log_likelihood(params, q, t, prefix=(5, 6), suffix=(4,)) for q, t in zip(QUERIES, TARGETS)]
    np.testing.assert_allclose(np.asarray(model.score_batch(params, _batch(QUERIES, TARGETS))), expected, rtol=1e-5)
    assert not np.allclose(expected, [_unpadded_log_likelihood(params, q, t) for q, t in zip(QUERIES, TARGETS)])
    rows = np.zeros((2, 5), np.int32)
    rows[:, :4] = [[21, 22, EOS_ID, 0], [23, 24, 25, EOS_ID]]
    trie = Trie.build(rows, vocab_size=CONFIG.vocab_size, sparse_fanout=4)
    decoded = model.score_docids(params, jnp.asarray(QUERIES), jnp.asarray(TARGETS), trie=trie)
    np.testing.assert_allclose(np.asarray(decoded.log_probs), expected, rtol=1e-5)
    # The template's text becomes the run vocabulary's pieces; text the vocabulary cannot encode is an error.
    vocabulary = load_vocabulary(spm_data_dir)
    prefix, suffix = PromptTemplate(prefix="query:", suffix="document").token_ids(vocabulary)
    assert list(prefix) == list(vocabulary.encode("query:")) and vocabulary.decode(list(suffix)) == "document"
    assert PromptTemplate().token_ids(vocabulary) == ((), ())
    assert dataclasses.replace(model, prompt_prefix=()).prompt_block(jnp.asarray(QUERIES)).shape == (2, 7)


def test_constrained_beam_search_ranks_every_docid_as_brute_force(model_and_params):
    model, params = model_and_params
    rng = np.random.default_rng(0)
    docids = {tuple(rng.integers(20, 30, size=rng.integers(1, 4)).tolist()) for _ in range(40)}
    rows = np.zeros((len(docids), 4), np.int32)
    for i, docid in enumerate(sorted(docids)):
        rows[i, :len(docid) + 1] = [*docid, EOS_ID]
    trie = Trie.build(rows, vocab_size=CONFIG.vocab_size, sparse_fanout=4)
    beams = len(rows)  # all 38 docids: the search must return them all, ranked
    assert beams == 38
    result = jax.jit(lambda p, q: model.predict_batch(p, q, num_beams=beams, max_decode_len=4, trie=trie))(
        params, jnp.asarray(QUERIES))
    for query in range(len(QUERIES)):
        brute = [_unpadded_log_likelihood(params, QUERIES[query], row) for row in rows]
        order = np.argsort(brute)[::-1]
        found = [tuple(seq) for seq in np.asarray(result.sequences[query])]
        assert sorted(found) == sorted(tuple(row) for row in rows)
        np.testing.assert_allclose(np.asarray(result.scores[query]), np.asarray(brute)[order], rtol=1e-4, atol=1e-5)
    top = model.score_docids(params, jnp.asarray(QUERIES), result.sequences[:, 0], trie=trie)
    np.testing.assert_allclose(np.asarray(top.log_probs), np.asarray(result.scores[:, 0]), rtol=1e-5)


def test_a_lora_run_from_a_hugging_face_checkpoint_with_a_prompt_trains_and_evaluates_through_the_entry_point(
        spm_data_dir, hf_checkpoint_dir, tmp_path):
    """decoder_only/train.gin + from_checkpoint.gin + lora.gin on a tiny Qwen3 checkpoint dir, with a prompt
    template: the network is its config.json's, queries and naive docids are tokenised by its tokenizer.json, its
    token rows follow PAD and EOS and the docid tokens' rows are appended; 3 steps, a checkpoint of the adapters and
    embedding only, constrained evaluation of the restored state on the merged network, whose frozen base is the
    checkpoint's."""
    from safetensors.numpy import load_file

    from gr_jax import train as train_main
    from gr_jax.data.hf_tokenizer import HFTokenizerVocabulary
    data = tmp_path / "data"
    shutil.copytree(spm_data_dir, data)  # its naive docid table is cached beside it, in this vocabulary's tokens
    model_dir = tmp_path / "run"
    gin.clear_config()
    try:
        train_main.main(["--gin_file=decoder_only/train.gin", "--gin_file=decoder_only/from_checkpoint.gin",
                         "--gin_file=decoder_only/lora.gin", f"--gin.INIT_CHECKPOINT='{hf_checkpoint_dir}'",
                         "--gin.decoder_only_experiment.PromptTemplate.prefix='<|bos|>query:'",
                         "--gin.decoder_only_experiment.PromptTemplate.suffix='document'",
                         f"--gin.DATA_DIR='{data}'", f"--gin.MODEL_DIR='{model_dir}'",
                         "--gin.DATASET_NAME='decoder_only_hf'", "--gin.DOCID_SCHEME='naive'", "--gin.TRAIN_STEPS=3",
                         "--gin.INPUT_LENGTH=24", "--gin.TARGET_LENGTH=12", "--gin.BATCH_SIZE=8",
                         "--gin.WARMUP_STEPS=0", "--gin.training.EvalConfig.num_beams=4",
                         "--gin.training.EvalConfig.batch_size=8"])
    finally:
        gin.clear_config()
    metrics = json.loads((model_dir / "final_metrics.json").read_text())
    assert metrics["eval/num_queries"] == 4 and 0.0 <= metrics["eval/MRR@10"] <= 1.0
    assert metrics["eval/invalid_docid_rate"] == 0  # constrained: only docids come out
    assert np.isfinite(metrics["train/loss"]) and metrics["train/loss"] > 0
    config = (model_dir / "config.gin").read_text()
    assert "DecoderOnlyExperiment()" in config and "prefix = '<|bos|>query:'" in config and "rank = 16" in config
    from gr_jax.search import restore_run
    gin.clear_config()
    try:
        built = restore_run(str(model_dir))
    finally:
        gin.clear_config()
    vocabulary = built.vocabulary
    assert isinstance(vocabulary, HFTokenizerVocabulary) and vocabulary.path.parent == hf_checkpoint_dir.resolve()
    assert built.model.prompt_prefix[0] == vocabulary.encode("<|bos|>")[0] and built.model.token_offset == 2
    network = built.model.config
    assert (network.emb_dim, network.num_layers, network.qk_norm, network.lora.rank) == (24, 2, True, 16)
    assert network.vocab_size >= built.docid_space.model_vocab_size > vocabulary.vocab_size
    # The run starts from the checkpoint: its token rows after PAD and EOS, its kernels as the frozen base.
    tensors = load_file(str(hf_checkpoint_dir / "model.safetensors"))
    start = built.init_state().params
    rows = tensors["model.embed_tokens.weight"].shape[0]
    np.testing.assert_array_equal(np.asarray(start["token_embedder"])[2:2 + rows], tensors["model.embed_tokens.weight"])
    np.testing.assert_array_equal(np.asarray(start["layers_1"]["mlp"]["wo"]),
                                  tensors["model.layers.1.mlp.down_proj.weight"].T)
    # The checkpoint holds the adapters and the embedding only; the frozen base comes back from the checkpoint dir.
    saved = built.checkpointer.saved_params(3)
    assert saved and all("_lora_" in name or name == "token_embedder" for name in saved), sorted(saved)
    assert len(saved) == 1 + 2 * 7 * 2  # the embedding; A and B of 7 kernels in each of 2 layers
    trained, _ = built.restore(3)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(start), jax.tree.leaves(trained.params)):
        name = jax.tree_util.keystr(path)
        if "_lora_" not in name and "token_embedder" not in name:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
    params, step = built.restore_params(3)
    assert step == 3
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(trained.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    # The run records its start. A second LoRA run warm-started from the run dir (INIT_CHECKPOINT = the run) takes
    # the network and tokenizer of the checkpoint that run started from, and starts as the run's step 3: its
    # adapters and embedding from the run's checkpoint, its frozen base from the Hugging Face checkpoint again.
    assert json.loads((model_dir / "start.json").read_text()) == {
        "seed": 0, "init_checkpoint": str(hf_checkpoint_dir.resolve()), "frozen": built.trainer.frozen,
        "fingerprint": start_fingerprint(hf_checkpoint_dir)}
    gin.clear_config()
    try:
        gin_utils.parse_gin(gin_files=["decoder_only/train.gin", "decoder_only/from_checkpoint.gin",
                                       "decoder_only/lora.gin"],
                            bindings=[f"INIT_CHECKPOINT = '{model_dir}'", f"DATA_DIR = '{data}'",
                                      f"MODEL_DIR = '{tmp_path / 'second'}'", "DATASET_NAME = 'decoder_only_hf'",
                                      "DOCID_SCHEME = 'naive'", "INPUT_LENGTH = 24", "TARGET_LENGTH = 12",
                                      "TRAIN_STEPS = 1"])
        second = gin.query_parameter("%EXPERIMENT").scoped_configurable_fn().build()
    finally:
        gin.clear_config()
    assert second.model.config == network and second.model.token_offset == 2
    assert second.vocabulary.path == vocabulary.path
    continued = second.init_state().params
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(continued), jax.tree.leaves(trained.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))

    # The run read with another base of the same shapes (the checkpoint with another rms_norm_eps) is refused: its
    # adapters were trained on the first one.
    other = tmp_path / "other_base"
    shutil.copytree(hf_checkpoint_dir, other)
    config_json = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config_json, "rms_norm_eps": 1e-6}))
    gin.clear_config()
    try:
        elsewhere = restore_run(str(model_dir), gin_args=[f"--gin.INIT_CHECKPOINT='{other}'",
                                                          "--gin.DATASET_NAME='decoder_only_hf_other'"])
    finally:
        gin.clear_config()
    with pytest.raises(ValueError, match=r"start.json: .* trained on .*; this run's base is .*other_base"):
        elsewhere.restore_params(3)


def test_a_hugging_face_start_with_another_vocabulary_is_an_error(spm_data_dir, hf_checkpoint_dir, tmp_path):
    gin.clear_config()
    try:
        gin_utils.parse_gin(gin_files=["decoder_only/train.gin", "decoder_only/from_checkpoint.gin"],
                            bindings=[f"INIT_CHECKPOINT = '{hf_checkpoint_dir}'", f"DATA_DIR = '{spm_data_dir}'",
                                      f"MODEL_DIR = '{tmp_path / 'run'}'", "DATASET_NAME = 'hf_mismatch'",
                                      "TRAIN_STEPS = 1", "experiment.DatasetConfig.vocabulary_path = None"])
        with pytest.raises(ValueError, match=r"tokenises with its tokenizer.json, not .*spm.model"):
            gin.query_parameter("%EXPERIMENT").scoped_configurable_fn().build()
    finally:
        gin.clear_config()


def test_qwen3_0_6b_size_file_has_the_published_parameter_counts():
    gin.clear_config()
    try:
        gin_utils.parse_gin(gin_files=["decoder_only/qwen3_0_6b.gin"], bindings=[])
        from gr_jax.decoder_only import network
        config = gin.get_configurable(network.DecoderOnlyConfig)(vocab_size=151936)
    finally:
        gin.clear_config()
    # Qwen/Qwen3-0.6B's model card: 0.6B parameters, 0.44B of them non-embedding (embeddings tied).
    assert config.non_embedding_params() == 440_467_456
    assert config.non_embedding_params() + 151936 * 1024 == 596_049_920
    shapes = jax.eval_shape(DecoderOnlyTransformer(config).init, jax.random.PRNGKey(0), jnp.zeros((1, 2), jnp.int32))
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(shapes))) == 596_049_920
