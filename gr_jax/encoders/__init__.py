"""Text encoders: callables `list[str] -> float32[n, dim]` that semantic docids cluster.

Why an interface and not one model: DSI/NCI build semantic docids from BERT-family document embeddings,
and which encoder (MiniLM, a T5 encoder, precomputed vectors) is a choice of the experiment;
`gr_jax.encoders.collection` embeds a collection with any `Encoder`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Encoder(Protocol):
    """Embeds texts: `encoder(texts) -> float32[len(texts), encoder.dim]`, row i for texts[i]."""

    dim: int

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        ...


def __getattr__(name: str):
    """`load_minilm` (all-MiniLM-L6-v2 in Flax) is imported on first use: it imports jax, `Encoder` does not."""
    if name == "load_minilm":
        from gr_jax.encoders.minilm import load_minilm

        return load_minilm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Encoder", "load_minilm"]
