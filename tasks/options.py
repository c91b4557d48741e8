"""The knobs of the document representations, fixed when a data dir is registered.

They are part of what a task name means (`{dataset}.daq.{scheme}` with 10 chunks is not the same task as with
5), so `register_dataset` compares them when a name is registered again.
"""
from __future__ import annotations

import dataclasses

from gr_jax.data.d2q import SELECTIONS
from gr_jax.data.span_corruption import num_sentinels, span_corruption_window


def _check_int(name: str, value: object, *, smallest: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
        raise ValueError(f"{name} must be an integer >= {smallest}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class RepresentationOptions:
    """input_length: model input tokens (EOS included): the FirstP length, the DaQ window + EOS, the trim of
      queries.
    daq_num_chunks, daq_seed: DaQ examples per document and the seed of their offsets.
    d2q_path: the synthetic-queries file (absolute); D2Q tasks exist only when it does.
    d2q_queries_per_passage: D2Q examples per passage (at most; fewer when a passage has fewer queries).
    d2q_selection: "first" (the file's first k queries of a passage) or "random" (a seeded random subset).
    d2q_seed: the seed of the "random" selection.
    span_noise_density, span_mean_length, span_seed: span corruption (continued pretraining): the fraction of
      tokens masked, the mean length of a masked span, and the seed of their placement.
    target_length, sentinel_start: set by `register_dataset` (the targets budget and the first id after the
      SentencePiece pieces), for the span corruption window and its sentinel ids.
    """

    input_length: int
    d2q_path: str
    daq_num_chunks: int = 10
    daq_seed: int = 0
    d2q_queries_per_passage: int = 10
    d2q_selection: str = "first"
    d2q_seed: int = 0
    span_noise_density: float = 0.15
    span_mean_length: float = 3.0
    span_seed: int = 0
    target_length: int = 16
    sentinel_start: int = 0

    def __post_init__(self):
        _check_int("input_length", self.input_length, smallest=2)
        _check_int("daq_num_chunks", self.daq_num_chunks, smallest=1)
        _check_int("d2q_queries_per_passage", self.d2q_queries_per_passage, smallest=1)
        _check_int("target_length", self.target_length, smallest=2)
        _check_int("sentinel_start", self.sentinel_start, smallest=0)
        for name in ("daq_seed", "d2q_seed", "span_seed"):
            value = getattr(self, name)
            _check_int(name, value, smallest=0)
            if value >= 2**63:
                raise ValueError(f"{name} must be below 2**63, got {value}")
        if self.d2q_selection not in SELECTIONS:
            raise ValueError(f"d2q_selection must be one of {SELECTIONS}, got {self.d2q_selection!r}")
        span_corruption_window(input_length=self.input_length, target_length=self.target_length,
                               noise_density=self.span_noise_density, mean_noise_span_length=self.span_mean_length)

    @property
    def span_window(self) -> int:
        """Raw tokens per span-corrupted example (see `gr_jax.data.span_corruption.span_corruption_window`)."""
        return span_corruption_window(input_length=self.input_length, target_length=self.target_length,
                                      noise_density=self.span_noise_density,
                                      mean_noise_span_length=self.span_mean_length)

    @property
    def num_sentinels(self) -> int:
        """Sentinel ids a span-corrupted example may use: at most one more than a full window's spans."""
        return num_sentinels(input_length=self.input_length, target_length=self.target_length,
                             noise_density=self.span_noise_density, mean_noise_span_length=self.span_mean_length)
