"""A dual encoder as a retriever: queries encoded in fixed-shape batches, the corpus index searched.

The corpus index (`gr_jax.dense.index.CorpusIndex`) depends on the parameters, so a retriever builds it on first
use: it loads `index_dir` when that holds the index of this corpus and this encoder (its manifest says which: the
collection, the run, step and config, and a checksum of the parameters' values), and otherwise encodes the
collection (streamed, progress bar, documents/s) and, with `index_dir`, writes it there for the next search.
`with_params` gives the same retriever, compiled encoders included, for other parameters and an index not built
yet: a training run's periodic evaluation re-encodes the corpus with each state; its final evaluation keeps the
index in the run dir (`kept_in`), where `gr_jax.eval` of the same checkpoint finds it.

Each ranking also reports the probability of its rank-1 document (for the Brier score, `gr_vs_dense_limitations.txt`
Sec. 4.1), in two forms: `full_softmax`, P~(d | q) = exp(S(q, d) / tau) / Z(q) over the whole corpus (Eq. 8's Z),
and `top_k_softmax`, the softmax of S / tau over the k documents returned.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import pathlib
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from jax.sharding import Mesh

from gr_jax import partitioning
from gr_jax.data.readers import DataFormatError
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

    def _encoder(self, side: str, params: Any, ids: np.ndarray, mask: np.ndarray) -> Callable:
        """The compiled encoder of `side` for batches shaped as `ids` (compiled ahead of time on first use; the
        seconds it took are added to `compile_seconds`)."""
        key = (side, ids.shape)
        if key not in self._encoders:
            start = time.perf_counter()
            sharding = partitioning.batch_sharding(self.mesh)
            self._encoders[key] = jax.jit(functools.partial(self.model.encode, side=side),
                                          in_shardings=(self.param_shardings, sharding, sharding),
                                          out_shardings=partitioning.host_readable_sharding(self.mesh),
                                          ).lower(params, ids, mask).compile()
            self.compile_seconds += time.perf_counter() - start
        return self._encoders[key]

    def encode(self, texts: Sequence[str], *, side: str) -> np.ndarray:
        """float32[len(texts), dim] (multi-vector: [len(texts), length, dim], length = the side's token length)."""
        length = self.input_length if side == QUERY else self.target_length
        tokens = self.tokenizer(list(texts), length=length)
        self.truncated[side] += tokens.truncated
        lengths = tokens.mask.sum(axis=1)
        buckets = (length,) if side == QUERY else self.document_buckets
        order = np.argsort(-lengths, kind="stable")
        shape = (len(texts), *((length,) if self.model.config.multi_vector else ()), self.dim)
        out = np.zeros(shape, np.float32)
        params = jax.device_put(self.params, self.param_shardings)
        with partitioning.partitioning_context(mesh=self.mesh, rules=self.rules):
            for start in range(0, len(order), self.batch_size):
                rows = order[start:start + self.batch_size]
                width = next(b for b in buckets if b >= max(int(lengths[rows].max()), 1))
                ids = np.zeros((self.batch_size, width), np.int32)
                mask = np.zeros((self.batch_size, width), bool)
                ids[:len(rows)] = tokens.ids[rows, :width]
                mask[:len(rows)] = tokens.mask[rows, :width]
                encode = self._encoder(side, params, ids, mask)
                vectors = np.asarray(jax.device_get(encode(params, ids, mask)))[:len(rows)]
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
        `recall_queries`, query vectors)."""
        if self._index is not None:
            return self._index
        embedded = None
        if self.index_dir is not None and (self.index_dir / index_lib.MANIFEST).is_file():
            try:
                embedded = index_lib.CorpusIndex.load(self.index_dir, expect=self._expect)
                logger.info("corpus index of %d documents read from %s", len(embedded), self.index_dir)
            except DataFormatError as e:
                if not self.replace_stale:
                    raise
                logger.warning("%s; encoding the collection again into %s", str(e).partition(": delete")[0],
                               self.index_dir)
        if embedded is None:
            embedded = self._encode_corpus()
        self._index = embedded.with_faiss_index(self.index_config, recall_queries=recall_queries)
        return self._index

    def _encode_corpus(self) -> index_lib.CorpusIndex:
        """The collection encoded (streamed, progress bar), written to `index_dir` when set."""
        dataset = self.corpus.dataset
        shape = (self.target_length, self.dim) if self.model.config.multi_vector else (self.dim,)
        out_path = None
        if self.index_dir is not None:
            index_lib.clear_index_dir(self.index_dir)  # the manifest first: the directory is incomplete till saved
            out_path = self.index_dir / index_lib.EMBEDDINGS
        embeddings, seconds = index_lib.encode_corpus(
            texts=lambda: (text for _, text in dataset.collection()), num_documents=len(self.corpus),
            encode=lambda texts: self.encode(texts, side=DOCUMENT), shape=shape, out_path=out_path,
            show_progress=self.show_progress)
        manifest = dict(self._manifest(), encoding={"seconds": round(seconds, 3),
                                                    "documents_per_second": len(self.corpus) / max(seconds, 1e-9),
                                                    "documents_truncated": self.truncated[DOCUMENT]})
        if self.truncated[DOCUMENT]:
            logger.warning("%d of the %d documents are longer than target_length=%d tokens and were cut to it",
                           self.truncated[DOCUMENT], len(self.corpus), self.target_length)
        logger.info("encoded %d documents in %.1f s (%.1f documents/s)", len(self.corpus), seconds,
                    len(self.corpus) / max(seconds, 1e-9))
        embedded = index_lib.CorpusIndex(docids=self.corpus.docids, embeddings=embeddings, manifest=manifest)
        return embedded.save(self.index_dir) if self.index_dir is not None else embedded

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
