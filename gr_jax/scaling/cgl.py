"""The Contrastive Generation Loss (CGL) of a generative retrieval model (Cai et al. 2025, Eq. 5).

    CGL(q) = -log[ S- / (L+ + S-) ] = log(1 + L+ / S-),   S- = sum over the sampled negatives of L(q, I-)

L(q, I) is the generation loss of identifier I given q (a positive number, not a probability): by default the
mean per-token cross entropy of I's tokens, EOS included and padding masked (`token_reduction='mean'`; 'sum': the
sequence's negative log-likelihood). A document named by several identifier strings (n-gram ids: its distinct
span windows, `gr_jax.docids.identifiers`) scores the mean of L over them, as the authors' code does
(`identifier_reduction='mean'`; 'min' scores its best string, closer to how the n-gram retriever finds a document
through the few spans it generates). L+ is the minimum over the query's judged positives (`positive_reduction`,
or 'mean'); the negatives are `num_negatives` documents drawn uniformly without replacement from the docid space
minus the query's positives, fresh per query from `seed` (the authors' code: 256, S- = mean x 256, which is the
sum). A model that cannot tell positives from negatives scores log((n + 1) / n), 0.0039 for n = 256; lower is
better. The reported value is the mean over the split's queries, with its standard error and each query's value.

Scoring is teacher-forced and batched (`EncoderDecoderModel.score_candidates`: each query encoded once, its
1 + n candidates decoded together), jitted with the trainer's parameter shardings over the run's mesh. Queries
whose judged documents are not in the docid space are counted and skipped (`queries_without_positive`); a split
with none left is an error. `EvaluateCgl` is the same measurement as a periodic training action.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any, Literal, Optional

import numpy as np

from gr_jax import partitioning
from gr_jax.actions import Action
from gr_jax.candidates import CandidateScorer, TokenReduction, generation_losses
from gr_jax.data.readers import EVAL_SPLIT_SETTING, open_dataset
from gr_jax.docids.identifiers import DocumentIdentifiers
from gr_jax.run_dir import RunDir, write_json
from gr_jax.vocabulary import encode_inputs

logger = logging.getLogger(__name__)

Reduction = Literal["min", "mean"]


@dataclasses.dataclass(frozen=True)
class CglConfig:
    """How CGL is measured (see the module docstring); every field is recorded with the result."""
    num_negatives: int = 256
    positive_reduction: Reduction = "min"
    token_reduction: TokenReduction = "mean"
    identifier_reduction: Reduction = "mean"  # over a document's identifier strings (n-gram ids have several)
    seed: int = 0
    batch_size: int = 8  # queries per compiled call, each with its positives and num_negatives candidates
    # identifier strings per query in one compiled call (a fixed width, the last part padded): bounds the logits
    # [batch_size * candidates_per_call, length, vocab] when documents have many strings (n-gram ids)
    candidates_per_call: int = 1024
    max_queries: Optional[int] = None  # the split's first queries only

    def __post_init__(self):
        if self.num_negatives < 1 or self.batch_size < 1 or self.candidates_per_call < 1:
            raise ValueError(f"num_negatives, batch_size and candidates_per_call must be >= 1, got "
                             f"{self.num_negatives}, {self.batch_size}, {self.candidates_per_call}")
        if (self.positive_reduction not in ("min", "mean") or self.identifier_reduction not in ("min", "mean")
                or self.token_reduction not in ("mean", "sum")):
            raise ValueError(f"positive_reduction and identifier_reduction must be 'min' or 'mean' and "
                             f"token_reduction 'mean' or 'sum', got {self.positive_reduction!r}, "
                             f"{self.identifier_reduction!r}, {self.token_reduction!r}")


def contrastive_generation_loss(positive_losses: np.ndarray, positive_valid: np.ndarray,
                                negative_losses: np.ndarray, *, positive_reduction: Reduction = "min") -> np.ndarray:
    """Per-query CGL float64[Q] from L(q, I) of the positives float[Q, P] (valid where `positive_valid` bool[Q, P];
    every query needs one) and of the negatives float[Q, n]."""
    positive_losses = np.asarray(positive_losses, np.float64)
    valid = np.asarray(positive_valid, bool)
    if not valid.any(axis=1).all():
        raise ValueError("every query needs at least one valid positive")
    if positive_reduction == "min":
        positive = np.where(valid, positive_losses, np.inf).min(axis=1)
    else:
        positive = np.where(valid, positive_losses, 0.0).sum(axis=1) / valid.sum(axis=1)
    negatives = np.asarray(negative_losses, np.float64).sum(axis=1)
    return np.log1p(positive / negatives)


def chance_level(num_negatives: int) -> float:
    """CGL of a model whose L(q, I) is the same for every identifier: log((n + 1) / n)."""
    return math.log1p(1.0 / num_negatives)


def sample_negatives(*, num_documents: int, positives: Sequence[np.ndarray], num_negatives: int,
                     seed: int) -> np.ndarray:
    """int64[Q, n]: per query, `num_negatives` distinct rows of range(num_documents) that are not its positives,
    uniform, from one seeded generator in query order."""
    rng = np.random.default_rng(seed)
    out = np.empty((len(positives), num_negatives), np.int64)
    for i, rows in enumerate(positives):
        excluded = np.unique(np.asarray(rows, np.int64))
        available = num_documents - excluded.size
        if available < num_negatives:
            raise ValueError(f"{num_negatives} negatives asked for, but only {available} documents are not positives "
                             f"of query {i}: lower num_negatives")
        draw = rng.choice(available, size=num_negatives, replace=False)
        # Map [0, available) onto the rows that are not excluded: shift past every excluded row at or below.
        out[i] = draw + np.searchsorted(excluded - np.arange(excluded.size), draw, side="right")
    return out


class CglScorer:
    """L(q, I) of candidate identifiers with one compiled, sharded function (`gr_jax.candidates`).

    built: a generative run (`gr_jax.experiment.Built`) with a docid space."""

    def __init__(self, built: Any, *, config: CglConfig = CglConfig()):
        self.built = built
        self.config = config
        self._scorer = CandidateScorer(built, batch_size=config.batch_size)
        self.table = self._scorer.table

    def candidate_losses(self, params, tokens: np.ndarray, rows: np.ndarray, *,
                         show_progress: bool = False) -> np.ndarray:
        """L(q, I) float32[Q, C] of docid-table rows int64[Q, C] (-1: padding, to be masked by the caller)."""
        log_likelihood, positions = self._scorer.scores(params, tokens, rows, show_progress=show_progress, desc="CGL")
        return generation_losses(log_likelihood, positions, token_reduction=self.config.token_reduction)

    def document_losses(self, params, tokens: np.ndarray, documents: np.ndarray, identifiers: DocumentIdentifiers, *,
                        show_progress: bool = False) -> np.ndarray:
        """L(q, d) float64[Q, D] of documents int64[Q, D] (-1: padding, NaN out): the mean (or, with
        `identifier_reduction='min'`, the minimum) of L(q, I) over each document's identifier strings I
        (`DocumentIdentifiers`; one row, its docid, for the docid schemes)."""
        counts = np.where(documents >= 0, np.diff(identifiers.offsets)[np.maximum(documents, 0)], 0)
        width = max(int(counts.sum(axis=1).max(initial=0)), 1)
        rows = np.full((len(documents), width), -1, np.int64)
        owner = np.full((len(documents), width), -1, np.int64)  # the column of `documents` each row belongs to
        for q in range(len(documents)):
            slots = np.flatnonzero(documents[q] >= 0)
            if slots.size:
                parts = [identifiers.rows_of(documents[q, j]) for j in slots]
                n = sum(len(part) for part in parts)
                rows[q, :n] = np.concatenate(parts)
                owner[q, :n] = np.repeat(slots, [len(part) for part in parts])
        per_call = min(width, self.config.candidates_per_call)
        calls = -(-width // per_call)
        rows = np.pad(rows, ((0, 0), (0, calls * per_call - width)), constant_values=-1)
        losses = np.concatenate([self.candidate_losses(params, tokens, rows[:, i * per_call:(i + 1) * per_call],
                                                       show_progress=show_progress)
                                 for i in range(calls)], axis=1)[:, :width].astype(np.float64)
        out = np.full(documents.shape, np.nan)
        for q in range(len(documents)):
            kept = owner[q] >= 0
            number = np.bincount(owner[q, kept], minlength=documents.shape[1])
            if self.config.identifier_reduction == "min":
                reduced = np.full(documents.shape[1], np.inf)
                np.minimum.at(reduced, owner[q, kept], losses[q, kept])
            else:
                reduced = np.bincount(owner[q, kept], weights=losses[q, kept], minlength=documents.shape[1])
                reduced = reduced / np.maximum(number, 1)
            out[q] = np.where(number > 0, reduced, np.nan)
        return out

    def measure(self, params, *, split: str, show_progress: bool = False) -> dict[str, Any]:
        """CGL of `split` with `params`: the mean, its parts and the settings (JSON-ready). The positives and the
        sampled negatives are documents (`built.document_identifiers()`), each scored by its identifier strings."""
        config = self.config
        experiment = self.built.experiment
        identifiers = self.built.document_identifiers()
        data = open_dataset(experiment.dataset.data_dir)
        queries = list(data.queries(split))
        if config.max_queries:
            queries = queries[:config.max_queries]
        qrels = data.qrels(split)
        kept, kept_ids, positives, without = [], [], [], 0
        for qid, text in queries:
            judged = [docid for docid, grade in qrels.get(qid, {}).items() if grade > 0]
            documents = identifiers.documents_of(judged) if judged else np.zeros(0, np.int64)
            documents = documents[documents >= 0]
            if documents.size == 0:
                without += 1
                continue
            kept.append(text)
            kept_ids.append(qid)
            positives.append(documents)
        if not kept:
            raise ValueError(f"no query of {experiment.dataset.data_dir} split {split!r} has a judged document in "
                             "the docid space: nothing to measure")
        negatives = sample_negatives(num_documents=len(identifiers), positives=positives,
                                     num_negatives=config.num_negatives, seed=config.seed)
        most = max(len(p) for p in positives)
        positive_documents = np.full((len(kept), most), -1, np.int64)
        for i, documents in enumerate(positives):
            positive_documents[i, :len(documents)] = documents
        tokens = encode_inputs(kept, vocabulary=self.built.vocabulary, input_length=experiment.dataset.input_length)
        losses = self.document_losses(params, tokens, np.concatenate([positive_documents, negatives], axis=1),
                                      identifiers, show_progress=show_progress)
        per_query = contrastive_generation_loss(losses[:, :most], positive_documents >= 0, losses[:, most:],
                                                positive_reduction=config.positive_reduction)
        strings = np.diff(identifiers.offsets)
        # The standard error of the mean over queries; the per-query values (same negatives for the same split,
        # seed and docid space) allow paired comparisons of two checkpoints or runs.
        standard_error = float(per_query.std(ddof=1) / math.sqrt(len(per_query))) if len(per_query) > 1 else None
        return {"cgl": float(per_query.mean()), "cgl_standard_error": standard_error,
                "chance": chance_level(config.num_negatives),
                "positive_loss": float(np.nanmean(losses[:, :most])), "negative_loss": float(losses[:, most:].mean()),
                "num_queries": len(kept), "queries_without_positive": without, "split": split,
                "identifier_strings_per_document": {"mean": float(strings.mean()), "max": int(strings.max())},
                "settings": dataclasses.asdict(config), "per_query": dict(zip(kept_ids, per_query.tolist()))}


def evaluate_cgl(*, experiment: Any, split: Optional[str] = None, step: Optional[int] = None,
                 config: CglConfig = CglConfig(), progress: bool = True) -> dict[str, Any]:
    """CGL of a checkpoint (latest, or `step`) on `split` (default: the run's eval split); writes
    `cgl.{split}.{step}.json` into the model dir and returns what it wrote."""
    open_dataset(experiment.dataset.data_dir).require_split(
        split or experiment.dataset.eval_split, setting="--gin.CGL_SPLIT" if split else EVAL_SPLIT_SETTING)
    built = experiment.build()
    params, step = built.restore_params(step)
    split = split or experiment.dataset.eval_split
    result = {"step": step, **CglScorer(built, config=config).measure(params, split=split, show_progress=progress)}
    if partitioning.is_primary_process():
        write_json(RunDir.of(experiment.model_dir).cgl(split, step), result)
    return result


class EvaluateCgl(Action):
    """CGL of `split` every `every_steps` steps and at the last step, as `cgl/{split}/*` scalars and in the run's
    report. gin: `training.train.actions = [@cgl.EvaluateCgl()]` (gin_configs/scaling/cgl_every.gin)."""

    def __init__(self, *, every_steps: int, split: Optional[str] = None, config: CglConfig = CglConfig()):
        if every_steps < 1:
            raise ValueError(f"every_steps must be >= 1, got {every_steps}")
        self.every_steps = every_steps
        self.split = split
        self.config = config
        self.found: dict[str, float] = {}

    def start(self, run):
        self._scorer = CglScorer(run.built, config=self.config)
        self._split = self.split or run.built.experiment.dataset.eval_split
        return False

    def _measure(self, run, step: int, params) -> None:
        result = self._scorer.measure(params, split=self._split)
        scalars = {f"cgl/{self._split}/{k}": result[k] for k in ("cgl", "positive_loss", "negative_loss")}
        run.writer.write_scalars(step, scalars)
        self.found.update(scalars)
        logger.info("step %d CGL on %s: %.6f (chance %.6f)", step, self._split, result["cgl"], result["chance"])

    def __call__(self, run, progress):
        self._measure(run, progress.step, progress.state.params)  # also at the last step (`Action.due`)
        return False

    def report(self):
        return dict(self.found)
