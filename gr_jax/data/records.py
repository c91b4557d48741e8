"""Training examples preprocessed once into ArrayRecord files, read back by index with Grain: the input path of the
study's 8.8M-passage runs (docs/scale.md), whose resumable state does not grow with the corpus.

Why Grain + ArrayRecord rather than seqio's offline cache (t5x's answer): the cache is read back through tf.data,
whose saved iterator holds the shuffle buffer, and needs TensorFlow on every host. Here the example at any position
of the endless stream is computed from the position alone (Grain's `MapDataset`: a per-epoch index permutation
(`index_shuffle`, no permutation array), the tasks mixed by rate, and ArrayRecord's random reads), so:
- resuming at batch 100k costs what resuming at batch 100 does, and a checkpoint's input state is the batch count it
  already records (`batches_consumed`), a few bytes whatever the corpus;
- host memory holds the batches in flight and the files' record indexes (ArrayRecord's, 8 bytes a record): no
  Python object per example;
- each host reads only its rows of every global batch (`shard_index` of `num_shards`), the layout of every other
  host-made source (`gr_jax.data.batches`): a 2-process run trains on the 1-process run's batches;
- reading needs neither TensorFlow nor seqio (the accelerator images have neither).

The seqio Tasks and Mixtures stay the definitions of the study's rows: `python -m gr_jax.tools.preprocess` makes the
files from a run's registered mixture (`write_part`, one unshuffled pass over each task, optionally one shard of
it per process), and a run reads them through `PreprocessedData` (gin: gin_configs/data/preprocessed.gin).

A directory holds, per preprocessing shard i of n, `{task}.{i:05d}-of-{n:05d}.{k:05d}.array_record` per task (its
file k, of at most `RECORDS_PER_FILE` records) and `manifest.{i:05d}-of-{n:05d}.json`: the source data's settings,
the task's mixing rate, example count and files, the input fingerprint (`gr_jax.data.fingerprint`). A record is one
example: little-endian int32 [len(inputs), len(targets), inputs..., targets...], the task's output after trimming
and EOS, before padding.

Differences from the seqio stream (`gr_jax.data.pipeline`), same examples: tasks are interleaved at exactly their
rates (Grain's proportional mix) instead of sampled by them, and every epoch is a fresh permutation of the whole
task instead of a shuffle buffer's window. Preprocessing after a task's cache placeholder runs once, so a random
one (span corruption's noise) is drawn once for all epochs instead of anew each epoch.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Optional

import numpy as np

from gr_jax.data.batches import sharded_batches
from gr_jax.data.features import decoder_inputs
from gr_jax.data.fingerprint import input_fingerprint
from gr_jax.run_dir import write_json
from gr_jax.vocabulary import vocabulary_file

FORMAT = "gr_jax.records/2"  # 1: one file per task and shard
RECORD_DTYPE = np.dtype("<i4")
_MANIFEST = re.compile(r"manifest\.(\d{5})-of-(\d{5})\.json")


def encode_example(inputs: np.ndarray, targets: np.ndarray) -> bytes:
    """One record: int32 [len(inputs), len(targets), inputs..., targets...] (`inputs`, `targets`: int[n], unpadded)."""
    return np.concatenate([[len(inputs), len(targets)], inputs, targets]).astype(RECORD_DTYPE).tobytes()


def decode_example(record: bytes, *, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(inputs int32[n], targets int32[m]) of one record; a record that is not one names `where`."""
    values = np.frombuffer(record, RECORD_DTYPE)
    if len(values) < 2 or len(values) != 2 + int(values[0]) + int(values[1]) or values[0] < 0 or values[1] < 0:
        raise ValueError(f"{where}: a record of {len(record)} bytes is not a gr_jax example ({FORMAT})")
    split = 2 + int(values[0])
    return values[2:split], values[split:]


def example_features(records: Sequence[bytes], *, input_length: int, target_length: int,
                     where: str) -> dict[str, np.ndarray]:
    """The model features of a batch of records, as seqio's `EncDecFeatureConverter(pack=False)` makes them:
    encoder_input_tokens int32[b, input_length]; decoder_target_tokens, decoder_input_tokens (targets shifted right,
    starting with 0) and decoder_loss_weights (1 on target tokens) int32[b, target_length]. A record longer than the
    lengths is an error, never cut."""
    inputs = np.zeros((len(records), input_length), np.int32)
    targets = np.zeros((len(records), target_length), np.int32)
    for row, record in enumerate(records):
        example_inputs, example_targets = decode_example(record, where=where)
        if len(example_inputs) > input_length or len(example_targets) > target_length:
            raise ValueError(f"{where}: an example of {len(example_inputs)} input and {len(example_targets)} target "
                             f"tokens is longer than this run's {input_length} / {target_length}: preprocess with "
                             "the run's lengths")
        inputs[row, :len(example_inputs)] = example_inputs
        targets[row, :len(example_targets)] = example_targets
    return {"encoder_input_tokens": inputs, "decoder_target_tokens": targets,
            "decoder_input_tokens": decoder_inputs(targets),
            "decoder_loss_weights": (targets != 0).astype(np.int32)}


def part_suffix(*, shard_index: int, num_shards: int) -> str:
    return f"{shard_index:05d}-of-{num_shards:05d}"


def records_file(directory: str | os.PathLike, *, task: str, shard_index: int, num_shards: int,
                 file_index: int) -> pathlib.Path:
    suffix = part_suffix(shard_index=shard_index, num_shards=num_shards)
    return pathlib.Path(directory) / f"{task}.{suffix}.{file_index:05d}.array_record"


# Records a file holds at most: ArrayRecord's writer keeps each chunk's index entry in memory until it closes (about
# 180 bytes a one-record chunk, measured at 8.8M), so one file per task would grow the writer with the task.
RECORDS_PER_FILE = 1_000_000


def write_part(*, directory: str | os.PathLike, description: Mapping[str, Any],
               tasks: Sequence[tuple[str, float, Iterable[tuple[np.ndarray, np.ndarray]]]], shard_index: int = 0,
               num_shards: int = 1, records_per_file: int = RECORDS_PER_FILE) -> dict[str, Any]:
    """Writes preprocessing shard `shard_index` of `num_shards`: each (task, mixing rate, its examples of this shard
    as (inputs, targets)) into its ArrayRecord files of at most `records_per_file` records, then this part's manifest
    (written last: a part without one is incomplete). `description`: what the examples are (the source data's
    settings, lengths, input fingerprint), the same in every part. An existing part is an error. Returns the
    manifest."""
    from array_record.python.array_record_module import ArrayRecordWriter

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    suffix = part_suffix(shard_index=shard_index, num_shards=num_shards)
    manifest_path = directory / f"manifest.{suffix}.json"
    if manifest_path.exists():
        raise FileExistsError(f"{manifest_path}: this part is already written (remove the directory to remake it)")
    counts = []
    for task, rate, examples in tasks:
        files: list[str] = []
        writer: Any = None  # the open file's ArrayRecordWriter
        count = 0
        try:
            for inputs, targets in examples:
                if count % records_per_file == 0:
                    if writer is not None:
                        writer.close()
                    path = records_file(directory, task=task, shard_index=shard_index, num_shards=num_shards,
                                        file_index=len(files))
                    # One record per chunk, uncompressed: a random read reads one record and decompresses nothing
                    # (zstd's default window made single reads ~10x slower, docs/scale.md).
                    writer = ArrayRecordWriter(str(path), "group_size:1,uncompressed")
                    files.append(path.name)
                writer.write(encode_example(inputs, targets))
                count += 1
        finally:
            if writer is not None:
                writer.close()
        counts.append({"task": task, "rate": float(rate), "num_examples": count, "files": files})
    manifest = {"format": FORMAT, "shard_index": shard_index, "num_shards": num_shards,
                "description": dict(description), "tasks": counts}
    write_json(manifest_path, manifest)
    return manifest


@dataclasses.dataclass(frozen=True)
class TaskRecords:
    """One task's examples across all parts: its mixing rate, files and example count."""
    task: str
    rate: float
    files: tuple[str, ...]
    num_examples: int


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A complete preprocessed directory: every part's manifest present and in agreement."""
    directory: str
    description: dict[str, Any]
    tasks: tuple[TaskRecords, ...]

    @classmethod
    def read(cls, directory: str | os.PathLike) -> Manifest:
        directory = pathlib.Path(directory)
        parts = sorted(p for p in directory.glob("manifest.*.json") if _MANIFEST.fullmatch(p.name)) \
            if directory.is_dir() else []
        if not parts:
            raise FileNotFoundError(f"{directory}: no preprocessed examples (manifest.*-of-*.json); make them with "
                                    "python -m gr_jax.tools.preprocess")
        manifests = []
        for path in parts:
            try:
                manifest = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{e.lineno}: not a JSON manifest: {e.msg}") from e
            if manifest.get("format") != FORMAT:
                raise ValueError(f"{path}: format {manifest.get('format')!r}, this reader reads {FORMAT!r}")
            manifests.append((path, manifest))
        first_path, first = manifests[0]
        num_shards = first["num_shards"]
        for path, manifest in manifests[1:]:
            if manifest["num_shards"] != num_shards or manifest["description"] != first["description"] or \
                    [t["task"] for t in manifest["tasks"]] != [t["task"] for t in first["tasks"]]:
                raise ValueError(f"{path}: another preprocessing than {first_path.name}'s (shards, description or "
                                 "tasks differ): one directory holds the parts of one preprocessing")
        missing = sorted(set(range(num_shards)) - {m["shard_index"] for _, m in manifests})
        if missing:
            raise FileNotFoundError(f"{directory}: parts {missing} of {num_shards} are missing or unfinished (no "
                                    f"manifest.{part_suffix(shard_index=missing[0], num_shards=num_shards)}.json)")
        tasks = []
        for i, entry in enumerate(first["tasks"]):
            files = tuple(str(directory / name) for _, m in manifests for name in m["tasks"][i]["files"])
            for file in files:
                if not os.path.exists(file):
                    raise FileNotFoundError(f"{file}: listed in {directory}'s manifests but missing")
            tasks.append(TaskRecords(task=entry["task"], rate=float(entry["rate"]), files=files,
                                     num_examples=sum(m["tasks"][i]["num_examples"] for _, m in manifests)))
        return cls(directory=str(directory), description=first["description"], tasks=tuple(tasks))

    @property
    def num_examples(self) -> int:
        return sum(task.num_examples for task in self.tasks)


class RecordFiles:
    """The records of ArrayRecord files in order, by index (Grain's random-access source protocol: `len` and
    `[index]`), each read with a range read: ArrayRecord's read of an index list, which Grain's
    `ArrayRecordDataSource` uses for one record too, costs time proportional to the file's records at every call
    (75 ms a record at 4.4M records against 10-20 us for a range read, docs/scale.md)."""

    def __init__(self, paths: Sequence[str]):
        from array_record.python.array_record_module import ArrayRecordReader

        self.paths = tuple(paths)
        self._readers = [ArrayRecordReader(path, "readahead_buffer_size:0") for path in self.paths]
        self._ends = np.cumsum([reader.num_records() for reader in self._readers])

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def __getitem__(self, index: int) -> bytes:
        if not 0 <= index < len(self):
            raise IndexError(f"record {index} of {len(self)} in {self.paths}")
        file = int(np.searchsorted(self._ends, index, side="right"))
        position = int(index) - (int(self._ends[file - 1]) if file else 0)
        return self._readers[file].read(position, position + 1)[0]


def _task_seed(seed: int, index: int) -> int:
    """A 32-bit shuffle seed per (run seed, task): tasks of equal size are not permuted alike."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


class RecordBatches:
    """Global batch b of the endless seeded stream of a preprocessed directory's examples (see the module doc);
    `batch` and `batches` as `gr_jax.data.examples.ExampleBatches`'s."""

    def __init__(self, *, manifest: Manifest, batch_size: int, seed: int, input_length: int, target_length: int):
        import grain

        empty = [task.task for task in manifest.tasks if task.num_examples == 0]
        if empty or not manifest.tasks:
            raise ValueError(f"{manifest.directory}: tasks {empty} have no examples: nothing to train on")
        # The files' record indexes are read into memory (8 bytes a record: docs/scale.md); ArrayRecord's offloaded
        # index, read from disk per record, made random reads ~30x slower.
        streams = [grain.MapDataset.source(RecordFiles(task.files)).shuffle(seed=_task_seed(seed, i)).repeat()
                   for i, task in enumerate(manifest.tasks)]
        self.examples = streams[0] if len(streams) == 1 else grain.MapDataset.mix(
            streams, weights=[task.rate for task in manifest.tasks])
        self.batch_size = batch_size
        self._lengths = {"input_length": input_length, "target_length": target_length}
        self._where = manifest.directory
        self._shares: dict[int, Any] = {}

    def batch(self, batch: int, *, shard_index: int = 0, num_shards: int = 1) -> dict[str, np.ndarray]:
        """This host's rows [shard_index * share, (shard_index + 1) * share) of global batch `batch`."""
        share = self.batch_size // num_shards
        if share not in self._shares:
            self._shares[share] = self.examples.batch(share, batch_fn=lambda records: example_features(
                records, **self._lengths, where=self._where))
        return self._shares[share][batch * num_shards + shard_index]

    def batches(self, *, start_batch: int = 0, shard_index: int = 0, num_shards: int = 1,
                prefetch: int = 2) -> Iterator[dict[str, np.ndarray]]:
        return sharded_batches(self.batch, batch_size=self.batch_size, start_batch=start_batch,
                               shard_index=shard_index, num_shards=num_shards, prefetch=prefetch)


# Settings of the source data that change no training example (kept out of the comparison with the manifest).
_NOT_EXAMPLES = ("cache_in_memory", "eval_split")


def source_description(source: Any) -> dict[str, Any]:
    """What a source `RunData`'s examples are, as the manifest records it: its class and dataclass fields."""
    fields = {key: value for key, value in dataclasses.asdict(source).items() if key not in _NOT_EXAMPLES}
    return {"source": type(source).__name__, **json.loads(json.dumps(fields))}


@dataclasses.dataclass(frozen=True)
class PreprocessedData:
    """A `gr_jax.experiment.RunData` that trains on `source`'s examples as preprocessed into `directory` (by
    `python -m gr_jax.tools.preprocess` with the same gin): everything else (the docid space, the vocabulary, the
    evaluation split) is `source`'s. Registers no seqio task, so training needs neither TensorFlow nor seqio.
    The directory must have been made from this source (its settings and input fingerprint), else an error."""
    source: Any
    directory: str

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def data_dir(self) -> str:
        return self.source.data_dir

    @property
    def eval_split(self) -> str:
        return self.source.eval_split

    @property
    def input_length(self) -> int:
        return self.source.input_length

    @property
    def target_length(self) -> int:
        return self.source.target_length

    @property
    def vocabulary_path(self) -> Optional[str]:
        return self.source.vocabulary_path

    def docid_space(self) -> Any:
        return self.source.docid_space()

    @functools.cached_property
    def manifest(self) -> Manifest:
        """The directory's manifest, read once (registration, the mixture name and the batches all consult it)."""
        return Manifest.read(self.directory)

    @property
    def mixture_name(self) -> str:
        return self.source.mixture_name  # the mixture the files were made from, once `check` has passed

    def register(self, docid_space: Any, *, input_vocabulary_dir: Optional[str] = None) -> list[str]:
        """Registers nothing and reads nothing: evaluation and search use only the source's files (a model dir copied
        without its training examples still evaluates). What the directory must match is checked by `check`, which
        training runs before it reads."""
        del docid_space, input_vocabulary_dir
        return []

    def check(self, docid_space: Any, *, input_vocabulary_dir: Optional[str] = None) -> None:
        """Raises unless the directory holds this source's examples over these token ids (its manifest's settings and
        input fingerprint), naming the directory."""
        manifest = self.manifest
        where = f"{manifest.directory} (manifest.*.json)"
        saved = {key: value for key, value in manifest.description.items()
                 if key not in ("mixture", "input_fingerprint")}
        current = source_description(self.source)
        if saved != current:
            different = {key: (saved.get(key), current.get(key)) for key in sorted(set(saved) | set(current))
                         if saved.get(key) != current.get(key)}
            raise ValueError(f"{where}: preprocessed from other data settings; (preprocessed, this run): {different}")
        fingerprint = input_fingerprint(vocabulary_file=vocabulary_file(self.source), docid_space=docid_space,
                                        input_vocabulary_dir=input_vocabulary_dir)
        if manifest.description["input_fingerprint"] != fingerprint:
            raise ValueError(f"{where}: preprocessed with another vocabulary or docid table than this run reads "
                             "(the data dir was rebuilt since): preprocess again")

    def train_batches(self, *, docid_space: Any, batch_size: int, seed: int, start_batch: int, shard_index: int,
                      num_shards: int, input_vocabulary_dir: Optional[str] = None
                      ) -> Iterator[dict[str, np.ndarray]]:
        self.check(docid_space, input_vocabulary_dir=input_vocabulary_dir)
        return RecordBatches(manifest=self.manifest, batch_size=batch_size, seed=seed,
                             input_length=self.input_length, target_length=self.target_length).batches(
            start_batch=start_batch, shard_index=shard_index, num_shards=num_shards)
