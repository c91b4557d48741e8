"""seqio Tasks and Mixtures of the study: document representations -> docid, and the table rows mixing them.

`register_dataset(name=..., data_dir=...)` registers, for one data dir and docid scheme:

* one Task per document representation in `REPRESENTATIONS`, named `{name}.{representation}.{scheme}`:
    - `firstp`  (indexing): the first `input_length` tokens of each document (FirstP) -> its docid; split 'train'.
    - `labeled` (retrieval): a training query -> a relevant docid, one example per relevant (query, document)
      pair; split 'train'. Split 'validation': each dev query -> its first relevant docid (for an eval loss).
* one Mixture per row in `MIXTURE_ROWS`, named `{name}.{row}.{scheme}`:
    - `labeled_only`   (row 1a): labeled queries only, no indexing.
    - `firstp_labeled` (row 2a, DSI): FirstP indexing + labeled queries.
  Mixing rates default to the tasks' training example counts (one pass over each per "epoch" of the
  mixture); `mixing_rates` overrides them per representation.

Adding a representation or a row is one entry in these tables; every task shares the same pipeline:

    source -> tokenize_inputs -> docid_targets -> representation inputs (FirstP: trim_inputs_and_append_eos)
           -> cache_in_memory -> seqio.CacheDatasetPlaceholder -> [stochastic representation inputs]
           -> require_feature_lengths

Targets are the docid table's rows (pre-tokenized, EOS included), never re-tokenized or trimmed; the table is
built once per data dir and scheme (cached as `{data_dir}/docids.{scheme}.tsv`) and must fit `target_length`.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pathlib
import re
from collections.abc import Callable, Mapping, Sequence

import seqio
import tensorflow as tf

from gr_jax.data import preprocessors
from gr_jax.data.readers import RetrievalDataset, open_dataset
from gr_jax.docids import DocidTable
from gr_jax.vocabulary import MODEL_FILENAME, load_vocabulary
from tasks import docid_tables, sources

logger = logging.getLogger(__name__)

# Raw example sources a representation can start from (see `tasks.sources`).
SOURCES: dict[str, Callable[..., tuple[seqio.DataSource | None, dict[str, int]]]] = {
    "documents": sources.documents_source,              # every document: {"docid", "inputs": text}
    "labeled_queries": sources.labeled_queries_source,  # (query, relevant doc): {"qid", "docid", "inputs": query}
}


def first_tokens(input_length: int) -> tuple[Callable[..., tf.data.Dataset], ...]:
    """The first `input_length - 1` tokens + EOS: FirstP on documents, a plain trim on queries."""
    return (functools.partial(preprocessors.trim_inputs_and_append_eos, input_length=input_length),)


@dataclasses.dataclass(frozen=True)
class Representation:
    """One way of turning a data dir into `(inputs, docid)` examples.

    source: the raw examples it starts from, a key of `SOURCES`.
    inputs: given `input_length`, the seqio preprocessors that turn the tokenized `inputs: int32[n]` into the
      model's inputs (at most `input_length` tokens, EOS last).
    deterministic: whether `inputs` yields the same examples every epoch; then it runs before the in-memory
      cache. Stochastic ones (e.g. random spans) run after it and are reseeded each epoch by seqio.
    """

    name: str
    description: str
    source: str
    inputs: Callable[[int], tuple[Callable[..., tf.data.Dataset], ...]] = first_tokens
    deterministic: bool = True


REPRESENTATIONS: dict[str, Representation] = {r.name: r for r in (
    Representation("firstp", "indexing: the first input_length tokens of a document -> its docid", "documents"),
    Representation("labeled", "retrieval: a labeled training query -> a relevant docid", "labeled_queries"),
)}

# Rows of the study's tables: mixture name -> the representations it mixes.
MIXTURE_ROWS: dict[str, tuple[str, ...]] = {
    "labeled_only": ("labeled",),             # 1a: retrieval only
    "firstp_labeled": ("firstp", "labeled"),  # 2a: DSI (FirstP indexing + labeled queries)
}

DEFAULT_SHUFFLE_BUFFER_SIZE = 100_000
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_]+$")


def task_name(*, name: str, representation: str, docid_scheme: str) -> str:
    return f"{name}.{representation}.{docid_scheme}"


def mixture_name(*, name: str, row: str, docid_scheme: str) -> str:
    return f"{name}.{row}.{docid_scheme}"


@dataclasses.dataclass(frozen=True)
class _Registration:
    """Everything that defines the registered Tasks; equal registrations may be repeated, others conflict."""

    data_dir: str
    vocabulary_path: str
    input_length: int
    target_length: int
    mixing_rates: tuple[tuple[str, float], ...] | None
    shuffle_buffer_size: int
    cache_in_memory: bool


# (name, docid scheme) -> registration and the provider names it added.
_REGISTERED: dict[tuple[str, str], tuple[_Registration, tuple[str, ...]]] = {}


def register_dataset(
        *,
        name: str,
        data_dir: str | os.PathLike,
        docid_scheme: str = "naive",
        input_length: int = 64,
        target_length: int = 16,
        vocabulary_path: str | os.PathLike | None = None,
        mixing_rates: Mapping[str, float] | None = None,
        shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER_SIZE,
        cache_in_memory: bool = True,
) -> list[str]:
    """Registers the Tasks and Mixtures of one data dir (see the module docstring); returns their names.

    data_dir: MS MARCO or BEIR layout (`gr_jax.data.readers`); the vocabulary defaults to `{data_dir}/spm.model`.
    input_length: the FirstP length and the trim of every input (EOS included).
    target_length: the docid length budget (EOS included); a docid that does not fit is an error.
    mixing_rates: representation -> rate for every representation a registered mixture uses;
      None mixes proportionally to training example counts.
    shuffle_buffer_size: examples per task in the training shuffle buffer (after trimming, so ~80 tokens each),
      at most one epoch of the task; the default shuffles corpora up to 100k documents completely.
    cache_in_memory: keep each task's trimmed, tokenized examples in memory after the first epoch, so later
      epochs skip reading, tokenizing and the docid lookup (at most input_length + target_length int32 and
      the id strings per example: a few GB for all of MS MARCO, divided among hosts).

    Registering the same name and scheme again with the same arguments re-registers (picking up changed
    files); different arguments under the same name and scheme raise ValueError. Mixture rows whose
    representations have no training examples (e.g. a data dir without training queries) are skipped
    with a warning and not returned.
    """
    if not _NAME_PATTERN.match(name):
        raise ValueError(f"dataset name {name!r} must be letters, digits and underscores (it is part of task "
                         f"names `{{name}}.{{representation}}.{{scheme}}`)")
    if docid_scheme not in docid_tables.DOCID_SCHEMES:
        raise ValueError(f"unknown docid scheme {docid_scheme!r}; known: {sorted(docid_tables.DOCID_SCHEMES)}")
    for arg, value, smallest in (("input_length", input_length, 2), ("target_length", target_length, 2),
                                 ("shuffle_buffer_size", shuffle_buffer_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
            raise ValueError(f"{arg} must be an integer >= {smallest}, got {value!r}")
    data_dir = pathlib.Path(data_dir).resolve()
    vocabulary_path = pathlib.Path(vocabulary_path or data_dir / MODEL_FILENAME).resolve()
    registration = _Registration(
        data_dir=str(data_dir), vocabulary_path=str(vocabulary_path), input_length=input_length,
        target_length=target_length, shuffle_buffer_size=shuffle_buffer_size, cache_in_memory=bool(cache_in_memory),
        mixing_rates=None if mixing_rates is None else tuple(sorted((k, float(v)) for k, v in mixing_rates.items())))
    previous = _REGISTERED.get((name, docid_scheme))
    if previous is not None:
        if previous[0] != registration:
            raise ValueError(f"dataset {name!r} (docid scheme {docid_scheme!r}) is already registered with "
                             f"{previous[0]}; registering it with {registration} would change what its task names "
                             f"mean. Use another name.")
        _unregister(previous[1])
        del _REGISTERED[(name, docid_scheme)]

    dataset = open_dataset(data_dir)
    vocabulary = load_vocabulary(vocabulary_path)
    table = docid_tables.load_or_build_docid_table(dataset=dataset, scheme=docid_scheme, vocabulary=vocabulary,
                                                   vocabulary_path=vocabulary_path)
    if not len(table):
        raise ValueError(f"{dataset.collection_path} holds no documents")
    table.check_fits(target_length)

    names: list[str] = []  # Filled as providers are added, so a failure part-way removes them again.
    try:
        train_counts = _register_tasks(
            name=name, docid_scheme=docid_scheme, dataset=dataset, table=table, vocabulary=vocabulary,
            input_length=input_length, target_length=target_length, shuffle_buffer_size=shuffle_buffer_size,
            cache_in_memory=cache_in_memory, added=names)
        _register_mixtures(name=name, docid_scheme=docid_scheme, train_counts=train_counts,
                           mixing_rates=mixing_rates, added=names)
    except BaseException:
        _unregister(names)
        raise
    _REGISTERED[(name, docid_scheme)] = (registration, tuple(names))
    return names


def unregister_dataset(*, name: str, docid_scheme: str = "naive") -> list[str]:
    """Removes what `register_dataset(name=name, docid_scheme=docid_scheme, ...)` added; returns those names."""
    registration = _REGISTERED.pop((name, docid_scheme), None)
    if registration is None:
        return []
    _unregister(registration[1])
    return list(registration[1])


def _unregister(names: Sequence[str]) -> None:
    for provider in names:
        seqio.MixtureRegistry.remove(provider)
        seqio.TaskRegistry.remove(provider)


def _register_tasks(
        *,
        name: str,
        docid_scheme: str,
        dataset: RetrievalDataset,
        table: DocidTable,
        vocabulary: seqio.SentencePieceVocabulary,
        input_length: int,
        target_length: int,
        shuffle_buffer_size: int,
        cache_in_memory: bool,
        added: list[str],
) -> dict[str, int]:
    """Adds one Task per representation (appending its name to `added`); returns training example counts."""
    built = {kind: SOURCES[kind](dataset=dataset, table=table)
             for kind in dict.fromkeys(r.source for r in REPRESENTATIONS.values())}
    output_features = {
        "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True),
        # Pre-tokenized docid rows already end in EOS.
        "targets": seqio.Feature(vocabulary=vocabulary, add_eos=False),
    }
    train_counts = {}
    for representation in REPRESENTATIONS.values():
        source, counts = built[representation.source]
        if source is None:
            logger.warning("%s: no data for source %r, so no %r task", dataset.data_dir, representation.source,
                           representation.name)
            continue
        provider = task_name(name=name, representation=representation.name, docid_scheme=docid_scheme)
        inputs = representation.inputs(input_length)
        deterministic = [preprocessors.tokenize_inputs,
                         functools.partial(preprocessors.docid_targets, docid_table=table),
                         *(inputs if representation.deterministic else ())]
        seqio.TaskRegistry.add(
            provider,
            source=source,
            output_features=output_features,
            preprocessors=[
                *deterministic,
                *([preprocessors.cache_in_memory] if cache_in_memory else []),
                # Everything before the placeholder is the same every epoch: seqio may also cache it offline.
                seqio.CacheDatasetPlaceholder(),
                *(() if representation.deterministic else inputs),
                functools.partial(preprocessors.require_feature_lengths, provider_name=provider,
                                  minimum={"inputs": input_length, "targets": target_length}),
            ],
            # seqio repeats before shuffling: a buffer larger than one epoch would only make the first batch
            # wait for several epochs of preprocessing.
            shuffle_buffer_size=max(1, min(shuffle_buffer_size, counts.get(sources.TRAIN, 0))),
        )
        added.append(provider)
        train_counts[representation.name] = counts.get(sources.TRAIN, 0)
        logger.info("registered %s: %s", provider, counts)
    return train_counts


def _register_mixtures(
        *,
        name: str,
        docid_scheme: str,
        train_counts: Mapping[str, int],
        mixing_rates: Mapping[str, float] | None,
        added: list[str],
) -> None:
    """Adds one Mixture per row whose representations all have training examples (names appended to `added`)."""
    rows = {}
    for row, representations in MIXTURE_ROWS.items():
        empty = [r for r in representations if not train_counts.get(r)]
        if empty:
            logger.warning("skipping mixture row %r of %r: no training examples for %s", row, name, empty)
        else:
            rows[row] = representations
    if mixing_rates is not None:
        used = {r for representations in rows.values() for r in representations}
        missing = sorted(used - set(mixing_rates))
        unknown = sorted(set(mixing_rates) - set(REPRESENTATIONS))
        bad = sorted(r for r, rate in mixing_rates.items() if not rate > 0)
        if missing or unknown or bad:
            raise ValueError(f"mixing_rates {dict(mixing_rates)} must give a positive rate to each of {sorted(used)}"
                             f" (missing: {missing}, unknown: {unknown}, not positive: {bad})")
    for row, representations in rows.items():
        provider = mixture_name(name=name, row=row, docid_scheme=docid_scheme)
        seqio.MixtureRegistry.add(provider, [
            (task_name(name=name, representation=r, docid_scheme=docid_scheme),
             float(train_counts[r]) if mixing_rates is None else float(mixing_rates[r]))
            for r in representations])
        added.append(provider)
