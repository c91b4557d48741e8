"""The decoder-only tower of the dense family (gr_jax.decoder_only.towers) and last-token pooling: the vector of a
text is the causal network's final state at its last real token, and a micro dual encoder with such towers trains
and evaluates through the entry point. The per-layer adapters (DecoderOnlyConfig.adapter_dim), which GR and DR
runs on this backbone share."""
import dataclasses
import json

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from gr_jax.decoder_only.network import DecoderOnlyConfig, DecoderOnlyTransformer
from gr_jax.decoder_only.towers import DecoderOnlyTower
from gr_jax.dense.model import DualEncoderConfig, DualEncoderNetwork, last_token_pool


def unflatten(flat: dict) -> dict:
    return traverse_util.unflatten_dict({tuple(name.split("/")): value for name, value in flat.items()})


CONFIG = DecoderOnlyConfig(vocab_size=64, emb_dim=16, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8,
                           mlp_dim=32, tie_embeddings=True)


def test_last_token_pool_reads_each_rows_last_real_token():
    value = (4 * jnp.arange(3)[:, None] + jnp.arange(4)[None, :]).astype(jnp.float32)  # row * 4 + position
    states = jnp.stack([value, -value], axis=-1)  # [3, 4, 2]
    mask = jnp.asarray([[True, True, True, False], [False, True, True, True], [False, False, False, False]])
    pooled = np.asarray(last_token_pool(states, mask))
    # Right-padded: position 2; left-padded: position 3; no real token: zeros.
    np.testing.assert_array_equal(pooled, [[2.0, -2.0], [7.0, -7.0], [0.0, 0.0]])


def test_the_towers_vector_is_the_networks_state_at_the_last_real_token():
    """Right-padded SentencePiece ids (EOS last): the unnormalised single vector equals the network's final-norm
    state at each text's EOS, computed on the unpadded text."""
    dual = DualEncoderConfig(tower=DecoderOnlyTower(config=CONFIG), pooling=last_token_pool, normalize=False)
    ids = jnp.asarray([[5, 6, 7, 1, 0, 0], [8, 9, 10, 11, 12, 1]], jnp.int32)
    mask = ids > 0
    network = DualEncoderNetwork(dual)
    params = network.init(jax.random.PRNGKey(0), ids, mask, ids, mask)["params"]
    vectors = network.apply({"params": params}, ids, mask, side="query", method=DualEncoderNetwork.encode)
    for row, length in enumerate((4, 6)):
        states = DecoderOnlyTransformer(CONFIG).apply({"params": params["tower"]}, ids[row:row + 1, :length],
                                                      method=DecoderOnlyTransformer.states)
        np.testing.assert_allclose(np.asarray(vectors[row]), np.asarray(states[0, -1]), rtol=1e-5, atol=1e-6)


def test_a_micro_decoder_only_dual_encoder_trains_and_evaluates_through_the_entry_point(spm_data_dir, tmp_path):
    from gr_jax import train as train_main
    model_dir = tmp_path / "dr"
    gin.clear_config()
    try:
        train_main.main(["--gin_file=dense/decoder_only.gin", "--gin_file=decoder_only/micro.gin",
                         f"--gin.DATA_DIR={spm_data_dir}", f"--gin.MODEL_DIR={model_dir}", "--gin.TRAIN_STEPS=3",
                         "--gin.BATCH_SIZE=8", "--gin.QUERY_LENGTH=8", "--gin.DOCUMENT_LENGTH=32"])
    finally:
        gin.clear_config()
    final = json.loads((model_dir / "final_metrics.json").read_text())
    assert final["eval/num_queries"] == 4 and np.isfinite(final["train/loss"]) and final["train/loss"] > 0
    assert 0.0 <= final["eval/MRR@10"] <= 1.0
    config = (model_dir / "config.gin").read_text()
    assert "DecoderOnlyTower()" in config and "pooling = @model.last_token_pool" in config


def test_layer_adapters_add_their_parameters_and_decode_as_they_train():
    """adapter_dim=8: each layer gains W_down [16, 8], W_up [8, 16] and a norm scale [16], counted by
    non_embedding_params; drawn at random, so the adapted network differs from its base; and a cached decoding step
    gives the full pass's logits."""
    adapted = dataclasses.replace(CONFIG, adapter_dim=8)
    ids = jnp.asarray([[5, 6, 7, 1, 9]], jnp.int32)
    params = DecoderOnlyTransformer(adapted).init(jax.random.PRNGKey(0), ids)["params"]
    flat = {"/".join(k): np.asarray(v) for k, v in traverse_util.flatten_dict(nn.unbox(params)).items()}
    assert flat["layers_1/adapter/down"].shape == (16, 8) and flat["layers_1/adapter/up"].shape == (8, 16)
    non_embedding = sum(v.size for name, v in flat.items() if name != "token_embedder")
    assert non_embedding == adapted.non_embedding_params() == CONFIG.non_embedding_params() + 2 * (2 * 16 * 8 + 16)
    base = {name: v for name, v in flat.items() if "/adapter/" not in name}
    full = DecoderOnlyTransformer(adapted).apply({"params": unflatten(flat)}, ids)
    assert not np.allclose(np.asarray(full), np.asarray(DecoderOnlyTransformer(CONFIG).apply(
        {"params": unflatten(base)}, ids)), atol=1e-3)
    valid = jnp.ones((1, 4), bool)
    positions = jnp.arange(4, dtype=jnp.int32)[None]
    _, cache = DecoderOnlyTransformer(adapted).apply({"params": unflatten(flat)}, ids[:, :4], positions=positions,
                                                     valid=valid, max_len=6, method=DecoderOnlyTransformer.prefill)
    step, _ = DecoderOnlyTransformer(adapted).apply({"params": unflatten(flat)}, ids[:, 4],
                                                    positions=positions[:, 3] + 1, index=jnp.int32(4), cache=cache,
                                                    method=DecoderOnlyTransformer.decode_step)
    np.testing.assert_allclose(np.asarray(step[0]), np.asarray(full[0, 4]), rtol=1e-5, atol=1e-5)

