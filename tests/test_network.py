"""T5.1.1 network: parameter shapes/counts, incremental decoding == teacher forcing, masking, dropout."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from gr_jax import network
from gr_jax.heads import StandardHead

TINY = network.T5Config(vocab_size=2048, emb_dim=256, num_heads=4, num_encoder_layers=4, num_decoder_layers=4,
                        head_dim=64, mlp_dim=512)
STANDARD = StandardHead()  # T5.1.1's output layer
MICRO = network.T5Config(vocab_size=128, emb_dim=32, num_heads=2, num_encoder_layers=2, num_decoder_layers=2,
                         head_dim=8, mlp_dim=64, dropout_rate=0.0)


def _variables(cfg, input_length=7, target_length=5):
    enc = jnp.ones((1, input_length), jnp.int32)
    dec = jnp.ones((1, target_length), jnp.int32)
    return network.Transformer(cfg, head=STANDARD).init(jax.random.PRNGKey(0), enc, dec)


def _init(cfg):
    return network.Transformer(cfg, head=STANDARD), _initial_variables(cfg)


@functools.cache
def _initial_variables(cfg):
    """_variables(cfg), computed once per config by one program (op by op, each of the initialiser's ops compiles
    on its own); the tests only read them. The initialiser draws no dropout: configs that differ in `dropout_rate`
    alone share one init (the same values)."""
    if cfg.dropout_rate:
        return _initial_variables(network.T5Config(**{**cfg.__dict__, "dropout_rate": 0.0}))
    return jax.jit(lambda: _variables(cfg))()


# The network's entry points compiled whole, one program per config and shape (op by op, each of the network's
# ops compiles on its own), shared by the tests below.
@functools.partial(jax.jit, static_argnums=0, static_argnames="enable_dropout")
def _apply(cfg, variables, enc, dec, rngs=None, *, enable_dropout=False):
    return network.Transformer(cfg, head=STANDARD).apply(variables, enc, dec, enable_dropout=enable_dropout, rngs=rngs)


@functools.partial(jax.jit, static_argnums=0, static_argnames="max_decode_len")
def _prefill(cfg, variables, enc, *, max_decode_len):
    return network.Transformer(cfg, head=STANDARD).apply(variables, enc, max_decode_len=max_decode_len,
                                          method=network.Transformer.prefill)


@functools.partial(jax.jit, static_argnums=0)
def _decode_step(cfg, variables, tokens, position, cache, context):
    return network.Transformer(cfg, head=STANDARD).apply(variables, tokens, position=position, cache=cache,
                                                         context=context, method=network.Transformer.decode_step)


def _expected_param_count(cfg: network.T5Config) -> int:
    d, h, k, m, v = cfg.emb_dim, cfg.num_heads, cfg.head_dim, cfg.mlp_dim, cfg.vocab_size
    attention = 4 * d * h * k
    mlp = 3 * d * m
    encoder = cfg.num_encoder_layers * (attention + mlp + 2 * d) + d
    decoder = cfg.num_decoder_layers * (2 * attention + mlp + 3 * d) + d
    relpos = 2 * h * cfg.relative_attention_num_buckets
    return v * d + encoder + decoder + relpos + d * v  # embedding + stacks + biases + untied output


def test_tiny_param_shapes_and_count():
    variables = jax.eval_shape(lambda: _variables(TINY))
    params = nn.unbox(variables)["params"]
    assert params["token_embedder"].shape == (2048, 256)
    assert params["logits_dense"].shape == (256, 2048)
    layer = params["encoder_layers_0"]
    assert layer["attention"]["query"].shape == (256, 4, 64)
    assert layer["attention"]["out"].shape == (4, 64, 256)
    assert layer["mlp"]["wi_0"].shape == (256, 512)
    assert layer["mlp"]["wi_1"].shape == (256, 512)
    assert layer["mlp"]["wo"].shape == (512, 256)
    assert params["encoder_relpos"]["rel_embedding"].shape == (4, 32)
    assert "encoder_relpos" in params and "decoder_relpos" in params
    assert not any("relpos" in k for k in layer)  # one bias table per stack, shared by its layers
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    # 2*2048*256 embeddings + 4*(4*256*256+3*256*512+2*256) + 4*(8*256*256+3*256*512+3*256) + 2*256 norms + 256 relpos
    assert count == _expected_param_count(TINY) == 7_345_920


@pytest.mark.parametrize("size,expected_millions", [("small", 76.96), ("base", 247.58)])
def test_published_sizes_match_t5_1_1(size, expected_millions):
    """T5.1.1 small/base have 77.0M/247.6M parameters with the 32,128-token vocabulary."""
    dims = {"small": dict(emb_dim=512, num_heads=6, num_encoder_layers=8, num_decoder_layers=8, mlp_dim=1024),
            "base": dict(emb_dim=768, num_heads=12, num_encoder_layers=12, num_decoder_layers=12, mlp_dim=2048)}
    cfg = network.T5Config(vocab_size=32128, **dims[size])
    variables = jax.eval_shape(lambda: _variables(cfg))
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(variables)))
    assert count / 1e6 == pytest.approx(expected_millions, abs=0.01)


def test_every_param_has_logical_names():
    variables = jax.eval_shape(lambda: _variables(TINY))
    boxed = jax.tree.leaves(variables, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert boxed and all(isinstance(b, nn.LogicallyPartitioned) for b in boxed)
    for b in boxed:
        assert len(b.names) == len(b.value.shape)


def test_incremental_decoding_matches_teacher_forcing():
    _, variables = _init(MICRO)
    enc = jax.random.randint(jax.random.PRNGKey(1), (3, 7), 1, 128).at[0, 5:].set(0)
    tgt = jax.random.randint(jax.random.PRNGKey(2), (3, 5), 1, 128)
    dec_in = jnp.concatenate([jnp.zeros((3, 1), jnp.int32), tgt[:, :-1]], axis=1)
    # Compiled whole; one decode step program for all t.
    full = _apply(MICRO, variables, enc, dec_in)
    context = _prefill(MICRO, variables, enc, max_decode_len=5)
    cache = network.init_cache(MICRO, head=STANDARD, rows=3, max_decode_len=5)
    steps = []
    for t in range(5):
        logits, cache = _decode_step(MICRO, variables, dec_in[:, t], jnp.int32(t), cache, context)
        steps.append(logits)
    np.testing.assert_allclose(np.stack(steps, 1), full, atol=1e-4, rtol=1e-4)


def test_decode_step_shares_cross_attention_across_beams():
    """batch*beams rows against per-query keys equal the same rows with the encoder repeated per beam."""
    _, variables = _init(MICRO)
    enc = jax.random.randint(jax.random.PRNGKey(3), (2, 7), 1, 128)
    beams = 3
    tokens = jax.random.randint(jax.random.PRNGKey(4), (2 * beams,), 1, 128)
    shared = _prefill(MICRO, variables, enc, max_decode_len=4)
    repeated = _prefill(MICRO, variables, jnp.repeat(enc, beams, axis=0), max_decode_len=4)
    cache = network.init_cache(MICRO, head=STANDARD, rows=2 * beams, max_decode_len=4)
    a, _ = _decode_step(MICRO, variables, tokens, jnp.int32(0), cache, shared)
    b, _ = _decode_step(MICRO, variables, tokens, jnp.int32(0), cache, repeated)
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_padding_in_encoder_input_does_not_change_outputs():
    _, variables = _init(MICRO)
    enc = jax.random.randint(jax.random.PRNGKey(5), (1, 4), 1, 128)
    padded = jnp.concatenate([enc, jnp.zeros((1, 3), jnp.int32)], axis=1)
    dec_in = jnp.array([[0, 5, 6]])
    np.testing.assert_allclose(_apply(MICRO, variables, enc, dec_in), _apply(MICRO, variables, padded, dec_in),
                               atol=1e-5)


def test_dropout_is_active_only_when_enabled():
    cfg = network.T5Config(**{**MICRO.__dict__, "dropout_rate": 0.5})
    _, variables = _init(cfg)
    enc = jnp.ones((2, 7), jnp.int32)
    dec = jnp.ones((2, 5), jnp.int32)
    a = _apply(cfg, variables, enc, dec)
    b = _apply(cfg, variables, enc, dec)
    np.testing.assert_array_equal(a, b)
    c = _apply(cfg, variables, enc, dec, {"dropout": jax.random.PRNGKey(1)}, enable_dropout=True)
    assert not np.allclose(a, c)


@pytest.mark.parametrize("broadcast_dims", [(), (-2,), (0,)])
def test_dropout_multiplies_by_the_mask_nn_dropout_draws(broadcast_dims):
    """network.Dropout (x * mask / keep, t5x's attention dropout) drops exactly what flax's nn.Dropout (select)
    drops with the same key, and scales the rest alike; its gradient is that mask / keep."""
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 8)) + 3.0  # no zeros of its own
    rngs = {"dropout": jax.random.PRNGKey(7)}
    ours = network.Dropout(0.3, broadcast_dims=broadcast_dims).apply({}, x, deterministic=False, rngs=rngs)
    theirs = nn.Dropout(0.3, broadcast_dims=broadcast_dims).apply({}, x, deterministic=False, rngs=rngs)
    np.testing.assert_array_equal(ours == 0, theirs == 0)
    assert 0 < int((ours == 0).sum()) < x.size
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    grad = jax.grad(lambda v: network.Dropout(0.3, broadcast_dims=broadcast_dims).apply(
        {}, v, deterministic=False, rngs=rngs).sum())(x)
    np.testing.assert_allclose(grad, np.where(ours == 0, 0.0, 1 / 0.7), rtol=1e-6)
    np.testing.assert_array_equal(network.Dropout(0.3).apply({}, x, deterministic=True), x)
    np.testing.assert_array_equal(network.Dropout(1.0).apply({}, x, deterministic=False, rngs=rngs), 0.0)


def test_relative_position_buckets_hand_computed():
    rel = jnp.array([-200, -20, -3, 0, 3, 20, 200])
    bi = network.relative_position_bucket(rel, bidirectional=True, num_buckets=32, max_distance=128)
    uni = network.relative_position_bucket(rel, bidirectional=False, num_buckets=32, max_distance=128)
    # Bidirectional: 16 buckets per direction, 8 of them exact; keys after the query use the upper half.
    # n = query - key; small n exact, larger ones 8 + log(n/8)/log(128/8)*8, e.g. n=20 -> 8 + 2.64 -> 10.
    np.testing.assert_array_equal(bi, [15, 10, 3, 0, 19, 26, 31])
    # Causal: 16 exact buckets, keys after the query all map to 0; n=20 -> 16 + log(20/16)/log(8)*16 -> 17.
    np.testing.assert_array_equal(uni, [31, 17, 3, 0, 0, 0, 0])


def test_unknown_activation_fails_early():
    with pytest.raises(ValueError, match="Unknown MLP activation"):
        network.T5Config(mlp_activations=("swishy", "linear"))


def test_remat_gives_the_same_logits_and_gradients():
    """Rematerialisation trades memory for compute only: identical outputs and gradients, dropout included."""
    enc = jax.random.randint(jax.random.PRNGKey(6), (2, 7), 1, 128)
    dec = jax.random.randint(jax.random.PRNGKey(7), (2, 5), 1, 128)
    rngs = {"dropout": jax.random.PRNGKey(8)}
    # One layer a stack: each layer is rematerialised on its own, one of each kind covers it (and compiles in half
    # the time of two).
    config = network.T5Config(**{**MICRO.__dict__, "dropout_rate": 0.1, "num_encoder_layers": 1,
                                 "num_decoder_layers": 1})
    params = _initial_variables(config)["params"]  # remat changes no parameter: one init for both settings
    results = []
    for remat in (False, True):
        module = network.Transformer(network.T5Config(**{**config.__dict__, "remat": remat}), head=STANDARD)

        @jax.jit  # one program per setting: run op by op, the remat'd layers compile hundreds of small programs
        def value_and_grad(params):

            def loss(params):
                logits = module.apply({"params": params}, enc, dec, enable_dropout=True, rngs=rngs)
                return jnp.mean(jax.nn.logsumexp(logits, -1))

            return jax.value_and_grad(loss)(params)

        results.append(value_and_grad(params))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(results[0][1]), jax.tree.leaves(results[1][1])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_bfloat16_parameters_are_bfloat16_kernels_too():
    """param_dtype='bfloat16' holds for every parameter: the fan-in initialiser's scale must not promote kernels
    to float32 (a numpy float64 scale did)."""
    from gr_jax.models import EncoderDecoderModel
    config = network.T5Config(vocab_size=128, emb_dim=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                              head_dim=16, mlp_dim=64, dropout_rate=0.0, param_dtype="bfloat16")
    model = EncoderDecoderModel(config=config)
    params = nn.unbox(jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), input_length=4,
                                                        target_length=3))["params"])
    dtypes = {jax.tree_util.keystr(path): leaf.dtype for path, leaf in jax.tree_util.tree_leaves_with_path(params)}
    assert {str(d) for d in dtypes.values()} == {"bfloat16"}, dtypes
    assert any("query" in name for name in dtypes)


def _dropout_mask_shapes(cfg, *, batch=2, input_length=7, target_length=5) -> list[tuple[int, ...]]:
    """The shape of every dropout mask drawn by a teacher-forced forward pass (the `random_bits` of the jaxpr)."""
    module = network.Transformer(cfg, head=STANDARD)
    variables = jax.eval_shape(lambda: _variables(cfg))  # the trace needs their shapes only
    enc = jnp.ones((batch, input_length), jnp.int32)
    dec = jnp.ones((batch, target_length), jnp.int32)
    jaxpr = jax.make_jaxpr(lambda r, v: module.apply(v, enc, dec, enable_dropout=True, rngs={"dropout": r}))(
        jax.random.PRNGKey(1), variables)
    shapes = []

    def walk(inner):
        for eqn in inner.eqns:
            if eqn.primitive.name == "random_bits":
                shapes.append(tuple(eqn.params["shape"]))
            for param in eqn.params.values():
                sub = getattr(param, "jaxpr", param)
                if hasattr(sub, "eqns"):
                    walk(sub)

    walk(jaxpr.jaxpr)
    return sorted(shapes)


def test_dropout_masks_are_shared_along_the_length_axis_as_in_t5x():
    """T5.1.1's default (t5x's broadcast_dims=(-2,)): one mask per example and feature, the same at every position;
    attention weights [b, heads, q, k] drop the same keys for every query. Counted by hand for one layer each."""
    b, i, t, d, h, m = 2, 7, 5, 32, 2, 64
    cfg = network.T5Config(**{**MICRO.__dict__, "dropout_rate": 0.1, "num_encoder_layers": 1, "num_decoder_layers": 1})
    assert cfg.dropout_broadcast_dims == (-2,)
    mlp_hidden = (b, 1, m)
    encoder = [(b, 1, d), (b, h, 1, i), (b, 1, d), mlp_hidden, (b, 1, d), (b, 1, d)]  # embed, attn w/out, mlp, norm
    decoder = [(b, 1, d), (b, h, 1, t), (b, 1, d), (b, h, 1, i), (b, 1, d), mlp_hidden, (b, 1, d), (b, 1, d)]
    assert _dropout_mask_shapes(cfg, batch=b, input_length=i, target_length=t) == sorted(encoder + decoder)
    # () draws one mask element per activation element: the same sites, full shapes.
    full = network.T5Config(**{**cfg.__dict__, "dropout_broadcast_dims": []})
    assert full.dropout_broadcast_dims == ()
    unshared = [(b, i, d), (b, h, i, i), (b, i, d), (b, i, m), (b, i, d), (b, i, d),
                (b, t, d), (b, h, t, t), (b, t, d), (b, h, t, i), (b, t, d), (b, t, m), (b, t, d), (b, t, d)]
    assert _dropout_mask_shapes(full, batch=b, input_length=i, target_length=t) == sorted(unshared)
    with pytest.raises(ValueError, match="dropout_broadcast_dims"):
        network.T5Config(**{**cfg.__dict__, "dropout_broadcast_dims": ("length",)})
