"""gr_jax.lora: adapters that start as the base network, gradients and optimizer state for the adapters only, and
merged kernels that compute what the factored adapters compute, on both model families."""
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from gr_jax import network
from gr_jax import optimizers
from gr_jax import partitioning
from gr_jax.decoder_only.model import DecoderOnlyModel
from gr_jax.decoder_only.network import DecoderOnlyConfig, DecoderOnlyTransformer
from gr_jax.lora import LoraConfig, merge
from gr_jax.models import EncoderDecoderModel
from gr_jax.tools.bench.train_step import random_batch
from gr_jax.trainer import Trainer

LORA = LoraConfig(rank=2, alpha=4.0)
DECODER_ONLY = DecoderOnlyConfig(vocab_size=48, emb_dim=16, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=4,
                                 mlp_dim=24, qkv_bias=True, qk_norm=True)
T5 = network.T5Config(vocab_size=128, emb_dim=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                      head_dim=8, mlp_dim=32, dropout_rate=0.0)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(1, 48, size=(2, 7)), jnp.int32)


def _flat(params) -> dict[str, np.ndarray]:
    return {"/".join(path): np.asarray(leaf) for path, leaf in traverse_util.flatten_dict(
        partitioning.strip_boxes(params)).items()}


def _tree(flat: dict[str, np.ndarray]) -> dict:
    return traverse_util.unflatten_dict({tuple(name.split("/")): value for name, value in flat.items()})


def _random_adapters(flat: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """The parameters with every adapter (B included, which starts at zero) drawn at random."""
    rng = np.random.default_rng(seed)
    return {name: rng.normal(0, 0.3, value.shape).astype(value.dtype) if "_lora_" in name else value
            for name, value in flat.items()}


def test_zero_initialised_adapters_compute_the_base_network():
    config = dataclasses.replace(DECODER_ONLY, lora=LORA)
    flat = _flat(DecoderOnlyTransformer(config).init(jax.random.PRNGKey(0), TOKENS)["params"])
    adapters = sorted(name for name in flat if "_lora_" in name)
    assert len(adapters) == 7 * 2 * 2  # 7 kernels per layer, A and B, 2 layers
    # A [input side, rank], B [rank, output side]: grouped-query keys [16] x [2, 2, 4]; the output [4, 4] x [16].
    assert flat["layers_0/attention/key_lora_a"].shape == (16, 2)
    assert flat["layers_0/attention/key_lora_b"].shape == (2, 2, 4)
    assert flat["layers_1/attention/out_lora_a"].shape == (4, 4, 2)
    assert flat["layers_1/mlp/wo_lora_b"].shape == (2, 16)
    assert not np.any(flat["layers_1/mlp/wo_lora_b"]) and np.any(flat["layers_1/mlp/wo_lora_a"])
    with_adapters = DecoderOnlyTransformer(config).apply({"params": _tree(flat)}, TOKENS)
    base = {name: value for name, value in flat.items() if "_lora_" not in name}
    plain = DecoderOnlyTransformer(DECODER_ONLY).apply({"params": _tree(base)}, TOKENS)
    np.testing.assert_array_equal(np.asarray(with_adapters), np.asarray(plain))


@pytest.mark.parametrize("scan_layers", [False, True])
def test_merged_kernels_equal_the_factored_adapters(scan_layers):
    """W + (alpha / r) A.B computed once (`merge`) against (x.W + (alpha / r) (x.A).B) in every layer, for
    adapters drawn at random, unscanned and scanned (kernels with a leading layers axis)."""
    config = dataclasses.replace(DECODER_ONLY, lora=LORA, scan_layers=scan_layers)
    flat = _random_adapters(_flat(DecoderOnlyTransformer(config).init(jax.random.PRNGKey(1), TOKENS)["params"]), 2)
    factored = DecoderOnlyTransformer(config).apply({"params": _tree(flat)}, TOKENS)
    merged_params = merge(_tree(flat), lora=LORA)
    assert not any("_lora_" in name for name in _flat(merged_params))
    merged = DecoderOnlyTransformer(dataclasses.replace(config, lora=None)).apply({"params": merged_params}, TOKENS)
    np.testing.assert_allclose(np.asarray(merged), np.asarray(factored), rtol=1e-5, atol=1e-5)
    # A hand-merged kernel: the query's W [16, 4, 4] + 2 * A [16, 2] . B [2, 4, 4].
    prefix = "layers/attention/query" if scan_layers else "layers_0/attention/query"
    a, b, w = (flat[prefix + suffix] for suffix in ("_lora_a", "_lora_b", ""))
    hand = w + 2.0 * (np.einsum("ldr,lrhk->ldhk", a, b) if scan_layers else np.einsum("dr,rhk->dhk", a, b))
    np.testing.assert_allclose(np.asarray(_flat(merged_params)[prefix]), hand, rtol=1e-6, atol=1e-6)


def _trainer(model, *, frozen: str, input_length: int, target_length: int) -> Trainer:
    return Trainer(model=model, optimizer=optimizers.make_optimizer(name="adamw", learning_rate=1e-2),
                   mesh=partitioning.make_mesh(data=4, model=2), input_length=input_length,
                   target_length=target_length, batch_size=4, frozen=frozen)


@pytest.mark.parametrize("family", ["decoder_only", "t5"])
def test_gradients_and_optimizer_state_reach_only_the_adapters(family):
    """Two AdamW steps: every base parameter is bit for bit as initialised, each B moves at the first step and
    each A at the second (A's gradient is zero while B is); the optimizer state holds AdamW's two moments of the
    adapters and nothing of the base; the compiled step computes no gradient of a base kernel (its flops are
    those of the step that differentiates only the adapters, below the full fine-tune's)."""
    if family == "t5":
        model = EncoderDecoderModel(config=dataclasses.replace(T5, lora=LORA))
    else:
        model = DecoderOnlyModel(config=dataclasses.replace(DECODER_ONLY, lora=LORA))
    vocab = 48 if family == "decoder_only" else 128
    trainer = _trainer(model, frozen=model.frozen_parameters, input_length=6, target_length=4)
    state = trainer.init_state(jax.random.PRNGKey(0))
    start = _flat(state.params)
    adapter_sizes = sum(value.size for name, value in start.items() if "_lora_" in name)
    state_sizes = sum(np.size(leaf) for leaf in jax.tree.leaves(state.opt_state) if np.ndim(leaf) > 0)
    assert state_sizes == 2 * adapter_sizes, (state_sizes, adapter_sizes)
    batch = random_batch(np.random.default_rng(0), batch=4, inputs=6, targets=4, vocab=vocab)
    assert trainer.param_count(trained_only=True) == adapter_sizes
    steps = []
    for i in range(2):
        state, _ = trainer.train_step(state, batch, jax.random.PRNGKey(i))
        steps.append(_flat(state.params))
    for name, value in start.items():
        if "_lora_b" in name:
            assert not np.array_equal(steps[0][name], value), name
        elif "_lora_a" in name:
            np.testing.assert_array_equal(steps[0][name], value, err_msg=name)
            assert not np.array_equal(steps[1][name], value), name
        else:
            np.testing.assert_array_equal(steps[1][name], value, err_msg=name)
    if family == "decoder_only":  # below the step that differentiates everything, less the base's weight gradients
        full = _trainer(model, frozen=None, input_length=6, target_length=4)
        # XLA's cost analysis counts one device's share: the 8 devices split the batch and the kernels.
        assert _step_flops(trainer, batch) < (_step_flops(full, batch)
                                              - _base_weight_gradient_flops(start, batch) / jax.device_count())


def _step_flops(trainer: Trainer, batch) -> float:
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=trainer.replicated)
    abstract_batch = {name: jax.ShapeDtypeStruct(value.shape, jnp.int32, sharding=trainer.batch_sharding)
                      for name, value in batch.items()}
    return trainer.lower_train_step(trainer.abstract_state, abstract_batch, rng).compile().cost_analysis()["flops"]


def _base_weight_gradient_flops(flat, batch) -> float:
    """2 x tokens x |W| for each adapted base kernel: the weight gradients a full fine-tune computes."""
    tokens = batch["encoder_input_tokens"].size + batch["decoder_input_tokens"].size
    return sum(2.0 * tokens * value.size for name, value in flat.items() if f"{name}_lora_a" in flat)


def test_decoder_only_decoding_runs_on_the_merged_network():
    """The retriever's predictions with adapters equal the plain network's over the merged parameters."""
    model = DecoderOnlyModel(config=dataclasses.replace(DECODER_ONLY, lora=LORA))
    variables = model.init(jax.random.PRNGKey(3), input_length=6, target_length=3)["params"]
    params = _tree(_random_adapters(_flat(variables), 4))
    plain = DecoderOnlyModel(config=DECODER_ONLY)
    queries = TOKENS[:, :6]
    ours = model.predict_batch(params, queries, num_beams=3, max_decode_len=3)
    theirs = plain.predict_batch(merge(params, lora=LORA), queries, num_beams=3, max_decode_len=3)
    np.testing.assert_array_equal(np.asarray(ours.sequences), np.asarray(theirs.sequences))
    np.testing.assert_allclose(np.asarray(ours.scores), np.asarray(theirs.scores), rtol=1e-6)
    # Teacher-forced scoring keeps the factored adapters: it agrees with the merged network too.
    candidates = jnp.asarray([[[5, 6, 1], [7, 1, 0]], [[8, 9, 1], [5, 1, 0]]], jnp.int32)
    np.testing.assert_allclose(np.asarray(model.score_candidates(params, queries, candidates)[0]),
                               np.asarray(plain.score_candidates(merge(params, lora=LORA), queries, candidates)[0]),
                               rtol=1e-5, atol=1e-5)


def test_bad_lora_settings_are_refused():
    with pytest.raises(ValueError, match="rank must be >= 1"):
        LoraConfig(rank=0)
    with pytest.raises(ValueError, match="each must be one of"):
        LoraConfig(targets=("query", "gate_proj"))
    with pytest.raises(ValueError, match="match every parameter"):
        optimizers.freeze(optimizers.make_optimizer(name="adamw", learning_rate=1e-3), ".*").init({"w": jnp.zeros(2)})
    with pytest.raises(ValueError, match="match no parameter"):
        optimizers.trained_mask({"w": jnp.zeros(2)}, "v")


def test_also_trained_parameters_train_in_full_beside_the_adapters():
    pattern = LoraConfig(also_trained=("token_embedder", "output")).frozen_pattern()
    frozen = re.compile(pattern)
    assert not frozen.fullmatch("token_embedder") and not frozen.fullmatch("layers_0/mlp/wo_lora_a")
    assert frozen.fullmatch("layers_0/mlp/wo") and frozen.fullmatch("layers/attention/query")
    assert frozen.fullmatch("token_embedder_scale")
