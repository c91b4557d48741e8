"""Retrievers: anything that ranks documents for query texts, `rank(queries, k=...) -> Ranking`.

The generative model (`GenerativeRetriever`: params + model + DocidSpace, decoding compiled once per batch shape)
implements it here; a dense retriever or a hybrid implements the same protocol. Evaluation (`gr_jax.evaluator`)
and TREC runs take any retriever, and `gr-jax search`, `gr_jax.eval` and `gr_jax.infer` rank only through it.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True)
class Ranking:
    """What a retriever returns for `n` queries.

    ids[i]: query i's documents, best first, at most k (fewer where the retriever found fewer);
    scores[i]: their scores, same length, non-increasing;
    invalid: the returned ids that name no document (a generative model decoding without its trie can emit
      sequences that are no docid; they are ranked under stand-in names and count towards `invalid_docid_rate`);
    seconds: wall time of the ranking, one-time compilation excluded; compile_seconds: compilation this call paid;
    top1_probability: per definition name (e.g. 'full_softmax'), the probability the retriever gives each query's
      rank-1 document (NaN for an empty ranking), for the Brier score (`gr_jax.evaluation.brier_scores`).
    """
    ids: list[list[str]]
    scores: list[list[float]]
    invalid: frozenset[str] = frozenset()
    seconds: float = math.nan
    compile_seconds: float = 0.0
    top1_probability: Mapping[str, Sequence[float]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if len(self.ids) != len(self.scores) or any(len(a) != len(b) for a, b in zip(self.ids, self.scores)):
            raise ValueError("ids and scores must have the same shape")
        for name, values in self.top1_probability.items():
            if len(values) != len(self.ids):
                raise ValueError(f"top1_probability[{name!r}] has {len(values)} values for {len(self.ids)} queries")

    def run(self, qids: Sequence[str]) -> dict[str, list[tuple[str, float]]]:
        """`{qid: [(docid, score)]}` (`gr_jax.evaluation`'s scored run) for the queries' ids, in order."""
        if len(qids) != len(self.ids):
            raise ValueError(f"{len(qids)} qids for {len(self.ids)} ranked queries")
        return {qid: list(zip(ids, scores)) for qid, ids, scores in zip(qids, self.ids, self.scores)}


class Retriever(Protocol):
    """Ranks documents for query texts."""

    def rank(self, queries: Sequence[str], *, k: int) -> Ranking:
        """The `k` best documents of each query (see `Ranking`)."""
        ...


class ParametricRetriever(Retriever, Protocol):
    """A retriever of a trained model: the same retriever for other parameters of the same shapes (what the training
    loop's evaluations call at each evaluation, reusing its compiled functions)."""

    def with_params(self, params: Any) -> ParametricRetriever: ...
