"""Training metrics that carry their own reduction (t5x's `AveragePerStep`/`Sum` metrics, without clu).

A loss returns `{name: metric}`; microbatches (inside the jitted step), steps and batches (on the host) merge
them, and `summarize` turns each into the number it reports. So the trainer averages whatever a new loss
reports without a table of names, and divides its gradients by the loss's own count (`loss_count`).

Every field is a float32 scalar (or a host float once fetched). Merging adds in the order given, as the
trainer's scan and the host loops do.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Union

import flax
import numpy as np

Scalar = Any  # a float32[] jax.Array inside the step, a numpy scalar or float on the host


@flax.struct.dataclass
class Sum:
    """A total over every part (e.g. the examples seen)."""
    total: Scalar

    def merge(self, other: AnyMetric) -> Sum:
        if not isinstance(other, Sum):
            raise TypeError(f"cannot merge a metrics.Sum with a {type(other).__name__}")
        return Sum(total=self.total + other.total)

    def compute(self) -> float:
        return float(self.total)


@flax.struct.dataclass
class Average:
    """`total / count` over every part: a loss per target token (count = its summed weights), an accuracy per
    query. A count below 1 (a batch of padding) divides by 1."""
    total: Scalar
    count: Scalar

    def merge(self, other: AnyMetric) -> Average:
        if not isinstance(other, Average):
            raise TypeError(f"cannot merge a metrics.Average with a {type(other).__name__}")
        return Average(total=self.total + other.total, count=self.count + other.count)

    def compute(self) -> float:
        return float(self.total) / max(float(self.count), 1.0)


@flax.struct.dataclass
class LastValue:
    """The last part's value (the learning rate, the gradient norm of the last step)."""
    value: Scalar

    def merge(self, other: AnyMetric) -> LastValue:
        if not isinstance(other, LastValue):
            raise TypeError(f"cannot merge a metrics.LastValue with a {type(other).__name__}")
        return other

    def compute(self) -> float:
        return float(self.value)


AnyMetric = Union[Sum, Average, LastValue]  # each merges with another of its kind and computes its reported value


def merge(a: Mapping[str, AnyMetric], b: Mapping[str, AnyMetric]) -> dict[str, AnyMetric]:
    """Merges two parts with the same names (microbatches, eval batches)."""
    if a.keys() != b.keys():
        raise ValueError(f"cannot merge metrics {sorted(a)} with {sorted(b)}")
    return {name: a[name].merge(b[name]) for name in a}


def merge_steps(steps: Sequence[Mapping[str, AnyMetric]]) -> dict[str, AnyMetric]:
    """Merges the fetched metrics of consecutive steps: each field summed over the steps in one numpy sum, a
    `LastValue` the last step's."""
    if not steps:
        raise ValueError("merge_steps got no steps")
    out: dict[str, AnyMetric] = {}
    for name, first in steps[0].items():
        parts = [step[name] for step in steps]
        if isinstance(first, LastValue):
            out[name] = parts[-1]
        else:
            out[name] = type(first)(**{field: np.sum([getattr(p, field) for p in parts])
                                       for field in first.__dataclass_fields__})
    return out


def summarize(metrics: Mapping[str, AnyMetric]) -> dict[str, float]:
    """The reported value of every metric, by name."""
    return {name: metric.compute() for name, metric in metrics.items()}


def loss_count(metrics: Mapping[str, AnyMetric]) -> Scalar:
    """What the summed loss is a sum over (target tokens, queries): the count of its `Average`, which the
    trainer's gradients are divided by (at least 1)."""
    loss = metrics.get("loss")
    if not isinstance(loss, Average):
        raise TypeError(f"a loss must report its 'loss' as a metrics.Average, got {type(loss).__name__}")
    return loss.count
