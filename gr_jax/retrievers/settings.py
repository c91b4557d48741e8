"""How a run's model ranks when it is evaluated or searched: the retrieval settings every retriever reads from.

A settings value only: the retrievers read the fields they need, the training actions (`gr_jax.actions.
evaluation_actions`) read the evaluation schedule, and `gr-jax search`, `gr_jax.infer` and the dense tools build one
without the training loop. gin still names `EvalConfig` `training.EvalConfig` (the gin files and the `config.gin` of
every run written before it moved here): `gr_jax.training` imports it, and gin binds one class under both names.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Protocol


class RetrievalSettings(Protocol):
    """What a retriever reads of the settings (`EvalConfig` is one). batch_size: queries at once; num_beams /
    constrained: a generative model's beam search; depth: how many documents a ranking holds."""
    @property
    def batch_size(self) -> int: ...

    @property
    def num_beams(self) -> int: ...

    @property
    def constrained(self) -> bool: ...

    @property
    def depth(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Retrieval evaluation during training: every_steps > 0 periodically, 0 only at the end, -1 never.

    num_beams: the beams of a generative model's search; ranking_depth: how many documents each ranking holds (the
    metrics' and TREC runs' `depth`; None: num_beams, since a beam search ranks as deep as its beams); batch_size:
    queries ranked at once; constrained: decode through the docid trie; max_queries: rank only the split's first
    queries. A dense retriever reads batch_size and depth only.

    Model selection (early stopping on a held-out metric): with `select_split`, the periodic evaluations and
    one at the last step rank that split instead of the eval split; the state with the best `select_metric`
    is kept in `model_dir/best/`, training stops after `patience` evaluations without improvement (None:
    never), and the final evaluation ranks the eval split with that best state. Select on a split other than
    the one you report (e.g. WordNet's `valid`: definitions of documents without a training query).
    """
    every_steps: int = 0
    num_beams: int = 40
    constrained: bool = True
    batch_size: int = 32
    max_queries: Optional[int] = None
    ranking_depth: Optional[int] = None
    select_split: Optional[str] = None
    select_metric: str = "MRR@10"
    patience: Optional[int] = None

    def __post_init__(self):
        if self.select_split is not None and self.every_steps <= 0:
            raise ValueError(f"select_split={self.select_split!r} needs periodic evaluation (every_steps > 0), "
                             f"got every_steps={self.every_steps}")
        if self.patience is not None and (self.select_split is None or self.patience < 1):
            raise ValueError(f"patience={self.patience} needs a select_split and must be >= 1")
        if self.ranking_depth is not None and self.ranking_depth < 1:
            raise ValueError(f"ranking_depth must be >= 1 or None, got {self.ranking_depth}")

    @property
    def depth(self) -> int:
        return self.ranking_depth or self.num_beams
