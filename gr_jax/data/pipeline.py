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

Resuming (`TrainBatches`): the training iterator's tf.data state is saved with every model checkpoint, one file set
per process named as t5x's (`train_ds-{process_index}-of-{process_count}`), and read back on restart, so a resumed
run continues at the exact next example in time independent of the step (`gr_jax.checkpoints` stores it beside the
orbax step). Where a checkpoint holds no such state, the iterator re-reads the consumed batches instead: exact too,
in time linear in the step.

TensorFlow only feeds data here: it is kept off accelerators on import (see `_keep_tensorflow_on_cpu`).
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

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
) -> TrainBatches:
    """Endless shuffled training batches: `{feature: int32[batch_size // num_shards, length]}` (see module doc).

    The order is a function of (`seed`, `num_shards`, `shard_index`) alone: seqio's shuffle buffers and
    mixture sampling are seeded, and tf.data is kept deterministic. `start_batch=k` resumes after a restart
    at exactly the k-th batch of a fresh run (no example skipped or repeated): by reading the iterator state
    saved at batch k when the caller has one (`TrainBatches.restore_input_state`, time independent of k), else
    by re-reading the first k batches on the first `next` (time linear in k, no model time). Incomplete
    batches never occur (the data repeats forever, so `drop_remainder` drops nothing).
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
    # No `skip` in the graph: the saved iterator state is only valid for the graph it was saved from, so every
    # run of a config builds the same one, and a resume without state skips in `TrainBatches` instead.
    dataset = _with_options(dataset.batch(host_batch, drop_remainder=True)).prefetch(tf.data.AUTOTUNE)
    stream = {"mixture_or_task_name": mixture_or_task_name, "batch_size": batch_size, "input_length": input_length,
              "target_length": target_length, "seed": seed, "shard_index": shard_index, "num_shards": num_shards}
    return TrainBatches(dataset, stream=stream, start_batch=start_batch)


def state_name(*, shard_index: int, num_shards: int) -> str:
    """The file prefix of one process's iterator state in a checkpoint (t5x's name)."""
    return f"train_ds-{shard_index}-of-{num_shards}"


# Errors of tf.data's SerializeIterator for a pipeline that holds state it cannot save: a Python generator source
# (`from_generator`: the documents and D2Q sources of tasks/) still being read, i.e. before its in-memory cache is
# complete, and always for an uncached stream.
_UNSAVEABLE = (tf.errors.FailedPreconditionError, tf.errors.UnimplementedError)


class TrainBatches(Iterator[dict[str, np.ndarray]]):
    """The training batches of `train_batches`: a real tf.data iterator (not `as_numpy_iterator`, whose state
    cannot be saved), each element converted to numpy here, whose position can be saved and restored.

    `stream` names the batch sequence (mixture, global batch, lengths, seed, shard of num_shards): a state is only
    restored into the same stream. `batches_consumed` counts from the fresh run's first batch. The tf.data iterator
    starts on the first `next` (re-reading `start_batch` batches then) or on `restore_input_state`, so a run that
    restores its state never re-reads.
    """

    def __init__(self, dataset: tf.data.Dataset, *, stream: dict[str, Any], start_batch: int):
        self._dataset = dataset
        self.stream = dict(stream)
        self._pending_skip = start_batch
        self._consumed = start_batch
        self._iterator: Iterator[Any] | None = None  # tf.data's, started by the first `next` or a restore
        self.name = state_name(shard_index=stream["shard_index"], num_shards=stream["num_shards"])

    @property
    def batches_consumed(self) -> int:
        """Batches of the fresh run before the next one (the start batch plus those yielded)."""
        return self._consumed

    def _tf_iterator(self) -> Iterator[Any]:
        if self._iterator is None:
            self._iterator = iterator = iter(self._dataset)
            if self._pending_skip:
                logger.info("%s: re-reading %d batches to resume there (no saved iterator state)", self.name,
                            self._pending_skip)
                for _ in range(self._pending_skip):
                    next(iterator)
                self._pending_skip = 0
        return self._iterator

    def __iter__(self) -> TrainBatches:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        element = next(self._tf_iterator())
        self._consumed += 1
        return {name: value.numpy() for name, value in element.items()}

    def save_input_state(self, directory: str) -> None:
        """Writes this process's state after `batches_consumed` batches into `directory` (synchronously):
        `{name}.index` / `{name}.data-*` (tf.train.Checkpoint of the iterator) and `{name}.json` (the stream and
        position). A pipeline whose state tf.data cannot save (see `_UNSAVEABLE`) gets only the JSON, saying why,
        and a warning: a resume from that checkpoint re-reads instead."""
        prefix = os.path.join(directory, self.name)
        record: dict[str, Any] = {**self.stream, "batches_consumed": self._consumed}
        try:
            tf.train.Checkpoint(iterator=self._tf_iterator()).write(prefix)
            record["state"] = True
        except _UNSAVEABLE as e:
            for path in tf.io.gfile.glob(prefix + ".*"):
                tf.io.gfile.remove(path)
            reason = str(e.message).strip().splitlines()[0] if e.message else type(e).__name__
            record |= {"state": False, "reason": reason}
            logger.warning("%s: tf.data cannot save the input iterator after batch %d (%s: a generator source is "
                           "still being read before its in-memory cache is complete, or streams every epoch); a "
                           "resume from this checkpoint re-reads its batches instead", self.name, self._consumed,
                           reason)
        with tf.io.gfile.GFile(prefix + ".json", "w") as f:
            f.write(json.dumps(record, sort_keys=True))

    def restore_input_state(self, directory: str) -> bool:
        """Continues from the state saved in `directory` (by `save_input_state` of a run of the same stream at
        this `start_batch`); returns False, with a warning, when that save could not keep the iterator state (the
        first `next` then re-reads). Raises, naming the file, when `directory` has no state of this process
        (another process count saved it) or one of another stream or position: never resumes anywhere else."""
        if self._iterator is not None:
            raise RuntimeError(f"{self.name}: restore_input_state after the iterator started")
        prefix = os.path.join(directory, self.name)
        if not tf.io.gfile.exists(prefix + ".json"):
            saved = sorted(os.path.basename(p)[:-len(".json")] for p in tf.io.gfile.glob(
                os.path.join(directory, "train_ds-*-of-*.json")))
            raise FileNotFoundError(
                f"{prefix}.json: no input iterator state of process {self.stream['shard_index']} of "
                f"{self.stream['num_shards']} (the checkpoint has {saved or 'none'}). A seqio stream is split by "
                f"process count, so a run cannot continue another count's streams exactly: resume with the count "
                f"that saved it, or train in a new model_dir starting from this one (Experiment.init_checkpoint)")
        with tf.io.gfile.GFile(prefix + ".json") as f:
            record = json.loads(f.read())
        different = {key: (record.get(key), value) for key, value in self.stream.items() if record.get(key) != value}
        if different:
            raise ValueError(f"{prefix}.json: saved for another input stream; (saved, this run): {different}")
        if record.get("batches_consumed") != self._consumed:
            raise ValueError(f"{prefix}.json: the iterator state is after batch {record.get('batches_consumed')}, "
                             f"but the checkpoint's input position is batch {self._consumed}")
        if not record.get("state"):
            logger.warning("%s.json: no iterator state was saved (%s); re-reading %d batches to resume", prefix,
                           record.get("reason"), self._pending_skip)
            return False
        iterator = iter(self._dataset)
        try:
            tf.train.Checkpoint(iterator=iterator).read(prefix).assert_consumed()
        except (tf.errors.OpError, AssertionError, ValueError) as e:
            raise ValueError(f"{prefix}: cannot restore the input iterator state into this pipeline (was the task's "
                             f"preprocessing changed?): {e}") from e
        self._iterator, self._pending_skip = iterator, 0
        return True


def task_rates(mixture_or_task_name: str) -> list[tuple[str, float]]:
    """(task name, mixing rate) of each task of a registered Mixture (a Task: itself at rate 1), sorted by name."""
    provider = seqio.get_mixture_or_task(mixture_or_task_name)
    if isinstance(provider, seqio.Mixture):
        return sorted((task.name, float(provider.get_rate(task))) for task in provider.tasks)
    return [(provider.name, 1.0)]


def task_examples(task_name: str, *, input_length: int, target_length: int, split: str = "train", shard_index: int = 0,
                  num_shards: int = 1) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One unshuffled pass over shard `shard_index` of `num_shards` of a registered Task's `split`: each example's
    (inputs int32[n], targets int32[m]) as the trainer would see them (trimmed to the lengths, EOS appended), before
    padding: what `gr_jax.data.records` stores."""
    dataset = seqio.get_dataset(
        task_name, task_feature_lengths=_feature_lengths(input_length=input_length, target_length=target_length),
        feature_converter=seqio.PassThroughFeatureConverter(), dataset_split=split, shuffle=False, num_epochs=1,
        shard_info=_shard_info(shard_index=shard_index, num_shards=num_shards), verbose=False)
    # Crossing into Python a batch at a time, not per example (tf.data's per-element overhead is most of the cost).
    for batch in _with_options(dataset.ragged_batch(1024)).prefetch(2):
        inputs, targets = (_rows(batch[name]) for name in ("inputs", "targets"))
        yield from zip(inputs, targets)


def _rows(ragged: tf.RaggedTensor) -> list[np.ndarray]:
    """The rows of a [rows, None] ragged batch as int32 arrays."""
    values, splits = ragged.flat_values.numpy().astype(np.int32), ragged.row_splits.numpy()
    return np.split(values, splits[1:-1])


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
    task_datasets = [
        seqio.get_dataset(
            task, task_feature_lengths=lengths, feature_converter=seqio.EncDecFeatureConverter(pack=False),
            dataset_split=split, shuffle=False, num_epochs=1, shard_info=shard_info, verbose=False)
        for task in task_list]
    dataset = task_datasets[0]
    for task_dataset in task_datasets[1:]:
        dataset = dataset.concatenate(task_dataset)

    share = None
    if num_shards > 1:
        declared = {task.name: _num_examples(task, split=split) for task in task_list}
        missing = [name for name, count in declared.items() if count is None]
        if missing:
            raise ValueError(f"multi-host evaluation needs every task's example count for split {split!r} "
                             f"(seqio num_input_examples); missing for {missing}")
        counts = [count for count in declared.values() if count is not None]
        # tf.data's shard(n, i) keeps examples i, i + n, ...: host i gets ceil((count - i) / n) of each task.
        largest_host = sum((c + num_shards - 1) // num_shards for c in counts)
        share = _HostShare(examples=sum((c - shard_index + num_shards - 1) // num_shards for c in counts),
                           batches=-(-largest_host // host_batch))

    widths = {name: target_length for name in FEATURES} | {"encoder_input_tokens": input_length}
    return _padded_eval_batches(
        _with_options(dataset.batch(host_batch)), host_batch=host_batch, widths=widths, share=share,
        where=f"host {shard_index} of {num_shards}, {mixture_or_task_name!r}:{split}")


class _HostShare(NamedTuple):
    """What one host of a multi-host evaluation must yield: its examples, and the batches of the largest host."""
    examples: int
    batches: int


def _padded_eval_batches(
        dataset: tf.data.Dataset,
        *,
        host_batch: int,
        share: _HostShare | None,
        widths: dict[str, int],
        where: str,
) -> Iterator[dict[str, np.ndarray]]:
    """Pads the batches of `dataset` (the last may be short) and, given the host's `share`, appends fully masked
    ones up to `share.batches`, checking that exactly `share.examples` examples arrived."""
    yielded = seen = 0
    for batch in dataset.as_numpy_iterator():
        rows = len(batch[FEATURES[0]])
        seen += rows
        if share is not None and seen > share.examples:
            raise RuntimeError(f"{where}: read more than the {share.examples} examples of its share; the "
                               f"tasks' declared example counts (num_input_examples) are wrong")
        yield _pad_batch(batch, host_batch=host_batch)
        yielded += 1
    if share is not None:
        if seen != share.examples:
            raise RuntimeError(f"{where}: read {seen} examples, expected {share.examples} from the tasks' "
                               f"declared example counts (num_input_examples)")
        empty = _pad_batch({name: np.zeros((0, width), np.int32) for name, width in widths.items()},
                           host_batch=host_batch)
        for _ in range(share.batches - yielded):
            yield {name: value.copy() for name, value in empty.items()}


def _pad_batch(batch: dict[str, np.ndarray], *, host_batch: int) -> dict[str, np.ndarray]:
    """Pads every feature to `host_batch` rows with zeros (PAD, zero loss weight) and adds `example_mask`."""
    rows = len(batch[FEATURES[0]])
    padded = {name: np.pad(batch[name], ((0, host_batch - rows), (0, 0))) for name in FEATURES}
    padded[EXAMPLE_MASK] = np.arange(host_batch) < rows
    return padded
