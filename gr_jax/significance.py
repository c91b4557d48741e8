"""Paired significance of the difference between two systems' mean metric over the same queries.

A margin of 0.01 MRR@10 over a few hundred queries (docs/quality.md) is the size of one split's noise; whether it
is real is a question for a paired test over the per-query values (`gr_jax.evaluation.per_query_metrics`). Two
tests, both as IR evaluation uses them (Smucker et al., CIKM 2007), both scipy's:
- 'fisher': Fisher's randomisation test, the sign of each query's difference flipped at random
  (`scipy.stats.permutation_test`, permutation_type 'samples'; exact when 2**queries <= `permutations`);
- 'student': the paired t-test (`scipy.stats.ttest_rel`).
Both two-sided: the null hypothesis is that the two systems' means are equal.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import scipy.stats

from gr_jax.evaluation import DEFAULT_KS, Qrels, Run, per_query_metrics

TESTS = ("fisher", "student")
_BATCH_VALUES = 2 ** 24  # values of one batch of resampled differences (128 MiB)


def paired_p_value(a: np.ndarray, b: np.ndarray, *, test: str = "fisher", permutations: int = 10_000,
                   seed: int = 0) -> float:
    """The two-sided p-value that systems with per-query values `a` and `b` (float[queries], the same queries in
    the same order) have equal means."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"paired values must be two 1-D arrays of one non-zero length, got {a.shape} and {b.shape}")
    if test not in TESTS:
        raise ValueError(f"significance test {test!r} is not one of {', '.join(TESTS)}")
    if np.array_equal(a, b):
        return 1.0
    if test == "student":
        return float(scipy.stats.ttest_rel(a, b).pvalue)
    # Resamples in batches of float64[batch, queries]: memory bounded whatever the split's size.
    batch = max(1, _BATCH_VALUES // len(a))
    result = scipy.stats.permutation_test((a, b), lambda x, y, axis: np.mean(x - y, axis=axis), vectorized=True,
                                          permutation_type="samples", n_resamples=permutations, batch=batch,
                                          alternative="two-sided", rng=np.random.default_rng(seed))
    return float(result.pvalue)


def paired_p_values(*, qrels: Qrels, runs: Mapping[str, Run], metric: str = "MRR@10", test: str = "fisher",
                    permutations: int = 10_000, seed: int = 0) -> dict[str, dict[str, float]]:
    """`{a: {b: p}}` for every pair of `runs` (named), on `metric` (a `retrieval_metrics` name) over `qrels`'
    queries; a query a run lacks scores 0 there, as in `retrieval_metrics`."""
    ks = sorted(set(DEFAULT_KS) | ({int(metric.removeprefix("Recall@"))} if metric.startswith("Recall@") else set()))
    values = {}
    for name, run in runs.items():
        measures = per_query_metrics(run=run, qrels=qrels, ks=ks)
        if metric not in measures:
            raise ValueError(f"metric {metric!r} is not one of {', '.join(measures)}")
        values[name] = measures[metric]
    p_values: dict[str, dict[str, float]] = {name: {} for name in runs}
    for i, a in enumerate(runs):
        for b in list(runs)[i + 1:]:
            p_values[a][b] = p_values[b][a] = paired_p_value(values[a], values[b], test=test,
                                                             permutations=permutations, seed=seed)
    return p_values
