"""A dual encoder's corpus index: the collection encoded in batches, its vectors on disk, and a faiss index.

    model_dir/index/{step}/embeddings.npy         float32[N, dim] (multi-vector: float32[N, target_length, dim])
                          /embeddings.{i:05d}-of-{n:05d}.npy  instead, written by n processes: process i's rows
                          /docids.npy             the collection's docids in order (bytes)
                          /manifest.json          which corpus, which encoder, the shard files and their rows, how
                                                  fast each process encoded its rows
                          /index.{factory}.faiss  a faiss index of the single vectors, one per `IndexConfig.factory`
                          /index.{factory}.json   its settings, build time and recall against exact search

The embeddings are the costly part (hours at 8.8M passages on CPU): every index type is built from the same ones.

Encoding streams the collection (`encode_corpus`: blocks of texts, a progress bar with documents/s) into a .npy
written block by block (read back memory-mapped), so an 8.8M-passage collection never sits in memory as text or
vectors; texts are tokenised per batch and sorted by length within each batch of `read_size` texts, so a forward
pass pads to the smallest length bucket that holds its texts (one compilation per bucket).

Several processes (a multi-host job) write one index together: process i of n encodes only its rows of the
collection (`gr_jax.data.readers.shard_rows`) into its own shard file; process 0 writes the docids and the manifest
once every shard is complete (`JobProcesses`: the jax.distributed key-value store's barriers), and every process then
reads all shards, memory-mapped (`ShardedRows`: one array to its readers, no copy of the vectors). An index of any
layout loads in any job, one process or many; the manifest names its shard files and their rows.

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
import itertools
import json
import logging
import operator
import os
import pathlib
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Optional, cast

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from gr_jax import partitioning
from gr_jax.data.readers import DataFormatError
from gr_jax.dense.similarity import scores

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike
MANIFEST = "manifest.json"
EMBEDDINGS = "embeddings.npy"
DOCIDS = "docids.npy"
_SCAN_CHUNK = 16_384  # documents scored at once by the chunked passes (log Z, MaxSim)
_SHARD_FILE = re.compile(r"embeddings\.\d{5}-of-\d{5}\.npy")
_JOB_SCOPES = itertools.count()  # one key prefix per index written by a job: the same sequence in every process
_WAIT_MS = 24 * 3_600_000  # a process may wait for another to encode its shard of millions of documents


def shard_file(index: int, count: int) -> str:
    """The embeddings file of process `index` of `count` (one process: `embeddings.npy`, the layout of old)."""
    return EMBEDDINGS if count == 1 else f"embeddings.{index:05d}-of-{count:05d}.npy"


class ShardedRows:
    """Read-only float32[N, ...] rows kept in several arrays (an index's shard files, memory-mapped), read as one
    array by what reads an index's embeddings: `len`, `shape`, `ndim`, `dtype`, and `[key]` with a row, a slice
    or an integer array of rows, each read from the shards that hold it (a slice inside one shard is a view of
    it). `np.asarray` copies all rows into memory."""

    def __init__(self, shards: Sequence[np.ndarray]):
        if not shards or len({(s.shape[1:], s.dtype) for s in shards}) != 1:
            raise ValueError(f"shards must be one or more arrays of one row shape and dtype, got "
                             f"{[(list(s.shape), str(s.dtype)) for s in shards]}")
        self.shards = list(shards)
        self.starts = np.cumsum([0, *(len(s) for s in self.shards)])  # int64[len(shards) + 1]
        self.shape: tuple[int, ...] = (int(self.starts[-1]), *self.shards[0].shape[1:])
        self.dtype = self.shards[0].dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return self[np.arange(start, stop, step)]
            parts = [shard[max(start - lo, 0):min(stop - lo, len(shard))]
                     for shard, lo in zip(self.shards, self.starts.tolist()) if start - lo < len(shard) and stop > lo]
            if not parts:
                return np.empty((0, *self.shape[1:]), self.dtype)
            return parts[0] if len(parts) == 1 else np.concatenate(parts)
        if isinstance(key, (int, np.integer)):
            return self[np.asarray([operator.index(key)])][0]
        rows = np.asarray(key)
        if rows.dtype.kind not in "iu":
            raise IndexError(f"rows of sharded embeddings are read by a row, a slice or an integer array, not "
                             f"{type(key).__name__} of {rows.dtype}")
        flat = rows.reshape(-1).astype(np.int64)
        flat = np.where(flat < 0, flat + len(self), flat)
        if flat.size and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"row {int(rows.reshape(-1)[np.argmax((flat < 0) | (flat >= len(self)))])} of "
                             f"{len(self)} rows")
        shard_of = np.searchsorted(self.starts, flat, side="right") - 1
        out = np.empty((flat.size, *self.shape[1:]), self.dtype)
        for shard in np.unique(shard_of).tolist():
            picked = shard_of == shard
            out[picked] = self.shards[shard][flat[picked] - self.starts[shard]]
        return out.reshape(*rows.shape, *self.shape[1:])

    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray:
        whole = np.concatenate(self.shards)
        return whole if dtype is None else whole.astype(dtype, copy=False)


class JobProcesses:
    """The processes of a job that write one index directory together: this process's `index` of `count`, and the
    jax.distributed key-value store through which they wait for each other (barriers) and pass small values (as
    `gr_jax.actions.ProcessZeroDecides`). Each index written takes its own key prefix (`scope`), the same in every
    process as they write their indexes in the same order. With one process every wait is a no-op."""

    def __init__(self, *, index: int = 0, count: int = 1, client: Any = None, scope: str = "gr_jax/dense_index"):
        self.index, self.count, self._client, self.scope = index, count, client, scope

    @classmethod
    def of_job(cls, client: Any = None) -> JobProcesses:
        """This job's processes (jax.process_index / process_count) under a fresh scope."""
        return cls(index=jax.process_index(), count=jax.process_count(), client=client,
                   scope=f"gr_jax/dense_index/{next(_JOB_SCOPES)}")

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = partitioning.distributed_client()
        return self._client

    def barrier(self, name: str) -> None:
        """Returns once every process has called it with `name`."""
        if self.count > 1:
            self.client.wait_at_barrier(f"{self.scope}/{name}", _WAIT_MS)

    def post(self, name: str, value: str) -> None:
        """Makes `value` this process's `name` for every process to `read`."""
        if self.count > 1:
            self.client.key_value_set(f"{self.scope}/{name}/{self.index}", value, allow_overwrite=True)

    def read(self, name: str, process: int) -> str:
        """Process `process`'s `name`, waiting for it to be posted."""
        return self.client.blocking_key_value_get(f"{self.scope}/{name}/{process}", _WAIT_MS)

    def forget(self, name: str) -> None:
        """Deletes every process's `name` from the store (call when no process reads them any more)."""
        if self.count > 1:
            for process in range(self.count):
                self.client.key_value_delete(f"{self.scope}/{name}/{process}")


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
    embeddings: np.ndarray  # float32[N, dim] or [N, length, dim]; loaded from several shard files: a ShardedRows
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

    def with_faiss_index(self, config: IndexConfig, *, recall_queries: Optional[np.ndarray] = None,
                         write: bool = True) -> CorpusIndex:
        """This index searched through `config`'s faiss index: read from the index directory when it holds one of
        that type, else built from the embeddings (and written there when `write`: one process of a job writes,
        each file under a temporary name, so another never reads half of one). For an approximate index built here
        its recall@k against exact search on `recall_queries` is measured."""
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
        if path is not None and write:
            settings, tmp = path.with_suffix(".json"), path.with_name(f".{path.name}.tmp")
            settings.with_name(f".{settings.name}.tmp").write_text(json.dumps(info, indent=1))
            os.replace(settings.with_name(f".{settings.name}.tmp"), settings)  # first: the index's reader reads it
            _faiss().write_index(faiss_index, str(tmp))
            os.replace(tmp, path)
        return dataclasses.replace(self, faiss_index=faiss_index, index_info=info)

    # --- On disk ---

    def save(self, directory: PathLike) -> CorpusIndex:
        """Writes the docids and the manifest beside the embeddings (already in `directory`: `embeddings.npy`, or
        the shard files the manifest's `shards` name); the manifest last, so a directory with one is complete.
        Returns this index placed there."""
        directory = pathlib.Path(directory)
        save_manifest(directory, docids=self.docids, manifest=self.manifest)
        return dataclasses.replace(self, directory=directory)

    @classmethod
    def load(cls, directory: PathLike, *, expect: Callable[[dict, pathlib.Path], None]) -> CorpusIndex:
        """Reads the embeddings written by `save` (memory-mapped, every shard file of any layout);
        `expect(manifest, path)` raises when they are not the ones wanted (another corpus, another encoder). Attach
        a faiss index with `with_faiss_index`."""
        directory = pathlib.Path(directory)
        manifest_path = directory / MANIFEST
        if not manifest_path.is_file():
            raise FileNotFoundError(f"{manifest_path} is missing: {directory} holds no complete corpus index")
        manifest = json.loads(manifest_path.read_text())
        expect(manifest, manifest_path)
        documents = manifest["corpus"]["documents"]
        shards = manifest.get("shards") or [{"file": EMBEDDINGS, "rows": [0, documents]}]  # older: one file
        embeddings = load_shards(directory, shards=shards, documents=documents)
        docids = np.load(directory / DOCIDS)
        if len(docids) != documents:
            raise DataFormatError(f"{manifest_path}: {documents} documents, but {directory / DOCIDS} has "
                                  f"{len(docids)}: the index files do not belong together")
        if embeddings.shape[-1] != manifest["encoder"]["dim"]:
            raise DataFormatError(f"{directory / shards[0]['file']}: vectors of dimension {embeddings.shape[-1]}, "
                                  f"but {manifest_path} says {manifest['encoder']['dim']}")
        return cls(docids=docids, embeddings=embeddings, manifest=manifest, directory=directory)


def save_manifest(directory: PathLike, *, docids: np.ndarray, manifest: dict) -> None:
    """Writes `docids` (bytes[N]) and `manifest` beside the embeddings in `directory`, the manifest last (under a
    temporary name, renamed): a directory with a manifest holds a complete index."""
    directory = pathlib.Path(directory)
    np.save(directory / DOCIDS, docids)
    tmp = directory / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, directory / MANIFEST)


def load_shards(directory: PathLike, *, shards: Sequence[dict], documents: int) -> np.ndarray:
    """The embeddings of `documents` rows kept in `shards` (the manifest's: each a file of `directory` and its
    [start, stop) rows, in order), memory-mapped: one file's array, or a `ShardedRows` over several. A missing
    file, rows that do not tile [0, documents) or a file of other rows or shape is an error naming it."""
    directory = pathlib.Path(directory)
    arrays: list[np.ndarray] = []
    expected_start = 0
    for shard in shards:
        path = directory / shard["file"]
        start, stop = shard["rows"]
        if start != expected_start:
            raise DataFormatError(f"{directory / MANIFEST}: shard {path.name} holds rows [{start}, {stop}), but the "
                                  f"shards before it end at row {expected_start}")
        if not path.is_file():
            raise DataFormatError(f"{path} is missing: {directory / MANIFEST} names it as rows [{start}, {stop}) "
                                  "of the index")
        array = np.load(path, mmap_mode="r")
        if len(array) != stop - start or (arrays and array.shape[1:] != arrays[0].shape[1:]):
            raise DataFormatError(f"{path}: {list(array.shape)} vectors, but {directory / MANIFEST} says rows "
                                  f"[{start}, {stop}) of vectors {list(arrays[0].shape[1:]) if arrays else ''}: the "
                                  "index files do not belong together")
        arrays.append(array)
        expected_start = stop
    if expected_start != documents:
        raise DataFormatError(f"{directory / MANIFEST}: {documents} documents, but its shards hold rows [0, "
                              f"{expected_start}): the index files do not belong together")
    # A ShardedRows reads as the arrays it stands for (what an index's readers use of one; see its docstring).
    return arrays[0] if len(arrays) == 1 else cast(np.ndarray, ShardedRows(arrays))


def clear_index_dir(directory: PathLike) -> None:
    """Removes an index directory's manifest, then its faiss indexes and embeddings files of any layout (before the
    collection is encoded into it again): a directory without a manifest is incomplete, and no faiss index or
    vectors of earlier embeddings outlive them."""
    directory = pathlib.Path(directory)
    (directory / MANIFEST).unlink(missing_ok=True)
    for path in directory.glob("index.*"):
        if path.suffix in (".faiss", ".json"):
            path.unlink()
    for path in directory.glob("embeddings*.npy"):
        if path.name == EMBEDDINGS or _SHARD_FILE.fullmatch(path.name):
            path.unlink()


def encode_corpus(*, texts: Callable[[], Iterable[str]], num_documents: int,
                  encode: Callable[[list[str]], np.ndarray], shape: tuple[int, ...],
                  out_path: Optional[PathLike] = None, read_size: int = 4096,
                  show_progress: bool = False) -> tuple[np.ndarray, float]:
    """(vectors float32[num_documents, *shape], seconds): `encode` over the streamed texts, `read_size` at a time
    (a progress bar in documents/s), into `out_path` (.npy, written under a temporary name and renamed when
    complete; returned memory-mapped) or an array. The file is written block by block, not through a memory map:
    the written pages of a map count in the process's resident memory, up to the whole file, so host memory holds
    one block of texts and vectors whatever num_documents. More or fewer texts than num_documents is an error."""
    full_shape = (num_documents, *shape)
    width = int(np.prod(shape, dtype=np.int64))
    if out_path is None:
        out = np.empty(full_shape, np.float32)
        rows = out.reshape(num_documents, width)

        def store(vectors: np.ndarray, row: int) -> None:
            rows[row:row + len(vectors)] = vectors

        return out, _encode_blocks(texts=texts, num_documents=num_documents, encode=encode, width=width, write=store,
                                   read_size=read_size, show_progress=show_progress)
    out_path = pathlib.Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    header = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=full_shape)  # header and file size
    offset = header.offset
    del header
    with open(tmp, "r+b") as f:
        f.seek(offset)
        seconds = _encode_blocks(texts=texts, num_documents=num_documents, encode=encode, width=width,
                                 write=lambda vectors, row: f.write(vectors.tobytes()), read_size=read_size,
                                 show_progress=show_progress)
    os.replace(tmp, out_path)
    return np.load(out_path, mmap_mode="r"), seconds


def _encode_blocks(*, texts: Callable[[], Iterable[str]], num_documents: int,
                   encode: Callable[[list[str]], np.ndarray], width: int,
                   write: Callable[[np.ndarray, int], Any], read_size: int, show_progress: bool) -> float:
    """`write(vectors float32[block, width] C-contiguous, first row)` for each block of `read_size` texts, in
    order; returns the seconds it took."""
    start = time.perf_counter()
    filled = 0
    with tqdm.tqdm(total=num_documents, desc="embedding", unit="doc", disable=not show_progress) as bar:
        iterator = iter(texts())
        while block := list(itertools.islice(iterator, read_size)):
            if filled + len(block) > num_documents:
                raise ValueError(f"more than num_documents={num_documents} texts")
            vectors = np.ascontiguousarray(np.asarray(encode(block), np.float32).reshape(len(block), -1))
            if vectors.shape != (len(block), width):
                raise ValueError(f"encode returned {vectors.shape[1]} values a text for {len(block)} texts, "
                                 f"expected {width}")
            write(vectors, filled)
            filled += len(block)
            bar.update(len(block))
    if filled != num_documents:
        raise ValueError(f"got {filled} texts, expected num_documents={num_documents}")
    return time.perf_counter() - start


def index_from_vectors(*, docids: np.ndarray, embeddings: np.ndarray, config: IndexConfig, manifest: dict,
                       recall_queries: Optional[np.ndarray] = None) -> CorpusIndex:
    """A `CorpusIndex` over encoded documents held in memory, searched through `config`'s index."""
    return CorpusIndex(docids=docids, embeddings=embeddings, manifest=manifest).with_faiss_index(
        config, recall_queries=recall_queries)
