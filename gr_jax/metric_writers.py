"""Training metrics to TensorBoard event files (process 0 only) and to the console log.

Same interface as `clu.metric_writers` (`write_scalars(step, {...})`, `write_texts`, `write_hparams`,
`flush`, `close`), built on the `tensorboard` package's own event-file writer and summary protos, so that a
JAX-only host (a GPU or TPU image without TensorFlow) writes the same files. The records are those
`tf.summary.scalar` / `tf.summary.text` write (tensor summaries with the scalars / text plugin metadata), so
TensorBoard shows scalars under "Scalars" and texts (markdown) under "Text"; the tests read them back with
TensorFlow's own reader.
"""
from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.compat.proto import tensor_pb2
from tensorboard.compat.proto import tensor_shape_pb2
from tensorboard.compat.proto import types_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from gr_jax import logs

logger = logging.getLogger(__name__)

_SCALARS = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
                                       data_class=summary_pb2.DATA_CLASS_SCALAR)
_TEXT = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"),
                                    data_class=summary_pb2.DATA_CLASS_TENSOR)
_SCALAR_SHAPE = tensor_shape_pb2.TensorShapeProto()


def _scalar_tensor(value: float) -> tensor_pb2.TensorProto:
    return tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=_SCALAR_SHAPE, float_val=[value])


def _text_tensor(text: str) -> tensor_pb2.TensorProto:
    return tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, tensor_shape=_SCALAR_SHAPE,
                                  string_val=[text.encode("utf-8")])


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
        self._writer = EventFileWriter(self.logdir) if self.write_to_disk else None

    @staticmethod
    def _write(writer: EventFileWriter, step: int, values: list[summary_pb2.Summary.Value]) -> None:
        summary = summary_pb2.Summary(value=values)
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        """`scalars`: name -> number (Python, numpy or a one-element jax array), e.g. 'train/loss'."""
        values = {name: _scalar(name, value) for name, value in scalars.items()}
        if self.log_to_console:
            logger.info("[%d] %s", step, ", ".join(f"{k}={_format(v)}" for k, v in values.items()))
        if self._writer is not None:
            self._write(self._writer, step, [
                summary_pb2.Summary.Value(tag=name, tensor=_scalar_tensor(value), metadata=_SCALARS)
                for name, value in values.items()])

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """`texts`: name -> markdown string (e.g. the operative gin config)."""
        for name, text in texts.items():
            if not isinstance(text, str):
                raise TypeError(f"text summary {name!r} must be a str, got {type(text).__name__}")
        if self.log_to_console:
            for name, text in texts.items():
                logger.info("[%d] %s:\n%s", step, name, text, extra=logs.FILE_ONLY)
        if self._writer is not None:
            self._write(self._writer, step, [
                summary_pb2.Summary.Value(tag=name, tensor=_text_tensor(text), metadata=_TEXT)
                for name, text in texts.items()])

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
