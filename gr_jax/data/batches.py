"""Training batches as a pure function of (seed, batch index), made ahead on a background thread.

Batch b of a run holds examples b*B .. b*B + B - 1 of an endless sequence of epochs, each a seeded permutation of the
examples (`SeededEpochs`): resuming at any batch costs nothing (no fast-forward), and with several hosts every host
computes the same global batch and keeps its own rows (`shard_index` of `num_shards`). The dense, GDR and host-made
generative batches (`gr_jax.data.examples`) are all made this way.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np


class SeededEpochs:
    """The examples of global batch b of an endless sequence of epochs, each a permutation of `num_examples`
    seeded by (seed, epoch): batch b holds examples b*B .. b*B + B - 1, so any batch is computed without the ones
    before it (exact resume, every host the same global batch)."""

    def __init__(self, *, num_examples: int, batch_size: int, seed: int):
        self.num_examples = num_examples
        self.batch_size = batch_size
        self.seed = seed
        self._epoch_order: tuple[int, np.ndarray] = (-1, np.zeros(0, np.int64))

    def _order(self, epoch: int) -> np.ndarray:
        if self._epoch_order[0] != epoch:
            self._epoch_order = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.num_examples))
        return self._epoch_order[1]

    def indices(self, batch: int) -> np.ndarray:
        """int64[batch_size]: the examples of global batch `batch`."""
        positions = np.arange(batch * self.batch_size, (batch + 1) * self.batch_size)
        epochs, within = np.divmod(positions, self.num_examples)
        return np.array([self._order(int(e))[int(w)] for e, w in zip(epochs, within)], np.int64)


def sharded_batches(batch: Callable[..., dict], *, batch_size: int, start_batch: int, shard_index: int,
                    num_shards: int, prefetch: int) -> Iterator[dict]:
    """`batch(b, shard_index=..., num_shards=...)` for b = start_batch, start_batch + 1, ..., made `prefetch` ahead
    on a background thread (tokenisation and file reads release the GIL)."""
    if batch_size % num_shards:
        raise ValueError(f"the global batch_size={batch_size} must be a multiple of num_shards={num_shards}")
    if start_batch < 0:
        raise ValueError(f"start_batch must be >= 0, got {start_batch}")
    return _prefetched((batch(b, shard_index=shard_index, num_shards=num_shards) for b in _count(start_batch)),
                       size=prefetch)


def _count(start: int) -> Iterator[int]:
    while True:
        yield start
        start += 1


def _prefetched(items: Iterator, *, size: int) -> Iterator:
    """`items` produced up to `size` ahead on a daemon thread; an exception there is raised here."""
    if size < 1:
        yield from items
        return
    buffer: queue.Queue = queue.Queue(maxsize=size)
    stop = threading.Event()

    def offer(entry: tuple[bool, Any]) -> bool:
        """Puts `entry` once there is room; False when the consumer stopped first."""
        while not stop.is_set():
            try:
                buffer.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            for item in items:
                if not offer((True, item)):
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            offer((False, e))

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        while True:
            ok, item = buffer.get()
            if not ok:
                raise item
            yield item
    finally:
        # Closed: the producer stops after the item it is making. Joined, so no read is in flight when the process
        # exits (a native reader's threads, e.g. ArrayRecord's, abort the process if torn down mid-read).
        stop.set()
        producer.join()
