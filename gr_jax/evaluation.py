"""Retrieval evaluation: MRR@10 / Recall@k / nDCG@10 over ranked docid lists, and TREC run files.

The numbers follow ir-measures / trec_eval definitions (``RR@10``, ``R@k`` with relevance >= 1) so that they are
comparable with the papers we reproduce (DSI, NCI, GENRE-style generative retrieval, BM25 baselines), with two
conventions those evaluators share with the study:

* the mean is over *all* queries of the qrels: a query missing from the run (or with an empty ranking) scores 0,
  and so does a qrels query without any relevant document (relevance >= 1);
* a docid repeated in one ranking (beam search can produce the same docid twice after de-tokenisation) counts
  once, at its first (best) position; later copies are removed and do not use up rank positions.

A run is ``dict[qid, list[docid]]`` (best first) or ``dict[qid, list[(docid, score)]]``; scored rankings are
ordered by score, highest first, ties keeping list order (trec_eval also ranks by score, not by list order).
Docids need not exist in any corpus: generative models may emit invalid ones, measured by ``invalid_docid_rate``.
"""
from __future__ import annotations

import logging
import math
import operator
import os
import tempfile
from collections.abc import Container, Mapping, Sequence
from typing import Union, cast

import numpy as np

from gr_jax.data.readers import DataFormatError
from gr_jax.data.readers import read_lines  # (line number, line): splits on \n only, names bad UTF-8

Ranking = Union[Sequence[str], Sequence[tuple[str, float]]]
Run = Mapping[str, Ranking]
ScoredRun = Mapping[str, Sequence[tuple[str, float]]]
Qrels = Mapping[str, Mapping[str, int]]

MRR_CUTOFF = 10
DEFAULT_KS = (1, 5, 10, 20, 100)

logger = logging.getLogger(__name__)


def fillable_ks(ks: Sequence[int], *, depth: int | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the cut-offs a ranking `depth` deep can fill, the ones it cannot): Recall@k with k > depth would only
    repeat Recall@depth (20 beams give Recall@100 = Recall@20), so it is not a Recall@k. depth None: all fill."""
    ks = tuple(int(k) for k in ks)
    if depth is None:
        return ks, ()
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    return tuple(k for k in ks if k <= depth), tuple(k for k in ks if k > depth)


def ranked_docids(ranking: Ranking) -> list[str]:
    """Docids of one ranking, best first, each docid once (first occurrence kept).

    Accepts a plain ``list[docid]`` (already best first) or a ``list[(docid, score)]``, which is ordered by
    descending score with ties kept in list order.
    """
    if len(ranking) == 0:
        return []
    docids: Sequence[str]
    if isinstance(ranking[0], str):  # the first entry's kind is the whole ranking's
        docids = cast(Sequence[str], ranking)
    else:  # Python's sort is stable, also with reverse=True: equal scores keep list order.
        scored = cast(Sequence[tuple[str, float]], ranking)
        docids = [docid for docid, _ in sorted(scored, key=operator.itemgetter(1), reverse=True)]
    return list(dict.fromkeys(docids))


def retrieval_metrics(
    *,
    run: Run,
    qrels: Qrels,
    valid_docids: Container[str] | None = None,
    ks: Sequence[int] = DEFAULT_KS,
    depth: int | None = None,
) -> dict[str, float | int]:
    """MRR@10, Recall@k for each k, nDCG@10 and the rate of invalid top-1 docids.

    Returns ``{"MRR@10", "Recall@{k}" for k in ks, "nDCG@10", "num_queries"[, "invalid_docid_rate"]}``, where
    ``depth`` is the most docids the run's rankings can hold per query (a beam search's beams, a dense retriever's
    k, BM25's run depth; None: not known, every k is reported): a Recall@k with k > depth is left out, with one
    warning naming the cut-offs left out and the depth (a corpus smaller than k is no reason: rankings may be
    shorter than ``depth``).

    * ``MRR@10``: mean reciprocal rank of the first relevant docid within the top 10 (0 if none).
    * ``nDCG@10``: trec_eval's ``ndcg_cut.10`` (ir-measures ``nDCG@10``): gain = the qrels grade (graded qrels,
      e.g. TREC DL's 0-3; grades <= 0 gain nothing), discount 1 / log2(rank + 1), normalised by the ideal ordering
      of the query's judged grades (0 for a query without a relevant document).
    * ``Recall@k``: |relevant docids in the top k| / |relevant docids| (ir-measures ``R@k``).
    * ``num_queries``: number of qrels queries, the denominator of every mean. Queries that are missing from
      the run, or that have no relevant docid in the qrels, score 0 (as in the study's evaluators); run queries
      absent from the qrels are ignored.
    * ``invalid_docid_rate`` (only if ``valid_docids`` is given): fraction of top-1 docids not in
      ``valid_docids``, over the qrels queries that have a non-empty ranking (NaN when none has).

    Relevance is ``qrels[qid][docid] >= 1``. Duplicated docids in a ranking count once (first occurrence).
    """
    ks, unfillable = fillable_ks(_cutoffs(ks), depth=depth)
    if unfillable:
        logger.warning("%s not reported: the rankings are at most %d docids deep (the ranking depth: beams, "
                       "ranking_depth or k), so %s would only repeat Recall@%d",
                       ", ".join(f"Recall@{k}" for k in unfillable), depth,
                       "it" if len(unfillable) == 1 else "they", depth)
    per_query, top1_valid = _per_query(run=run, qrels=qrels, ks=ks, valid_docids=valid_docids)
    metrics: dict[str, float | int] = {name: float(values.mean()) for name, values in per_query.items()}
    metrics["num_queries"] = len(qrels)
    if valid_docids is not None:
        metrics["invalid_docid_rate"] = (
            float(1.0 - np.mean(top1_valid)) if top1_valid else float("nan")
        )
    return metrics


def per_query_metrics(*, run: Run, qrels: Qrels, ks: Sequence[int] = DEFAULT_KS) -> dict[str, np.ndarray]:
    """`retrieval_metrics`' measures for each query, float[num_queries] in `qrels`' order: the samples a paired
    significance test compares (`gr_jax.significance`); their means are `retrieval_metrics`'."""
    return _per_query(run=run, qrels=qrels, ks=_cutoffs(ks), valid_docids=None)[0]


def _cutoffs(ks: Sequence[int]) -> tuple[int, ...]:
    ks = tuple(int(k) for k in ks)
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be positive cutoffs, got {ks!r}")
    return ks


def _per_query(*, run: Run, qrels: Qrels, ks: Sequence[int], valid_docids: Container[str] | None
               ) -> tuple[dict[str, np.ndarray], list[bool]]:
    """Each measure float[num_queries] in `qrels`' order, and whether each non-empty ranking's top-1 docid is in
    `valid_docids` (empty when None)."""
    columns = max(max(ks, default=1), MRR_CUTOFF)
    qids = list(qrels)
    num_queries = len(qids)
    if num_queries == 0:
        raise ValueError("qrels is empty: there is no query to evaluate")

    # hits[i, r]: the docid at rank r (0-based) of query i is relevant. Padding past the ranking is False.
    hits = np.zeros((num_queries, columns), dtype=bool)
    gains = np.zeros((num_queries, MRR_CUTOFF))
    ideal_gains = np.zeros((num_queries, MRR_CUTOFF))
    num_relevant = np.zeros((num_queries,), dtype=np.int64)
    top1_valid: list[bool] = []
    for i, qid in enumerate(qids):
        relevant = {docid for docid, rel in qrels[qid].items() if rel >= 1}
        num_relevant[i] = len(relevant)
        ranking = ranked_docids(run.get(qid, ()))
        if valid_docids is not None and ranking:
            top1_valid.append(ranking[0] in valid_docids)
        top = ranking[:columns]
        for docid in relevant.intersection(top):  # set ops and list.index run in C: fast for 100k queries
            rank = top.index(docid)
            hits[i, rank] = True
            if rank < MRR_CUTOFF:
                gains[i, rank] = qrels[qid][docid]
        best = sorted((rel for rel in qrels[qid].values() if rel >= 1), reverse=True)[:MRR_CUTOFF]
        ideal_gains[i, :len(best)] = best

    per_query: dict[str, np.ndarray] = {}
    in_cutoff = hits[:, :MRR_CUTOFF]
    first_hit = np.argmax(in_cutoff, axis=1)
    per_query[f"MRR@{MRR_CUTOFF}"] = np.where(in_cutoff.any(axis=1), 1.0 / (first_hit + 1.0), 0.0)
    cumulative_hits = np.cumsum(hits, axis=1)  # int[num_queries, columns]
    safe_denominator = np.maximum(num_relevant, 1)
    for k in ks:
        per_query[f"Recall@{k}"] = cumulative_hits[:, k - 1] / safe_denominator
    discounts = 1.0 / np.log2(np.arange(2, MRR_CUTOFF + 2))
    ideal = ideal_gains @ discounts
    per_query[f"nDCG@{MRR_CUTOFF}"] = np.where(ideal > 0, (gains @ discounts) / np.maximum(ideal, 1e-12), 0.0)
    return per_query, top1_valid


def brier_score(*, run: Run, qrels: Qrels, probabilities: Mapping[str, float]) -> float:
    """Mean over the qrels queries of (p - y)^2, p the probability given to the query's rank-1 document and y = 1
    when that document is relevant (`gr_vs_dense_limitations.txt` Sec. 4.1; lower is better). A query with an
    empty ranking (or no probability) has no rank-1 document: it counts as p = 0 for an irrelevant one (0), so a
    retriever cannot gain by returning nothing only when it has nothing right to return."""
    qids = list(qrels)
    if not qids:
        raise ValueError("qrels is empty: there is no query to evaluate")
    total = 0.0
    for qid in qids:
        ranking = ranked_docids(run.get(qid, ()))
        p = probabilities.get(qid, math.nan)
        if not ranking or math.isnan(p):
            continue
        if not 0.0 <= p <= 1.0 + 1e-6:
            raise ValueError(f"query {qid!r}: probability {p} is not in [0, 1]")
        relevant = qrels[qid].get(ranking[0], 0) >= 1
        total += (min(p, 1.0) - float(relevant)) ** 2
    return total / len(qids)


def _check_trec_field(value: str, *, what: str) -> None:
    if not isinstance(value, str) or not value or any(ch.isspace() for ch in value):
        raise ValueError(f"{what} {value!r} is not a non-empty string without whitespace: not writable as TREC")


def _umask() -> int:
    """The process's umask (read by setting it, then restored at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_trec_run(path: str | os.PathLike, run_with_scores: ScoredRun, *, tag: str) -> None:
    """Write ``qid Q0 docid rank score tag`` lines (rank from 1), queries in mapping order.

    Each ranking is written by descending score (ties keep list order), since trec_eval ranks by score.
    Scores are written with ``repr`` so that reading the file back gives the same floats. A docid repeated
    within a query, a non-finite score, or whitespace inside an id is a ValueError (trec_eval rejects them).
    The file is written under a temporary name and renamed: a failed write leaves no truncated run behind.
    """
    _check_trec_field(tag, what="tag")
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's file is private (0600); a run is shared as any file is
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for qid, ranking in run_with_scores.items():
                _check_trec_field(qid, what="qid")
                seen: set[str] = set()
                ordered = sorted(ranking, key=operator.itemgetter(1), reverse=True)  # stable
                for rank, (docid, score) in enumerate(ordered, start=1):
                    _check_trec_field(docid, what=f"docid of query {qid!r}")
                    if docid in seen:
                        raise ValueError(
                            f"docid {docid!r} appears twice for query {qid!r}: keep its first occurrence only"
                        )
                    seen.add(docid)
                    score = float(score)
                    if not math.isfinite(score):
                        raise ValueError(f"docid {docid!r} of query {qid!r} has the non-finite score {score}")
                    f.write(f"{qid} Q0 {docid} {rank} {score!r} {tag}\n")
        os.replace(tmp_path, path)
    except BaseException:
        os.unlink(tmp_path)
        raise


def read_trec_run(path: str | os.PathLike) -> dict[str, list[tuple[str, float]]]:
    """Read a 6-column TREC run into ``{qid: [(docid, score), ...]}``, best first.

    Rankings are ordered by descending score, ties by the rank column. Malformed lines (wrong column count,
    non-integer rank, non-finite score, a docid twice for one query) raise DataFormatError naming path:line.
    """
    entries: dict[str, list[tuple[float, int, str]]] = {}
    seen: dict[str, set[str]] = {}
    for line_number, line in read_lines(path):
        fields = line.split()
        if len(fields) != 6:
            raise DataFormatError.at(
                path, line_number,
                f"expected 6 whitespace-separated columns 'qid Q0 docid rank score tag', found {len(fields)}",
            )
        qid, _, docid, rank_text, score_text, _ = fields
        try:
            rank = int(rank_text)
        except ValueError:
            raise DataFormatError.at(path, line_number, f"rank {rank_text!r} is not an integer") from None
        try:
            score = float(score_text)
        except ValueError:
            raise DataFormatError.at(path, line_number, f"score {score_text!r} is not a number") from None
        if not math.isfinite(score):
            raise DataFormatError.at(path, line_number, f"score {score_text!r} is not finite")
        docids = seen.setdefault(qid, set())
        if docid in docids:
            raise DataFormatError.at(path, line_number, f"docid {docid!r} appears twice for query {qid!r}")
        docids.add(docid)
        entries.setdefault(qid, []).append((-score, rank, docid))
    return {
        qid: [(docid, -neg_score) for neg_score, _, docid in sorted(rows, key=lambda row: (row[0], row[1]))]
        for qid, rows in entries.items()
    }


def scored_to_ranked(run_with_scores: ScoredRun) -> dict[str, list[str]]:
    """``{qid: [(docid, score)]}`` -> ``{qid: [docid]}`` best first, duplicates removed (first kept)."""
    return {qid: ranked_docids(ranking) for qid, ranking in run_with_scores.items()}

