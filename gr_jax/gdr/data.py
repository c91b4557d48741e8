"""GDR's training data: (query, positive document) examples, the positive's cluster id as the decoder's target, its
frozen vector and vectors of other documents of its cluster (the cluster-adaptive negatives), batched for the
trainer.

Examples come from three sources, each a (text, document row of the clustered index) pair:
  * labeled: the training split's queries and their relevant documents (one example per relevant pair);
  * d2q (`d2q_path`, a file of `gr_jax.data.d2q`'s layouts): synthetic queries of each document, trained like
    labeled ones (the paper's DocT5Query augmentation; `d2q_queries_per_passage` caps them per document);
  * indexing (`indexing=True`): every document's own text, cut to input_length tokens, as a query of its cluster
    (DSI's indexing task): how the generative stage learns the clusters of documents no query names.
Documents' texts are read by row (`DocumentLookup`) when a batch needs them, never held in memory.

Teacher targets (`token_targets`, SToICaL's trie targets of `gr_jax.ranking`): a labeled example's target becomes a
soft one over the clusters of a ranked list, its positive first, then the other documents its query's list holds
(judged ones by grade, then a teacher's TREC run of the training queries, `run_file`; `depth` documents in all).
Document r has mass 1 / r^beta and a cluster the mass of its documents, renormalised at each step of the cluster
id's trie: the decoder learns the positive's cluster and, below it, where the teacher (a dense retriever) finds the
query's other near documents, for the clusters recalled at inference. d2q and indexing examples keep one-hot
targets.

Batches are a pure function of (seed, batch index), as the dual encoder's (`gr_jax.dense.data`): batch b holds
examples b*B .. b*B + B - 1 of an endless sequence of seeded epoch permutations, and its negatives are drawn from a
generator seeded by (seed, b); resuming costs nothing and every host computes the same global batch and keeps its
rows. Each example's M negatives are drawn without replacement from its positive's cluster (other documents; a
cluster of fewer than M + 1 documents leaves slots empty, row -1).

Batch features (numpy, leading dimension the host's share of the global batch):
    encoder_input_tokens int32[b, input_length]          the query in the query encoder's tokens
    decoder_input_tokens, decoder_target_tokens, decoder_loss_weights int32[b, target_length]   its cluster id
    positive_row int32[b], positive_vector float32[b, dim]
    negative_rows int32[b, M], negative_vectors float32[b, M, dim]
    with token_targets: decoder_soft_target_tokens int32[b, target_length, K], decoder_soft_target_mass float32
    (`gr_jax.data.features`)
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import pathlib
from collections.abc import Iterator, Sequence
from typing import Optional

import numpy as np

from gr_jax.data.batches import SeededEpochs, sharded_batches
from gr_jax.data.d2q import iter_passage_queries
from gr_jax.data.features import SOFT_TARGET_MASS, SOFT_TARGET_TOKENS, decoder_inputs
from gr_jax.data.pairs import labeled_queries
from gr_jax.data.readers import DataFormatError, DocumentLookup, RetrievalDataset, open_dataset
from gr_jax.data.string_arrays import string_array
from gr_jax.dense.data import CorpusDocuments
from gr_jax.dense.towers import Tokenizer
from gr_jax.gdr import index as gdr_index
from gr_jax.gdr.index import ClusteredIndex
from gr_jax.ranking.data import TrieTargets, one_hot_targets, ranked_lists
from gr_jax.ranking.targets import trie_targets

logger = logging.getLogger(__name__)

_INDEXING = -1  # example_text value of an indexing example (the document's own text)
_D2Q_PASSAGES_AT_ONCE = 65_536  # passages whose synthetic queries are read into Python objects at a time


@dataclasses.dataclass(frozen=True)
class GdrData:
    """Where a GDR run's data come from (see the module docstring). index_dir: the clustered index
    (`python -m gr_jax.tools.gdr_index`), whose documents must be the data dir's collection. token_targets: soft
    targets over the clusters of each labeled query's ranked list (None: one-hot on the positive's cluster), with
    run_file (a teacher's TREC run of `train_split`'s queries) and depth (the list's length) shaping that list."""
    name: str
    data_dir: str
    index_dir: str
    input_length: int = 32
    train_split: str = "train"
    eval_split: str = "dev"
    num_cluster_negatives: int = 8
    indexing: bool = True
    d2q_path: Optional[str] = None
    d2q_queries_per_passage: Optional[int] = None
    vocabulary_path: Optional[str] = None
    token_targets: Optional[TrieTargets] = None
    run_file: Optional[str] = None
    depth: Optional[int] = None

    def __post_init__(self):
        if self.token_targets is None and (self.run_file is not None or self.depth is not None):
            raise ValueError("run_file and depth shape the ranked lists of soft targets: set token_targets too (with "
                             "one-hot targets they would be read for nothing)")
        if self.depth is not None and self.depth < 1:
            raise ValueError(f"depth must be >= 1 or None, got {self.depth}")
        if self.input_length < 2 or self.num_cluster_negatives < 0:
            raise ValueError(f"input_length must be >= 2 and num_cluster_negatives >= 0, got {self.input_length} and "
                             f"{self.num_cluster_negatives}")
        if self.d2q_queries_per_passage is not None and self.d2q_queries_per_passage < 1:
            raise ValueError(f"d2q_queries_per_passage must be >= 1 or None, got {self.d2q_queries_per_passage}")

    @functools.cached_property
    def target_length(self) -> int:
        """The cluster ids' length, EOS included (every level's digits, then EOS), from the index's manifest."""
        manifest_path = pathlib.Path(self.index_dir) / gdr_index.MANIFEST
        if not manifest_path.is_file():
            raise FileNotFoundError(f"{manifest_path} is missing: build the clustered index first (python -m "
                                    f"gr_jax.tools.gdr_index --index_dir ... --out_dir {self.index_dir})")
        branching = json.loads(manifest_path.read_text())["clusters"]["branching"]
        return sum(len(str(k - 1)) for k in branching) + 1

    @property
    def tokens_per_example(self) -> int:
        return self.input_length + self.target_length


@dataclasses.dataclass(frozen=True, eq=False)
class Examples:
    """query_texts: StringDType[Q] (labeled and d2q queries: `gr_jax.data.string_arrays`, no Python object each);
    example_text: int64[E], an index into query_texts or -1 (the document's own text); example_row: int64[E], the
    positive's row in the clustered index; collection_row: int64[num index rows], each index row's row in the data
    dir's collection (-1: an added document); ranked_rows: with token_targets, int64[num labeled examples, n], each
    labeled example's ranked list as index rows, its positive first, -1 past the list's end (the labeled examples
    are the first ones)."""
    query_texts: np.ndarray
    example_text: np.ndarray
    example_row: np.ndarray
    collection_row: np.ndarray
    counts: dict
    ranked_rows: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.example_row)


def training_examples(*, data: GdrData, index: ClusteredIndex) -> Examples:
    """Every training example of `data` over `index`'s documents (see the module docstring)."""
    corpus = CorpusDocuments(open_dataset(data.data_dir))
    collection_row = np.full(len(index), -1, np.int64)
    in_index = index.rows_of(corpus.docids)
    if (in_index < 0).any():
        missing = corpus.docid(int(np.argmax(in_index < 0)))
        raise ValueError(f"{data.data_dir}: {int((in_index < 0).sum())} documents of the collection (e.g. "
                         f"{missing!r}) are not in the clustered index {data.index_dir}: an index of another corpus?")
    collection_row[in_index] = np.arange(len(corpus))
    text_chunks: list[np.ndarray] = []  # StringDType arrays: no Python object per query outlives its chunk
    example_text: list[np.ndarray] = []
    example_row: list[np.ndarray] = []
    counts = {}
    labeled = labeled_queries(dataset=corpus.dataset, split=data.train_split, known_docids=corpus,
                              first_relevant_only=False)
    text_chunks.append(string_array(labeled.texts))
    example_text.append(np.arange(len(labeled.texts), dtype=np.int64))
    example_row.append(index.rows_of(labeled.docids))
    counts["labeled"] = len(labeled.texts)
    ranked_rows = None
    if data.token_targets is not None:
        ranked_rows = _ranked_rows(data=data, dataset=corpus.dataset, qids=labeled.qids, positives=labeled.docids,
                                   index=index)
    if data.d2q_path is not None:
        start = num_texts = len(labeled.texts)
        passages = iter_passage_queries(data.d2q_path, docids_in_order=(d.decode() for d in corpus.docids),
                                        is_docid=corpus.__contains__)
        while chunk := list(itertools.islice(passages, _D2Q_PASSAGES_AT_ONCE)):
            kept = [queries[:data.d2q_queries_per_passage] if data.d2q_queries_per_passage else queries
                    for _, queries in chunk]
            text_chunks.append(string_array([query for queries in kept for query in queries]))
            example_row.append(np.repeat(index.rows_of([docid for docid, _ in chunk]), [len(q) for q in kept]))
            num_texts += text_chunks[-1].size
        example_text.append(np.arange(start, num_texts, dtype=np.int64))
        counts["d2q"] = num_texts - start
    if data.indexing:
        example_text.append(np.full(len(corpus), _INDEXING, np.int64))
        example_row.append(in_index.astype(np.int64))
        counts["indexing"] = len(corpus)
    example_row_all = np.concatenate(example_row)
    if not len(example_row_all):
        raise ValueError(f"{data.data_dir}: no training example (no labeled {data.train_split!r} query, no d2q file, "
                         "indexing off)")
    logger.info("GDR training examples: %s", counts)
    return Examples(query_texts=np.concatenate(text_chunks), example_text=np.concatenate(example_text),
                    example_row=example_row_all, collection_row=collection_row, counts=counts,
                    ranked_rows=ranked_rows)


def _ranked_rows(*, data: GdrData, dataset: RetrievalDataset, qids: Sequence[str], positives: Sequence[str],
                 index: ClusteredIndex) -> np.ndarray:
    """Examples.ranked_rows of the labeled examples (qids[i], positives[i]): the positive, then its query's other
    ranked documents (`gr_jax.ranking.data.ranked_lists`), `depth` in all. A judged document the index lacks was
    counted by `labeled_queries` and is left out; a run's document the index lacks is an error naming the run."""
    lists = ranked_lists(dataset, split=data.train_split, run_file=data.run_file)
    qrels = dataset.qrels(data.train_split)
    rows_of_lists = []
    for qid, positive in zip(qids, positives):
        ranked = [positive] + [docid for docid in lists.get(qid, []) if docid != positive]
        rows = index.rows_of(ranked)
        unknown = [docid for docid, row in zip(ranked, rows.tolist()) if row < 0 and docid not in qrels[qid]]
        if unknown:
            raise DataFormatError(f"{data.run_file}: query {qid!r} ranks {len(unknown)} documents that are not in the "
                                  f"clustered index {data.index_dir} (e.g. {unknown[0]!r}): a run of another corpus?")
        rows = rows[rows >= 0][:data.depth]
        rows_of_lists.append(rows)
    out = np.full((len(rows_of_lists), max((len(rows) for rows in rows_of_lists), default=1)), -1, np.int64)
    for i, rows in enumerate(rows_of_lists):
        out[i, :len(rows)] = rows
    return out


class GdrBatchSource:
    """Global batch b of the endless, seeded example sequence (see the module docstring)."""

    def __init__(self, *, data: GdrData, index: ClusteredIndex, examples: Examples, cluster_tokens: np.ndarray,
                 tokenizer: Tokenizer, batch_size: int, seed: int):
        if cluster_tokens.shape != (index.clusters.num_clusters, data.target_length):
            raise ValueError(f"cluster id tokens of shape {list(cluster_tokens.shape)} for "
                             f"{index.clusters.num_clusters} clusters of length {data.target_length}")
        self.data = data
        self.index = index
        self.examples = examples
        self.cluster_tokens = cluster_tokens
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.seed = seed
        self.offsets, self.members = index.clusters.members()
        self._lookup = DocumentLookup(open_dataset(data.data_dir))
        self._epochs = SeededEpochs(num_examples=len(examples), batch_size=batch_size, seed=seed)
        self._reported_truncation = False

    def example_indices(self, batch: int) -> np.ndarray:
        """int64[batch_size]: the examples of global batch `batch`."""
        return self._epochs.indices(batch)

    def cluster_negatives(self, batch: int, rows: np.ndarray) -> np.ndarray:
        """int64[len(rows), M]: for each positive row, M other documents of its cluster (-1 past the cluster's)."""
        m = self.data.num_cluster_negatives
        out = np.full((len(rows), m), -1, np.int64)
        if not m:
            return out
        rng = np.random.default_rng([self.seed, batch, 2])
        clusters = self.index.clusters.assignment[rows]
        for i, (row, cluster) in enumerate(zip(rows.tolist(), clusters.tolist())):
            start, stop = int(self.offsets[cluster]), int(self.offsets[cluster + 1])
            take = min(m + 1, stop - start)
            drawn = self.members[start + rng.choice(stop - start, size=take, replace=False)]
            drawn = drawn[drawn != row][:m]
            out[i, :len(drawn)] = drawn
        return out

    def _texts(self, examples: np.ndarray) -> list[str]:
        text_ids = self.examples.example_text[examples]
        rows = self.examples.example_row[examples]
        texts = [str(self.examples.query_texts[t]) if t >= 0 else "" for t in text_ids.tolist()]
        indexing = np.flatnonzero(text_ids == _INDEXING)
        if indexing.size:
            documents = self._lookup.texts(self.examples.collection_row[rows[indexing]].tolist())
            for i, (_, text) in zip(indexing.tolist(), documents):
                texts[i] = text
        return texts

    def batch(self, batch: int, *, shard_index: int = 0, num_shards: int = 1) -> dict[str, np.ndarray]:
        """This host's rows of global batch `batch` (see the module docstring for the features)."""
        examples = self.example_indices(batch)
        rows = self.examples.example_row[examples]
        negatives = self.cluster_negatives(batch, rows)
        share = self.batch_size // num_shards
        mine = slice(shard_index * share, (shard_index + 1) * share)
        examples, rows, negatives = examples[mine], rows[mine], negatives[mine]
        queries = self.tokenizer(self._texts(examples), length=self.data.input_length)
        if queries.truncated and not self._reported_truncation:
            logger.warning("texts longer than input_length=%d tokens are cut to it (%d of this batch's %d; "
                           "documents' own texts for indexing are cut as FirstP); said once per run",
                           self.data.input_length, queries.truncated, len(rows))
            self._reported_truncation = True
        targets = self.cluster_tokens[self.index.clusters.assignment[rows]]
        features = {
            "encoder_input_tokens": queries.ids.astype(np.int32),
            "decoder_input_tokens": decoder_inputs(targets).astype(np.int32),
            "decoder_target_tokens": targets.astype(np.int32),
            "decoder_loss_weights": (targets > 0).astype(np.int32),
            "positive_row": rows.astype(np.int32),
            "positive_vector": self.index.vectors(rows),
            "negative_rows": negatives.astype(np.int32),
            "negative_vectors": self.index.vectors(negatives),
        }
        if self.data.token_targets is not None:
            features[SOFT_TARGET_TOKENS], features[SOFT_TARGET_MASS] = self.soft_targets(examples, targets)
        return features

    def soft_targets(self, examples: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(int32[b, target_length, K], float32[b, target_length, K]): each example's soft targets (see the module
        docstring); one-hot on `targets` for an example without a ranked list."""
        spec = self.data.token_targets
        ranked_rows = self.examples.ranked_rows
        if spec is None or ranked_rows is None:
            raise ValueError(f"{self.data.data_dir}: soft targets need token_targets and the examples' ranked lists")
        tokens, mass = one_hot_targets(targets, spec.max_children)
        assignment = self.index.clusters.assignment
        for i, example in enumerate(examples.tolist()):
            if example < len(ranked_rows):
                rows = ranked_rows[example]
                tokens[i], mass[i] = trie_targets(self.cluster_tokens[assignment[rows[rows >= 0]]], rank=1,
                                                  beta=spec.beta, max_children=spec.max_children)
        return tokens, mass

    def batches(self, *, start_batch: int = 0, shard_index: int = 0, num_shards: int = 1,
                prefetch: int = 2) -> Iterator[dict[str, np.ndarray]]:
        """Endless batches from `start_batch`, made `prefetch` ahead (`gr_jax.data.batches.sharded_batches`)."""
        return sharded_batches(self.batch, batch_size=self.batch_size, start_batch=start_batch,
                               shard_index=shard_index, num_shards=num_shards, prefetch=prefetch)
