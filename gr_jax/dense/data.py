"""Training data of a dual encoder: (query, positive document, K hard negatives) examples, batched for the trainer.

Why not seqio: the towers tokenise with their own vocabularies (MiniLM's WordPiece, the run's SentencePiece), and
documents are fetched by row (a positive, a mined negative) rather than streamed. The batches are a pure function
of (seed, batch index): batch b holds examples b*B .. b*B + B - 1 of an endless sequence of epochs, each a seeded
permutation of the training pairs, and its negatives are drawn from a generator seeded by (seed, b). So resuming at
any batch costs nothing (no fast-forward), and with several hosts every host computes the same global batch and
keeps its own rows (`shard_index` of `num_shards`), which is the one-process batch split over processes.

Hard negatives come from a TREC run of the training queries (`negatives_run`): BM25's (`python -m
gr_jax.tools.bm25 --split train --k 100 --run_file ...`) or the dense model's own (`python -m gr_jax.infer
--model_dir RUN --queries queries.train.tsv --output ...`, then a new run trained on it: self-mined negatives).
Each query's candidates are its run's top `negatives_depth` documents that are not judged relevant to it; of the K
slots, round(hard_negative_fraction * K) are drawn from them without replacement (the paper's hard-negative
ratio rho) and the rest uniformly from the collection (random negatives), as are the hard slots of a query the run
does not rank deep enough (the paper's fill order: hard, then random).

Batch features (numpy, leading dimension the host's share of the global batch):
    query_ids int32[b, Lq], query_mask bool[b, Lq]            the query (Lq = input_length)
    document_ids int32[b, Ld], document_mask bool[b, Ld]      its positive document (Ld = target_length)
    document_row int32[b]                                     the positive's row in the collection
    negative_ids int32[b, K, Ld], negative_mask bool[b, K, Ld], negative_row int32[b, K]
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Optional

import numpy as np

from gr_jax.data.batches import SeededEpochs, sharded_batches
from gr_jax.data.pairs import labeled_queries
from gr_jax.data.string_arrays import SortedKeys
from gr_jax.data.readers import DataFormatError, DocumentLookup, RetrievalDataset, open_dataset
from gr_jax.dense.towers import Tokenizer

logger = logging.getLogger(__name__)


_DOCIDS_AT_ONCE = 65_536  # docids held as Python objects at a time while the collection is read


class CorpusDocuments:
    """A collection's docids in collection order (a compact bytes array) and its texts by row, without holding the
    texts: the docids are read once, texts are read by line offset (`DocumentLookup`) when a batch needs them.

    An empty document (only whitespace) is an error naming its file and line: it would embed to the zero vector.
    """

    def __init__(self, dataset: RetrievalDataset):
        self.dataset = dataset
        chunks, docids = [], []  # a chunk of docids at a time as Python bytes, then a bytes array
        for row, (docid, text) in enumerate(dataset.collection()):
            if not text.strip():
                raise DataFormatError.at(dataset.collection_path, row + 1, f"document {docid!r} is empty")
            docids.append(docid.encode("utf-8"))
            if len(docids) == _DOCIDS_AT_ONCE:
                chunks.append(np.asarray(docids, dtype=bytes))
                docids = []
        chunks.append(np.asarray(docids, dtype=bytes))
        if not sum(len(chunk) for chunk in chunks):
            raise DataFormatError(f"{dataset.collection_path}: the collection is empty")
        self.docids = np.concatenate(chunks)  # S<longest id>: 8.8M MS MARCO pids take 62 MB
        self._keys = SortedKeys.of(self.docids)
        self._lookup = DocumentLookup(dataset)

    def __len__(self) -> int:
        return len(self.docids)

    def docid(self, row: int) -> str:
        return self.docids[row].decode("utf-8")

    def rows_of(self, docids: Sequence[str]) -> np.ndarray:
        """int64[len(docids)]: each docid's row, -1 where the collection has no such document."""
        return self._keys.rows_of(np.asarray([d.encode("utf-8") for d in docids], dtype=bytes))

    def __contains__(self, docid: object) -> bool:
        return isinstance(docid, str) and self.rows_of([docid])[0] >= 0

    def texts(self, rows: Iterable[int]) -> list[str]:
        """The texts of collection `rows` (ints, or an int array), in that order."""
        return [text for _, text in self._lookup.texts([int(r) for r in rows])]


@dataclasses.dataclass(frozen=True)
class DenseData:
    """Where a dual encoder's training and evaluation data come from (gin: `gin_configs/dense/train.gin`).

    input_length / target_length: query and document tokens (documents longer than `target_length` are cut, as
    sentence-transformers cuts at its max_seq_length; the first batch logs how many were). num_negatives: K hard
    negatives per query (0: in-batch negatives only); negatives_run, negatives_depth, hard_negative_fraction: see
    the module docstring.
    """
    name: str
    data_dir: str
    input_length: int = 32
    target_length: int = 128
    train_split: str = "train"
    eval_split: str = "dev"
    num_negatives: int = 0
    negatives_run: Optional[str] = None
    negatives_depth: int = 30
    hard_negative_fraction: float = 1.0

    def __post_init__(self):
        if self.num_negatives < 0 or self.negatives_depth < 1:
            raise ValueError(f"num_negatives must be >= 0 and negatives_depth >= 1, got {self.num_negatives} and "
                             f"{self.negatives_depth}")
        if not 0.0 <= self.hard_negative_fraction <= 1.0:
            raise ValueError(f"hard_negative_fraction must be in [0, 1], got {self.hard_negative_fraction}")
        if self.num_negatives and self.hard_negative_fraction > 0 and self.negatives_run is None:
            raise ValueError(f"{self.num_negatives} hard negatives per query need a negatives_run (a TREC run of the "
                             f"{self.train_split!r} queries, e.g. BM25's); or set hard_negative_fraction = 0 for "
                             "random negatives")

    @property
    def tokens_per_example(self) -> int:
        return self.input_length + (1 + self.num_negatives) * self.target_length


@dataclasses.dataclass(frozen=True, eq=False)
class TrainingPairs:
    """The (query, relevant document) pairs of a split and each query's mined negatives.

    query_texts: str[Q]; pair_query: int32[P] (index into query_texts); pair_document: int64[P] (collection rows);
    positives: per query, the rows of all its relevant documents; mined: int64[Q, depth], each query's run
    candidates (not relevant to it) best first, -1 past the ones found.
    """
    query_texts: tuple[str, ...]
    pair_query: np.ndarray
    pair_document: np.ndarray
    positives: tuple[frozenset, ...]
    mined: np.ndarray

    def __len__(self) -> int:
        return len(self.pair_query)


def training_pairs(*, data: DenseData, corpus: CorpusDocuments) -> TrainingPairs:
    """Reads the training split's queries and qrels (and the negatives run); counts what cannot be used in warnings
    (`gr_jax.data.pairs.labeled_queries`: the same pairs the generative tasks train on)."""
    labeled = labeled_queries(dataset=corpus.dataset, split=data.train_split, known_docids=corpus,
                              first_relevant_only=False)
    if not len(labeled):
        raise ValueError(f"{data.data_dir}: split {data.train_split!r} has no query with a relevant document in the "
                         f"collection: nothing to train on")
    index: dict[str, int] = {}
    texts: list[str] = []
    for qid, text in zip(labeled.qids, labeled.texts):
        if qid not in index:
            index[qid] = len(texts)
            texts.append(text)
    pair_query = np.asarray([index[qid] for qid in labeled.qids], np.int32)
    pair_document = corpus.rows_of(labeled.docids)
    positives: list[set[int]] = [set() for _ in texts]  # each query's positive rows
    for q, row in zip(pair_query.tolist(), pair_document.tolist()):
        positives[q].add(row)
    mined = np.full((len(texts), data.negatives_depth), -1, np.int64)
    if data.negatives_run is not None:
        from gr_jax.evaluation import read_trec_run
        run = read_trec_run(data.negatives_run)
        unranked = 0
        for qid, q in index.items():
            ranking = run.get(qid)
            if not ranking:
                unranked += 1
                continue
            rows = corpus.rows_of([docid for docid, _ in ranking])
            unknown = int(np.sum(rows < 0))
            if unknown:
                raise DataFormatError(f"{data.negatives_run}: the run ranks {unknown} documents for query {qid!r} "
                                      f"that are not in {corpus.dataset.collection_path}: a run of another corpus?")
            negatives = [r for r in rows.tolist() if r not in positives[q]][:data.negatives_depth]
            mined[q, :len(negatives)] = negatives
        if unranked:
            logger.warning("%s ranks no document for %d of the %d training queries: their hard negatives are random",
                           data.negatives_run, unranked, len(texts))
    return TrainingPairs(query_texts=tuple(texts), pair_query=pair_query, pair_document=pair_document,
                         positives=tuple(frozenset(p) for p in positives), mined=mined)


class BatchSource:
    """Global batch b of the endless, seeded example sequence (see the module docstring)."""

    def __init__(self, *, data: DenseData, corpus: CorpusDocuments, pairs: TrainingPairs, tokenizer: Tokenizer,
                 batch_size: int, seed: int):
        self.data = data
        self.corpus = corpus
        self.pairs = pairs
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.seed = seed
        self._epochs = SeededEpochs(num_examples=len(pairs), batch_size=batch_size, seed=seed)
        self._reported_truncation = False

    def pair_indices(self, batch: int) -> np.ndarray:
        """int64[batch_size]: the training pairs of global batch `batch`."""
        return self._epochs.indices(batch)

    def negatives(self, batch: int, pairs: np.ndarray) -> np.ndarray:
        """int64[batch_size, K]: each example's negatives (see the module docstring)."""
        k = self.data.num_negatives
        out = np.full((len(pairs), k), -1, np.int64)
        if not k:
            return out
        rng = np.random.default_rng([self.seed, batch, 1])
        hard = int(round(self.data.hard_negative_fraction * k))
        num_docs = len(self.corpus)
        for i, pair in enumerate(pairs.tolist()):
            query = int(self.pairs.pair_query[pair])
            mined = self.pairs.mined[query]
            mined = mined[mined >= 0]
            take = min(hard, len(mined))
            chosen = list(rng.choice(mined, size=take, replace=False)) if take else []
            excluded = set(chosen) | self.pairs.positives[query]
            if len(excluded) >= num_docs:
                raise ValueError(f"the collection ({num_docs} documents) is too small for {k} negatives per query")
            while len(chosen) < k:
                row = int(rng.integers(num_docs))
                if row not in excluded:
                    chosen.append(row)
                    excluded.add(row)
            out[i] = chosen
        return out

    def batch(self, batch: int, *, shard_index: int = 0, num_shards: int = 1) -> dict[str, np.ndarray]:
        """This host's rows of global batch `batch` (see the module docstring for the features)."""
        pairs = self.pair_indices(batch)
        negatives = self.negatives(batch, pairs)
        share = self.batch_size // num_shards
        mine = slice(shard_index * share, (shard_index + 1) * share)
        pairs, negatives = pairs[mine], negatives[mine]
        queries = self.tokenizer([self.pairs.query_texts[self.pairs.pair_query[p]] for p in pairs.tolist()],
                                 length=self.data.input_length)
        positive_rows = self.pairs.pair_document[pairs]
        rows = np.concatenate([positive_rows, negatives.reshape(-1)])
        documents = self.tokenizer(self.corpus.texts(rows), length=self.data.target_length)
        if (documents.truncated or queries.truncated) and not self._reported_truncation:
            logger.warning("this batch's texts longer than their length are cut to it: %d of %d documents "
                           "(target_length=%d, FirstP), %d of %d queries (input_length=%d); said once per run",
                           documents.truncated, len(rows), self.data.target_length, queries.truncated, len(pairs),
                           self.data.input_length)
            self._reported_truncation = True
        n, k, length = len(pairs), self.data.num_negatives, self.data.target_length
        return {
            "query_ids": queries.ids, "query_mask": queries.mask,
            "document_ids": documents.ids[:n], "document_mask": documents.mask[:n],
            "document_row": positive_rows.astype(np.int32),
            "negative_ids": documents.ids[n:].reshape(n, k, length),
            "negative_mask": documents.mask[n:].reshape(n, k, length),
            "negative_row": negatives.astype(np.int32),
        }

    def batches(self, *, start_batch: int = 0, shard_index: int = 0, num_shards: int = 1,
                prefetch: int = 2) -> Iterator[dict[str, np.ndarray]]:
        """Endless batches from `start_batch`, made `prefetch` ahead (`sharded_batches`), so the next batch is ready
        while the devices train on this one."""
        return sharded_batches(self.batch, batch_size=self.batch_size, start_batch=start_batch,
                               shard_index=shard_index, num_shards=num_shards, prefetch=prefetch)


def open_training_data(*, data: DenseData, tokenizer: Tokenizer, batch_size: int, seed: int) -> BatchSource:
    corpus = CorpusDocuments(open_dataset(data.data_dir))
    return BatchSource(data=data, corpus=corpus, pairs=training_pairs(data=data, corpus=corpus), tokenizer=tokenizer,
                       batch_size=batch_size, seed=seed)
