"""A retriever that fuses other retrievers' rankings (`gr_jax.fusion`: RRF, score interpolation, ...).

Each member ranks the queries `depth` deep; their rankings are fused per query and cut to `k`. GR + BM25, GR +
dense, GDR + BM25: any `Retriever`s, with a `Fusion` whose parameters were chosen on another split
(`Fusion.chosen_on`, or `python -m gr_jax.tools.fuse` over the members' TREC runs).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from gr_jax.fusion import Fusion
from gr_jax.retrievers import Ranking, Retriever


@dataclasses.dataclass(frozen=True)
class FusedRetriever:
    """members: the retrievers fused (at least two, in the order of `fusion`'s weights); depth: how deep each member
    ranks (>= the k asked for; a fused ranking holds documents any member ranked)."""
    members: Sequence[Retriever]
    fusion: Fusion
    depth: int = 100

    def __post_init__(self):
        if len(self.members) < 2:
            raise ValueError(f"a fused retriever needs at least two members, got {len(self.members)}")

    def rank(self, queries: Sequence[str], *, k: int) -> Ranking:
        if k > self.depth:
            raise ValueError(f"k={k} is deeper than the members' depth {self.depth}")
        rankings = [member.rank(queries, k=self.depth) for member in self.members]
        keys = [str(i) for i in range(len(queries))]  # queries may repeat: each position is its own query
        fused = self.fusion.fuse([ranking.run(keys) for ranking in rankings], depth=k)
        ids = [[docid for docid, _ in fused.get(key, [])] for key in keys]
        scores = [[score for _, score in fused.get(key, [])] for key in keys]
        invalid = frozenset().union(*(ranking.invalid for ranking in rankings))
        return Ranking(ids=ids, scores=scores, invalid=invalid,
                       seconds=math.fsum(ranking.seconds for ranking in rankings),
                       compile_seconds=math.fsum(ranking.compile_seconds for ranking in rankings))
