"""tools/plan_memory: XLA's per-device memory analysis of the train step equals the bytes of its sharded inputs."""
import functools
import math

import jax
import numpy as np
import pytest

from gr_jax import network
from gr_jax.heads import StandardHead
from gr_jax.tools import plan_memory

MICRO = network.T5Config(vocab_size=512, emb_dim=64, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                         head_dim=32, mlp_dim=128, dtype="float32")


@functools.cache
def _plan(mesh_shape, rules_2d):
    """The plan of MICRO's train step on `mesh_shape`, computed once per mesh and rules (the tests only read it)."""
    return plan_memory.plan(config=MICRO, mesh_shape=mesh_shape, batch=8, input_length=16, target_length=4,
                            rules_2d=rules_2d)


def _expected_argument_bytes(*, mesh_shape, rules_2d, batch, input_length, target_length, model=None):
    """Per-device bytes of the step's arguments, by hand: every train-state leaf's shard on one device, the
    batch's four int32 arrays split over 'data', and the replicated uint32[2] key; less Adafactor's float32[1]
    placeholders (the unused half of each factored or unfactored pair), which jit drops as unused inputs."""
    from gr_jax import optimizers, partitioning
    from gr_jax.models import EncoderDecoderModel
    from gr_jax.trainer import Trainer
    rules = partitioning.LOGICAL_AXIS_RULES_2D if rules_2d else partitioning.LOGICAL_AXIS_RULES
    model = model or EncoderDecoderModel(config=MICRO)
    trainer = Trainer(model=model, optimizer=optimizers.make_optimizer(name="adafactor", learning_rate=1e-3),
                      frozen=model.frozen_parameters,
                      mesh=partitioning.make_mesh(data=mesh_shape[0], model=mesh_shape[1]),
                      input_length=input_length, target_length=target_length, batch_size=batch, rules=rules)
    state = sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * np.dtype(leaf.dtype).itemsize
                for leaf in jax.tree.leaves(trainer.abstract_state))
    placeholders = sum(4 for leaf in jax.tree.leaves(trainer.abstract_state.opt_state) if leaf.shape == (1,))
    per_device_rows = batch // mesh_shape[0]
    return state - placeholders + 4 * per_device_rows * (input_length + 3 * target_length) + 8


@pytest.mark.parametrize("mesh_shape,rules_2d", [((8, 1), False), ((4, 2), False), ((4, 2), True)])
def test_argument_bytes_are_the_sharded_state_batch_and_key(mesh_shape, rules_2d):
    result = _plan(mesh_shape, rules_2d)
    assert result["argument_bytes"] == _expected_argument_bytes(mesh_shape=mesh_shape, rules_2d=rules_2d,
                                                                batch=8, input_length=16, target_length=4)
    # The donated state is aliased to the new one: the peak counts it once.
    assert result["peak_bytes"] == (result["argument_bytes"] + result["output_bytes"] + result["temp_bytes"]
                                    - result["alias_bytes"])
    # The network's parameters by their shapes (op by op, initialising them compiles each of its ops on its own).
    assert result["params"] == sum(math.prod(x.shape) for x in jax.tree.leaves(jax.eval_shape(
        lambda: network.Transformer(MICRO, head=StandardHead()).init(jax.random.PRNGKey(0), np.ones((1, 16), np.int32),
                                                np.ones((1, 4), np.int32))["params"])))


def test_a_decoder_only_step_is_planned_from_its_size_file():
    """A decoder-only family's config plans its own train step (the query block and docid tokens in one sequence),
    its argument bytes the sharded state, batch and key as for T5."""
    from gr_jax import gin_utils
    from gr_jax.decoder_only.model import DecoderOnlyModel
    config = gin_utils.decoder_only_config(["decoder_only/micro.gin"], vocab_size=512)
    assert gin_utils.binds_decoder_only(["decoder_only/micro.gin"])
    assert not gin_utils.binds_decoder_only(["models/t5_1_1/tiny.gin"])
    result = plan_memory.plan(config=config, mesh_shape=(4, 2), batch=8, input_length=16, target_length=4,
                              rules_2d=True)
    # Less the uint32[2] dropout key: the family trains without dropout, so jit drops the unused input.
    assert result["argument_bytes"] == _expected_argument_bytes(mesh_shape=(4, 2), rules_2d=True, batch=8,
                                                                input_length=16, target_length=4,
                                                                model=DecoderOnlyModel(config=config)) - 8
    assert result["params"] == config.non_embedding_params() + 512 * config.emb_dim  # tied embeddings


def test_a_lora_plan_trains_the_adapters_and_embedding_and_keeps_no_state_for_the_base():
    """decoder_only/lora.gin on micro: the trained parameters are the adapters (by hand, rank 16) and the tied
    embedding; the step's arguments are the full fine-tune's less the base's optimizer state."""
    from gr_jax import gin_utils
    from gr_jax.decoder_only.model import DecoderOnlyModel
    files = ["decoder_only/micro.gin", "decoder_only/lora.gin"]
    config = gin_utils.decoder_only_config(files, vocab_size=512)
    assert config.lora is not None and config.lora.rank == 16
    result = plan_memory.plan(config=config, mesh_shape=(4, 2), batch=8, input_length=16, target_length=4,
                              rules_2d=True)
    d, h, g, k, m, r = 32, 4, 2, 8, 64, 16
    per_layer = ((d + h * k) + 2 * (d + g * k) + (h * k + d) + 2 * (d + m) + (m + d)) * r
    assert result["trained_params"] == 2 * per_layer + 512 * d
    assert result["params"] == config.non_embedding_params() + 512 * d + 2 * per_layer
    assert result["argument_bytes"] == _expected_argument_bytes(
        mesh_shape=(4, 2), rules_2d=True, batch=8, input_length=16, target_length=4,
        model=DecoderOnlyModel(config=config)) - 8


def test_two_dimensional_rules_shard_the_state_further():
    one, two = _plan((4, 2), False), _plan((4, 2), True)
    assert two["argument_bytes"] < one["argument_bytes"]


def test_bad_mesh_is_an_error():
    with pytest.raises(ValueError, match="DATAxMODEL"):
        plan_memory.parse_mesh("8-8")
    with pytest.raises(ValueError, match=">= 1"):
        plan_memory.parse_mesh("0x8")
