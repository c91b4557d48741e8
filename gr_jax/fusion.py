"""Rank fusion of two or more scored runs with ranx: reciprocal-rank fusion, score interpolation, and the rest of
ranx's methods, with their parameters chosen on a held-out split.

A `Fusion` is a value (method, score normalisation, parameters); `Fusion.fuse` combines runs of the same queries
into one, and `Fusion.chosen_on` picks the parameters that maximise a metric on a split's qrels (ranx's grid
search: RRF's k in 10..100, interpolation weights in steps of 0.1). Choose on `valid` and apply the value to dev's
runs: the fused run of a split is never tuned on that split. Runs are `gr_jax.evaluation`'s scored runs
(`{qid: [(docid, score)]}`, e.g. `read_trec_run`'s); a query one run lacks, or ranks nothing for, counts there as an
empty ranking.
"""
from __future__ import annotations

import dataclasses
import itertools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numba
import ranx

from gr_jax.evaluation import Qrels, ScoredRun

# ranx's names (`ranx.fusion.fusion_switch`); the methods whose parameters `chosen_on` optimises are those with a
# grid in ranx.fusion_optimization. Interpolation ('wsum') of min-max-normalised scores and RRF are the two the
# fusion literature reports for sparse + dense + generative retrievers.
METHODS = ("rrf", "wsum", "sum", "mnz", "max", "isr", "log_isr", "bordafuse", "condorcet")
WEIGHTED = ("wsum",)  # the METHODS whose parameters have no default
NORMS = ("min-max", "max", "sum", "zmuv", "rank", "borda", None)


@dataclasses.dataclass(frozen=True)
class Fusion:
    """method: one of METHODS; norm: how each run's scores are scaled before combining (None: as they are; RRF reads
    only ranks, so its norm does not matter); params: the method's parameters (rrf: {'k': int}; wsum:
    {'weights': one per run}); empty: ranx's defaults."""
    method: str = "rrf"
    norm: Optional[str] = "min-max"
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"fusion method {self.method!r} is not one of {', '.join(METHODS)}")
        if self.norm not in NORMS:
            raise ValueError(f"fusion norm {self.norm!r} is not one of {NORMS}")

    def fuse(self, runs: Sequence[ScoredRun], *, depth: Optional[int] = None) -> dict[str, list[tuple[str, float]]]:
        """One run `{qid: [(docid, score)]}`, best first, over the union of the runs' queries; `depth`: at most that
        many documents a query (None: every document any run ranked)."""
        weights = self.params.get("weights")
        if weights is None and self.method in WEIGHTED:
            raise ValueError(f"fusion method {self.method!r} needs params={{'weights': [one per run]}} (or "
                             f"Fusion.chosen_on to choose them)")
        if weights is not None and len(weights) != len(runs):
            raise ValueError(f"{len(weights)} fusion weights for {len(runs)} runs")
        qids = _union_qids(runs)
        keys = _DocidKeys.of(runs)
        fused = _quiet(ranx.fuse, runs=[_ranx_run(run, qids=qids, keys=keys, name=f"run{i}")
                                        for i, run in enumerate(runs)],
                       norm=self.norm, method=self.method, params=dict(self.params))
        return _scored(fused.to_dict(), qids=qids, keys=keys, depth=depth)

    @classmethod
    def chosen_on(cls, *, qrels: Qrels, runs: Sequence[ScoredRun], method: str = "rrf",
                  norm: Optional[str] = "min-max", metric: str = "mrr@10") -> Fusion:
        """The `method`'s parameters that maximise `metric` (ranx's name, e.g. 'mrr@10', 'recall@100') of the fused
        run on `qrels`' queries (every one of them; a query no run ranks scores 0); `runs` are that split's."""
        unchosen = cls(method=method, norm=norm)  # checks the names
        qids = sorted(qrels)
        if not qids:
            raise ValueError("no judged queries to choose the fusion's parameters on")
        keys = _DocidKeys.of(runs, qrels=qrels)
        ranx_runs = [_ranx_run({qid: run.get(qid, []) for qid in qids}, qids=qids, keys=keys, name=f"run{i}")
                     for i, run in enumerate(runs)]
        ranx_qrels = ranx.Qrels({qid: {keys.key[docid]: grade for docid, grade in judged.items()}
                                 for qid, judged in qrels.items()})
        params = _quiet(ranx.optimize_fusion, qrels=ranx_qrels, runs=ranx_runs, norm=unchosen.norm,
                        method=unchosen.method, metric=metric, show_progress=False)
        return cls(method=method, norm=norm, params={name: _plain(value) for name, value in params.items()})


def compile_kernels() -> None:
    """ranx compiles its numba kernels when first used and caches them beside the package; `make venv` calls this
    once after installing, as pip compiles .pyc files, so no run or test pays it. Docids reach ranx as fixed-width
    keys (`_DocidKeys`), so these are the kernels of every later call; the typed containers ranx builds are compiled
    again in each process that fuses (numba caches no typed-container code; docs/performance.md)."""
    runs = [{"q": [("a", 1.0), ("b", 0.5)]}, {"q": [("b", 1.0)]}]
    for method in ("rrf", "wsum"):
        Fusion.chosen_on(qrels={"q": {"b": 1}}, runs=runs, method=method).fuse(runs)


def _union_qids(runs: Sequence[ScoredRun]) -> list[str]:
    if len(runs) < 2:
        raise ValueError(f"fusion needs at least two runs, got {len(runs)}")
    return list(dict.fromkeys(qid for run in runs for qid in run))


@dataclasses.dataclass(frozen=True)
class _DocidKeys:
    """ranx turns a run's docids into a fixed-width numpy string array and numba compiles its kernels once per
    width, in every process (its typed containers are not cached): docids of any length go to ranx as keys of one
    width, so the kernels `compile_kernels` cached are the ones every later call uses."""
    key: Mapping[str, str]
    docid: Mapping[str, str]

    WIDTH = 12

    @classmethod
    def of(cls, runs: Sequence[ScoredRun], *, qrels: Optional[Qrels] = None) -> _DocidKeys:
        judged = (docid for grades in (qrels or {}).values() for docid in grades)
        ranked = (docid for run in runs for ranking in run.values() for docid, _ in ranking)
        docids = list(dict.fromkeys(itertools.chain(ranked, judged)))
        if len(docids) >= 10 ** cls.WIDTH:
            raise ValueError(f"{len(docids)} distinct docids: fusion keys them in {cls.WIDTH} digits")
        key = {docid: f"{index:0{cls.WIDTH}d}" for index, docid in enumerate(docids)}
        return cls(key=key, docid={k: docid for docid, k in key.items()})


def _ranx_run(run: ScoredRun, *, qids: Sequence[str], keys: _DocidKeys, name: str) -> ranx.Run:
    """ranx wants every run to hold the same queries; a ranking listing a docid twice keeps its best score."""
    as_dict: dict[str, dict[str, float]] = {}
    for qid in qids:
        scores: dict[str, float] = {}
        for docid, score in run.get(qid, ()):
            key = keys.key[docid]
            scores[key] = max(float(score), scores.get(key, -float("inf")))
        as_dict[qid] = scores
    return ranx.Run(as_dict, name=name)


def _scored(fused: Mapping[str, Mapping[str, float]], *, qids: Sequence[str], keys: _DocidKeys,
            depth: Optional[int]) -> dict[str, list[tuple[str, float]]]:
    run: dict[str, list[tuple[str, float]]] = {}
    for qid in qids:
        ranked = sorted(((keys.docid[key], score) for key, score in fused.get(qid, {}).items()),
                        key=lambda item: (-item[1], item[0]))
        run[qid] = [(docid, float(score)) for docid, score in ranked[:depth]]
    return run


def _plain(value: Any) -> Any:
    """ranx returns numpy scalars (and tuples of them); a Fusion's params are plain JSON values."""
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    return value.item() if hasattr(value, "item") else value


def _quiet(function, **kwargs):
    """ranx's kernels warn of an unsigned-to-signed cast of its own query counts (no effect below 2**63)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", numba.NumbaTypeSafetyWarning)
        return function(**kwargs)
