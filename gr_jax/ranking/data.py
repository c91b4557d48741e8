"""Ranked-list training data (SToICaL, Rozonoyer et al. Eq. 11): each query's ranked docids d_1 > ... > d_n become
weighted examples (query, d_r) with item weight lambda(r) and, optionally, trie-marginalised soft token targets.

Where the ranked lists come from (`ranked_lists`):
  * graded qrels of the training split: the judged documents (grade > 0) by grade, highest first, ties in the
    qrels file's order (TREC DL's graded qrels; the WordNet hypernym task writes grade n_q - r + 1);
  * plus a teacher's TREC run (`run_file`: BM25's, the dense retriever's): after the judged documents, the run's
    other documents in its order, `depth` documents in all (`depth` also cuts lists from qrels alone).
A judged or ranked docid that is not in the docid space is an error naming the file.

Examples (`ranked_list_examples`, built once per run on the host): one per (query, d_r) with lambda(r) > 0 (the
item weights of `gr_jax.ranking.targets`: `TopOne` keeps only d_1, which is today's next-token training), plus,
with `indexing`, each document's own text (FirstP: its first input_length - 1 tokens) -> its docid with weight 1,
as the study's indexing examples. With `token_targets` (`TrieTargets`), every ranked example also carries y(r, t)
as [target_length, K] arrays (`trie_targets`); indexing examples and TopOne's single docid get one-hot rows.

Batches (`gr_jax.data.examples.ExampleBatches`) are a pure function of (seed, batch index): resuming at any step
costs nothing; decoder_loss_weights carry lambda(r) on the docid's tokens (EOS included).

Batch reduction: the trainer divides the summed loss by the summed weights, so a batch's loss is
sum_i lambda_i sum_t CE_it / sum_i lambda_i |d_i| (Eq. 14's normalisation by the summed lambda, per token as the
study's training); the paper leaves it open.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Optional, Protocol

import numpy as np

from gr_jax.data.examples import Examples, HostExamplesData
from gr_jax.data.readers import DataFormatError, RetrievalDataset, open_dataset
from gr_jax.docids import DocidSpace
from gr_jax.ranking.targets import TopOne, trie_targets
from gr_jax.vocabulary import PAD_ID, encode_and_count_cut

logger = logging.getLogger(__name__)


class ItemWeights(Protocol):
    """lambda(r): float32 weights of 1-based ranks int[n] in lists of lengths int[n] (`gr_jax.ranking.targets`)."""

    def __call__(self, ranks: np.ndarray, list_lengths: np.ndarray) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True)
class TrieTargets:
    """Token-level targets y(r, t) over the trie of the query's ranked docids, mu(r) = 1 / r^beta (Sec. 4.3);
    `from_rank`: the trie of d_r, ..., d_n only (the combined variant of App. D, with `Fractional(2)`).
    max_children: K, the most children of one prefix (more is an error)."""
    beta: float = 2.0
    from_rank: bool = False
    max_children: int = 16

    def __post_init__(self):
        if not self.beta >= 0 or self.max_children < 1:
            raise ValueError(f"TrieTargets needs beta >= 0 and max_children >= 1, got {self.beta}, "
                             f"{self.max_children}")


def ranked_lists(dataset: RetrievalDataset, *, split: str, run_file: Optional[str] = None,
                 depth: Optional[int] = None) -> dict[str, list[str]]:
    """qid -> docids best first (see the module docstring), for every query of `split` with at least one."""
    if depth is not None and depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    qrels = dataset.qrels(split)
    run = {}
    if run_file is not None:
        from gr_jax.evaluation import read_trec_run
        run = read_trec_run(run_file)
    lists = {}
    for qid, _ in dataset.queries(split):
        judged = [(docid, grade) for docid, grade in qrels.get(qid, {}).items() if grade > 0]
        docids = [docid for docid, _ in sorted(judged, key=lambda item: -item[1])]  # stable: file order in ties
        seen = set(docids)
        docids += [docid for docid, _ in run.get(qid, []) if docid not in seen]
        if depth is not None:
            docids = docids[:depth]
        if docids:
            lists[qid] = docids
    return lists


def one_hot_targets(targets: np.ndarray, max_children: int) -> tuple[np.ndarray, np.ndarray]:
    """Soft-target arrays of targets int[N, T] that put all mass on the target token: [N, T, K] tokens and mass
    (the rows of examples without a ranked list beside those with one)."""
    tokens = np.zeros(targets.shape + (max_children,), np.int32)
    mass = np.zeros(targets.shape + (max_children,), np.float32)
    tokens[..., 0] = targets
    mass[..., 0] = targets != PAD_ID
    return tokens, mass


def ranked_list_examples(*, data: "RankedListData", docid_space: DocidSpace, vocabulary) -> Examples:
    """The examples of `data` (see the module docstring)."""
    dataset = open_dataset(data.data_dir)
    table = docid_space.table
    table.check_fits(data.target_length)
    lists = ranked_lists(dataset, split=data.train_split, run_file=data.run_file, depth=data.depth)
    if not lists:
        raise ValueError(f"{data.data_dir}: no query of split {data.train_split!r} has a ranked document")
    texts = dict(dataset.queries(data.train_split))
    width = data.target_length
    tokens = np.zeros((len(table), width), np.int32)
    tokens[:, :table.tokens.shape[1]] = table.tokens
    query_texts: list[str] = []
    target_rows: list[np.ndarray] = []  # int32[target_length] each
    row_weights: list[float] = []
    soft_token_rows: list[np.ndarray] = []  # int32[target_length, K] each
    soft_mass_rows: list[np.ndarray] = []  # float32[target_length, K] each
    for qid, docids in lists.items():
        rows = table.rows_of(docids)
        if (rows < 0).any():
            source = data.run_file or f"{data.data_dir}'s qrels.{data.train_split}"
            raise DataFormatError(f"{source}: query {qid!r} ranks {int((rows < 0).sum())} documents that are not in "
                                  f"the docid space of {data.data_dir} (e.g. {docids[int(np.argmax(rows < 0))]!r})")
        n = len(rows)
        ranks = np.arange(1, n + 1)
        lam = np.asarray(data.item_weights(ranks, np.full(n, n)), np.float32)
        for rank in ranks[lam > 0].tolist():
            query_texts.append(texts[qid])
            target_rows.append(tokens[rows[rank - 1]])
            row_weights.append(lam[rank - 1])
            if data.token_targets is not None:
                spec = data.token_targets
                y_tokens, y_mass = trie_targets(tokens[rows], rank=rank, beta=spec.beta,
                                                max_children=spec.max_children, from_rank=spec.from_rank)
                soft_token_rows.append(y_tokens)
                soft_mass_rows.append(y_mass)
    inputs, cut = encode_and_count_cut(query_texts, vocabulary=vocabulary, input_length=data.input_length)
    if cut:
        if not data.cut_queries:
            raise ValueError(f"{cut} of the {len(query_texts)} training queries of {data.data_dir} are longer than "
                             f"input_length={data.input_length} - 1 tokens: raise input_length, or ask for "
                             f"cut_queries=True")
        logger.info("ranked-list examples: %d of %d training queries cut to their first %d tokens (cut_queries)",
                    cut, len(query_texts), data.input_length - 1)
    targets = np.stack(target_rows)
    weights = np.asarray(row_weights, np.float32)
    if data.indexing:
        doc_ids, documents = zip(*dataset.collection())
        doc_inputs, doc_cut = encode_and_count_cut(documents, vocabulary=vocabulary, input_length=data.input_length)
        logger.info("indexing examples: %d documents, %d cut to their first %d tokens (FirstP)", len(documents),
                    doc_cut, data.input_length - 1)
        inputs = np.concatenate([inputs, doc_inputs])
        targets = np.concatenate([targets, tokens[table.rows_of(doc_ids)]])
        weights = np.concatenate([weights, np.ones(len(documents), np.float32)])
    if data.token_targets is None:
        return Examples(inputs=inputs, targets=targets, weights=weights)
    k = data.token_targets.max_children
    soft_tokens, soft_mass = np.stack(soft_token_rows), np.stack(soft_mass_rows)
    if data.indexing:
        extra_tokens, extra_mass = one_hot_targets(targets[len(soft_tokens):], k)
        soft_tokens, soft_mass = np.concatenate([soft_tokens, extra_tokens]), np.concatenate([soft_mass, extra_mass])
    return Examples(inputs=inputs, targets=targets, weights=weights, soft_tokens=soft_tokens, soft_mass=soft_mass)


@dataclasses.dataclass(frozen=True)
class RankedListData(HostExamplesData):
    """A generative run trained on ranked lists (gin: `gin_configs/ranking/ranked_lists.gin`); evaluated as any
    generative run on `eval_split`'s queries and qrels, with the docids of `docid_scheme`.

    item_weights: lambda(r) (`TopOne()`, `Fractional(alpha)`, `Stepwise()`); token_targets: None (one-hot) or
    `TrieTargets`; run_file / depth: a teacher's ranking after the judged documents, and the list length;
    indexing: add every document's own text as an example of its docid; cut_queries: a training query longer than
    input_length - 1 tokens keeps its first ones (counted in the log, as evaluation cuts its queries) instead of
    being an error."""
    name: str
    data_dir: str
    docid_scheme: str = "naive"
    item_weights: ItemWeights = TopOne()
    token_targets: Optional[TrieTargets] = None
    run_file: Optional[str] = None
    depth: Optional[int] = None
    indexing: bool = False
    cut_queries: bool = False
    train_split: str = "train"
    eval_split: str = "dev"
    input_length: int = 64
    target_length: int = 16
    vocabulary_path: Optional[str] = None

    def docid_space(self) -> DocidSpace:
        from gr_jax import tasks
        return tasks.load_docid_space(data_dir=self.data_dir, docid_scheme=self.docid_scheme,
                                      input_length=self.input_length, target_length=self.target_length,
                                      vocabulary_path=self.vocabulary_path)

    @property
    def mixture_name(self) -> str:
        return f"{self.name}.ranked_lists.{self.docid_scheme}"

    def examples(self, *, docid_space: DocidSpace, vocabulary) -> Examples:
        return ranked_list_examples(data=self, docid_space=docid_space, vocabulary=vocabulary)


__all__ = ["ItemWeights", "RankedListData", "TrieTargets", "one_hot_targets", "ranked_list_examples",
           "ranked_lists"]
