"""Training metrics to TensorBoard event files (process 0 only) and to the console log.

Same interface as `clu.metric_writers` (`write_scalars(step, {...})`, `write_texts`, `write_hparams`,
`flush`, `close`), but built directly on TensorFlow's core summary ops: with TensorFlow >= 2.21 the
`tensorboard` package is no longer a TensorFlow dependency, and without it neither
`clu.metric_writers` nor `tf.summary.scalar` can be imported or used. `tf.summary.write` with the
TensorBoard plugin metadata writes exactly the records `tf.summary.scalar` / `tf.summary.text`
would, so TensorBoard shows scalars under "Scalars" and texts (markdown) under "Text".
"""
from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

logger = logging.getLogger(__name__)

_tf = None


def _tensorflow():
    """TensorFlow, imported on first use and kept off the accelerators (jax owns them)."""
    global _tf
    if _tf is None:
        import tensorflow as tf

        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError:  # TF's runtime is already initialised (e.g. by tf.data): leave it as it is.
            pass
        _tf = tf
    return _tf


def _metadata(plugin_name: str, data_class: int):
    from tensorflow.core.framework import summary_pb2

    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin_name), data_class=data_class
    )


def _scalar(name: str, value: Any) -> float:
    array = np.asarray(jax.device_get(value))
    if array.size != 1:
        raise ValueError(f"scalar metric {name!r} has shape {array.shape}; expected a single value")
    return float(array.reshape(()))


class MetricWriter:
    """Writes summaries under `logdir` (TensorBoard event files) and logs them as one line per call.

    `write_to_disk=False` (the default on processes other than 0) only logs, so a multi-host job
    writes one set of event files.
    """

    def __init__(self, logdir: str | os.PathLike, *, write_to_disk: bool | None = None, log_to_console: bool = True):
        self.logdir = os.fspath(logdir)
        self.write_to_disk = jax.process_index() == 0 if write_to_disk is None else write_to_disk
        self.log_to_console = log_to_console
        self._writer = None
        if self.write_to_disk:
            tf = _tensorflow()
            self._writer = tf.summary.create_file_writer(self.logdir)

    def _write(self, step: int, tag: str, tensor, metadata) -> None:
        tf = _tensorflow()
        with self._writer.as_default():
            tf.summary.write(tag=tag, tensor=tensor, step=int(step), metadata=metadata)

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        """`scalars`: name -> number (Python, numpy or a one-element jax array), e.g. 'train/loss'."""
        values = {name: _scalar(name, value) for name, value in scalars.items()}
        if self.log_to_console:
            logger.info("[%d] %s", step, ", ".join(f"{k}={_format(v)}" for k, v in values.items()))
        if self._writer is not None:
            tf = _tensorflow()
            metadata = _metadata("scalars", 1)  # DATA_CLASS_SCALAR
            for name, value in values.items():
                self._write(step, name, tf.constant(value, tf.float32), metadata)

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """`texts`: name -> markdown string (e.g. the operative gin config)."""
        for name, text in texts.items():
            if not isinstance(text, str):
                raise TypeError(f"text summary {name!r} must be a str, got {type(text).__name__}")
        if self.log_to_console:
            for name, text in texts.items():
                logger.info("[%d] %s:\n%s", step, name, text)
        if self._writer is not None:
            tf = _tensorflow()
            metadata = _metadata("text", 2)  # DATA_CLASS_TENSOR
            for name, text in texts.items():
                self._write(step, name, tf.constant(text), metadata)

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Hyper-parameters as a markdown table in the text summary 'hparams' at step 0."""
        rows = "\n".join(f"| {name} | {value!r} |" for name, value in sorted(hparams.items()))
        self.write_texts(0, {"hparams": f"| name | value |\n|---|---|\n{rows}"})

    def flush(self) -> None:
        """Makes everything written so far readable on disk."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> MetricWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _format(value: float) -> str:
    if value != 0 and math.isfinite(value) and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.4e}"
    return f"{value:.6g}"


def create_writer(logdir: str | os.PathLike, *, just_logging: bool | None = None) -> MetricWriter:
    """Like `clu.metric_writers.create_default_writer`: files on process 0 only, logging everywhere."""
    write_to_disk = None if just_logging is None else not just_logging
    return MetricWriter(logdir, write_to_disk=write_to_disk)
