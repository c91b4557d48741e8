"""Builds a GDR clustered index from a dense run's corpus index, or adds new documents to one without training.

    python -m gr_jax.tools.gdr_index build --index_dir DENSE_RUN/index/STEP --branching 16,8 --out_dir DIR
        [--cluster_index_dir OTHER_RUN/index/STEP] [--cluster_groups groups.tsv] [--seed 0] [--niter 20]
    python -m gr_jax.tools.gdr_index add --gdr_index DIR --documents new.tsv [--out_dir DIR2] [--batch_size 64]

`build`: the documents of `--index_dir` (a dense run's encoded collection, `gr_jax.tools.dense_index`) are the
ones GDR ranks, by those vectors. Their clusters are fixed-depth hierarchical k-means (`--branching`: clusters per
level; at most their product, whatever the corpus size) over the same vectors, or over `--cluster_index_dir`'s
(another encoder of the same documents, e.g. zero-shot MiniLM: the paper's "-bert" cluster ids).
`--cluster_groups` (`docid \\t label` for every document, e.g. WordNet's lexicographer file) makes the labels the
first level, in sorted order, and `--branching` the k-means levels below it. Prints one JSON line: documents,
clusters, their sizes, seconds.

`add`: each document of `--documents` (the collection layout, `docid \\t text`) is encoded by the dense run that
encoded the index (named in its manifest, rebuilt from its config.gin at the same step) and put in the cluster of
its nearest centroid; the index is written to `--out_dir` (default: in place). A document already in the index, or
given twice, and an encoder that is not the index's are errors, and nothing is written. Prints one JSON line:
documents added, their clusters, encoding documents/s.
"""
from __future__ import annotations

import argparse
import pathlib
import time
from collections.abc import Sequence
from typing import Optional

import numpy as np

from gr_jax.entry_point import run_tool


def parse_branching(text: str) -> tuple[int, ...]:
    try:
        branching = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--branching takes comma-separated integers, got {text!r}") from None
    if not branching or min(branching) < 2:
        raise argparse.ArgumentTypeError(f"--branching needs every level >= 2, got {text!r}")
    return branching


def _size_summary(sizes: np.ndarray) -> dict:
    return {"min": int(sizes.min()), "median": float(np.median(sizes)), "max": int(sizes.max())}


def read_groups(path: str, *, docids: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """(int32[N]: the group of each of `docids` bytes[N], the labels in sorted order): every docid needs a line of
    `path`, and a line of a document the index does not hold is an error naming it."""
    from gr_jax.data.readers import DataFormatError, read_document_labels
    from gr_jax.data.string_arrays import SortedKeys
    pairs = list(read_document_labels(path))
    labelled = np.asarray([docid.encode("utf-8") for docid, _ in pairs], bytes)
    names, group = np.unique(np.asarray([label for _, label in pairs], dtype=object), return_inverse=True)
    rows = SortedKeys.of(labelled).rows_of(docids)
    if (rows < 0).any():
        missing = docids[np.argmax(rows < 0)].decode("utf-8")
        raise DataFormatError(f"{path}: no label for document {missing!r} ({int((rows < 0).sum())} of the index's "
                              f"{len(docids)} documents have none)")
    if len(pairs) != len(docids):
        used = np.zeros(len(pairs), bool)
        used[rows] = True
        line = int(np.argmin(used)) + 1
        raise DataFormatError.at(path, line, f"document {pairs[line - 1][0]!r} is not in the index")
    if len(names) < 2:
        raise DataFormatError(f"{path}: one label ({names[0]!r}) for every document: a first level needs two or more")
    return group[rows].astype(np.int32), [str(name) for name in names]


def build(*, index_dir: str, out_dir: str, branching: Sequence[int], cluster_index_dir: Optional[str] = None,
          cluster_groups: Optional[str] = None, seed: int = 0, niter: int = 20) -> dict:
    from gr_jax.data.readers import DataFormatError
    from gr_jax.dense.index import CorpusIndex, docids_digest
    from gr_jax.gdr.clusters import build_cluster_ids
    from gr_jax.gdr.index import ClusteredIndex
    start = time.perf_counter()
    corpus_index = CorpusIndex.load(index_dir, expect=lambda manifest, path: None)
    source = corpus_index
    if cluster_index_dir is not None:
        source = CorpusIndex.load(cluster_index_dir, expect=lambda manifest, path: None)
        if docids_digest(source.docids) != docids_digest(corpus_index.docids):
            raise DataFormatError(f"{cluster_index_dir}: its documents are not those of {index_dir} (another corpus, "
                                  "or another order): cluster ids must name the same rows")
    if corpus_index.multi_vector or source.multi_vector:
        raise ValueError("GDR clusters and ranks single vectors; a multi-vector (MaxSim) index cannot be used")
    groups, source_groups = None, {}
    if cluster_groups is not None:
        groups, labels = read_groups(cluster_groups, docids=corpus_index.docids)
        branching = (len(labels), *branching)
        source_groups = {"groups": {"file": str(pathlib.Path(cluster_groups).resolve()), "labels": labels}}
    clusters = build_cluster_ids(embeddings=source.embeddings, branching=branching, seed=seed, niter=niter,
                                 groups=groups, show_progress=True)
    clustered = ClusteredIndex.from_corpus_index(
        corpus_index, clusters=clusters,
        clusters_source={"directory": str(source.directory.resolve()), "encoder": source.manifest.get("encoder"),
                         "seed": seed, "niter": niter, **source_groups}).save(out_dir)
    return {"out_dir": out_dir, "documents": len(clustered), "clusters": clusters.num_clusters,
            "branching": list(clusters.branching), "cluster_sizes": _size_summary(clusters.sizes()),
            "seconds": round(time.perf_counter() - start, 3)}


def document_encoder(encoder: dict, *, where: str):
    """The dense run of an index's `encoder` fingerprint, as texts -> vectors; another encoder is an error."""
    from gr_jax.data.readers import DataFormatError
    from gr_jax.dense.experiment import DenseBuilt
    from gr_jax.retrievers.dense import DocumentEncoder
    from gr_jax.retrievers.settings import EvalConfig
    from gr_jax.search import restore_run
    if not encoder.get("model_dir"):
        raise DataFormatError(f"{where}: the index names no document encoder (its manifest has no encoder)")
    built = restore_run(encoder["model_dir"])
    if not isinstance(built, DenseBuilt):
        raise DataFormatError(f"{where}: {encoder['model_dir']} is not a dense run")
    params, step = built.restore_params(int(encoder["step"]))
    fingerprint = built.fingerprint(step)
    if fingerprint["config_sha1"] != encoder.get("config_sha1"):
        raise DataFormatError(f"{where}: {encoder['model_dir']} is now another encoder (config sha1 "
                              f"{fingerprint['config_sha1']}, the index's vectors were made by "
                              f"{encoder.get('config_sha1')}): its vectors would not match the index's")
    return DocumentEncoder(built.retriever(params, settings=EvalConfig(), step=None))


def add(*, gdr_index: str, documents: str, out_dir: Optional[str] = None) -> dict:
    from gr_jax.data.readers import read_collection
    from gr_jax.gdr.index import MANIFEST, ClusteredIndex
    index = ClusteredIndex.load(gdr_index)
    pairs = list(read_collection(documents))
    if not pairs:
        raise ValueError(f"{documents} holds no documents")
    docids = [docid for docid, _ in pairs]
    # Refuse duplicates before the (costly) encoding; `with_documents` checks again.
    index.with_documents(docids=docids, vectors=np.zeros((len(docids), index.dim), np.float32))
    encode = document_encoder(index.encoder, where=f"{gdr_index}/{MANIFEST}")
    start = time.perf_counter()
    vectors = encode([text for _, text in pairs])
    seconds = time.perf_counter() - start
    grown = index.with_documents(docids=docids, vectors=vectors).save(out_dir or gdr_index)
    assigned = grown.clusters.assignment[len(index):]
    return {"out_dir": str(grown.directory), "added": len(docids), "documents": len(grown),
            "clusters_receiving": int(np.unique(assigned).size), "documents_per_second": len(docids) / max(seconds,
                                                                                                            1e-9)}


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.gdr_index", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="cluster a dense corpus index into a GDR clustered index")
    make.add_argument("--index_dir", required=True, help="a dense run's index/{step} dir: the documents' vectors")
    make.add_argument("--out_dir", required=True)
    make.add_argument("--branching", type=parse_branching, required=True, help="clusters per level, e.g. 16,8")
    make.add_argument("--cluster_index_dir", default=None,
                      help="cluster over this index's vectors (same documents) instead of --index_dir's")
    make.add_argument("--cluster_groups", default=None,
                      help="docid \\t label lines: the labels are the first level, --branching the k-means below")
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--niter", type=int, default=20, help="k-means iterations per split")
    grow = commands.add_parser("add", help="add documents to a GDR clustered index, no training")
    grow.add_argument("--gdr_index", required=True, help="a clustered index dir (gdr_index build)")
    grow.add_argument("--documents", required=True, help="docid \\t text lines")
    grow.add_argument("--out_dir", default=None, help="where the grown index goes (default: in place)")
    args = parser.parse_args(argv)
    if args.command == "build":
        return run_tool(lambda: build(index_dir=args.index_dir, out_dir=args.out_dir, branching=args.branching,
                                      cluster_index_dir=args.cluster_index_dir,
                                      cluster_groups=args.cluster_groups, seed=args.seed, niter=args.niter))
    return run_tool(lambda: add(gdr_index=args.gdr_index, documents=args.documents, out_dir=args.out_dir))


if __name__ == "__main__":
    main()
