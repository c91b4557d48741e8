"""seqio Tasks and Mixtures of the study: document representations -> docid, and the table rows mixing them.

`register_dataset(name=..., data_dir=..., docid_space=...)` registers, for one data dir and its docid space (a
run builds the space once, with `load_docid_space`, and hands the same value to the model builder and the
retriever):

* one Task per document representation in `REPRESENTATIONS`, named `{name}.{representation}.{scheme}`
  (split 'train'; `labeled` also has 'validation'):
    - `firstp`  (indexing): the first `input_length` tokens of each document (FirstP) -> its docid.
    - `daq`     (indexing, Document as Query): `daq_num_chunks` windows of `input_length` tokens at seeded random
                offsets in each document -> its docid.
    - `d2q`     (indexing): synthetic queries of each passage (docTTTTTquery, `{data_dir}/d2q.tsv`) -> its docid;
                registered only when that file exists.
    - `labeled` (retrieval): a training query -> a relevant docid, one example per relevant (query, document)
                pair. Split 'validation': each dev query -> its first relevant docid (for an eval loss).
    - `span_corruption` (continued pretraining, not a table row): T5's span corruption over all of each
                document's text; targets are the masked spans, and the sentinels are the ids right after the
                SentencePiece pieces, reserved in every run's vocabulary. Train on it alone
                (`row='span_corruption'`, with a SentencePiece-token docid scheme such as naive), then start
                the indexing runs from that run (`INIT_CHECKPOINT`).
* one Mixture per row of the study's tables in `MIXTURE_ROWS`, named `{name}.{row}.{scheme}`, and the same
  Mixture again under the row's table id (`ROW_IDS`), e.g. `msmarco.2a.naive` = `msmarco.firstp_labeled.naive`:
    - 1a `labeled_only`: labeled queries only, no indexing.
    - 2a `firstp_labeled` (DSI), 2b `daq_labeled`: one indexing representation + labeled queries.
    - 3a `daq_d2q_labeled`, 3b `firstp_daq_d2q_labeled`: several indexing representations + labeled queries.
    - 6a `daq_only`, 6b `d2q_only`: indexing alone (no labeled queries).
  A row whose representations lack a task (no D2Q file) or training examples (no training queries) is not
  registered, and a warning says which and why. Mixing rates default to the tasks' training example counts
  (one pass over each per "epoch" of the mixture); `mixing_rates` overrides them per representation.

Adding a representation or a row is one entry in these tables; every task shares the same pipeline:

    source -> [on_text] -> tokenize_inputs -> docid_targets -> [on_tokens] (FirstP: trim_inputs_and_append_eos)
           -> cache_in_memory (if cacheable) -> seqio.CacheDatasetPlaceholder -> [after_cache] (DaQ: daq_chunks)
           -> require_feature_lengths

Targets are the docid table's rows (pre-tokenized, EOS included), never re-tokenized or trimmed; the table must
fit `target_length`. The ids after the SentencePiece pieces that span corruption uses as sentinels are reserved in
every run's docid space (`load_docid_space`), so a continued-pretraining run and the indexing runs started from it
have the same shapes; schemes whose tokens go beyond the vocabulary (semantic2d, atomic) enlarge it further.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pathlib
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import seqio
import tensorflow as tf

from gr_jax.data import d2q, preprocessors
from gr_jax.data.readers import RetrievalDataset, open_dataset
from gr_jax.docids import DocidSpace, DocidTable
from gr_jax.data.wordpiece import WordPieceVocabulary
from gr_jax.vocabulary import MODEL_FILENAME, load_vocabulary
from gr_jax.tasks import sources
from gr_jax.tasks.options import RepresentationOptions

logger = logging.getLogger(__name__)

# Not a row of the study: the span corruption Task, trained on alone (row name = Task name) before indexing.
PRETRAINING_ROW = "span_corruption"

Preprocessor = Callable[..., tf.data.Dataset]
# Given the registered options, the seqio preprocessors of one stage of a representation's pipeline.
Stage = Callable[[RepresentationOptions], tuple[Preprocessor, ...]]

# Raw example sources a representation can start from (see `tasks.sources`).
SOURCES: dict[str, Callable[..., tuple[seqio.DataSource | None, dict[str, int]]]] = {
    "documents": sources.documents_source,                  # every document: {"docid", "inputs": text}
    "labeled_queries": sources.labeled_queries_source,      # (query, relevant doc): {"qid", "docid", "inputs"}
    "synthetic_queries": sources.synthetic_queries_source,  # per passage: {"docid", "queries": string[n]}
}


def no_steps(options: RepresentationOptions) -> tuple[Preprocessor, ...]:
    del options
    return ()


def first_tokens(options: RepresentationOptions) -> tuple[Preprocessor, ...]:
    """The first `input_length - 1` tokens + EOS: FirstP on documents, a plain trim on queries."""
    return (functools.partial(preprocessors.trim_inputs_and_append_eos, input_length=options.input_length),)


def daq_chunks(options: RepresentationOptions) -> tuple[Preprocessor, ...]:
    """DaQ: `daq_num_chunks` seeded random windows of `input_length - 1` tokens + EOS per document."""
    return (functools.partial(preprocessors.daq_chunks, num_chunks=options.daq_num_chunks,
                              input_length=options.input_length, seed=options.daq_seed),)


def synthetic_query_selection(options: RepresentationOptions) -> tuple[Preprocessor, ...]:
    """D2Q: the first or a seeded random `d2q_queries_per_passage` of each passage's queries, one example each."""
    return (functools.partial(preprocessors.select_synthetic_queries,
                              queries_per_passage=options.d2q_queries_per_passage,
                              selection=options.d2q_selection, seed=options.d2q_seed),)


def span_corruption(options: RepresentationOptions) -> tuple[Preprocessor, ...]:
    """T5's span corruption over all of each document's tokens, for continued pretraining on the corpus."""
    return (functools.partial(preprocessors.span_corruption, window=options.span_window,
                              sentinel_start=options.sentinel_start, noise_density=options.span_noise_density,
                              mean_noise_span_length=options.span_mean_length, seed=options.span_seed),)


def one_example_per_input(options: RepresentationOptions) -> int:
    del options
    return 1


@dataclasses.dataclass(frozen=True)
class Representation:
    """One way of turning a data dir into `(inputs, docid)` examples.

    source: the raw examples it starts from, a key of `SOURCES`.
    on_text: preprocessors on the source's string examples, before tokenizing (e.g. D2Q's query selection).
    on_tokens: preprocessors on tokenized `inputs: int32[n]` (no EOS) with their `targets`, before the cache;
      must be the same every epoch.
    after_cache: preprocessors run on every pass after the cache, on the repeated data: cheap expansions whose
      output would take much more memory than their input (DaQ: the chunks of each cached document).
    cacheable: whether `cache_in_memory` may keep this task's examples; False when they cannot fit (D2Q:
      k synthetic queries per passage, e.g. 88M examples for MS MARCO at k=10), which are re-read each epoch.
    examples_per_input: training examples per source example, for the default mixing rates and the shuffle
      buffer (at most that many for D2Q: passages may have fewer queries; at least that many for span
      corruption: one per window of a document).
    docid_targets: targets are the docid table's rows; False when a stage makes its own (span corruption).
    After the last stage, `inputs` is at most `input_length` tokens, EOS last.
    """

    name: str
    description: str
    source: str
    on_text: Stage = no_steps
    on_tokens: Stage = first_tokens
    after_cache: Stage = no_steps
    cacheable: bool = True
    examples_per_input: Callable[[RepresentationOptions], int] = one_example_per_input
    docid_targets: bool = True


REPRESENTATIONS: dict[str, Representation] = {r.name: r for r in (
    Representation("firstp", "indexing: the first input_length tokens of a document -> its docid", "documents"),
    Representation("daq", "indexing (Document as Query): random input_length-token windows of a document -> its "
                   "docid", "documents", on_tokens=no_steps, after_cache=daq_chunks,
                   examples_per_input=lambda options: options.daq_num_chunks),
    Representation("d2q", "indexing: synthetic queries of a passage (doc2query) -> its docid", "synthetic_queries",
                   on_text=synthetic_query_selection, cacheable=False,
                   examples_per_input=lambda options: options.d2q_queries_per_passage),
    Representation("labeled", "retrieval: a labeled training query -> a relevant docid", "labeled_queries"),
    Representation(PRETRAINING_ROW, "continued pretraining: T5 span corruption of every document's text (targets "
                   "are the masked spans, not docids)", "documents", on_tokens=no_steps, after_cache=span_corruption,
                   docid_targets=False),
)}

# Rows of the study's tables (Pradeep et al. 2023, Tables 2 and 3): mixture name -> the representations it mixes.
MIXTURE_ROWS: dict[str, tuple[str, ...]] = {
    "labeled_only": ("labeled",),                                    # 1a: retrieval only, no indexing
    "firstp_labeled": ("firstp", "labeled"),                         # 2a: DSI
    "daq_labeled": ("daq", "labeled"),                               # 2b
    "daq_d2q_labeled": ("daq", "d2q", "labeled"),                    # 3a
    "firstp_daq_d2q_labeled": ("firstp", "daq", "d2q", "labeled"),   # 3b
    "daq_only": ("daq",),                                            # 6a: indexing only
    "d2q_only": ("d2q",),                                            # 6b: indexing only
}
# Table id -> row name; each row is registered under both names (the same Mixture, the same batches).
ROW_IDS: dict[str, str] = {
    "1a": "labeled_only", "2a": "firstp_labeled", "2b": "daq_labeled", "3a": "daq_d2q_labeled",
    "3b": "firstp_daq_d2q_labeled", "6a": "daq_only", "6b": "d2q_only",
}

DEFAULT_SHUFFLE_BUFFER_SIZE = 100_000
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_]+$")


def task_name(*, name: str, representation: str, docid_scheme: str) -> str:
    return f"{name}.{representation}.{docid_scheme}"


def mixture_name(*, name: str, row: str, docid_scheme: str) -> str:
    """`{name}.{row}.{scheme}`; `row` is a row name of `MIXTURE_ROWS` or its table id in `ROW_IDS` (e.g. '2a')."""
    row_name(row)  # Checks it.
    return f"{name}.{row}.{docid_scheme}"


def row_name(row: str) -> str:
    """The row name of a row name or table id ('2a' -> 'firstp_labeled')."""
    if row in MIXTURE_ROWS:
        return row
    if row in ROW_IDS:
        return ROW_IDS[row]
    if row == PRETRAINING_ROW:
        return row
    raise ValueError(f"unknown mixture row {row!r}; rows: {sorted(MIXTURE_ROWS)}, table ids: {sorted(ROW_IDS)}, "
                     f"continued pretraining: {PRETRAINING_ROW!r}")


@dataclasses.dataclass(frozen=True)
class _Registration:
    """Everything that defines the registered Tasks; equal registrations may be repeated, others conflict."""

    data_dir: str
    vocabulary_path: str
    target_length: int
    options: RepresentationOptions
    mixing_rates: tuple[tuple[str, float], ...] | None
    shuffle_buffer_size: int
    cache_in_memory: bool
    input_vocabulary_dir: str | None = None


@dataclasses.dataclass(frozen=True)
class _Registered:
    registration: _Registration
    table: DocidTable  # The targets: another table gives the task names another meaning.
    names: tuple[str, ...]  # The providers it added.

    def means(self, registration: _Registration, table: DocidTable) -> bool:
        """Whether registering `registration` with `table` would mean the same tasks (the tables compared only when
        they are not the same object: a run registers its one DocidSpace). Caching in memory or not changes no
        example: such a registration replaces the tasks."""
        same = dataclasses.replace(registration, cache_in_memory=self.registration.cache_in_memory)
        return same == self.registration and (table is self.table or (
            table.docids == self.table.docids and np.array_equal(table.tokens, self.table.tokens)))


# What each registered (name, docid scheme) means, so that the same names are never registered with another
# meaning, and `unregister_dataset` removes exactly what was added. Nothing here sizes a model: that is the
# DocidSpace's job.
_REGISTRATIONS: dict[tuple[str, str], _Registered] = {}


def _representations_of(rows: Sequence[str] | None) -> frozenset[str] | None:
    """The representations the given rows train on (None: every row's)."""
    if rows is None:
        return None
    return frozenset(r for row in rows for r in MIXTURE_ROWS.get(row, (row,)))


def register_dataset(
        *,
        name: str,
        data_dir: str | os.PathLike,
        docid_space: DocidSpace,
        input_length: int = 64,
        target_length: int = 16,
        vocabulary_path: str | os.PathLike | None = None,
        mixing_rates: Mapping[str, float] | None = None,
        shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER_SIZE,
        cache_in_memory: bool = True,
        daq_num_chunks: int = 10,
        daq_seed: int = 0,
        d2q_path: str | os.PathLike | None = None,
        d2q_queries_per_passage: int = 10,
        d2q_selection: str = "first",
        d2q_seed: int = 0,
        rows: Sequence[str] | None = None,
        input_vocabulary_dir: str | os.PathLike | None = None,
) -> list[str]:
    """Registers the Tasks and Mixtures of one data dir (see the module docstring); returns their names.

    data_dir: MS MARCO or BEIR layout (`gr_jax.data.readers`); the vocabulary defaults to `{data_dir}/spm.model`.
    docid_space: the data dir's docids (`load_docid_space`); its scheme is part of the task names, its table gives
      the targets, and it must hold the span corruption sentinels of these lengths after the vocabulary's pieces.
    input_length: the FirstP length, the DaQ window and the trim of every input (EOS included).
    target_length: the docid length budget (EOS included); a docid that does not fit is an error.
    mixing_rates: representation -> rate for every representation a registered mixture uses;
      None mixes proportionally to training example counts.
    shuffle_buffer_size: examples per task in the training shuffle buffer (after trimming, so ~80 tokens each),
      at most one epoch of the task; the default shuffles corpora up to 100k documents completely.
    cache_in_memory: keep each task's tokenized examples in memory after the first epoch, so later epochs skip
      reading, tokenizing and the docid lookup (at most input_length + target_length int32 and the id strings
      per example, whole documents for DaQ: a few GB for all of MS MARCO, divided among hosts). D2Q is never
      cached (k queries per passage would not fit); it streams its file every epoch.
    daq_num_chunks, daq_seed: DaQ examples per document and the seed of their offsets (the same every epoch).
    d2q_path: the synthetic-queries file (see `gr_jax.data.d2q`); default `{data_dir}/d2q.tsv`, whose absence
      only leaves the D2Q task and its rows out (with a warning). A given path that does not exist is an error.
    d2q_queries_per_passage: D2Q examples per passage (10 to 100 in the study; fewer if a passage has fewer).
    d2q_selection: "first" (the first k of each passage's queries) or "random" (a random subset, seeded by
      `d2q_seed`, the same every epoch).
    rows: the mixture rows a run trains on (row names, table ids or 'span_corruption'): only they and the tasks
      they mix are registered, and a row that cannot be registered is an error. None registers every
      representation and every row whose representations have data, and skips the others with a warning.
    input_vocabulary_dir: a WordPiece tokenizer folder (`gr_jax.data.wordpiece`, e.g. all-MiniLM-L6-v2's) that
      tokenises the inputs instead of the SentencePiece vocabulary, for a pretrained tower encoder; the targets
      stay the docid table's. Span corruption (its targets are input tokens) cannot be registered with it.

    Registering the same name and scheme again with the same arguments re-registers (picking up changed
    files); different arguments under the same name and scheme raise ValueError. Mixture rows whose
    representations have no task or no training examples are skipped with a warning and not returned.
    """
    if not _NAME_PATTERN.match(name):
        raise ValueError(f"dataset name {name!r} must be letters, digits and underscores (it is part of task "
                         f"names `{{name}}.{{representation}}.{{scheme}}`)")
    docid_scheme = docid_space.scheme
    wanted = None if rows is None else tuple(dict.fromkeys(row_name(row) for row in rows))
    for arg, value, smallest in (("target_length", target_length, 2), ("shuffle_buffer_size", shuffle_buffer_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
            raise ValueError(f"{arg} must be an integer >= {smallest}, got {value!r}")
    data_dir = pathlib.Path(data_dir).resolve()
    vocabulary_path = pathlib.Path(vocabulary_path or data_dir / MODEL_FILENAME).resolve()
    if d2q_path is not None and not pathlib.Path(d2q_path).is_file():
        raise FileNotFoundError(f"d2q_path {d2q_path} does not exist (leave it unset to use {{data_dir}}/"
                                f"{d2q.DEFAULT_FILENAME} when present)")
    vocabulary = load_vocabulary(vocabulary_path)
    input_vocabulary = None
    if input_vocabulary_dir is not None:
        input_vocabulary = WordPieceVocabulary(input_vocabulary_dir)
        if wanted is not None and PRETRAINING_ROW in wanted:
            raise ValueError(f"{name}: the {PRETRAINING_ROW!r} row's targets are spans of the inputs, which "
                             f"{input_vocabulary} tokenises, not the decoder's vocabulary {vocabulary_path}")
    options = RepresentationOptions(
        input_length=input_length, daq_num_chunks=daq_num_chunks, daq_seed=daq_seed,
        d2q_path=str(pathlib.Path(d2q_path or d2q.default_path(data_dir)).resolve()),
        d2q_queries_per_passage=d2q_queries_per_passage, d2q_selection=d2q_selection, d2q_seed=d2q_seed,
        target_length=target_length, sentinel_start=vocabulary.vocab_size)
    registration = _Registration(
        data_dir=str(data_dir), vocabulary_path=str(vocabulary_path), target_length=target_length, options=options,
        shuffle_buffer_size=shuffle_buffer_size, cache_in_memory=bool(cache_in_memory),
        mixing_rates=None if mixing_rates is None else tuple(sorted((k, float(v)) for k, v in mixing_rates.items())),
        input_vocabulary_dir=None if input_vocabulary is None else str(input_vocabulary.model_dir))
    if docid_space.text_vocab_size != vocabulary.vocab_size:
        raise ValueError(f"the docid space was built over a vocabulary of {docid_space.text_vocab_size} pieces, but "
                         f"{vocabulary_path} has {vocabulary.vocab_size}")
    if docid_space.model_vocab_size < options.sentinel_start + options.num_sentinels:
        raise ValueError(f"the docid space's {docid_space.model_vocab_size} model token ids do not hold the "
                         f"{options.num_sentinels} span corruption sentinels after the {vocabulary.vocab_size} pieces "
                         f"(build it with tasks.load_docid_space and the same input and target lengths)")
    previous = _REGISTRATIONS.get((name, docid_scheme))
    if previous is not None:
        if not previous.means(registration, docid_space.table):
            raise ValueError(f"dataset {name!r} (docid scheme {docid_scheme!r}) is already registered with "
                             f"{previous.registration} and its docid table; registering it with {registration} and "
                             f"this docid table would change what its task names mean. Use another name.")
        _unregister(previous.names)
        del _REGISTRATIONS[(name, docid_scheme)]

    dataset = open_dataset(data_dir)
    table = docid_space.table
    table.check_fits(target_length)

    needed = _representations_of(wanted)
    if input_vocabulary is not None and needed is None:  # span corruption's targets would be WordPiece ids
        needed = frozenset(REPRESENTATIONS) - {PRETRAINING_ROW}
    names: list[str] = []  # Filled as providers are added, so a failure part-way removes them again.
    try:
        train_counts = _register_tasks(
            name=name, docid_scheme=docid_scheme, dataset=dataset, table=table, vocabulary=vocabulary,
            input_vocabulary=input_vocabulary or vocabulary, options=options, target_length=target_length,
            shuffle_buffer_size=shuffle_buffer_size, cache_in_memory=cache_in_memory, needed=needed, added=names)
        _register_mixtures(name=name, docid_scheme=docid_scheme, train_counts=train_counts,
                           mixing_rates=mixing_rates, rows=wanted, added=names)
    except BaseException:
        _unregister(names)
        raise
    _REGISTRATIONS[(name, docid_scheme)] = _Registered(registration=registration, table=table, names=tuple(names))
    return names


def unregister_dataset(*, name: str, docid_scheme: str = "naive") -> list[str]:
    """Removes what `register_dataset(name=name, docid_scheme=docid_scheme, ...)` added; returns those names."""
    registered = _REGISTRATIONS.pop((name, docid_scheme), None)
    if registered is None:
        return []
    _unregister(registered.names)
    return list(registered.names)


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
        input_vocabulary: seqio.Vocabulary,
        options: RepresentationOptions,
        target_length: int,
        shuffle_buffer_size: int,
        cache_in_memory: bool,
        needed: frozenset[str] | None,
        added: list[str],
) -> dict[str, int]:
    """Adds one Task per `needed` representation (None: every one) that has data (appending its name to
    `added`); returns training example counts per representation."""
    representations = [r for r in REPRESENTATIONS.values() if needed is None or r.name in needed]
    built = {kind: SOURCES[kind](dataset=dataset, table=table, options=options)
             for kind in dict.fromkeys(r.source for r in representations)}
    output_features = {
        "inputs": seqio.Feature(vocabulary=input_vocabulary, add_eos=True),
        # Pre-tokenized docid rows already end in EOS.
        "targets": seqio.Feature(vocabulary=vocabulary, add_eos=False),
    }
    train_counts = {}
    for representation in representations:
        source, counts = built[representation.source]
        if source is None:
            logger.warning("%s: no data for source %r, so no %r task", dataset.data_dir, representation.source,
                           representation.name)
            continue
        provider = task_name(name=name, representation=representation.name, docid_scheme=docid_scheme)
        train_count = counts.get(sources.TRAIN, 0) * representation.examples_per_input(options)
        seqio.TaskRegistry.add(
            provider,
            source=source,
            output_features=output_features,
            preprocessors=[
                *representation.on_text(options),
                preprocessors.tokenize_inputs,
                *([functools.partial(preprocessors.docid_targets, docid_table=table)]
                  if representation.docid_targets else []),
                *representation.on_tokens(options),
                *([preprocessors.cache_in_memory] if cache_in_memory and representation.cacheable else []),
                # Everything before the placeholder is the same every epoch: seqio may also cache it offline.
                seqio.CacheDatasetPlaceholder(),
                *representation.after_cache(options),
                functools.partial(preprocessors.require_feature_lengths, provider_name=provider,
                                  minimum={"inputs": options.input_length, "targets": target_length}),
            ],
            # seqio repeats before shuffling: a buffer larger than one epoch would only make the first batch
            # wait for several epochs of preprocessing.
            shuffle_buffer_size=max(1, min(shuffle_buffer_size, train_count)),
        )
        added.append(provider)
        train_counts[representation.name] = train_count
        logger.info("registered %s: %s source examples, %d training examples", provider, counts, train_count)
    return train_counts


def _register_mixtures(
        *,
        name: str,
        docid_scheme: str,
        train_counts: Mapping[str, int],
        mixing_rates: Mapping[str, float] | None,
        rows: Sequence[str] | None,
        added: list[str],
) -> None:
    """Adds one Mixture per row (of `rows`, default all) whose representations all have training examples, under
    its row name and its table id (names appended to `added`: all row names, then all table ids). A row of `rows`
    that cannot be registered is an error; of all rows, a warning."""
    registered = {}
    table_ids = {row: table_id for table_id, row in ROW_IDS.items()}
    for row, representations in MIXTURE_ROWS.items():
        if rows is not None and row not in rows:
            continue
        missing = [r for r in representations if r not in train_counts]
        empty = [r for r in representations if r in train_counts and not train_counts[r]]
        if missing or empty:
            reason = "; ".join(([f"no task for {missing}"] if missing else [])
                               + ([f"no training examples for {empty}"] if empty else []))
            if rows is not None:
                raise ValueError(f"{name}: mixture row {table_ids[row]} {row!r} cannot be registered: {reason} (see "
                                 "the warnings above; a D2Q row needs {data_dir}/d2q.tsv from gr_jax.tools.doc2query)")
            logger.warning("%s: skipping mixture row %s %r: %s", name, table_ids[row], row, reason)
        else:
            registered[row] = representations
    if rows is not None and PRETRAINING_ROW in rows and PRETRAINING_ROW not in train_counts:
        raise ValueError(f"{name}: the {PRETRAINING_ROW!r} task cannot be registered (no documents)")
    if mixing_rates is not None:
        used = {r for representations in registered.values() for r in representations}
        missing = sorted(used - set(mixing_rates))
        unknown = sorted(set(mixing_rates) - set(REPRESENTATIONS))
        bad = sorted(r for r, rate in mixing_rates.items() if not rate > 0)
        if missing or unknown or bad:
            raise ValueError(f"mixing_rates {dict(mixing_rates)} must give a positive rate to each of {sorted(used)}"
                             f" (missing: {missing}, unknown: {unknown}, not positive: {bad})")
    for alias in (False, True):
        for row, representations in registered.items():
            provider = mixture_name(name=name, row=table_ids[row] if alias else row, docid_scheme=docid_scheme)
            seqio.MixtureRegistry.add(provider, [
                (task_name(name=name, representation=r, docid_scheme=docid_scheme),
                 float(train_counts[r]) if mixing_rates is None else float(mixing_rates[r]))
                for r in representations])
            added.append(provider)
