"""seqio Task `{name}.doc2query`: a document -> one of its labeled queries (the training data of doc2query-T5).

docTTTTTquery (Nogueira & Lin) trains a T5 on MS MARCO's (relevant passage, query) training pairs and samples
synthetic queries from it; those queries are the study's D2Q document representation and the BM25 + D2Q
baseline. `register_doc2query(name=..., data_dir=...)` registers, for one data dir:

* split 'train': one example per relevant (training query, document) pair, in qrels order;
* split 'validation' (when the data dir has a dev split): each dev query with its first relevant document,
  for a held-out loss.

Examples are `{"qid", "docid", "inputs": document text, "targets": query text}`, tokenized with the data dir's
SentencePiece vocabulary (the one the retrieval model uses):

    source -> tokenize -> trim both features to their length and append EOS -> cache_in_memory
           -> seqio.CacheDatasetPlaceholder -> require_feature_lengths

Documents are cut to `input_length` tokens by design (as docTTTTTquery cut passages to 512). Queries longer
than `target_length` are cut too; that is counted in a warning at registration, never silent.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pathlib
import re
from collections.abc import Mapping

import seqio
import tensorflow as tf

from gr_jax.data import preprocessors
from gr_jax.data.pairs import labeled_queries
from gr_jax.data.readers import RetrievalDataset, open_dataset
from gr_jax.vocabulary import MODEL_FILENAME, load_vocabulary
from gr_jax.tasks import sources

logger = logging.getLogger(__name__)

REPRESENTATION = "doc2query"
DEFAULT_SHUFFLE_BUFFER_SIZE = 100_000
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_]+$")


def doc2query_task_name(*, name: str) -> str:
    return f"{name}.{REPRESENTATION}"


@dataclasses.dataclass(frozen=True)
class DocumentQueryPairs:
    """Aligned (qid, docid, document text, query text) tuples of one split, in qrels order."""

    qids: tuple[str, ...]
    docids: tuple[str, ...]
    documents: tuple[str, ...]
    queries: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.qids)


def document_query_pairs(
        *,
        dataset: RetrievalDataset,
        reader_splits: Mapping[str, str],
) -> dict[str, DocumentQueryPairs]:
    """Resolves `{seqio split: reader split}` into (document, query) pairs with one pass over the collection.

    'train' gets every relevant pair, other splits the first relevant document per query (see
    `gr_jax.data.pairs.labeled_queries`, which also counts qrels naming unknown documents in a warning). Only the
    texts of judged documents are kept in memory (MS MARCO: ~0.5M of the 8.8M passages).
    """
    wanted = {docid for split in reader_splits.values() for judged in dataset.qrels(split).values()
              for docid, relevance in judged.items() if relevance > 0}
    texts = {docid: text for docid, text in dataset.collection() if docid in wanted}
    pairs = {}
    for seqio_split, reader_split in reader_splits.items():
        labeled = labeled_queries(dataset=dataset, split=reader_split, known_docids=texts.keys(),
                                  first_relevant_only=seqio_split != sources.TRAIN)
        pairs[seqio_split] = DocumentQueryPairs(qids=labeled.qids, docids=labeled.docids,
                                                documents=tuple(texts[docid] for docid in labeled.docids),
                                                queries=labeled.texts)
    return pairs


def _reader_splits(dataset: RetrievalDataset) -> dict[str, str]:
    available = set(dataset.splits())
    if sources.TRAIN not in available:
        raise FileNotFoundError(f"{dataset.data_dir} has no training queries and qrels (split 'train'): "
                                f"doc2query learns from labeled (document, query) pairs")
    splits = {sources.TRAIN: sources.TRAIN}
    validation = next((s for s in sources.VALIDATION_READER_SPLITS if s in available), None)
    if validation is not None:
        splits[sources.VALIDATION] = validation
    return splits


def _warn_about_long_queries(pairs: DocumentQueryPairs, *, vocabulary: seqio.SentencePieceVocabulary,
                             target_length: int, where: str) -> int:
    """Counts queries of more than `target_length - 1` tokens (they lose their tail); returns the count."""
    lengths = [len(ids) for ids in vocabulary.tokenizer.encode(list(pairs.queries))]
    too_long = [i for i, n in enumerate(lengths) if n > target_length - 1]
    if too_long:
        first = too_long[0]
        logger.warning("%s: %d of %d queries have more than target_length - 1 = %d tokens and are cut "
                       "(longest: %d tokens; e.g. qid %s: %r); raise TARGET_LENGTH to keep them whole", where,
                       len(too_long), len(pairs), target_length - 1, max(lengths), pairs.qids[first],
                       pairs.queries[first])
    return len(too_long)


def trim_and_append_eos(dataset: tf.data.Dataset, output_features: Mapping[str, seqio.Feature], *,
                        lengths: Mapping[str, int]) -> tf.data.Dataset:
    """Keeps the first `lengths[k] - 1` tokens of each feature and appends EOS: `{k: int32[<= lengths[k]]}`.

    seqio's `append_eos_after_trim` with lengths fixed at registration (an argument not named
    `sequence_length`, so seqio lets it run before the cache): a Task always means the same examples.
    """
    return seqio.preprocessors.append_eos_after_trim(dataset, output_features=output_features,
                                                     sequence_length=dict(lengths))


@dataclasses.dataclass(frozen=True)
class _Registration:
    data_dir: str
    vocabulary_path: str
    input_length: int
    target_length: int
    shuffle_buffer_size: int
    cache_in_memory: bool


# What each registered name means, so that it is never registered with another meaning.
_REGISTRATIONS: dict[str, _Registration] = {}


def register_doc2query(
        *,
        name: str,
        data_dir: str | os.PathLike,
        input_length: int = 64,
        target_length: int = 32,
        vocabulary_path: str | os.PathLike | None = None,
        shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER_SIZE,
        cache_in_memory: bool = True,
) -> str:
    """Registers the Task `{name}.doc2query` of `data_dir` (see the module docstring) and returns its name.

    input_length: document tokens kept, EOS included; target_length: query tokens kept, EOS included.
    The vocabulary defaults to `{data_dir}/spm.model`. Registering the same name with the same arguments
    re-registers (picking up changed files); other arguments under the same name raise ValueError.
    """
    if not _NAME_PATTERN.match(name):
        raise ValueError(f"dataset name {name!r} must be letters, digits and underscores (it is part of the task "
                         f"name `{{name}}.{REPRESENTATION}`)")
    for arg, value, smallest in (("input_length", input_length, 2), ("target_length", target_length, 2),
                                 ("shuffle_buffer_size", shuffle_buffer_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
            raise ValueError(f"{arg} must be an integer >= {smallest}, got {value!r}")
    data_dir = pathlib.Path(data_dir).resolve()
    vocabulary_path = pathlib.Path(vocabulary_path or data_dir / MODEL_FILENAME).resolve()
    registration = _Registration(data_dir=str(data_dir), vocabulary_path=str(vocabulary_path),
                                 input_length=input_length, target_length=target_length,
                                 shuffle_buffer_size=shuffle_buffer_size, cache_in_memory=bool(cache_in_memory))
    provider = doc2query_task_name(name=name)
    previous = _REGISTRATIONS.get(name)
    if previous is not None and previous != registration:
        raise ValueError(f"{provider!r} is already registered with {previous}; registering it with {registration} "
                         f"would change what the task name means. Use another name.")

    dataset = open_dataset(data_dir)
    vocabulary = load_vocabulary(vocabulary_path)
    pairs = document_query_pairs(dataset=dataset, reader_splits=_reader_splits(dataset))
    if not len(pairs[sources.TRAIN]):
        raise ValueError(f"{data_dir}: no training query has a relevant document in the collection")
    for split, split_pairs in pairs.items():
        _warn_about_long_queries(split_pairs, vocabulary=vocabulary, target_length=target_length,
                                 where=f"{provider}:{split}")

    def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
        del shuffle_files, seed  # In-memory arrays in qrels order; the Task shuffles examples.
        split_pairs = pairs[split]
        strings = lambda values: tf.constant(values, dtype=tf.string, shape=[len(split_pairs)])  # noqa: E731
        return tf.data.Dataset.from_tensor_slices({
            "qid": strings(split_pairs.qids), "docid": strings(split_pairs.docids),
            "inputs": strings(split_pairs.documents), "targets": strings(split_pairs.queries)})

    counts = {split: len(split_pairs) for split, split_pairs in pairs.items()}
    lengths = {"inputs": input_length, "targets": target_length}
    seqio.TaskRegistry.remove(provider)
    seqio.TaskRegistry.add(
        provider,
        source=seqio.FunctionDataSource(dataset_fn, splits=tuple(pairs), num_input_examples=counts),
        output_features={"inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True),
                         "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True)},
        preprocessors=[
            preprocessors.tokenize_inputs,
            functools.partial(trim_and_append_eos, lengths=lengths),
            *([preprocessors.cache_in_memory] if cache_in_memory else []),
            seqio.CacheDatasetPlaceholder(),
            functools.partial(preprocessors.require_feature_lengths, provider_name=provider, minimum=lengths),
        ],
        shuffle_buffer_size=max(1, min(shuffle_buffer_size, counts[sources.TRAIN])),
    )
    _REGISTRATIONS[name] = registration
    logger.info("registered %s: %s (document -> query pairs)", provider, counts)
    return provider


def unregister_doc2query(*, name: str) -> bool:
    """Removes `{name}.doc2query`; returns whether it was registered."""
    if _REGISTRATIONS.pop(name, None) is None:
        return False
    seqio.TaskRegistry.remove(doc2query_task_name(name=name))
    return True

