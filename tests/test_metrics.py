"""gr_jax.metrics: each metric merges and reports by its own reduction, and the trainer averages a loss's new
metric and divides its gradients by the loss's own count without a table of names."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gr_jax import metrics
from gr_jax import partitioning
from gr_jax.metrics import Average, LastValue, Sum
from gr_jax.trainer import Trainer


def test_each_metric_merges_and_reports_by_its_own_reduction():
    parts = [{"loss": Average(total=6.0, count=4.0), "seen": Sum(total=4.0), "lr": LastValue(value=0.1)},
             {"loss": Average(total=2.0, count=0.0), "seen": Sum(total=0.0), "lr": LastValue(value=0.2)},
             {"loss": Average(total=1.0, count=1.0), "seen": Sum(total=1.0), "lr": LastValue(value=0.3)}]
    expected = {"loss": (6.0 + 2.0 + 1.0) / 5.0, "seen": 5.0, "lr": 0.3}
    merged = parts[0]
    for part in parts[1:]:
        merged = metrics.merge(merged, part)
    assert metrics.summarize(merged) == pytest.approx(expected)
    assert metrics.summarize(metrics.merge_steps(parts)) == pytest.approx(expected)
    # A count below 1 (a batch of padding) divides by 1, not by 0.
    assert Average(total=3.0, count=0.0).compute() == 3.0
    with pytest.raises(ValueError, match="cannot merge"):
        metrics.merge(parts[0], {"loss": parts[0]["loss"]})
    # A name reported with another reduction in another part is an error, not a Sum that silently drops a count.
    swapped = {"loss": Sum(total=2.0), "seen": Average(total=0.0, count=1.0), "lr": Sum(total=0.2)}
    for name in swapped:
        with pytest.raises(TypeError, match=f"cannot merge a metrics.{type(parts[0][name]).__name__} with a "
                                            f"{type(swapped[name]).__name__}"):
            metrics.merge(parts[0], {**parts[0], name: swapped[name]})


def test_steps_are_merged_in_one_float32_sum_per_field():
    rng = np.random.default_rng(0)
    totals, counts = rng.normal(size=7).astype(np.float32), rng.integers(1, 9, 7).astype(np.float32)
    steps = [{"loss": Average(total=t, count=c)} for t, c in zip(totals, counts)]
    merged = metrics.merge_steps(steps)["loss"]
    assert merged.total == np.sum(totals) and merged.count == np.sum(counts)


class _LeastSquares:
    """A trainable model of one weight vector whose loss reports a metric no table names: `residual` (the
    summed |error| per example) beside the summed squared error per example."""

    def init(self, rng, *, input_length, target_length):
        del rng, target_length
        return {"params": {"w": jnp.zeros((input_length,), jnp.float32)}}

    def loss_fn(self, params, batch, dropout_rng):
        del dropout_rng
        error = batch["x"] @ params["w"] - batch["y"]
        examples = jnp.float32(error.shape[0])
        loss = jnp.sum(error ** 2)
        return loss, {"loss": Average(total=loss, count=examples),
                      "residual": Average(total=jnp.sum(jnp.abs(error)), count=examples)}


def test_the_trainer_averages_a_new_metric_and_divides_the_gradient_by_the_losss_count():
    mesh = partitioning.make_mesh(data=1, model=1, devices=jax.devices()[:1])
    x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    y = np.array([1.0, -1.0, 2.0, 0.5], np.float32)
    trainer = Trainer(model=_LeastSquares(), optimizer=optax.sgd(1.0), mesh=mesh, input_length=3, target_length=1,
                      batch_size=4, learning_rate_fn=lambda step: jnp.float32(1.0))
    state = trainer.init_state(jax.random.PRNGKey(0))
    state, step_metrics = trainer.train_step(state, {"x": x, "y": y}, jax.random.PRNGKey(0))
    # At w = 0: the mean squared error and mean |error| over the 4 examples; SGD at rate 1 steps by the gradient
    # of the mean, 2 x^T (x w - y) / 4.
    summary = metrics.summarize(jax.device_get(step_metrics))
    assert summary["loss"] == pytest.approx(np.mean(y ** 2)) and summary["residual"] == pytest.approx(
        np.mean(np.abs(y)))
    grad = 2 * x.T @ (-y) / 4
    np.testing.assert_allclose(state.params["w"], -grad, rtol=1e-6)
    assert summary["grad_norm"] == pytest.approx(np.linalg.norm(grad), rel=1e-6) and summary["learning_rate"] == 1.0
    assert trainer.evaluate_loss(state.params, iter([{"x": x, "y": y}] * 2))["residual"] == pytest.approx(
        np.mean(np.abs(x @ np.asarray(state.params["w"]) - y)), rel=1e-6)


def test_a_loss_must_report_its_loss_as_an_average():
    with pytest.raises(TypeError, match="'loss' as a metrics.Average, got Sum"):
        metrics.loss_count({"loss": Sum(total=1.0)})
