"""A collection's embeddings: texts streamed through an `Encoder` into one matrix, cached as a .npy.

Embedding is the costly step of the docids built from embeddings (`gr_jax.tools.semantic_ids`) and of a dense
index (`gr_jax.dense.index`): both stream the texts `batch_size` at a time, with a progress bar in documents/s.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np
import tqdm

if TYPE_CHECKING:
    from gr_jax.data.readers import RetrievalDataset
    from gr_jax.encoders import Encoder

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


def embed_texts(
    *,
    texts: Iterable[str],
    encode: Encoder | Callable[[list[str]], np.ndarray],
    num_texts: int,
    dim: int,
    batch_size: int = 1024,
    out: np.ndarray | None = None,
    show_progress: bool = False,
) -> np.ndarray:
    """float32[num_texts, dim]: `encode` over `texts`, streamed `batch_size` at a time into one matrix.

    `out` (e.g. a `np.lib.format.open_memmap`) receives the rows instead of a new array, so the
    collection's embeddings can exceed memory. The progress bar shows documents/s.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if out is None:
        out = np.empty((num_texts, dim), np.float32)
    elif out.shape != (num_texts, dim):
        raise ValueError(f"out has shape {list(out.shape)}, expected {[num_texts, dim]}")
    filled = 0
    batch: list[str] = []

    def flush() -> None:
        nonlocal filled
        vectors = np.asarray(encode(batch))
        if vectors.shape != (len(batch), dim):
            raise ValueError(f"encode returned shape {list(vectors.shape)} for {len(batch)} texts, expected "
                             f"{[len(batch), dim]}")
        out[filled:filled + len(batch)] = vectors
        filled += len(batch)
        bar.update(len(batch))
        batch.clear()

    with tqdm.tqdm(total=num_texts, desc="embedding", unit="doc", disable=not show_progress) as bar:
        for text in texts:
            if filled + len(batch) >= num_texts:
                raise ValueError(f"more than num_texts={num_texts} texts")
            batch.append(text)
            if len(batch) == batch_size:
                flush()
        if batch:
            flush()
    if filled != num_texts:
        raise ValueError(f"got {filled} texts, expected num_texts={num_texts}")
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class CollectionEmbeddings:
    """A collection's embeddings: docids[i] is row i of `embeddings` (float32[N, dim], often memory-mapped).

    `seconds` is the embedding time (0 when `cached`, i.e. read back from the cache file).
    """

    docids: tuple[str, ...]
    embeddings: np.ndarray
    cached: bool
    seconds: float

    @property
    def documents_per_s(self) -> float | None:
        return None if self.cached else len(self.docids) / max(self.seconds, 1e-9)


def collection_embeddings(
    *,
    dataset: RetrievalDataset,
    encoder: Encoder,
    cache_path: PathLike | None = None,
    batch_size: int = 1024,
    show_progress: bool = False,
) -> CollectionEmbeddings:
    """The embeddings of a dataset's collection, in collection order.

    With `cache_path` (a `.npy`), the embeddings are written there (memory-mapped, so an 8.8M x 384
    collection never sits in RAM) and reused while the file is newer than the collection and has one row
    per document: embedding the collection is the costly step (hours on CPU), and builds with other
    k / c / seed or token schemes share it. The cache is written under a temporary name and renamed when
    complete, so an interrupted run never leaves a truncated cache. The cache is known by its path only:
    use one path per encoder.
    """
    docids = tuple(docid for docid, _ in dataset.collection())
    if not docids:
        raise ValueError(f"{dataset.collection_path}: the collection is empty")
    shape = (len(docids), encoder.dim)
    if cache_path is not None:
        cache_path = pathlib.Path(cache_path)
        if cache_path.is_file() and cache_path.stat().st_mtime_ns >= dataset.collection_path.stat().st_mtime_ns:
            cached = np.load(cache_path, mmap_mode="r")
            if cached.shape == shape and cached.dtype == np.float32:
                logger.info("embeddings of %d documents from %s (cached)", len(docids), cache_path)
                return CollectionEmbeddings(docids=docids, embeddings=cached, cached=True, seconds=0.0)
            logger.warning("re-embedding: %s has shape %s, expected %s", cache_path, cached.shape, shape)
        tmp_path = cache_path.with_name(f".{cache_path.name}.tmp")
        out = np.lib.format.open_memmap(tmp_path, mode="w+", dtype=np.float32, shape=shape)
    else:
        out = None
    start = time.perf_counter()
    embeddings = embed_texts(texts=(text for _, text in dataset.collection()), encode=encoder, num_texts=len(docids),
                             dim=encoder.dim, batch_size=batch_size, out=out, show_progress=show_progress)
    seconds = time.perf_counter() - start
    logger.info("embedded %d documents in %.1f s (%.1f documents/s)", len(docids), seconds,
                len(docids) / max(seconds, 1e-9))
    if cache_path is not None and out is not None:  # `out`: the cache's memory map, which embed_texts filled
        out.flush()
        del embeddings, out
        os.replace(tmp_path, cache_path)
        embeddings = np.load(cache_path, mmap_mode="r")
    return CollectionEmbeddings(docids=docids, embeddings=embeddings, cached=False, seconds=seconds)
