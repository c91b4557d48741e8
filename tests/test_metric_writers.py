"""Event files written by MetricWriter, read back with TensorFlow's own event-file reader."""
import logging
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from gr_jax import metric_writers


def _read_events(logdir):
    """[(step, tag, plugin_name, value)] from every event file under `logdir`, in file order."""
    records = []
    for path in sorted(tf.io.gfile.glob(f"{logdir}/events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                array = tf.make_ndarray(value.tensor)
                if array.dtype == object:
                    array = array.item().decode("utf-8")
                else:
                    array = float(array)
                records.append((event.step, value.tag, value.metadata.plugin_data.plugin_name, array))
    return records


def test_scalars_texts_and_hparams_round_trip(tmp_path):
    logdir = tmp_path / "run"
    with metric_writers.create_writer(logdir) as writer:
        writer.write_texts(0, {"config": "TRAIN_STEPS = 100\nmake_optimizer.name = 'adafactor'"})
        writer.write_hparams({"learning_rate": 1e-3, "optimizer": "adafactor"})
        writer.write_scalars(
            10,
            {
                "train/loss": 2.5,
                "train/token_accuracy": np.float32(0.25),
                "train/learning_rate": jnp.array(1e-4),
                "train/steps_per_second": jnp.array([3.0]),
                "train/tokens_per_second": 12345,
            },
        )
        writer.write_scalars(20, {"train/loss": 1.25})
        writer.flush()
        # Readable after flush, before close.
        assert any(tag == "train/loss" for _, tag, _, _ in _read_events(logdir))

    records = _read_events(logdir)
    scalars = {(step, tag): value for step, tag, plugin, value in records if plugin == "scalars"}
    assert scalars.keys() == {
        (10, "train/loss"),
        (10, "train/token_accuracy"),
        (10, "train/learning_rate"),
        (10, "train/steps_per_second"),
        (10, "train/tokens_per_second"),
        (20, "train/loss"),
    }
    assert scalars[(10, "train/loss")] == 2.5
    assert scalars[(10, "train/token_accuracy")] == 0.25
    assert scalars[(10, "train/learning_rate")] == pytest.approx(1e-4, rel=1e-6)
    assert scalars[(10, "train/steps_per_second")] == 3.0
    assert scalars[(10, "train/tokens_per_second")] == 12345.0
    assert scalars[(20, "train/loss")] == 1.25
    texts = {tag: (step, value) for step, tag, plugin, value in records if plugin == "text"}
    assert texts["config"] == (0, "TRAIN_STEPS = 100\nmake_optimizer.name = 'adafactor'")
    step, table = texts["hparams"]
    assert step == 0
    assert "| learning_rate | 0.001 |" in table and "| optimizer | 'adafactor' |" in table


def test_console_log_and_just_logging(tmp_path, caplog):
    logdir = tmp_path / "other_process"
    with caplog.at_level(logging.INFO, logger="gr_jax.metric_writers"):
        with metric_writers.create_writer(logdir, just_logging=True) as writer:
            writer.write_scalars(7, {"train/loss": 0.5, "train/learning_rate": 1e-4})
            writer.flush()
    assert "[7] train/loss=0.5, train/learning_rate=1.0000e-04" in caplog.text
    # A non-zero process (just_logging) leaves no event file behind.
    assert not logdir.exists() or not list(logdir.iterdir())


def test_bad_values_are_rejected(tmp_path):
    with metric_writers.create_writer(tmp_path) as writer:
        with pytest.raises(ValueError, match="'train/loss' has shape \\(2,\\)"):
            writer.write_scalars(1, {"train/loss": np.array([1.0, 2.0])})
        with pytest.raises(TypeError, match="'config' must be a str"):
            writer.write_texts(1, {"config": 3})


def test_writes_without_tensorflow(tmp_path):
    """A JAX-only host (no TensorFlow importable) writes the same event files."""
    logdir = tmp_path / "jax_only"
    script = ("import sys; sys.modules['tensorflow'] = None\n"  # any `import tensorflow` now fails
              "from gr_jax import metric_writers\n"
              f"with metric_writers.create_writer({str(logdir)!r}) as writer:\n"
              "    writer.write_scalars(3, {'train/loss': 0.75})\n"
              "    writer.write_texts(0, {'config': 'x = 1'})\n"
              "assert 'tensorflow' not in {m.split('.')[0] for m, v in sys.modules.items() if v is not None}\n")
    subprocess.run([sys.executable, "-c", script], check=True)
    records = _read_events(logdir)
    assert (3, "train/loss", "scalars", 0.75) in records
    assert (0, "config", "text", "x = 1") in records
