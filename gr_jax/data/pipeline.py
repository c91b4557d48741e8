"""numpy batches of model features from a registered seqio Task or Mixture, for training and evaluation.

Features (seqio `EncDecFeatureConverter`, unpacked), each `int32[batch, length]`:
    encoder_input_tokens   [batch, input_length]    the inputs, PAD-padded
    decoder_target_tokens  [batch, target_length]   the docid tokens + EOS, PAD-padded
    decoder_input_tokens   [batch, target_length]   targets shifted right, starting with the decoder start (PAD)
    decoder_loss_weights   [batch, target_length]   1 on target tokens, 0 on padding

Multi-host: every host calls with the same arguments and its own `shard_index` (`jax.process_index()`) of
`num_shards` (`jax.process_count()`); `batch_size` is the *global* batch, as in t5x, and each host yields its
`batch_size // num_shards` rows. Examples are sharded before preprocessing (seqio `ShardInfo`), so hosts
never see the same example, and every host yields the same number of batches.

TensorFlow only feeds data here: it is kept off accelerators on import (see `_keep_tensorflow_on_cpu`).
"""
from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import seqio
import tensorflow as tf

logger = logging.getLogger(__name__)

FEATURES = ("encoder_input_tokens", "decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights")
EXAMPLE_MASK = "example_mask"


def _keep_tensorflow_on_cpu() -> None:
    """Hides GPUs from TensorFlow, which would otherwise reserve most of their memory that JAX needs (as t5x does).

    Must run before TensorFlow creates its first tensor; entry points that touch TensorFlow earlier should
    import this module first. If it is too late, a warning says so.
    """
    if not tf.config.list_physical_devices("GPU"):
        return
    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError as e:  # TensorFlow's devices are already initialised.
        logger.warning("could not hide GPUs from TensorFlow (import gr_jax.data.pipeline earlier): %s", e)


_keep_tensorflow_on_cpu()


def _feature_lengths(*, input_length: int, target_length: int) -> dict[str, int]:
    return {"inputs": input_length, "targets": target_length}


def _host_batch_size(*, batch_size: int, shard_index: int, num_shards: int) -> int:
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index={shard_index} must be in [0, num_shards={num_shards})")
    if batch_size < 1 or batch_size % num_shards:
        raise ValueError(f"the global batch_size={batch_size} must be a positive multiple of num_shards={num_shards}")
    return batch_size // num_shards


def _shard_info(*, shard_index: int, num_shards: int) -> seqio.ShardInfo | None:
    return seqio.ShardInfo(index=shard_index, num_shards=num_shards) if num_shards > 1 else None


def _with_options(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Order-preserving tf.data whatever the parallelism (the basis of reproducible, resumable runs), with
    consecutive per-example maps fused (seqio chains many small ones; fusing saves ~20% on 2 cores)."""
    options = tf.data.Options()
    options.deterministic = True
    options.experimental_optimization.map_fusion = True
    return dataset.with_options(options)


def train_batches(
        *,
        mixture_or_task_name: str,
        batch_size: int,
        input_length: int,
        target_length: int,
        seed: int,
        start_batch: int = 0,
        shard_index: int = 0,
        num_shards: int = 1,
) -> Iterator[dict[str, np.ndarray]]:
    """Endless shuffled training batches: `{feature: int32[batch_size // num_shards, length]}` (see module doc).

    The order is a function of (`seed`, `num_shards`, `shard_index`) alone: seqio's shuffle buffers and
    mixture sampling are seeded, and tf.data is kept deterministic. `start_batch=k` resumes after a restart
    at exactly the k-th batch of a fresh run (no example skipped or repeated) by fast-forwarding the
    pipeline, which costs preprocessing time linear in `k` but no model time. Incomplete batches never
    occur (the data repeats forever, so `drop_remainder` drops nothing).
    """
    host_batch = _host_batch_size(batch_size=batch_size, shard_index=shard_index, num_shards=num_shards)
    if start_batch < 0:
        raise ValueError(f"start_batch must be >= 0, got {start_batch}")
    dataset = seqio.get_dataset(
        mixture_or_task_name,
        task_feature_lengths=_feature_lengths(input_length=input_length, target_length=target_length),
        feature_converter=seqio.EncDecFeatureConverter(pack=False),
        dataset_split="train",
        shuffle=True,
        num_epochs=None,
        shard_info=_shard_info(shard_index=shard_index, num_shards=num_shards),
        seed=seed,
        verbose=False,
    )
    dataset = dataset.batch(host_batch, drop_remainder=True).skip(start_batch)
    return _with_options(dataset).prefetch(tf.data.AUTOTUNE).as_numpy_iterator()


def _num_examples(provider: seqio.Task, *, split: str) -> int | None:
    count = provider.num_input_examples(split)
    return None if count is None else int(count)


def eval_batches(
        *,
        mixture_or_task_name: str,
        batch_size: int,
        input_length: int,
        target_length: int,
        split: str = "validation",
        shard_index: int = 0,
        num_shards: int = 1,
) -> Iterator[dict[str, np.ndarray]]:
    """One unshuffled pass over `split`: the features plus `example_mask: bool[batch_size // num_shards]`.

    Nothing is dropped: the last batch is filled with all-PAD rows (zero loss weights) whose mask is False.
    A Mixture is evaluated as the concatenation of its tasks that have `split` (sorted by name), each in
    full, instead of sampling from them. With several hosts every host yields the same number of batches
    (hosts with fewer examples add fully masked ones), computed from the tasks' declared example counts
    (`num_input_examples`, exact for the one-example-per-input tasks of `tasks/`: FirstP and labeled queries; DaQ
    and D2Q expand each input into several examples, so a multi-host pass over them raises); a host whose stream
    does not match its expected count raises instead of yielding a different number of batches.
    """
    host_batch = _host_batch_size(batch_size=batch_size, shard_index=shard_index, num_shards=num_shards)
    provider = seqio.get_mixture_or_task(mixture_or_task_name)
    task_list = [task for task in seqio.get_subtasks(provider) if split in task.splits]
    if not task_list:
        raise ValueError(f"{mixture_or_task_name!r} has no task with a {split!r} split")
    lengths = _feature_lengths(input_length=input_length, target_length=target_length)
    shard_info = _shard_info(shard_index=shard_index, num_shards=num_shards)
    dataset = None
    for task in task_list:
        task_dataset = seqio.get_dataset(
            task, task_feature_lengths=lengths, feature_converter=seqio.EncDecFeatureConverter(pack=False),
            dataset_split=split, shuffle=False, num_epochs=1, shard_info=shard_info, verbose=False)
        dataset = task_dataset if dataset is None else dataset.concatenate(task_dataset)

    expected_batches = expected_examples = None
    if num_shards > 1:
        counts = {task.name: _num_examples(task, split=split) for task in task_list}
        if any(count is None for count in counts.values()):
            raise ValueError(f"multi-host evaluation needs every task's example count for split {split!r} "
                             f"(seqio num_input_examples); missing for {[n for n, c in counts.items() if c is None]}")
        # tf.data's shard(n, i) keeps examples i, i + n, ...: host i gets ceil((count - i) / n) of each task.
        expected_examples = sum((c - shard_index + num_shards - 1) // num_shards for c in counts.values())
        largest_host = sum((c + num_shards - 1) // num_shards for c in counts.values())
        expected_batches = -(-largest_host // host_batch)

    widths = {name: target_length for name in FEATURES} | {"encoder_input_tokens": input_length}
    return _padded_eval_batches(
        _with_options(dataset.batch(host_batch)), host_batch=host_batch, widths=widths,
        expected_examples=expected_examples, expected_batches=expected_batches,
        where=f"host {shard_index} of {num_shards}, {mixture_or_task_name!r}:{split}")


def _padded_eval_batches(
        dataset: tf.data.Dataset,
        *,
        host_batch: int,
        expected_examples: int | None,
        expected_batches: int | None,
        widths: dict[str, int],
        where: str,
) -> Iterator[dict[str, np.ndarray]]:
    """Pads the batches of `dataset` (the last may be short) and appends fully masked ones up to
    `expected_batches`, checking that exactly `expected_examples` examples arrived (when given)."""
    yielded = seen = 0
    for batch in dataset.as_numpy_iterator():
        rows = len(batch[FEATURES[0]])
        seen += rows
        if expected_examples is not None and seen > expected_examples:
            raise RuntimeError(f"{where}: read more than the {expected_examples} examples of its share; the "
                               f"tasks' declared example counts (num_input_examples) are wrong")
        yield _pad_batch(batch, host_batch=host_batch)
        yielded += 1
    if expected_examples is not None:
        if seen != expected_examples:
            raise RuntimeError(f"{where}: read {seen} examples, expected {expected_examples} from the tasks' "
                               f"declared example counts (num_input_examples)")
        empty = _pad_batch({name: np.zeros((0, width), np.int32) for name, width in widths.items()},
                           host_batch=host_batch)
        for _ in range(expected_batches - yielded):
            yield {name: value.copy() for name, value in empty.items()}


def _pad_batch(batch: dict[str, np.ndarray], *, host_batch: int) -> dict[str, np.ndarray]:
    """Pads every feature to `host_batch` rows with zeros (PAD, zero loss weight) and adds `example_mask`."""
    rows = len(batch[FEATURES[0]])
    padded = {name: np.pad(batch[name], ((0, host_batch - rows), (0, 0))) for name in FEATURES}
    padded[EXAMPLE_MASK] = np.arange(host_batch) < rows
    return padded
