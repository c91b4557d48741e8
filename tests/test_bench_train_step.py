"""tools/bench/train_step: the model FLOPs it divides by time, against the matmuls counted by hand."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax import gin_utils
from gr_jax import optimizers
from gr_jax import partitioning
from gr_jax.decoder_only.model import DecoderOnlyModel
from gr_jax.tools.bench import train_step

BATCH, INPUTS, TARGETS, VOCAB = 8, 16, 4, 512


def _hand_count(config) -> float:
    """A train step's matmul FLOPs: forward (every position through every layer's projections and MLP, the tied
    output layer, attention's two [T, T] products per head), backward twice that."""
    d, k, tokens = config.emb_dim, config.head_dim, INPUTS + TARGETS
    layer = d * k * (2 * config.num_heads + 2 * config.num_kv_heads) + 3 * d * config.mlp_dim
    forward = 2 * tokens * (config.num_layers * layer + d * VOCAB)
    forward += config.num_layers * 2 * 2 * tokens * tokens * config.num_heads * k
    return 3.0 * BATCH * forward


def test_model_flops_count_every_layer_of_a_scanned_rematerialised_stack():
    base = gin_utils.decoder_only_config(["decoder_only/micro.gin"], vocab_size=VOCAB)
    config = dataclasses.replace(base, scan_layers=True, remat=True)
    model = DecoderOnlyModel(config=config)
    optimizer = optimizers.make_optimizer(name="adafactor", learning_rate=1e-3)
    mesh = partitioning.make_mesh(data=-1, model=1)
    batch = train_step.random_batch(np.random.default_rng(0), batch=BATCH, inputs=INPUTS, targets=TARGETS,
                                    vocab=VOCAB)
    hand = _hand_count(config)
    assert train_step.model_flops(model=model, optimizer=optimizer, mesh=mesh, batch=batch) == hand


def test_matmul_flops_of_a_jaxpr_by_hand():
    assert train_step.matmul_flops(64) == train_step.jaxpr_matmul_flops(
        jax.make_jaxpr(lambda x, y: x @ y)(jax.ShapeDtypeStruct((64, 64), np.float32),
                                           jax.ShapeDtypeStruct((64, 64), np.float32)))

    def scanned(x, w):  # a batched product inside a scan of 3 steps, under a jit
        def body(carry, _):
            return jnp.einsum("bij,jk->bik", carry, w), None
        return jax.lax.scan(body, x, None, length=3)[0]

    counted = train_step.jaxpr_matmul_flops(
        jax.make_jaxpr(jax.jit(scanned))(jax.ShapeDtypeStruct((5, 64, 32), np.float32),
                                         jax.ShapeDtypeStruct((32, 32), np.float32)))
    assert counted == 3 * 2 * 5 * 64 * 32 * 32
