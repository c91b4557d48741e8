"""seqio data sources over a retrieval data dir: raw string examples naming a `docid`.

Each builder takes `(*, dataset, table, options)` and returns `(seqio source or None, example count per split)`;
`tasks/retrieval.py` lists them in `SOURCES`. Three kinds:

* `documents_source`: every document of the collection, streamed from the reader each epoch (an 8.8M
  passage collection never sits in Python memory); example = `{"docid", "inputs": document text}`.
* `labeled_queries_source`: (query, relevant document) pairs; example = `{"qid", "docid", "inputs": query}`.
  Queries and qrels are small (MS MARCO: 0.5M training pairs), so the pairs are resolved once, when the
  source is built: qrels naming documents outside the collection are counted in a warning, then left out
  (they have no docid to generate), and the example counts are exact for seqio's mixing rates.
* `synthetic_queries_source`: each passage's synthetic queries (`options.d2q_path`, see `gr_jax.data.d2q`),
  streamed from the file every epoch: `{"docid", "queries": string[n]}` per passage with queries. Its count
  is the number of passages of the collection, an upper bound (passages may have no queries): counting
  exactly would mean reading the whole file (tens of GB for MS MARCO) at registration.

Order is the files' order; shuffling is the Task's job (`shuffle_buffer_size`).
"""
from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable, Iterator, Mapping

import seqio
import tensorflow as tf

from gr_jax.data import d2q
from gr_jax.data.pairs import LabeledQueries, known_qrels_docids, labeled_queries
from gr_jax.data.readers import RetrievalDataset, shard_rows
from gr_jax.docids import DocidTable
from gr_jax.tasks.options import RepresentationOptions

logger = logging.getLogger(__name__)

TRAIN = "train"
VALIDATION = "validation"
# Reader split that feeds the seqio 'validation' split, in order of preference. Test qrels are never used.
VALIDATION_READER_SPLITS = ("dev", "validation")

_STRINGS = tf.TensorSpec(shape=(None,), dtype=tf.string)
# Documents cross from Python to tf.data this many at a time: one element per document costs ~0.3 ms of
# `from_generator` overhead, several times the reading itself.
_CHUNK = 1024


def documents_source(
        *,
        dataset: RetrievalDataset,
        table: DocidTable,
        options: RepresentationOptions,
) -> tuple[seqio.FunctionDataSource, dict[str, int]]:
    """Every document as `{"docid": str, "inputs": text}`; split 'train' only (indexing sees the whole corpus).

    Returns the source and its example count per split (the docid table's size, declared to seqio).
    """
    del options  # Documents are documents; the representations differ in their preprocessors.
    def chunks(shard_index: int, num_shards: int) -> Iterator[dict[str, list[str]]]:
        docids, texts = [], []
        rows = None if num_shards == 1 else shard_rows(len(table), shard_index=shard_index, num_shards=num_shards)
        for docid, text in dataset.collection(rows=rows):
            docids.append(docid)
            texts.append(text)
            if len(docids) == _CHUNK:
                yield {"docid": docids, "inputs": texts}
                docids, texts = [], []
        if docids:
            yield {"docid": docids, "inputs": texts}

    return _streamed_train_source(chunks, signature={"docid": _STRINGS, "inputs": _STRINGS},
                                  num_examples=len(table))


def labeled_queries_source(
        *,
        dataset: RetrievalDataset,
        table: DocidTable,
        options: RepresentationOptions,
) -> tuple[seqio.FunctionDataSource | None, dict[str, int]]:
    """(query, relevant docid) examples: seqio split 'train' from the reader's 'train' split (one example per
    relevant pair) and 'validation' from its 'dev' split (first relevant document per query).

    Returns the source (None when the data dir has neither split) and the number of examples per seqio split.
    Splits the data dir lacks are absent from the source.
    """
    del options
    available = set(dataset.splits())
    reader_splits = {}
    if TRAIN in available:
        reader_splits[TRAIN] = TRAIN
    validation = next((s for s in VALIDATION_READER_SPLITS if s in available), None)
    if validation is not None:
        reader_splits[VALIDATION] = validation
    if not reader_splits:
        return None, {}
    known = known_qrels_docids(dataset=dataset, splits=reader_splits.values(), docids=table.docids)
    examples: Mapping[str, LabeledQueries] = {
        seqio_split: labeled_queries(dataset=dataset, split=reader_split, known_docids=known,
                                     first_relevant_only=seqio_split != TRAIN)
        for seqio_split, reader_split in reader_splits.items()}

    def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
        del shuffle_files, seed  # In-memory arrays in file order; the Task shuffles examples.
        pairs = examples[split]
        return tf.data.Dataset.from_tensor_slices({
            "qid": tf.constant(pairs.qids, dtype=tf.string, shape=[len(pairs)]),
            "docid": tf.constant(pairs.docids, dtype=tf.string, shape=[len(pairs)]),
            "inputs": tf.constant(pairs.texts, dtype=tf.string, shape=[len(pairs)]),
        })

    counts = {split: len(pairs) for split, pairs in examples.items()}
    source = seqio.FunctionDataSource(dataset_fn, splits=tuple(examples), num_input_examples=counts)
    return source, counts


_RAGGED_STRINGS = tf.RaggedTensorSpec(shape=(None, None), dtype=tf.string, ragged_rank=1, row_splits_dtype=tf.int64)


def synthetic_queries_source(
        *,
        dataset: RetrievalDataset,
        table: DocidTable,
        options: RepresentationOptions,
) -> tuple[seqio.FunctionDataSource | None, dict[str, int]]:
    """Each passage's synthetic queries as `{"docid": str, "queries": string[n]}` (n >= 1); split 'train' only.

    Returns (None, {}) with a warning when `options.d2q_path` does not exist. The file is checked while it
    is read (a malformed line fails the pipeline with `path:line`); the per-passage layout is paired with
    the collection's docids by streaming the collection alongside it.
    """
    path = pathlib.Path(options.d2q_path)
    if not path.is_file():
        logger.warning("%s: no synthetic-queries file %s, so no D2Q task; write docTTTTTquery's output there (one "
                       "line of tab-separated queries per passage in collection order, or 'pid<TAB>query' lines) "
                       "or pass d2q_path", dataset.data_dir, path)
        return None, {}
    logger.info("D2Q: synthetic queries from %s (%s of them per passage, selection %r)", path,
                options.d2q_queries_per_passage, options.d2q_selection)

    def chunks(shard_index: int, num_shards: int) -> Iterator[dict[str, object]]:
        rows = shard_rows(len(table), shard_index=shard_index, num_shards=num_shards)
        # The per-passage layout asks about one docid (its first line's) and reads only the shard's lines, beside the
        # shard's documents (for their docids). The pid layout asks about every line and is read whole, keeping the
        # shard's passages: it gets a set of the docids (Python objects: a few hundred MB at 8.8M) for the pass.
        if d2q.detect_layout(path, is_docid=table.__contains__) == d2q.PER_PASSAGE:
            whole = num_shards == 1
            passages = d2q.iter_passage_queries(
                path, docids_in_order=(docid for docid, _ in dataset.collection(rows=None if whole else rows)),
                is_docid=table.__contains__, passages=None if whole else rows)
        else:
            passages = (passage for passage in d2q.iter_passage_queries(
                path, docids_in_order=(), is_docid=frozenset(table.docids).__contains__)
                if num_shards == 1 or rows[0] <= table.rows_of([passage[0]])[0] < rows[1])
        docids: list[str] = []
        queries: list[str] = []
        lengths: list[int] = []
        for docid, passage_queries in passages:
            if not passage_queries:
                continue
            docids.append(docid)
            queries.extend(passage_queries)
            lengths.append(len(passage_queries))
            if len(docids) == _CHUNK:
                yield _ragged_chunk(docids, queries, lengths)
                docids, queries, lengths = [], [], []
        if docids:
            yield _ragged_chunk(docids, queries, lengths)

    return _streamed_train_source(chunks, signature={"docid": _STRINGS, "queries": _RAGGED_STRINGS},
                                  num_examples=len(table))


class ShardedFunctionSource(seqio.FunctionDataSource):
    """A `seqio.FunctionDataSource` that reads only its shard: seqio hands it the shard (`supports_arbitrary_sharding`)
    and `dataset_fn(split, shuffle_files, seed, shard_index, num_shards)` reads just those examples, where a plain
    FunctionDataSource reads every example on every host (or preprocessing process) and keeps every n-th."""

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return True

    def get_dataset(self, split: str = TRAIN, shuffle: bool = True, seed: int | None = None,
                    shard_info: seqio.ShardInfo | None = None, **unused: object) -> tf.data.Dataset:
        del unused  # sequence_length, use_cached, num_epochs: seqio's, unused by a function source
        index, count = (shard_info.index, shard_info.num_shards) if shard_info else (0, 1)
        return self._dataset_fn(split=split, shuffle_files=shuffle, seed=seed, shard_index=index, num_shards=count)


def _streamed_train_source(chunks: Callable[[int, int], Iterator[dict]], *, signature: dict[str, tf.TensorSpec],
                           num_examples: int) -> tuple[seqio.FunctionDataSource, dict[str, int]]:
    """A 'train'-only source streaming `chunks(shard_index, num_shards)` (dicts of equal-length lists, one example
    per position): each shard reads its rows only."""
    def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None, shard_index: int = 0,
                   num_shards: int = 1) -> tf.data.Dataset:
        del split, shuffle_files, seed  # One split, one file read in order; the Task shuffles examples.
        return tf.data.Dataset.from_generator(lambda: chunks(shard_index, num_shards),
                                              output_signature=signature).unbatch()

    counts = {TRAIN: num_examples}
    return ShardedFunctionSource(dataset_fn, splits=(TRAIN,), num_input_examples=counts), counts


def _ragged_chunk(docids: list[str], queries: list[str], lengths: list[int]) -> dict[str, object]:
    return {"docid": docids,
            "queries": tf.RaggedTensor.from_row_lengths(tf.constant(queries, tf.string),
                                                        tf.constant(lengths, tf.int64))}
