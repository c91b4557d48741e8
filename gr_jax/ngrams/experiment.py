"""A generative run whose identifiers are document spans (MINDER-style n-gram ids; docs/scaling.md).

`NgramData` trains query -> span: for each judged (query, document) pair of the training split, `num_spans` windows
of the document drawn by their overlap with the query (`gr_jax.ngrams.spans.select_starts`), one example each; with
`indexing`, each document's own text (FirstP) -> `num_spans` of its windows drawn uniformly. Decoding is constrained
to the corpus' windows (the span index's trie), and `NgramRetriever` ranks documents by the generated spans they
contain (`aggregate_documents`): `EvalConfig.num_beams` spans per query, `ranking_depth` documents.

gin: `gin_configs/ngrams/train.gin` (`EXPERIMENT = @experiment.NgramExperiment()`), after a size gin.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import pathlib
import time
from collections.abc import Container, Sequence
from typing import Any, Optional

import numpy as np

from gr_jax.data.examples import Examples, HostExamplesData
from gr_jax.data.pairs import labeled_queries
from gr_jax.data.readers import DataFormatError, open_dataset
from gr_jax.docids import DocidSpace
from gr_jax.docids.identifiers import DocumentIdentifiers
from gr_jax.experiment import Built, Experiment
from gr_jax.ngrams.index import SpanIndex, aggregate_documents, index_path
from gr_jax.ngrams.spans import select_starts, words_of
from gr_jax.retrievers import Ranking
from gr_jax.retrievers.generative import GenerativeRetriever
from gr_jax.retrievers.settings import RetrievalSettings
from gr_jax.vocabulary import encode_and_count_cut, load_vocabulary, vocabulary_file

logger = logging.getLogger(__name__)

NGRAM_SCHEME = "ngram"


@functools.lru_cache(maxsize=2)
def _load_index(path: pathlib.Path) -> SpanIndex:
    return SpanIndex.load(path)


@dataclasses.dataclass(frozen=True)
class NgramData(HostExamplesData):
    """Where an n-gram run's data come from (see the module docstring). width: words per span (the span index of
    `{data_dir}/ngrams.w{width}.npz`); num_spans: spans per (query, document) pair (MINDER: 10 of 10 words);
    temperature: of the span-start softmax; seed: of the span draws."""
    name: str
    data_dir: str
    width: int = 10
    num_spans: int = 10
    temperature: float = 1.0
    indexing: bool = True
    seed: int = 0
    train_split: str = "train"
    eval_split: str = "dev"
    input_length: int = 64
    target_length: int = 32
    vocabulary_path: Optional[str] = None

    def span_index(self) -> SpanIndex:
        return _load_index(index_path(self.data_dir, width=self.width).resolve())

    def docid_space(self) -> DocidSpace:
        table = self.span_index().table
        table.check_fits(self.target_length)
        vocabulary = load_vocabulary(vocabulary_file(self))
        return DocidSpace.from_table(table, scheme=NGRAM_SCHEME, text_vocab_size=vocabulary.vocab_size)

    @property
    def mixture_name(self) -> str:
        return f"{self.name}.ngrams.w{self.width}"

    def examples(self, *, docid_space: Optional[DocidSpace], vocabulary: Any) -> Examples:
        del docid_space  # the span index is the docid space
        return ngram_examples(data=self, index=self.span_index(), vocabulary=vocabulary)


def ngram_examples(*, data: NgramData, index: SpanIndex, vocabulary: Any) -> Examples:
    """The (input, span) examples of `data` (see the module docstring), each of weight 1. Judgements of documents
    outside the collection are counted in a warning (`gr_jax.data.pairs.labeled_queries`)."""
    dataset = open_dataset(data.data_dir)
    texts = [text for _, text in dataset.collection()]
    rows = {docid: row for row, docid in enumerate(index.docids)}
    if len(texts) != len(index.docids):
        raise DataFormatError(f"{index_path(data.data_dir, width=data.width)} indexes {len(index.docids)} documents "
                              f"but {dataset.collection_path} has {len(texts)}: rebuild the span index")
    labeled = labeled_queries(dataset=dataset, split=data.train_split, known_docids=rows, first_relevant_only=False)
    inputs, windows = [], []
    for pair, (query, docid) in enumerate(zip(labeled.texts, labeled.docids)):
        row = rows[docid]
        starts = select_starts(query, words_of(texts[row]), num_spans=data.num_spans,
                               temperature=data.temperature, rng=np.random.default_rng([data.seed, 0, pair]))
        inputs += [query] * data.num_spans
        windows.append(index.windows_of(row)[starts])
    if data.indexing:
        for row, text in enumerate(texts):
            starts = np.random.default_rng([data.seed, 1, row]).integers(len(index.windows_of(row)),
                                                                          size=data.num_spans)
            inputs += [text] * data.num_spans
            windows.append(index.windows_of(row)[starts])
    if not windows:
        raise ValueError(f"{data.data_dir}: nothing to train on (no judged pair in {data.train_split!r}, no indexing)")
    tokens, cut = encode_and_count_cut(inputs, vocabulary=vocabulary, input_length=data.input_length)
    logger.info("%s: %d examples; %d inputs cut to their first %d tokens (documents: FirstP)", data.mixture_name,
                len(inputs), cut, data.input_length - 1)
    spans = index.table.tokens[np.concatenate(windows)]
    targets = np.zeros((len(spans), data.target_length), np.int32)
    targets[:, :spans.shape[1]] = spans
    return Examples(inputs=tokens, targets=targets, weights=np.ones(len(tokens), np.float32))


@dataclasses.dataclass(frozen=True)
class _SpanSearch:
    """The span search of a retrieval setting: as many spans as beams."""
    batch_size: int
    num_beams: int
    constrained: bool

    @property
    def depth(self) -> int:
        return self.num_beams


class NgramRetriever:
    """Generated spans -> documents (`aggregate_documents`); `rank(queries, k)` returns k documents per query."""

    def __init__(self, *, spans: GenerativeRetriever, index: SpanIndex, num_spans: int):
        self.spans = spans
        self.index = index
        self.num_spans = num_spans

    def with_params(self, params: Any) -> NgramRetriever:
        return NgramRetriever(spans=self.spans.with_params(params), index=self.index, num_spans=self.num_spans)

    def rank(self, queries: Sequence[str], *, k: int) -> Ranking:
        spans = self.spans.rank(queries, k=self.num_spans)
        start = time.perf_counter()
        ids, scores = [], []
        for span_ids, span_scores in zip(spans.ids, spans.scores):  # constrained decoding: every id is a span
            rows, doc_scores = aggregate_documents(self.index.table.rows_of(span_ids), span_scores,
                                                   index=self.index, k=k)
            ids.append([self.index.docids[row] for row in rows])
            scores.append(doc_scores)
        return Ranking(ids=ids, scores=scores, seconds=spans.seconds + time.perf_counter() - start,
                       compile_seconds=spans.compile_seconds)


@dataclasses.dataclass(kw_only=True)
class NgramBuilt(Built):
    """A generative run over the span index: its retriever ranks documents (see the module docstring)."""
    index: SpanIndex

    def retriever(self, params: Any = None, *, settings: RetrievalSettings, show_progress: bool = False,
                  step: Optional[int] = None) -> NgramRetriever:
        if not settings.constrained:
            raise ValueError("n-gram ids decode through the span trie: constrained must be True")
        search = _SpanSearch(batch_size=settings.batch_size, num_beams=settings.num_beams, constrained=True)
        del step
        spans = self.docid_retriever(params, settings=search, show_progress=show_progress)
        return NgramRetriever(spans=spans, index=self.index, num_spans=settings.num_beams)

    @functools.cached_property
    def _rows(self) -> dict[str, int]:
        return {docid: row for row, docid in enumerate(self.index.docids)}

    def known_docids(self) -> Optional[Container[str]]:
        return self._rows

    def collection_rows(self, docids: Sequence[str]) -> np.ndarray:
        return np.asarray([self._rows.get(d, -1) for d in docids], np.int64)

    def document_identifiers(self) -> DocumentIdentifiers:
        """Every document of the collection, named by its distinct span windows (rows of the span table)."""
        return DocumentIdentifiers.from_lists(self.index.docids, [np.unique(self.index.windows_of(row))
                                                                  for row in range(len(self.index.docids))])


@dataclasses.dataclass(frozen=True, kw_only=True)
class NgramExperiment(Experiment):
    """An `Experiment` on `NgramData` (its docid space is the span index's windows)."""
    dataset: NgramData

    def build(self, *, keep_checkpoints: int = 3) -> NgramBuilt:
        vocabulary, docid_space, model = self.generative_model()
        mesh, trainer, checkpointer = self.training_parts(model, keep_checkpoints=keep_checkpoints)
        return NgramBuilt(experiment=self, vocabulary=vocabulary, docid_space=docid_space, model=model, mesh=mesh,
                          trainer=trainer, checkpointer=checkpointer, index=self.dataset.span_index())
