"""GDR query latency against pure generative and pure dense retrieval, in one process, at N random documents.

python -m gr_jax.tools.bench.gdr [--num_documents 1000000 --dim 256 --branching 32,32 --model tiny --batch 16
                                  --k 10 --beams 10 --repeats 5 --vocab path/to/spm.model]

Three retrievers answer the same batches of random 32-token queries, each returning its top `--k` documents:
  * GR: a random-init T5.1.1 (`--model` size gin, its vocabulary `--vocab` as `tools.bench.decode` loads it)
    decodes `k` beams through the trie of N MS MARCO-style naive docids (pids 0..N-1), and the beams are mapped to
    documents on the device (`GenerativeRetriever`'s computation);
  * DR: the same size's T5.1.1 encoder as a dual encoder's query tower (mean pool, unit vectors of width `dim` =
    the model's), then exact inner-product search (faiss Flat) over N random unit vectors;
  * GDR: the same T5.1.1 as a GDR model recalls `--beams` clusters through the trie of the cluster ids
    (`--branching`; documents assigned to clusters uniformly at random: random vectors have no cluster structure,
    and only the lists' sizes matter to the latency), computes r_q, and the clustered index ranks the documents
    of the recalled clusters (`ClusteredIndex.search`, one faiss call per beam rank).
Each is compiled and run once first, then the three are timed alternately `--repeats` times (so the machine's
drifting speed affects them alike); one JSON line: medians in ms per query, GDR / GR and GDR / DR ratios, build
seconds. Random weights decode like trained ones (the beam search runs its fixed number of steps).

Measured on the 2-core dev host: see docs/gdr.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax.core import meta

from gr_jax.docids import DocidSpace
from gr_jax.docids.trie import Trie
from gr_jax.gdr.clusters import ClusterIds, cluster_id_table, leaf_centroids
from gr_jax.gdr.index import ClusteredIndex
from gr_jax.gdr.model import GdrModel
from gr_jax.models import EncoderDecoderModel
from gr_jax.tools.bench.decode import digit_tokens, load_vocabulary, model_config, pid_docid_table
from gr_jax.vocabulary import EOS_ID


def _median_ms_per_query(seconds: Sequence[float], batch: int) -> float:
    return 1000.0 * statistics.median(seconds) / batch


def run(*, num_documents: int, dim: Optional[int], branching: Sequence[int], model: str, batch: int, k: int,
        beams: int, repeats: int, query_length: int, vocab: Optional[str], seed: int) -> dict:
    import faiss
    rng = np.random.default_rng(seed)
    processor, _ = load_vocabulary(vocab)
    config = model_config(model, vocab_size=processor.get_piece_size(), dtype="float32")
    width = dim or config.emb_dim
    build: dict[str, float] = {}

    # Documents: random unit vectors, uniformly random clusters.
    start = time.perf_counter()
    vectors = rng.standard_normal((num_documents, width), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    num_clusters = int(np.prod(branching))
    paths = np.stack(np.unravel_index(np.arange(num_clusters), tuple(branching)), axis=1)
    clusters = ClusterIds(branching=tuple(branching), paths=paths,
                          assignment=rng.integers(0, num_clusters, num_documents).astype(np.int32))
    docids = np.char.encode(np.arange(num_documents).astype(str))
    index = ClusteredIndex(base_docids=docids, base_vectors=vectors, clusters=clusters, manifest={},
                           centroids=leaf_centroids(vectors, clusters.assignment, num_clusters=num_clusters))
    _ = index.ivf
    build["clustered_index_s"] = time.perf_counter() - start
    start = time.perf_counter()
    flat = faiss.IndexFlatIP(width)
    flat.add(vectors)
    build["flat_index_s"] = time.perf_counter() - start

    # GR: the trie of N naive docids and a model sized to it.
    start = time.perf_counter()
    table = pid_docid_table(processor, num_docids=num_documents)
    space = DocidSpace.from_table(table, scheme="naive", text_vocab_size=processor.get_piece_size())
    gr_trie = space.trie
    build["gr_trie_s"] = time.perf_counter() - start
    gr_model = EncoderDecoderModel(config=config.with_vocab_size(space.model_vocab_size))
    cluster_space = DocidSpace.from_table(cluster_id_table(clusters, digit_tokens=digit_tokens(processor)),
                                          scheme="gdr_clusters", text_vocab_size=processor.get_piece_size())
    gdr_model = GdrModel(config=config.with_vocab_size(cluster_space.model_vocab_size), document_dim=width)
    init = {name: jax.jit(lambda key, m=m: meta.unbox(m.init(key, input_length=query_length, target_length=8)))
            for name, m in (("gr", gr_model), ("gdr", gdr_model))}
    params = {name: jax.block_until_ready(fn(jax.random.PRNGKey(seed))["params"]) for name, fn in init.items()}

    @jax.jit
    def gr_search(p, tokens, trie: Trie):
        result = gr_model.predict_batch(p, tokens, num_beams=k, max_decode_len=table.max_length, trie=trie)
        b, n, length = result.sequences.shape
        return trie.leaf_indices(result.sequences.reshape(b * n, length)).reshape(b, n), result.scores

    @jax.jit
    def gdr_recall(p, tokens, trie: Trie):
        result = gdr_model.predict_batch(p, tokens, num_beams=beams, max_decode_len=cluster_space.table.max_length,
                                         trie=trie)
        b, n, length = result.sequences.shape
        rows = trie.leaf_indices(result.sequences.reshape(b * n, length)).reshape(b, n)
        return rows, result.scores, gdr_model.query_vectors(p, tokens)

    @jax.jit
    def dr_encode(p, tokens):  # the GDR network's encoder and r_q are a dual encoder's query tower of this size
        return gdr_model.query_vectors(p, tokens)

    def gr(tokens):
        rows, _ = jax.device_get(gr_search(params["gr"], tokens, gr_trie))
        return rows

    def dr(tokens):
        return flat.search(np.asarray(dr_encode(params["gdr"], tokens)), k)[1]

    def gdr(tokens):
        found, log_probs, query = jax.device_get(gdr_recall(params["gdr"], tokens, cluster_space.trie))
        return index.search(query, clusters=np.where(np.isfinite(log_probs), found, -1),
                            cluster_log_probs=np.nan_to_num(log_probs), k=k, temperature=0.05,
                            cluster_weight=1.0)[1]

    systems = {"gr": gr, "dr": dr, "gdr": gdr}
    queries = rng.integers(3, processor.get_piece_size(), (repeats + 1, batch, query_length), dtype=np.int32)
    queries[..., -1] = EOS_ID
    first, results = {}, {}
    for name, fn in systems.items():
        start = time.perf_counter()
        results[name] = np.asarray(fn(jnp.asarray(queries[0])))
        first[name] = time.perf_counter() - start
    # What is timed is a ranking: k documents per query, DR's the exact top-k of its query vector.
    for name, rows in results.items():
        if rows.shape != (batch, k) or (rows < 0).any() or (rows >= num_documents).any():
            raise AssertionError(f"{name} returned rows of shape {rows.shape} outside [0, {num_documents})")
    query = np.asarray(dr_encode(params["gdr"], jnp.asarray(queries[0, :1])))[0]
    if set(results["dr"][0].tolist()) != set(np.argsort(-(vectors @ query))[:k].tolist()):
        raise AssertionError("DR's top-k is not the exact top-k")
    times: dict[str, list[float]] = {name: [] for name in systems}
    for repeat in range(1, repeats + 1):
        tokens = jnp.asarray(queries[repeat])
        for name, fn in systems.items():
            start = time.perf_counter()
            fn(tokens)
            times[name].append(time.perf_counter() - start)
    ms = {name: _median_ms_per_query(values, batch) for name, values in times.items()}
    sizes = clusters.sizes()
    return {"bench": "gdr", "num_documents": num_documents, "dim": width, "model": model,
            "branching": list(branching), "clusters": num_clusters, "mean_cluster_size": float(sizes.mean()),
            "batch": batch, "k": k, "gdr_beams": beams, "gr_beams": k, "repeats": repeats,
            **{f"{name}_ms_per_query": round(value, 3) for name, value in ms.items()},
            "gdr_over_gr": round(ms["gdr"] / ms["gr"], 4), "gdr_over_dr": round(ms["gdr"] / ms["dr"], 4),
            "first_call_s": {name: round(value, 3) for name, value in first.items()},
            "build_s": {name: round(value, 3) for name, value in build.items()},
            "backend": jax.default_backend()}


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.bench.gdr", description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_documents", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=None, help="document vector width (default: the model's)")
    parser.add_argument("--branching", default="32,32", help="clusters per level")
    parser.add_argument("--model", default="tiny", choices=("tiny", "small", "base", "large"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--k", type=int, default=10, help="documents per query (GR decodes this many beams)")
    parser.add_argument("--beams", type=int, default=10, help="clusters GDR recalls")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--query_length", type=int, default=32)
    parser.add_argument("--vocab", default=None, help="a SentencePiece model (default: as tools.bench.decode)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    line = run(num_documents=args.num_documents, dim=args.dim,
               branching=[int(b) for b in args.branching.split(",")], model=args.model, batch=args.batch, k=args.k,
               beams=args.beams, repeats=args.repeats, query_length=args.query_length, vocab=args.vocab,
               seed=args.seed)
    print(json.dumps(line), flush=True)
    return line


if __name__ == "__main__":
    main()
