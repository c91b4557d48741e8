"""Schedules against hand-computed values; Adafactor/AdamW first steps by hand; both minimise a quadratic."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from gr_jax import optimizers, partitioning


def _values(schedule, steps):
    return np.array([float(schedule(s)) for s in steps])


def test_warmup_constant_values():
    schedule = optimizers.warmup_constant(peak=1e-3, warmup_steps=10_000)
    np.testing.assert_allclose(
        _values(schedule, [0, 1, 5_000, 9_999, 10_000, 50_000]),
        [0.0, 1e-7, 5e-4, 9.999e-4, 1e-3, 1e-3],
        rtol=1e-5,  # float32 arithmetic
    )
    np.testing.assert_allclose(_values(optimizers.warmup_constant(peak=0.5, warmup_steps=0), [0, 7]), [0.5, 0.5])


def test_warmup_rsqrt_values():
    schedule = optimizers.warmup_rsqrt(peak=1e-3, warmup_steps=10_000)
    np.testing.assert_allclose(
        _values(schedule, [0, 2_500, 10_000, 40_000, 90_000, 1_000_000]),
        [0.0, 2.5e-4, 1e-3, 5e-4, 1e-3 / 3, 1e-4],
        rtol=1e-6,
    )
    # After warm-up it is T5's inverse square root decay 1 / sqrt(step) when peak = 1 / sqrt(warmup).
    t5 = optimizers.warmup_rsqrt(peak=0.01, warmup_steps=10_000)
    steps = [10_000, 12_345, 100_000, 524_288]
    np.testing.assert_allclose(_values(t5, steps), 1 / np.sqrt(steps), rtol=1e-6)
    # Works traced (inside the jitted train step) and on int32 counters.
    np.testing.assert_allclose(float(jax.jit(schedule)(jnp.int32(40_000))), 5e-4, rtol=1e-6)


def test_linear_decay_values():
    schedule = optimizers.linear_decay(peak=1.0, warmup_steps=10, total_steps=110, end_value=0.0)
    np.testing.assert_allclose(
        _values(schedule, [0, 5, 10, 35, 60, 110, 500]), [0.0, 0.5, 1.0, 0.75, 0.5, 0.0, 0.0], atol=1e-7
    )
    no_warmup = optimizers.linear_decay(peak=2.0, warmup_steps=0, total_steps=4, end_value=1.0)
    np.testing.assert_allclose(_values(no_warmup, [0, 2, 4, 9]), [2.0, 1.5, 1.0, 1.0])


@pytest.mark.parametrize(
    "factory, kwargs, message",
    [
        (optimizers.warmup_constant, {"peak": 0.0, "warmup_steps": 1}, "peak"),
        (optimizers.warmup_constant, {"peak": 1e-3, "warmup_steps": -1}, "warmup_steps"),
        (optimizers.warmup_rsqrt, {"peak": 1e-3, "warmup_steps": 0}, "warmup_steps >= 1"),
        (optimizers.linear_decay, {"peak": 1e-3, "warmup_steps": 10, "total_steps": 10}, "total_steps"),
    ],
)
def test_bad_schedule_arguments(factory, kwargs, message):
    with pytest.raises(ValueError, match=message):
        factory(**kwargs)


def _params():
    return {"kernel": jnp.full((128, 128), 2.0), "scale": jnp.full((128,), 2.0)}


def _first_update(tx, grads, params):
    @jax.jit
    def run(grads, params):
        updates, _ = tx.update(grads, tx.init(params), params)
        return optax.apply_updates(params, updates)

    return run(grads, params)


def test_adafactor_first_step_by_hand():
    """A constant gradient has a rank-1 square, so the factored estimate is exact: the normalised update
    is sign(g) = 1 (RMS 1, not clipped), times lr * RMS(param) = lr * 2; weight decay subtracts
    weight_decay * param without the learning rate (t5x's weight_decay_rate), on matrices only."""
    lr, wd = 0.01, 0.1
    tx = optimizers.make_optimizer(name="adafactor", learning_rate=lr, weight_decay=wd)
    grads = {"kernel": jnp.full((128, 128), 3.0), "scale": jnp.full((128,), -3.0)}
    new = _first_update(tx, grads, _params())
    np.testing.assert_allclose(np.asarray(new["kernel"]), 2.0 - lr * 2.0 - wd * 2.0, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(new["scale"]), 2.0 + lr * 2.0, rtol=1e-6)
    state = tx.init(_params())
    factored = state.inner[0].inner  # per_layer(chain(factor_by_logical_axes(scale_by_factored_rms), ...))
    assert factored.v_row["kernel"].shape == (128,) and factored.v["kernel"].shape == (1,)
    # Without parameter scaling, lr is an absolute step.
    absolute = optimizers.make_optimizer(name="adafactor", learning_rate=lr, multiply_by_parameter_scale=False)
    np.testing.assert_allclose(np.asarray(_first_update(absolute, grads, _params())["kernel"]), 2.0 - lr, rtol=1e-6)


def test_adamw_first_step_by_hand():
    """First Adam step is lr * g / |g| (bias-corrected); decoupled decay adds lr * wd * param on matrices."""
    lr, wd = 0.01, 0.1
    tx = optimizers.make_optimizer(name="adamw", learning_rate=lr, weight_decay=wd)
    grads = {"kernel": jnp.full((128, 128), 3.0), "scale": jnp.full((128,), -3.0)}
    new = _first_update(tx, grads, _params())
    np.testing.assert_allclose(np.asarray(new["kernel"]), 2.0 - lr * (1.0 + wd * 2.0), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(new["scale"]), 2.0 + lr, rtol=1e-6)


def test_learning_rate_scales_multiply_the_matching_parameters_steps():
    """A pretrained tower at 1/50 of the rate: its first Adam step is lr / 50 * sign(g); the rest move by lr."""
    lr = 0.01
    tx = optimizers.make_optimizer(name="adamw", learning_rate=lr, learning_rate_scales={"tower/.*": 0.02})
    params = {"tower": {"kernel": jnp.full((4, 4), 2.0)}, "decoder": {"kernel": jnp.full((4, 4), 2.0)}}
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 3.0), params)
    new = _first_update(tx, grads, params)
    np.testing.assert_allclose(np.asarray(new["tower"]["kernel"]), 2.0 - lr * 0.02, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(new["decoder"]["kernel"]), 2.0 - lr, rtol=1e-6)
    with pytest.raises(ValueError, match=r"\['towr/.\*'\] match no parameter"):
        optimizers.make_optimizer(name="adamw", learning_rate=lr, learning_rate_scales={"towr/.*": 0.1}).init(params)


def test_clip_norm_clips_the_gradient_before_the_optimizer():
    """Two AdamW steps with g1 = 100 u, g2 = u: clipped to norm |u| both become u, so the second update is
    exactly lr * sign(u); unclipped, the first big gradient dominates the moments and it is not."""
    lr = 0.01
    u = {"kernel": jnp.full((4, 4), 0.25)}  # global norm 1
    params = {"kernel": jnp.zeros((4, 4))}

    def second_update(clip_norm):
        tx = optimizers.make_optimizer(name="adamw", learning_rate=lr, clip_norm=clip_norm)

        @jax.jit
        def run(u, params):
            _, state = tx.update(jax.tree.map(lambda g: 100 * g, u), tx.init(params), params)
            updates, _ = tx.update(u, state, params)
            return updates

        return np.asarray(run(u, params)["kernel"])

    np.testing.assert_allclose(second_update(1.0), -lr, rtol=1e-4)  # float32 bias corrections
    assert np.all(np.abs(second_update(None) + lr) > 1e-2 * lr)


@pytest.mark.parametrize(
    "name, learning_rate",
    [
        ("adafactor", 1e-2),
        ("adamw", 1e-2),
        ("adafactor", optimizers.warmup_rsqrt(peak=3e-2, warmup_steps=20)),
        ("adamw", optimizers.warmup_constant(peak=1e-2, warmup_steps=20)),
    ],
)
def test_optimizers_minimise_a_quadratic(name, learning_rate):
    k1, k2, k3, k4 = jax.random.split(jax.random.key(0), 4)
    params = {"w": jax.random.normal(k1, (128, 128)), "b": jax.random.normal(k2, (16,))}
    target = {"w": 0.5 * jax.random.normal(k3, (128, 128)), "b": 0.5 * jax.random.normal(k4, (16,))}

    def loss(p):
        return sum(jnp.mean((p[k] - target[k]) ** 2) for k in p)

    tx = optimizers.make_optimizer(name=name, learning_rate=learning_rate, clip_norm=1.0)

    def step(carry, _):
        p, state = carry
        value, grads = jax.value_and_grad(loss)(p)
        updates, state = tx.update(grads, state, p)
        return (optax.apply_updates(p, updates), state), value

    (final, _), losses = jax.jit(lambda p: jax.lax.scan(step, (p, tx.init(p)), length=300))(params)
    assert float(loss(final)) < 0.05 * float(losses[0])
    assert np.all(np.diff(np.asarray(losses)[50:]) <= 1e-6)  # monotone once warmed up


def test_unknown_optimizer_name_lists_choices():
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'; choose one of adafactor, adamw"):
        optimizers.make_optimizer(name="sgd", learning_rate=1e-3)


def test_bad_optimizer_arguments():
    with pytest.raises(ValueError, match="weight_decay"):
        optimizers.make_optimizer(learning_rate=1e-3, weight_decay=-1.0)
    with pytest.raises(ValueError, match="clip_norm"):
        optimizers.make_optimizer(learning_rate=1e-3, clip_norm=0.0)


def _run(tx, params, grads_list):
    # As the Trainer does: init sees the boxed parameters, the state and steps are unboxed.
    state, updates_seen = partitioning.strip_boxes(tx.init(params)), []
    params = partitioning.strip_boxes(params)
    for grads in grads_list:
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        updates_seen.append(updates)
    return params, updates_seen, state


def _random_grads(shapes, steps, seed=0):
    rng = np.random.default_rng(seed)
    return [{k: jnp.asarray(rng.normal(size=s), jnp.float32) for k, s in shapes.items()} for _ in range(steps)]


def test_adafactor_chain_equals_optax_adafactor_without_axis_names():
    """Unnamed parameters (plain arrays): the rebuilt chain is optax.adafactor, factored by its shape rule."""
    shapes = {"kernel": (128, 256), "attention": (128, 4, 32), "scale": (128,)}
    params = {k: jnp.asarray(np.random.default_rng(1).normal(size=s), jnp.float32) for k, s in shapes.items()}
    grads = _random_grads(shapes, 4)
    ours = optimizers.make_optimizer(name="adafactor", learning_rate=0.01, weight_decay=0.1)
    reference = optax.adafactor(learning_rate=0.01, weight_decay_rate=0.1,
                                weight_decay_mask=optimizers.decay_matrices_only)
    for a, b in zip(jax.tree.leaves(_run(ours, params, grads)[0]), jax.tree.leaves(_run(reference, params, grads)[0])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_adafactor_factors_by_logical_axes_as_the_matrix_they_make():
    """Named parameters are factored as t5x's rules say: an attention kernel [embed, heads, kv] with kv=32 < 128
    (unfactored by optax's shape rule) is factored as [embed, heads * kv]; [heads, kv, embed] as its transpose; a
    scanned kernel [layers, embed, mlp] keeps statistics per layer; relative position tables and LoRA adapters
    stay unfactored, in their own shape and logical axes (so their full second moments shard as they do). Each
    update equals optax.adafactor applied to that explicit matrix."""
    d, h, k, m, layers = 128, 4, 32, 256, 3
    axes = {"query": ("embed", "heads", "kv"), "out": ("heads", "kv", "embed"), "scanned": ("layers", "embed", "mlp"),
            "relpos": ("heads", "relpos_buckets"), "scale": ("embed",), "adapter": ("embed", "lora_rank")}
    shapes = {"query": (d, h, k), "out": (h, k, d), "scanned": (layers, d, m), "relpos": (h, 32), "scale": (d,),
              "adapter": (d, 8)}
    rng = np.random.default_rng(2)
    plain = {n: jnp.asarray(rng.normal(size=s), jnp.float32) for n, s in shapes.items()}
    boxed = {n: nn.LogicallyPartitioned(v, names=axes[n]) for n, v in plain.items()}
    grads = _random_grads(shapes, 3, seed=3)
    tx = optimizers.make_optimizer(name="adafactor", learning_rate=0.01)
    boxed_state = tx.init(boxed).inner[0].inner
    assert boxed_state.v["adapter"].names == axes["adapter"] and boxed_state.v["relpos"].names == axes["relpos"]
    new, _, state = _run(tx, boxed, grads)
    inner = state.inner[0].inner  # the factored second moments
    assert inner.v_row["query"].shape == (d,) and inner.v_col["query"].shape == (h * k,)
    assert inner.v_row["out"].shape == (d,) and inner.v_col["out"].shape == (h * k,)
    assert [v.shape for v in inner.v_row["scanned"]] == [(d,)] * layers  # per layer
    assert inner.v["relpos"].shape == (h, 32) and inner.v["scale"].shape == (d,)
    assert inner.v["adapter"].shape == (d, 8)

    def as_matrix(name, x):
        return {"query": lambda a: a.reshape(d, h * k), "out": lambda a: a.reshape(h * k, d).T,
                "relpos": lambda a: a, "scale": lambda a: a, "adapter": lambda a: a}[name](x)
    reference = optax.adafactor(learning_rate=0.01)
    names = [n for n in shapes if n != "scanned"]
    expected, _, _ = _run(reference, {n: as_matrix(n, plain[n]) for n in names},
                          [{n: as_matrix(n, step[n]) for n in names} for step in grads])
    for name in names:
        np.testing.assert_allclose(np.asarray(as_matrix(name, new[name])), np.asarray(expected[name]), rtol=1e-6,
                                   atol=1e-7, err_msg=name)
    # Each layer of the scanned kernel is updated as the unscanned network's own parameter (statistics, update
    # clipping and parameter scale per layer).
    for i in range(layers):
        layer, _, _ = _run(reference, {"w": plain["scanned"][i]}, [{"w": g["scanned"][i]} for g in grads])
        np.testing.assert_allclose(np.asarray(new["scanned"][i]), np.asarray(layer["w"]), rtol=1e-6, atol=1e-7)


def test_scanned_layers_are_decayed_and_updated_as_unscanned_ones():
    """AdamW with weight decay (mask: ndim >= 2): a scanned stack of norm scales [layers, embed] is not decayed, as
    the unscanned [embed] scales are not; a scanned kernel is."""
    scales = nn.LogicallyPartitioned(jnp.ones((3, 8)), names=("layers", "embed"))
    kernel = nn.LogicallyPartitioned(jnp.ones((3, 8, 16)), names=("layers", "embed", "mlp"))
    tx = optimizers.make_optimizer(name="adamw", learning_rate=0.1, weight_decay=0.5)
    new, _, _ = _run(tx, {"scale": scales, "kernel": kernel},
                     [{"scale": jnp.ones((3, 8)), "kernel": jnp.ones((3, 8, 16))}])
    np.testing.assert_allclose(np.asarray(new["scale"]), 1.0 - 0.1, rtol=1e-5)  # Adam's first step only
    np.testing.assert_allclose(np.asarray(new["kernel"]), 1.0 - 0.1 * (1.0 + 0.5), rtol=1e-5)


def test_adafactor_factoring_rules_are_checked():
    boxed = {"w": nn.LogicallyPartitioned(jnp.zeros((128, 128)), names=("embed", "unknown_axis"))}
    with pytest.raises(ValueError, match="'unknown_axis'.*no Adafactor factoring rule"):
        optimizers.make_optimizer(learning_rate=0.01).init(boxed)
    two_batch_axes = {"w": nn.LogicallyPartitioned(jnp.zeros((2, 2, 128)), names=("layers", "layers", "mlp"))}
    with pytest.raises(ValueError, match="more than one batch axis"):
        optimizers.make_optimizer(learning_rate=0.01).init(two_batch_axes)
    # factor_rules=None: optax's shape rule leaves the 3-D attention kernel unfactored.
    kernel = {"w": nn.LogicallyPartitioned(jnp.zeros((128, 4, 32)), names=("embed", "heads", "kv"))}
    assert optimizers.make_optimizer(learning_rate=0.01, factor_rules=None).init(kernel)[0].v["w"].value.shape == (
        128, 4, 32)


def test_trainer_state_factors_every_attention_kernel():
    """Through the Trainer (init on the boxed parameters): no second moment of a T5 attention kernel [embed, heads,
    kv=64] is kept whole; optax's shape rule alone kept all 16 of this model's (kv 64 < 128), and its state held
    a float per parameter for them."""
    from gr_jax import network
    from gr_jax.models import EncoderDecoderModel
    from gr_jax.trainer import Trainer
    config = network.T5Config(vocab_size=256, emb_dim=128, num_heads=2, head_dim=64, mlp_dim=256,
                              num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0)

    def opt_state_floats(**kwargs) -> tuple[int, int]:
        trainer = Trainer(model=EncoderDecoderModel(config=config), mesh=partitioning.make_mesh(data=-1, model=1),
                          optimizer=optimizers.make_optimizer(learning_rate=1e-3, **kwargs), input_length=8,
                          target_length=4, batch_size=8)
        full = [leaf for leaf in jax.tree.leaves(trainer.abstract_state.opt_state)
                if leaf.shape in ((128, 2, 64), (2, 64, 128))]
        return len(full), sum(leaf.size for leaf in jax.tree.leaves(trainer.abstract_state.opt_state))

    by_axes, by_shape = opt_state_floats(), opt_state_floats(factor_rules=None)
    assert by_axes[0] == 0 and by_shape[0] == 4 * 3  # q, k, v, o of 2 self- and 1 cross-attention
    assert by_axes[1] < by_shape[1] / 10
