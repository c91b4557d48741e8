"""Schedules against hand-computed values; Adafactor/AdamW first steps by hand; both minimise a quadratic."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gr_jax import optimizers


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
    assert state[0].v_row["kernel"].shape == (128,) and state[0].v["kernel"].shape == (1,)  # factored
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
