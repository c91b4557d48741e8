"""Labeled (query, relevant document) pairs of a split, resolved against the documents a run can name: the pairs
that every family trains on (the generative tasks' `labeled` source, the dense and GDR batches, n-gram targets,
doc2query's inverted pairs), read by one function so that every tool counts and reports the same left-out pairs.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Container

from gr_jax.data.readers import RetrievalDataset

logger = logging.getLogger(__name__)


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
        known_docids: Container[str],
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
    where = f"{dataset.data_dir} split {split!r}"
    if unknown_pairs:
        logger.warning("%s: %d qrels name unknown documents (not in the collection); left out", where,
                       unknown_pairs)
    if without_known:
        logger.warning("%s: %d queries have no relevant document in the collection; left out", where,
                       without_known)
    dataset.check_judged_queries(split, qrels=qrels, qids=seen_qids)
    if unjudged:
        logger.info("%s: %d queries have no relevant judgement (no example)", where, unjudged)
    return LabeledQueries(qids=tuple(qids), texts=tuple(texts), docids=tuple(docids))


def known_qrels_docids(*, dataset: RetrievalDataset, splits: Collection[str], docids: Collection[str]) -> set[str]:
    """The docids named by the qrels of `splits` that are in `docids` (a scan; no set of all docids is built)."""
    named = {docid for split in splits for judged in dataset.qrels(split).values() for docid in judged}
    return {docid for docid in docids if docid in named}
