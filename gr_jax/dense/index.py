"""A dual encoder's corpus index: the collection encoded in batches, its vectors on disk, and a faiss index.

    model_dir/index/{step}/embeddings.npy         float32[N, dim] (multi-vector: float32[N, target_length, dim])
                          /docids.npy             the collection's docids in order (bytes)
                          /manifest.json          which corpus, which encoder, how fast it was encoded
                          /index.{factory}.faiss  a faiss index of the single vectors, one per `IndexConfig.factory`
                          /index.{factory}.json   its settings, build time and recall against exact search

The embeddings are the costly part (hours at 8.8M passages on CPU): every index type is built from the same ones.

Encoding streams the collection (`gr_jax.encoders.collection.embed_texts`: batches, a progress bar with documents/s)
into a memory-mapped .npy, so an 8.8M-passage collection never sits in memory as text or vectors; texts are
tokenised per batch and sorted by length within each batch of `read_size` texts, so a forward pass pads to the
smallest length bucket that holds its texts (one compilation per bucket).

Search: single vectors go through faiss (`faiss.index_factory` strings: "Flat" is exact inner product, the
default; "IVF4096,Flat", "HNSW32", "IVF4096,PQ32" ... for millions of documents, with `nprobe` / `ef_search`); an
approximate index is trained on a seeded sample of `train_size` vectors and its recall@k against exact search is
measured and kept in the manifest. Multi-vector (MaxSim) search is exact, a jitted scan over the corpus in chunks
(what PLAID-style candidate generation would replace at 8.8M passages).

`CorpusIndex.log_partition` is log Z(q) = log sum_d exp(S(q, d) / tau) over the whole corpus (a chunked pass), for
the full-corpus softmax probabilities of the Brier score and the normaliser gap.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import re
import time
from collections.abc import Callable
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.data.readers import DataFormatError
from gr_jax.dense.similarity import scores
from gr_jax.encoders.collection import embed_texts

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike
MANIFEST = "manifest.json"
EMBEDDINGS = "embeddings.npy"
DOCIDS = "docids.npy"
_SCAN_CHUNK = 16_384  # documents scored at once by the chunked passes (log Z, MaxSim)


@dataclasses.dataclass(frozen=True)
class IndexConfig:
    """factory: a `faiss.index_factory` description over inner products ("Flat": exact). nprobe (IVF) and
    ef_search (HNSW): search-time breadth. train_size: vectors an IVF/PQ index is trained on. recall_k: the depth
    of the recall against exact search that the manifest reports for an approximate index."""
    factory: str = "Flat"
    nprobe: Optional[int] = None
    ef_search: Optional[int] = None
    train_size: int = 100_000
    recall_k: int = 10

    @property
    def exact(self) -> bool:
        return self.factory.strip() == "Flat"

    def faiss_path(self, directory: PathLike) -> pathlib.Path:
        """Where this index type of an index directory lives (its settings and recall beside, as .json)."""
        return pathlib.Path(directory) / f"index.{re.sub(r'[^A-Za-z0-9]+', '_', self.factory.strip())}.faiss"


def _faiss():
    import faiss
    return faiss


def docids_digest(docids: np.ndarray) -> str:
    """sha1 of the docids in order: what says an index belongs to a collection."""
    digest = hashlib.sha1()
    for start in range(0, len(docids), 1 << 20):
        digest.update(b"\n".join(docids[start:start + (1 << 20)].tolist()))
        digest.update(b"\n")
    return digest.hexdigest()


def build_faiss_index(vectors: np.ndarray, *, config: IndexConfig, seed: int = 0) -> Any:
    """A faiss index of `vectors` (float32[N, dim], possibly memory-mapped), added in chunks."""
    faiss = _faiss()
    dim = vectors.shape[1]
    index = faiss.index_factory(dim, config.factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        size = min(config.train_size, len(vectors))
        sample = np.sort(np.random.default_rng(seed).choice(len(vectors), size=size, replace=False))
        index.train(np.ascontiguousarray(vectors[sample], dtype=np.float32))
    for start in range(0, len(vectors), _SCAN_CHUNK * 8):
        index.add(np.ascontiguousarray(vectors[start:start + _SCAN_CHUNK * 8], dtype=np.float32))
    configure_search(index, config)
    return index


def configure_search(index: Any, config: IndexConfig) -> None:
    faiss = _faiss()
    if config.nprobe is not None:
        faiss.extract_index_ivf(index).nprobe = config.nprobe
    if config.ef_search is not None:
        faiss.downcast_index(index).hnsw.efSearch = config.ef_search


def ann_recall(index: Any, exact: Any, queries: np.ndarray, *, k: int) -> float:
    """Mean |top-k of `index` & exact top-k| / k over `queries`: how much of exact search an ANN index finds."""
    _, approximate = index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
    _, truth = exact.search(np.ascontiguousarray(queries, dtype=np.float32), k)
    return float(np.mean([len(set(a[a >= 0]) & set(t[t >= 0])) / k for a, t in zip(approximate, truth)]))


@jax.jit
def _chunk_log_sum_exp(queries: jax.Array, documents: jax.Array, temperature: float) -> jax.Array:
    return jax.nn.logsumexp(scores(queries, documents) / temperature, axis=-1)


@jax.jit
def _chunk_top_k(queries, documents, k_carry_scores, k_carry_rows, offset):
    chunk = scores(queries, documents)
    rows = offset + jnp.arange(chunk.shape[1])[None, :]
    all_scores = jnp.concatenate([k_carry_scores, chunk], axis=1)
    all_rows = jnp.concatenate([k_carry_rows, jnp.broadcast_to(rows, chunk.shape)], axis=1)
    top, picked = jax.lax.top_k(all_scores, k_carry_scores.shape[1])
    return top, jnp.take_along_axis(all_rows, picked, axis=1)


@dataclasses.dataclass
class CorpusIndex:
    """The encoded corpus (see the module docstring); `search` and `log_partition` take query vectors.

    manifest: the corpus, the encoder and the encoding; index_info: the faiss index's settings, build seconds and
    recall@k against exact search (approximate indexes)."""
    docids: np.ndarray  # bytes[N]
    embeddings: np.ndarray  # float32[N, dim] or [N, length, dim]
    faiss_index: Any = None  # single vectors only
    manifest: dict = dataclasses.field(default_factory=dict)
    index_info: dict = dataclasses.field(default_factory=dict)
    directory: Optional[pathlib.Path] = None

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[-1])

    @property
    def multi_vector(self) -> bool:
        return self.embeddings.ndim == 3

    def __len__(self) -> int:
        return len(self.docids)

    def _check_queries(self, queries: np.ndarray) -> None:
        where = self.directory / MANIFEST if self.directory else "the corpus index"
        if queries.shape[-1] != self.dim or queries.ndim != self.embeddings.ndim:
            raise ValueError(f"{where}: query vectors of shape {list(queries.shape[1:])} cannot be scored against "
                             f"document vectors of shape {list(self.embeddings.shape[1:])} (dimension mismatch: an "
                             "index of another encoder?)")

    def search(self, queries: np.ndarray, *, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores float32[n, k], rows int64[n, k]) best first; rows -1 (score -inf) where fewer than k exist."""
        self._check_queries(queries)
        k = int(k)
        if not self.multi_vector:
            found_scores, rows = self.faiss_index.search(np.ascontiguousarray(queries, np.float32), min(k, len(self)))
            rows = rows.astype(np.int64)
            found_scores = np.where(rows >= 0, found_scores, -np.inf).astype(np.float32)
        else:
            top = jnp.full((len(queries), min(k, len(self))), -jnp.inf, jnp.float32)
            top_rows = jnp.full(top.shape, -1, jnp.int32)
            for start in range(0, len(self), _SCAN_CHUNK):
                chunk = jnp.asarray(self.embeddings[start:start + _SCAN_CHUNK])
                top, top_rows = _chunk_top_k(jnp.asarray(queries), chunk, top, top_rows, start)
            found_scores, rows = np.asarray(top), np.asarray(top_rows).astype(np.int64)
        if rows.shape[1] < k:  # a corpus smaller than k
            pad = k - rows.shape[1]
            rows = np.pad(rows, ((0, 0), (0, pad)), constant_values=-1)
            found_scores = np.pad(found_scores, ((0, 0), (0, pad)), constant_values=-np.inf)
        return found_scores, rows

    def log_partition(self, queries: np.ndarray, *, temperature: float) -> np.ndarray:
        """float64[n]: log sum over every document of exp(S(q, d) / temperature)."""
        self._check_queries(queries)
        parts = []
        for start in range(0, len(self), _SCAN_CHUNK):
            parts.append(np.asarray(_chunk_log_sum_exp(jnp.asarray(queries),
                                                       jnp.asarray(self.embeddings[start:start + _SCAN_CHUNK]),
                                                       temperature), np.float64))
        return np.logaddexp.reduce(np.stack(parts), axis=0)

    def docid_strings(self, rows: np.ndarray) -> list[str]:
        return [self.docids[r].decode("utf-8") for r in rows.tolist()]

    def with_faiss_index(self, config: IndexConfig, *, recall_queries: Optional[np.ndarray] = None) -> CorpusIndex:
        """This index searched through `config`'s faiss index: read from the index directory when it holds one of
        that type, else built from the embeddings (and written there). For an approximate index built here its
        recall@k against exact search on `recall_queries` is measured."""
        if self.multi_vector:
            if not config.exact:
                raise ValueError(f"multi-vector (MaxSim) search is exact only; index factory {config.factory!r} "
                                 "applies to single vectors")
            return dataclasses.replace(self, index_info={"factory": config.factory})
        path = config.faiss_path(self.directory) if self.directory is not None else None
        if path is not None and path.is_file():
            faiss_index = _faiss().read_index(str(path))
            if faiss_index.d != self.dim or faiss_index.ntotal != len(self):
                raise DataFormatError(f"{path}: {faiss_index.ntotal} vectors of dimension {faiss_index.d}, but the "
                                      f"embeddings beside it are {list(self.embeddings.shape)}")
            configure_search(faiss_index, config)
            info = json.loads(path.with_suffix(".json").read_text())
            return dataclasses.replace(self, faiss_index=faiss_index, index_info=info)
        start = time.perf_counter()
        faiss_index = build_faiss_index(self.embeddings, config=config)
        info = {"factory": config.factory, "nprobe": config.nprobe, "ef_search": config.ef_search,
                "build_seconds": round(time.perf_counter() - start, 3)}
        if not config.exact and recall_queries is not None and len(recall_queries):
            exact = build_faiss_index(self.embeddings, config=IndexConfig())
            info[f"recall@{config.recall_k}_vs_exact"] = ann_recall(faiss_index, exact, recall_queries,
                                                                    k=config.recall_k)
            info["recall_queries"] = len(recall_queries)
            logger.info("%s index: recall@%d against exact search %.4f (%d queries)", config.factory,
                        config.recall_k, info[f"recall@{config.recall_k}_vs_exact"], len(recall_queries))
        if path is not None:
            _faiss().write_index(faiss_index, str(path))
            path.with_suffix(".json").write_text(json.dumps(info, indent=1))
        return dataclasses.replace(self, faiss_index=faiss_index, index_info=info)

    # --- On disk ---

    def save(self, directory: PathLike) -> CorpusIndex:
        """Writes the docids and the manifest beside `embeddings.npy` (already in `directory`); the manifest last,
        so a directory with one is complete. Returns this index placed there."""
        directory = pathlib.Path(directory)
        np.save(directory / DOCIDS, self.docids)
        tmp = directory / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(self.manifest, indent=1))
        os.replace(tmp, directory / MANIFEST)
        return dataclasses.replace(self, directory=directory)

    @classmethod
    def load(cls, directory: PathLike, *, expect: Callable[[dict, pathlib.Path], None]) -> CorpusIndex:
        """Reads the embeddings written by `save`; `expect(manifest, path)` raises when they are not the ones wanted
        (another corpus, another encoder). Attach a faiss index with `with_faiss_index`."""
        directory = pathlib.Path(directory)
        manifest_path = directory / MANIFEST
        if not manifest_path.is_file():
            raise FileNotFoundError(f"{manifest_path} is missing: {directory} holds no complete corpus index")
        manifest = json.loads(manifest_path.read_text())
        expect(manifest, manifest_path)
        embeddings = np.load(directory / EMBEDDINGS, mmap_mode="r")
        docids = np.load(directory / DOCIDS)
        if len(docids) != manifest["corpus"]["documents"] or len(embeddings) != len(docids):
            raise DataFormatError(f"{manifest_path}: {manifest['corpus']['documents']} documents, but "
                                  f"{directory / EMBEDDINGS} has {len(embeddings)} rows and {directory / DOCIDS} "
                                  f"{len(docids)}: the index files do not belong together")
        if embeddings.shape[-1] != manifest["encoder"]["dim"]:
            raise DataFormatError(f"{directory / EMBEDDINGS}: vectors of dimension {embeddings.shape[-1]}, but "
                                  f"{manifest_path} says {manifest['encoder']['dim']}")
        return cls(docids=docids, embeddings=embeddings, manifest=manifest, directory=directory)


def clear_index_dir(directory: PathLike) -> None:
    """Removes an index directory's manifest, then its faiss indexes (before the collection is encoded into it
    again): a directory without a manifest is incomplete, and no faiss index of earlier embeddings outlives them."""
    directory = pathlib.Path(directory)
    (directory / MANIFEST).unlink(missing_ok=True)
    for path in directory.glob("index.*"):
        if path.suffix in (".faiss", ".json"):
            path.unlink()


def encode_corpus(*, texts: Callable[[], Any], num_documents: int, encode: Callable[[list[str]], np.ndarray],
                  shape: tuple[int, ...], out_path: Optional[PathLike] = None, read_size: int = 4096,
                  show_progress: bool = False) -> tuple[np.ndarray, float]:
    """(vectors float32[num_documents, *shape], seconds): `encode` over the streamed texts, into a memory-mapped
    `out_path` (.npy, written under a temporary name and renamed when complete) or an array."""
    def fill(out: np.ndarray) -> float:
        """Writes the vectors into `out` [num_documents, *shape]; returns the seconds it took."""
        flat = out.reshape(num_documents, -1)
        start = time.perf_counter()
        embed_texts(texts=texts(), encode=lambda batch: np.asarray(encode(batch)).reshape(len(batch), -1),
                    num_texts=num_documents, dim=flat.shape[1], batch_size=read_size, out=flat,
                    show_progress=show_progress)
        return time.perf_counter() - start

    full_shape = (num_documents, *shape)
    if out_path is None:
        out = np.empty(full_shape, np.float32)
        return out, fill(out)
    out_path = pathlib.Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    mapped = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=full_shape)
    seconds = fill(mapped)
    mapped.flush()
    del mapped
    os.replace(tmp, out_path)
    return np.load(out_path, mmap_mode="r"), seconds


def index_from_vectors(*, docids: np.ndarray, embeddings: np.ndarray, config: IndexConfig, manifest: dict,
                       recall_queries: Optional[np.ndarray] = None) -> CorpusIndex:
    """A `CorpusIndex` over encoded documents held in memory, searched through `config`'s index."""
    return CorpusIndex(docids=docids, embeddings=embeddings, manifest=manifest).with_faiss_index(
        config, recall_queries=recall_queries)
