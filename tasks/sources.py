"""seqio data sources over a retrieval data dir: raw `{"docid", "inputs"[, "qid"]}` string examples.

Each builder takes `(*, dataset, table)` and returns `(seqio source or None, example count per split)`;
`tasks/retrieval.py` lists them in `SOURCES`. Two kinds so far:

* `documents_source`: every document of the collection, streamed from the reader each epoch (an 8.8M
  passage collection never sits in Python memory); example = `{"docid", "inputs": document text}`.
* `labeled_queries_source`: (query, relevant document) pairs; example = `{"qid", "docid", "inputs": query}`.
  Queries and qrels are small (MS MARCO: 0.5M training pairs), so the pairs are resolved once, when the
  source is built: qrels naming documents outside the collection are counted in a warning, then left out
  (they have no docid to generate), and the example counts are exact for seqio's mixing rates.

Order is the files' order; shuffling is the Task's job (`shuffle_buffer_size`).
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Iterator, Mapping

import seqio
import tensorflow as tf

from gr_jax.data.readers import RetrievalDataset
from gr_jax.docids import DocidTable

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
) -> tuple[seqio.FunctionDataSource, dict[str, int]]:
    """Every document as `{"docid": str, "inputs": text}`; split 'train' only (indexing sees the whole corpus).

    Returns the source and its example count per split (the docid table's size, declared to seqio).
    """
    def chunks() -> Iterator[dict[str, list[str]]]:
        docids, texts = [], []
        for docid, text in dataset.collection():
            docids.append(docid)
            texts.append(text)
            if len(docids) == _CHUNK:
                yield {"docid": docids, "inputs": texts}
                docids, texts = [], []
        if docids:
            yield {"docid": docids, "inputs": texts}

    def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
        del split, shuffle_files, seed  # One split, one file read in order; the Task shuffles examples.
        signature = {"docid": _STRINGS, "inputs": _STRINGS}
        return tf.data.Dataset.from_generator(chunks, output_signature=signature).unbatch()

    counts = {TRAIN: len(table)}
    return seqio.FunctionDataSource(dataset_fn, splits=(TRAIN,), num_input_examples=counts), counts


@dataclasses.dataclass(frozen=True)
class LabeledQueries:
    """Resolved (query, relevant docid) examples of one split, in file order: three aligned tuples."""

    qids: tuple[str, ...]
    texts: tuple[str, ...]
    docids: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.qids)


def labeled_queries(
        *,
        dataset: RetrievalDataset,
        split: str,
        known_docids: Collection[str],
        first_relevant_only: bool,
) -> LabeledQueries:
    """Pairs each query of reader split `split` with its relevant documents (relevance > 0).

    `first_relevant_only=False` gives one example per relevant (query, document) pair (training);
    `True` gives one per query, the first relevant document in qrels order that the collection holds
    (a single target, enough for an eval loss). Judgements naming unknown documents, queries without a
    usable judgement and qrels naming queries absent from the queries file are each counted in a warning.
    """
    qrels = dataset.qrels(split)
    qids, texts, docids = [], [], []
    seen_qids: set[str] = set()
    unknown_pairs = unjudged = without_known = 0
    for qid, text in dataset.queries(split):
        seen_qids.add(qid)
        relevant = [docid for docid, relevance in qrels.get(qid, {}).items() if relevance > 0]
        if not relevant:
            unjudged += 1
            continue
        known = [docid for docid in relevant if docid in known_docids]
        unknown_pairs += len(relevant) - len(known)
        if not known:
            without_known += 1
            continue
        for docid in known[:1] if first_relevant_only else known:
            qids.append(qid)
            texts.append(text)
            docids.append(docid)
    missing_queries = len(set(qrels) - seen_qids)
    where = f"{dataset.data_dir} split {split!r}"
    if unknown_pairs:
        logger.warning("%s: %d qrels name unknown documents (not in the collection); left out", where,
                       unknown_pairs)
    if without_known:
        logger.warning("%s: %d queries have no relevant document in the collection; left out", where,
                       without_known)
    if missing_queries:
        logger.warning("%s: %d queries named in the qrels are missing from the queries file", where,
                       missing_queries)
    if unjudged:
        logger.info("%s: %d queries have no relevant judgement (no example)", where, unjudged)
    return LabeledQueries(qids=tuple(qids), texts=tuple(texts), docids=tuple(docids))


def known_qrels_docids(*, dataset: RetrievalDataset, splits: Collection[str], docids: Collection[str]) -> set[str]:
    """The docids named by the qrels of `splits` that are in `docids` (a scan; no set of all docids is built)."""
    named = {docid for split in splits for judged in dataset.qrels(split).values() for docid in judged}
    return {docid for docid in docids if docid in named}


def labeled_queries_source(
        *,
        dataset: RetrievalDataset,
        table: DocidTable,
) -> tuple[seqio.FunctionDataSource | None, dict[str, int]]:
    """(query, relevant docid) examples: seqio split 'train' from the reader's 'train' split (one example per
    relevant pair) and 'validation' from its 'dev' split (first relevant document per query).

    Returns the source (None when the data dir has neither split) and the number of examples per seqio split.
    Splits the data dir lacks are absent from the source.
    """
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
