"""SToICaL's ranking evaluation (Rozonoyer et al. Sec. 5) of a generative run: each query's gold ranked list and
one negative are scored by the length-normalised mean token log-probability (`gr_jax.candidates`), and CVR, nDCG
(log gold gains) and the set-overlap R@k are computed over them (`gr_jax.ranking.metrics`); the same metrics by the
candidates' log-likelihood (the sum, what beam search ranks by) are reported beside them (`by_log_likelihood`).

The gold list of a query is its graded qrels by grade (`ranked_lists`); its negative is the `negatives.{split}.tsv`
line of the data dir (qid, docid; `gr_jax.tools.wordnet_hypernyms` writes one off the query's path) or, where the
file is absent, one document outside the list drawn uniformly from the docid space (seeded by `seed`).

    python -m gr_jax.ranking_eval --gin_file=RUN/config.gin [--gin.RANKING_SPLIT="'dev'"] [--gin.RANKING_STEP=N]
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Optional

import numpy as np

from gr_jax import partitioning
from gr_jax.candidates import CandidateScorer
from gr_jax.data.readers import (EVAL_SPLIT_SETTING, DataFormatError, RetrievalDataset, open_dataset,
                                 read_lines)
from gr_jax.ranking import metrics
from gr_jax.ranking.data import ranked_lists
from gr_jax.run_dir import RunDir, write_json
from gr_jax.vocabulary import encode_inputs

NEGATIVES = "negatives.{split}.tsv"


def read_negatives(path: pathlib.Path) -> dict[str, str]:
    """qid -> its evaluation negative, from a `qid<TAB>docid` file."""
    out = {}
    for number, line in read_lines(path):
        fields = line.split("\t")
        if len(fields) != 2 or not all(fields):
            raise DataFormatError.at(path, number, "expected `qid<TAB>docid`")
        if fields[0] in out:
            raise DataFormatError.at(path, number, f"query {fields[0]!r} has a second negative")
        out[fields[0]] = fields[1]
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class Candidates:
    """texts: the queries; rows int64[Q, N + 1]: the docid-table rows of each gold list (gold order, -1 padding)
    and, in column N, the negative; valid bool[Q, N]: the real gold columns."""
    texts: list[str]
    rows: np.ndarray
    valid: np.ndarray


def ranking_candidates(dataset: RetrievalDataset, *, split: str, table: Any, seed: int = 0) -> Candidates:
    """The candidate set of every query of `split` with a graded list (see the module docstring)."""
    lists = ranked_lists(dataset, split=split)
    if not lists:
        raise ValueError(f"{dataset.data_dir}: no query of split {split!r} has a judged document")
    negatives_path = pathlib.Path(dataset.data_dir) / NEGATIVES.format(split=split)
    negatives = read_negatives(negatives_path) if negatives_path.is_file() else None
    texts = dict(dataset.queries(split))
    width = max(len(docids) for docids in lists.values())
    rows = np.full((len(lists), width + 1), -1, np.int64)
    rng = np.random.default_rng(seed)
    for i, (qid, docids) in enumerate(lists.items()):
        gold = table.rows_of(docids)
        if negatives is not None:
            if qid not in negatives:
                raise DataFormatError(f"{negatives_path}: query {qid!r} of {split!r} has no negative")
            negative = table.rows_of([negatives[qid]])[0]
        else:
            negative = -1
            while negative < 0 or negative in gold:
                negative = int(rng.integers(len(table)))
        if (gold < 0).any() or negative < 0:
            raise DataFormatError(f"{dataset.data_dir}: query {qid!r} of {split!r} names a document that is not in "
                                  "the run's docid space")
        rows[i, :len(gold)] = gold
        rows[i, -1] = negative
    return Candidates(texts=[texts[qid] for qid in lists], rows=rows, valid=rows[:, :-1] >= 0)


def ranking_metrics(scores: np.ndarray, valid: np.ndarray, *, max_k: int = 5) -> dict[str, Any]:
    """CVR, nDCG and R@1..R@max_k (with the number of queries each counts) of scores float[Q, N + 1]."""
    out: dict[str, Any] = {"cvr": metrics.constraint_violation_rate(scores, valid),
                           "ndcg": metrics.ndcg(scores, valid), "num_queries": int(len(scores))}
    for k in range(1, max_k + 1):
        recall, counted = metrics.set_overlap_recall(scores, valid, k=k)
        out[f"R@{k}"], out[f"R@{k}_queries"] = recall, counted
    return out


def evaluate_ranking(*, experiment: Any, split: Optional[str] = None, step: Optional[int] = None,
                     batch_size: int = 8, max_k: int = 5, seed: int = 0) -> dict[str, Any]:
    """The ranking metrics of a checkpoint (latest, or `step`) on `split` (default: the run's eval split); writes
    `ranking.{split}.{step}.json` into the model dir and returns what it wrote."""
    open_dataset(experiment.dataset.data_dir).require_split(
        split or experiment.dataset.eval_split, setting="--gin.RANKING_SPLIT" if split else EVAL_SPLIT_SETTING)
    built = experiment.build()
    params, step = built.restore_params(step)
    split = split or experiment.dataset.eval_split
    candidates = ranking_candidates(open_dataset(experiment.dataset.data_dir), split=split,
                                    table=built.docid_space.table, seed=seed)
    tokens = encode_inputs(candidates.texts, vocabulary=built.vocabulary,
                           input_length=experiment.dataset.input_length)
    log_likelihood, positions = CandidateScorer(built, batch_size=batch_size).scores(
        params, tokens, candidates.rows, show_progress=True, desc="ranking")
    result = {"step": step, "split": split,
              **ranking_metrics(metrics.length_normalised(log_likelihood, positions), candidates.valid, max_k=max_k),
              "score": "length-normalised mean token log-probability",
              # The same candidates by their log-likelihood (what beam search ranks by), for comparison.
              "by_log_likelihood": ranking_metrics(log_likelihood, candidates.valid, max_k=max_k)}
    if partitioning.is_primary_process():
        write_json(RunDir.of(experiment.model_dir).ranking_metrics(split, step), result)
    return result
