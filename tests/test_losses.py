"""The token cross entropy's hand-written gradient against autodiff of its definition."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax import losses


def _by_definition(logits, targets, z_loss):
    """-log softmax(logits)[target] + z_loss * log(Z)^2, and the z part, differentiated by JAX."""
    logits = logits.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    nll = -jnp.sum(jax.nn.one_hot(targets, logits.shape[-1]) * log_probs, axis=-1)
    return nll + z_loss * log_z ** 2, z_loss * log_z ** 2


@pytest.mark.parametrize("z_loss", [0.0, 1e-4, 0.3])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_cross_entropy_value_and_gradient_equal_autodiff_of_the_definition(z_loss, dtype):
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(3, 5, 40)) * 4, dtype)
    logits = logits.at[0, 0, :20].set(-1e9)  # masked columns (an atomic head's padding rows) get no gradient
    targets = jnp.asarray(rng.integers(20, 40, size=(3, 5)), jnp.int32)
    # Cotangents for both outputs: the loss is summed with weights, the z part is logged (and may be differentiated).
    weights, z_weights = (jnp.asarray(rng.normal(size=(3, 5)), jnp.float32) for _ in range(2))

    def objective(loss_fn):
        def f(x):
            total, z = loss_fn(x, targets, z_loss)
            return jnp.sum(total * weights) + jnp.sum(z * z_weights)
        return f

    ours = lambda x, t, z: losses.cross_entropy_with_z_loss(x, t, z_loss=z)  # noqa: E731
    tol = 1e-5 if dtype == jnp.float32 else 1e-2
    for a, b in zip(ours(logits, targets, z_loss), _by_definition(logits, targets, z_loss)):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    grad, expected = jax.grad(objective(ours))(logits), jax.grad(objective(_by_definition))(logits)
    assert grad.dtype == dtype
    np.testing.assert_allclose(np.asarray(grad, np.float32), np.asarray(expected, np.float32), rtol=tol, atol=tol)
    np.testing.assert_array_equal(np.asarray(grad[0, 0, :20], np.float32), 0.0)
