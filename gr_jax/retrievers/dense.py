"""A dual encoder as a retriever: queries encoded in fixed-shape batches, the corpus index searched.

The corpus index (`gr_jax.dense.index.CorpusIndex`) depends on the parameters, so a retriever builds it on first
use: it loads `index_dir` when that holds the index of this corpus and this encoder (its manifest says which: the
collection, the run, step and config, and a checksum of the parameters' values), and otherwise encodes the
collection (streamed, progress bar, documents/s) and, with `index_dir`, writes it there for the next search.
`with_params` gives the same retriever, compiled encoders included, for other parameters and an index not built
yet: a training run's periodic evaluation re-encodes the corpus with each state; its final evaluation keeps the
index in the run dir (`kept_in`), where `gr_jax.eval` of the same checkpoint finds it.

In a job of several processes with an `index_dir` (on a file system they all reach, as the checkpoints are), each
process encodes only its rows of the collection (`gr_jax.data.readers.shard_rows`: it skips the lines before them
and stops after them) on its own devices, into its own shard file; process 0 writes the manifest once every shard
is there, and every process reads the whole index from the shards. Without an `index_dir` (training's periodic
evaluations), the processes encode the whole collection together, each its rows of every global batch.

Each ranking also reports the probability of its rank-1 document (for the Brier score, `gr_vs_dense_limitations.txt`
Sec. 4.1), in two forms: `full_softmax`, P~(d | q) = exp(S(q, d) / tau) / Z(q) over the whole corpus (Eq. 8's Z),
and `top_k_softmax`, the softmax of S / tau over the k documents returned.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import pathlib
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding

from gr_jax import partitioning
from gr_jax.data.readers import DataFormatError, shard_rows
from gr_jax.dense import index as index_lib
from gr_jax.dense.data import CorpusDocuments
from gr_jax.dense.model import DOCUMENT, QUERY, DualEncoderModel
from gr_jax.dense.towers import Tokenizer
from gr_jax.retrievers import Ranking

logger = logging.getLogger(__name__)


def params_checksum(params: Any, *, shardings: Any, mesh: Mesh) -> str:
    """sha1 of every parameter's bits (each leaf's bit patterns summed with position weights, modulo 2**32, in two
    ways) with the tree's paths, shapes and dtypes: what tells an index encoded by one set of parameters from one of
    another set saved under the same step. Summed where the parameters live, by one jitted program: no host copy
    of a sharded model, and the same value however they are sharded (modular sums do not depend on order)."""
    paths_and_leaves, _ = jax.tree_util.tree_flatten_with_path(jax.device_put(params, shardings))
    leaves = [leaf for _, leaf in paths_and_leaves]

    def sums(leaves):
        out = []
        for leaf in leaves:
            unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[leaf.dtype.itemsize]
            bits = jax.lax.bitcast_convert_type(leaf, unsigned).reshape(-1).astype(jnp.uint32)
            position = jax.lax.iota(jnp.uint32, bits.size)
            out.append(jnp.stack([jnp.sum(bits * (2 * position + 1)),
                                  jnp.sum((bits ^ (bits >> 13)) * (position * jnp.uint32(0x9E3779B1)
                                                                   + jnp.uint32(0x7F4A7C15)))]))
        return out

    values = jax.device_get(jax.jit(sums, out_shardings=partitioning.host_readable_sharding(mesh))(leaves))
    digest = hashlib.sha1()
    for (path, leaf), value in zip(paths_and_leaves, values):
        digest.update(f"{jax.tree_util.keystr(path)} {leaf.shape} {leaf.dtype} ".encode())
        digest.update(np.asarray(value, np.uint32).tobytes())
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class _Placement:
    """Where texts are encoded: a mesh, the parameters' shardings on it, the parameters (placed by `encode`), the
    batch size (a multiple of the mesh's 'data' axis) and the encoders compiled for it, by (side, batch shape)."""
    mesh: Mesh
    param_shardings: Any
    params: Any
    batch_size: int
    encoders: dict[tuple, Callable]


def length_buckets(longest: int, *, smallest: int = 16) -> tuple[int, ...]:
    """Powers of two from `smallest` below `longest`, then `longest`: the padded lengths of document batches."""
    buckets = []
    length = smallest
    while length < longest:
        buckets.append(length)
        length *= 2
    return (*buckets, longest)


class DenseRetriever:
    """`gr_jax.retrievers.Retriever` over a dual encoder (see the module docstring).

    corpus: the collection's docids and texts; fingerprint: what identifies this encoder in an index manifest
    (model dir, step, config; the parameters' checksum is added); index_dir: where the index is read from or written
    to (None: memory only); replace_stale: an index there of another corpus or encoder is encoded again with a
    warning (else it is an error naming it). probabilities: compute the rank-1 probabilities (a second pass over the
    corpus vectors for Z(q)). document_buckets: the lengths document batches are padded to (default
    `length_buckets(target_length)`; `(target_length,)` pads every document to target_length): `encode` sorts each
    call's documents by token length, so a batch pads only to the smallest bucket that holds its longest (one
    compilation per bucket), and puts the vectors back in the documents' order. Padding is masked, so the vectors are
    the same up to float rounding (`tests/test_dense.py`); docs/dense.md has the time it saves.
    """

    def __init__(self, *, model: DualEncoderModel, params: Any, tokenizer: Tokenizer, corpus: CorpusDocuments,
                 input_length: int, target_length: int, mesh: Mesh, param_shardings: Any,
                 rules: partitioning.LogicalAxisRules = partitioning.LOGICAL_AXIS_RULES, batch_size: int = 64,
                 index_config: index_lib.IndexConfig = index_lib.IndexConfig(),
                 index_dir: Optional[str | os.PathLike] = None,
                 fingerprint: Optional[dict] = None, replace_stale: bool = False, probabilities: bool = True,
                 show_progress: bool = False, document_buckets: Optional[Sequence[int]] = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        document_buckets = tuple(sorted(document_buckets or length_buckets(target_length)))
        if document_buckets[0] < 1 or document_buckets[-1] != target_length:
            raise ValueError(f"document_buckets {document_buckets} must be positive lengths, the longest "
                             f"target_length={target_length}")
        self.document_buckets = document_buckets
        self.model = model
        self.params = params
        self.tokenizer = tokenizer
        self.corpus = corpus
        self.input_length = input_length
        self.target_length = target_length
        self.mesh = mesh
        self.rules = rules
        self.param_shardings = param_shardings
        self.batch_size = partitioning.data_axis_multiple(batch_size, mesh)
        self.index_config = index_config
        self.index_dir = pathlib.Path(index_dir) if index_dir is not None else None
        self.fingerprint = dict(fingerprint or {})
        self.replace_stale = replace_stale
        self.probabilities = probabilities
        self.show_progress = show_progress
        self._encoders: dict[tuple, Callable] = {}  # (side, batch shape) -> executable; shared by `with_params` copies
        self._index: Optional[index_lib.CorpusIndex] = None
        self._params_checksum: Optional[str] = None
        self.compile_seconds = 0.0  # compilation paid since the last `rank` reported it
        self.truncated = {QUERY: 0, DOCUMENT: 0}  # texts cut to the side's token length, reported by rank / indexing

    def with_params(self, params: Any, *, fingerprint: Optional[dict] = None) -> DenseRetriever:
        """The same retriever (its compiled encoders, its index dir) for other parameters; the corpus is encoded
        again on use, unless the index dir holds its index."""
        copy = object.__new__(DenseRetriever)
        copy.__dict__.update(self.__dict__, params=params, _index=None, _params_checksum=None,
                             truncated={QUERY: 0, DOCUMENT: 0},
                             fingerprint=dict(fingerprint if fingerprint is not None else self.fingerprint))
        return copy

    def kept_in(self, index_dir: str | pathlib.Path, *, fingerprint: dict) -> DenseRetriever:
        """This retriever with its corpus index kept in `index_dir` under `fingerprint` (a checkpoint's: training's
        final evaluation keeps the index of the step it reports, `gr_jax.dense.experiment.DenseBuilt`): loaded from
        there when it holds this corpus encoded by these parameters, else encoded and written there, replacing with a
        warning an index of another corpus or encoder (the run's config or parameters changed since)."""
        copy = self.with_params(self.params, fingerprint=fingerprint)
        copy.index_dir, copy.replace_stale = pathlib.Path(index_dir), True
        return copy

    @property
    def dim(self) -> int:
        return self.model.config.dim

    # --- Encoding ---

    def _encoder(self, side: str, placement: _Placement, params: Any, ids: jax.Array, mask: jax.Array) -> Callable:
        """The compiled encoder of `side` on `placement`'s mesh for batches shaped as `ids` (compiled ahead of time on
        first use; the seconds it took are added to `compile_seconds`)."""
        key = (side, ids.shape)
        if key not in placement.encoders:
            start = time.perf_counter()
            sharding = partitioning.batch_sharding(placement.mesh)
            placement.encoders[key] = jax.jit(functools.partial(self.model.encode, side=side),
                                              in_shardings=(placement.param_shardings, sharding, sharding),
                                              out_shardings=partitioning.host_readable_sharding(placement.mesh),
                                              ).lower(params, ids, mask).compile()
            self.compile_seconds += time.perf_counter() - start
        return placement.encoders[key]

    def _placement(self) -> _Placement:
        """The job's mesh: every process encodes the same texts, each on its devices' rows of every batch."""
        return _Placement(mesh=self.mesh, param_shardings=self.param_shardings, params=self.params,
                          batch_size=self.batch_size, encoders=self._encoders)

    def _process_placement(self) -> _Placement:
        """This process's devices alone, for the texts only it encodes (its rows of the collection): a mesh of its
        devices (the job's 'model' axis, or the largest part of it they hold) and a copy of the parameters, gathered
        from every process (a collective: every process calls this at the same point). The tower must fit one
        process's devices."""
        devices = jax.local_devices()
        model = math.gcd(self.mesh.shape[partitioning.MODEL_AXIS], len(devices))
        mesh = partitioning.make_mesh(data=-1, model=model, devices=devices)

        def local(sharding: Any) -> NamedSharding:
            spec = sharding.spec if isinstance(sharding, NamedSharding) else jax.sharding.PartitionSpec()
            return NamedSharding(mesh, spec)

        shardings = jax.tree.map(local, self.param_shardings)
        whole = multihost_utils.process_allgather(jax.device_put(self.params, self.param_shardings), tiled=True)
        return _Placement(mesh=mesh, param_shardings=shardings, params=jax.device_put(whole, shardings),
                          batch_size=partitioning.data_axis_multiple(self.batch_size, mesh), encoders={})

    def encode(self, texts: Sequence[str], *, side: str, placement: Optional[_Placement] = None) -> np.ndarray:
        """float32[len(texts), dim] (multi-vector: [len(texts), length, dim], length = the side's token length), on
        `placement` (default: the job's mesh)."""
        placement = placement or self._placement()
        length = self.input_length if side == QUERY else self.target_length
        tokens = self.tokenizer(list(texts), length=length)
        self.truncated[side] += tokens.truncated
        lengths = tokens.mask.sum(axis=1)
        buckets = (length,) if side == QUERY else self.document_buckets
        order = np.argsort(-lengths, kind="stable")
        shape = (len(texts), *((length,) if self.model.config.multi_vector else ()), self.dim)
        out = np.zeros(shape, np.float32)
        params = jax.device_put(placement.params, placement.param_shardings)
        batch_size = placement.batch_size
        sharding = partitioning.batch_sharding(placement.mesh)

        def placed(array: np.ndarray) -> jax.Array:
            """The batch on the mesh (a jit takes no numpy batch split over devices in a job of several processes;
            every process holds the whole batch, so each places its devices' rows of it)."""
            return jax.make_array_from_callback(array.shape, sharding, lambda where: array[where])

        with partitioning.partitioning_context(mesh=placement.mesh, rules=self.rules):
            for start in range(0, len(order), batch_size):
                rows = order[start:start + batch_size]
                width = next(b for b in buckets if b >= max(int(lengths[rows].max()), 1))
                ids = np.zeros((batch_size, width), np.int32)
                mask = np.zeros((batch_size, width), bool)
                ids[:len(rows)] = tokens.ids[rows, :width]
                mask[:len(rows)] = tokens.mask[rows, :width]
                ids_on_mesh, mask_on_mesh = placed(ids), placed(mask)
                encode = self._encoder(side, placement, params, ids_on_mesh, mask_on_mesh)
                vectors = np.asarray(jax.device_get(encode(params, ids_on_mesh, mask_on_mesh)))[:len(rows)]
                if self.model.config.multi_vector:
                    out[rows, :width] = vectors
                else:
                    out[rows] = vectors
        return out

    def document_encoder(self) -> "DocumentEncoder":
        """The document side as a `gr_jax.encoders.Encoder` (texts -> float32[n, dim]), e.g. for semantic docids."""
        return DocumentEncoder(self)

    # --- The corpus index ---

    def params_checksum(self) -> str:
        """`params_checksum` of this retriever's parameters (computed once)."""
        if self._params_checksum is None:
            self._params_checksum = params_checksum(self.params, shardings=self.param_shardings, mesh=self.mesh)
        return self._params_checksum

    def _manifest(self) -> dict:
        dataset = self.corpus.dataset
        stat = dataset.collection_path.stat()
        return {"corpus": {"collection": str(dataset.collection_path.resolve()), "documents": len(self.corpus),
                           "docids_sha1": index_lib.docids_digest(self.corpus.docids), "bytes": stat.st_size},
                "encoder": {**self.fingerprint, "params_checksum": self.params_checksum(), "dim": self.dim,
                            "multi_vector": self.model.config.multi_vector, "target_length": self.target_length}}

    def _expect(self, manifest: dict, path: pathlib.Path) -> None:
        wanted = self._manifest()
        if manifest.get("corpus") != wanted["corpus"]:
            raise DataFormatError(f"{path}: the index was built for another corpus ({manifest.get('corpus')}), not "
                                  f"{wanted['corpus']['collection']} ({wanted['corpus']['documents']} documents): "
                                  f"delete {path.parent} to rebuild it")
        if manifest.get("encoder") != wanted["encoder"]:
            raise DataFormatError(f"{path}: the index was built by another encoder ({manifest.get('encoder')}), not "
                                  f"{wanted['encoder']}: delete {path.parent} to rebuild it")

    def index(self, *, recall_queries: Optional[np.ndarray] = None) -> index_lib.CorpusIndex:
        """The corpus index of these parameters, searched through `index_config`'s faiss index: the embeddings are
        loaded from `index_dir` when it holds this corpus encoded by this encoder, else encoded (and written
        there); a faiss index of that type is read from there or built (its recall against exact search measured on
        `recall_queries`, query vectors). In a job of several processes every process calls this at the same point
        (see the module docstring)."""
        if self._index is not None:
            return self._index
        self._index = self.encoded().with_faiss_index(self.index_config, recall_queries=recall_queries,
                                                      write=jax.process_index() == 0)
        return self._index

    def encoded(self) -> index_lib.CorpusIndex:
        """The corpus' embeddings without a faiss index: read from `index_dir` when it holds this corpus encoded
        by this encoder, else encoded (and written there). In a job of several processes every process calls this
        at the same point (see the module docstring)."""
        processes = index_lib.JobProcesses.of_job()
        embedded = None
        if self.index_dir is not None:
            self.params_checksum()  # a collective: in every process, before any reads or writes the directory
            embedded = self._read_index()
            if processes.count > 1:
                embedded = self._agree_on_reading(processes, embedded)
        if embedded is None:
            embedded = (self._encode_shards(processes) if processes.count > 1 and self.index_dir is not None
                        else self._encode_corpus())
        return embedded

    def _read_index(self) -> Optional[index_lib.CorpusIndex]:
        """The index in `index_dir` when it is this corpus encoded by this encoder; None when there is none, or
        (`replace_stale`) another one, which is encoded again."""
        assert self.index_dir is not None
        if not (self.index_dir / index_lib.MANIFEST).is_file():
            return None
        try:
            embedded = index_lib.CorpusIndex.load(self.index_dir, expect=self._expect)
        except DataFormatError as e:
            if not self.replace_stale:
                raise
            logger.warning("%s; encoding the collection again into %s", str(e).partition(": delete")[0],
                           self.index_dir)
            return None
        logger.info("corpus index of %d documents read from %s", len(embedded), self.index_dir)
        return embedded

    def _agree_on_reading(self, processes: index_lib.JobProcesses,
                          embedded: Optional[index_lib.CorpusIndex]) -> Optional[index_lib.CorpusIndex]:
        """Process 0's decision, once every process has read the index dir: its index (every process read the
        same), or none, when process 0 has cleared the directory for the shards (so no process writes a shard
        while another still reads the old files)."""
        assert self.index_dir is not None
        processes.barrier("read")
        if processes.index == 0:
            if embedded is None:
                index_lib.clear_index_dir(self.index_dir)
            processes.post("read", "1" if embedded is not None else "0")
            return embedded
        if processes.read("read", 0) == "0":
            return None
        if embedded is None:
            raise DataFormatError(f"{self.index_dir / index_lib.MANIFEST}: process 0 read the corpus index there, "
                                  f"process {processes.index} found none: is {self.index_dir} on a file system every "
                                  "process shares?")
        return embedded

    def _corpus_shape(self) -> tuple[int, ...]:
        return (self.target_length, self.dim) if self.model.config.multi_vector else (self.dim,)

    def _encode_corpus(self) -> index_lib.CorpusIndex:
        """The collection encoded (streamed, progress bar), written to `index_dir` when set."""
        dataset = self.corpus.dataset
        out_path = None
        if self.index_dir is not None:
            index_lib.clear_index_dir(self.index_dir)  # the manifest first: the directory is incomplete till saved
            out_path = self.index_dir / index_lib.EMBEDDINGS
        embeddings, seconds = index_lib.encode_corpus(
            texts=lambda: (text for _, text in dataset.collection()), num_documents=len(self.corpus),
            encode=lambda texts: self.encode(texts, side=DOCUMENT), shape=self._corpus_shape(), out_path=out_path,
            show_progress=self.show_progress)
        shard = self._shard_record(index=0, count=1, rows=(0, len(self.corpus)), seconds=seconds,
                                   encoded=len(embeddings), truncated=self.truncated[DOCUMENT])
        manifest = dict(self._manifest(), encoding=self._encoding([shard]), shards=[shard])
        self._log_truncated(self.truncated[DOCUMENT])
        logger.info("encoded %d documents in %.1f s (%.1f documents/s)", len(self.corpus), seconds,
                    len(self.corpus) / max(seconds, 1e-9))
        embedded = index_lib.CorpusIndex(docids=self.corpus.docids, embeddings=embeddings, manifest=manifest)
        return embedded.save(self.index_dir) if self.index_dir is not None else embedded

    def _encode_shards(self, processes: index_lib.JobProcesses) -> index_lib.CorpusIndex:
        """This process's rows of the collection encoded on its devices into its shard file of `index_dir` (which
        process 0 has cleared); process 0 writes the docids and the manifest once every process has written its
        shard; then every process reads the whole index from the shards."""
        assert self.index_dir is not None
        dataset = self.corpus.dataset
        first, stop = shard_rows(len(self.corpus), shard_index=processes.index, num_shards=processes.count)
        placement = self._process_placement()
        truncated, encoded = self.truncated[DOCUMENT], [0]

        def encode(texts: list[str]) -> np.ndarray:
            encoded[0] += len(texts)  # the documents this process encoded, as the manifest reports them
            return self.encode(texts, side=DOCUMENT, placement=placement)

        _, seconds = index_lib.encode_corpus(
            texts=lambda: (text for _, text in dataset.collection(rows=(first, stop))),
            num_documents=stop - first, encode=encode, shape=self._corpus_shape(),
            out_path=self.index_dir / index_lib.shard_file(processes.index, processes.count),
            show_progress=self.show_progress)
        shard = self._shard_record(index=processes.index, count=processes.count, rows=(first, stop), seconds=seconds,
                                   encoded=encoded[0], truncated=self.truncated[DOCUMENT] - truncated)
        logger.info("process %d of %d encoded rows [%d, %d) of %d documents in %.1f s (%.1f documents/s) into %s",
                    processes.index, processes.count, first, stop, len(self.corpus), seconds,
                    shard["documents_per_second"], self.index_dir / shard["file"])
        processes.post("shard", json.dumps(shard))
        processes.barrier("encoded")
        if processes.index == 0:
            shards = [json.loads(processes.read("shard", process)) for process in range(processes.count)]
            index_lib.load_shards(self.index_dir, shards=shards, documents=len(self.corpus))  # every shard complete
            self._log_truncated(sum(shard["documents_truncated"] for shard in shards))
            manifest = dict(self._manifest(), encoding=self._encoding(shards), shards=shards)
            index_lib.save_manifest(self.index_dir, docids=self.corpus.docids, manifest=manifest)
        processes.barrier("saved")
        if processes.index == 0:
            processes.forget("shard")
            processes.forget("read")
        return index_lib.CorpusIndex.load(self.index_dir, expect=self._expect)

    @staticmethod
    def _shard_record(*, index: int, count: int, rows: tuple[int, int], seconds: float, encoded: int,
                      truncated: int) -> dict:
        """What the manifest says of one process's shard: its file and rows, the documents the process encoded,
        how fast, and how many were cut to target_length."""
        return {"file": index_lib.shard_file(index, count), "rows": list(rows), "process": index,
                "documents": encoded, "seconds": round(seconds, 3),
                "documents_per_second": encoded / max(seconds, 1e-9), "documents_truncated": truncated}

    @staticmethod
    def _encoding(shards: Sequence[dict]) -> dict:
        """The manifest's encoding: the slowest process's seconds (they encode at once), the collection's
        documents/s over them, the documents cut to target_length, the processes."""
        seconds = max(shard["documents"] / shard["documents_per_second"] if shard["documents"] else 0.0
                      for shard in shards)  # unrounded
        documents = sum(shard["documents"] for shard in shards)
        return {"seconds": round(seconds, 3), "documents_per_second": documents / max(seconds, 1e-9),
                "documents_truncated": sum(shard["documents_truncated"] for shard in shards),
                "processes": len(shards)}

    def _log_truncated(self, truncated: int) -> None:
        if truncated:
            logger.warning("%d of the %d documents are longer than target_length=%d tokens and were cut to it",
                           truncated, len(self.corpus), self.target_length)

    # --- Retrieval ---

    def rank(self, queries: Sequence[str], *, k: int) -> Ranking:
        if k < 1:
            raise ValueError(f"k must be positive, got {k}")
        corpus_index = self.index()
        self.compile_seconds = 0.0
        start = time.perf_counter()
        ids: list[list[str]] = []
        scores: list[list[float]] = []
        full, top_k = [], []
        temperature = self.model.config.temperature
        bar = tqdm.tqdm(total=len(queries), desc="ranking", unit="query", leave=False, disable=not self.show_progress)
        for lo in range(0, len(queries), 4096):
            vectors = self.encode(queries[lo:lo + 4096], side=QUERY)
            found, rows = corpus_index.search(vectors, k=k)
            if self.probabilities:
                log_z = corpus_index.log_partition(vectors, temperature=temperature)
            for i, (query_scores, query_rows) in enumerate(zip(found, rows)):
                keep = query_rows >= 0
                ids.append(corpus_index.docid_strings(query_rows[keep]))
                scores.append(query_scores[keep].astype(float).tolist())
                if self.probabilities and keep.any():
                    logits = query_scores[keep].astype(np.float64) / temperature
                    top_log_z = np.logaddexp.reduce(logits)
                    # Z sums every document, these k included: a log Z below theirs is float32 rounding (the
                    # corpus pass and the index round the same scores apart), which would put p above 1.
                    full.append(float(np.exp(logits[0] - max(log_z[i], top_log_z))))
                    top_k.append(float(np.exp(logits[0] - top_log_z)))
                elif self.probabilities:
                    full.append(float("nan"))
                    top_k.append(float("nan"))
            bar.update(len(vectors))
        bar.close()
        probabilities = {"full_softmax": full, "top_k_softmax": top_k} if self.probabilities else {}
        if self.truncated[QUERY]:
            logger.warning("%d of the %d queries are longer than input_length=%d tokens and were cut to it",
                           self.truncated[QUERY], len(queries), self.input_length)
            self.truncated[QUERY] = 0
        return Ranking(ids=ids, scores=scores, seconds=time.perf_counter() - start - self.compile_seconds,
                       compile_seconds=self.compile_seconds, top1_probability=probabilities)


class DocumentEncoder:
    """A dense retriever's document side as a `gr_jax.encoders.Encoder` (texts -> float32[n, dim])."""

    def __init__(self, retriever: DenseRetriever):
        if retriever.model.config.multi_vector:
            raise ValueError("a multi-vector encoder gives one vector per token, not one per document")
        self.retriever = retriever
        self.dim = retriever.dim

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        return self.retriever.encode(texts, side=DOCUMENT)
