"""Builds a dataset's semantic (DSI), 2D semantic (NCI) or codebook (RIPOR-style) docid table from
all-MiniLM-L6-v2 embeddings.

    python -m gr_jax.tools.semantic_ids --data_dir DIR [--scheme semantic|semantic2d|codebook|atomic] [--k 10]
                                 [--c 100] [--levels 8 --codes 256 [--shared_codes]] [--seed 0] [--nredo 1]
                                 [--embeddings FILE | --no_embeddings_cache]

Streams the collection through the encoder (batched, progress bar with documents/s) into
`DIR/embeddings.minilm.npy` (reused by later runs while it is newer than the collection: embedding is
the costly step), clusters it (`gr_jax.semantic_ids.build_semantic_ids`), writes `DIR/docids.{scheme}.tsv`
(`DocidTable.save`, the table file that `gr_jax.docids.load_docid_table` reads) and prints one JSON line: the table's
size, the vocabulary size the model needs, timings and the tree's balance diagnostics.
"""
from __future__ import annotations

import argparse
import pathlib
import time
from collections.abc import Sequence

from gr_jax import semantic_ids
from gr_jax.data.readers import open_dataset
from gr_jax.docids import docid_table_path, get_scheme
from gr_jax.docids.schemes.atomic import atomic_docid_table
from gr_jax.encoders import Encoder
from gr_jax.entry_point import run_tool
from gr_jax.vocabulary import load_vocabulary

EMBEDDINGS_FILENAME = "embeddings.minilm.npy"
# The schemes this tool writes: the k-means ones, and atomic ids (also built by any run that needs them).
SCHEMES = ("semantic", "semantic2d", "codebook", "atomic")


def build(*, data_dir: str | pathlib.Path, scheme: str, k: int, c: int, seed: int, nredo: int = 1,
          embeddings_path: str | pathlib.Path | None, batch_size: int, encoder_batch_size: int = 128,
          show_progress: bool = False, encoder: Encoder | None = None, levels: int = 8, codes: int = 256,
          shared_codes: bool = False) -> dict:
    """Builds and writes `data_dir/docids.{scheme}.tsv`; returns the JSON report.

    encoder: any `list[str] -> float32[n, dim]` (default: all-MiniLM-L6-v2 with `encoder_batch_size`).
    k, c, nredo: the hierarchical k-means of the semantic schemes; levels, codes, shared_codes: the residual
    k-means of the codebook scheme (`gr_jax.docids.schemes.codebook`).
    """
    dataset = open_dataset(data_dir)
    vocabulary = load_vocabulary(dataset.data_dir)
    report: dict = {"data_dir": str(dataset.data_dir), "scheme": scheme}
    ids = None
    if scheme == "atomic":
        docids = tuple(docid for docid, _ in dataset.collection())
    else:
        if encoder is None:
            from gr_jax.encoders import load_minilm  # Imports jax: only for the semantic schemes.

            encoder = load_minilm(batch_size=encoder_batch_size)
        embedded = semantic_ids.collection_embeddings(
            dataset=dataset, encoder=encoder, cache_path=embeddings_path, batch_size=batch_size,
            show_progress=show_progress)
        docids = embedded.docids
        start = time.perf_counter()
        if scheme == "codebook":
            from gr_jax.codebook_ids import build_codebook_ids
            ids = build_codebook_ids(embeddings=embedded.embeddings, levels=levels, num_codes=codes, seed=seed,
                                     show_progress=show_progress)
            settings = {"levels": levels, "codes": codes, "shared_codes": shared_codes, "seed": seed}
        else:
            ids = semantic_ids.build_semantic_ids(embeddings=embedded.embeddings, k=k, c=c, seed=seed, nredo=nredo,
                                                  show_progress=show_progress)
            settings = {"k": k, "c": c, "seed": seed, "nredo": nredo}
        report.update(embeddings=str(embeddings_path) if embeddings_path else None,
                      embeddings_cached=embedded.cached, embed_s=round(embedded.seconds, 2),
                      embed_documents_per_s=embedded.documents_per_s and round(embedded.documents_per_s, 1),
                      cluster_s=round(time.perf_counter() - start, 2), **settings)
    if ids is None:
        extended = atomic_docid_table(docids=docids, vocab_size=vocabulary.vocab_size)
    elif scheme == "codebook":
        from gr_jax.docids.schemes.codebook import codebook_docid_table
        extended = codebook_docid_table(docids=docids, ids=ids, vocab_size=vocabulary.vocab_size,
                                        shared_codes=shared_codes)
    else:
        extended = get_scheme(scheme).from_semantic_ids(docids=docids, ids=ids, vocabulary=vocabulary)
    path = docid_table_path(dataset.data_dir, scheme)
    extended.table.save(path)
    report.update(docid_table=str(path), num_docids=len(extended.table), max_length=extended.table.max_length,
                  vocab_size=extended.vocab_size, num_extra_tokens=extended.num_extra_tokens,
                  model_vocab_size=extended.model_vocab_size)
    if ids is not None:
        report["diagnostics"] = ids.stats.to_json()
    return report


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.semantic_ids", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="dataset directory (gr_jax.data.readers) with spm.model")
    parser.add_argument("--scheme", choices=SCHEMES, default="semantic",
                        help="semantic: digit pieces of the vocabulary (DSI); semantic2d: NCI's position-aware "
                             "tokens appended after the vocabulary; codebook: residual k-means codes appended "
                             "after it (RIPOR-style); atomic: one new token per document")
    parser.add_argument("--k", type=int, default=10, help="clusters per level (default: 10)")
    parser.add_argument("--c", type=int, default=100, help="most documents per leaf (default: 100)")
    parser.add_argument("--levels", type=int, default=8, help="codebook: residual k-means levels (default: 8)")
    parser.add_argument("--codes", type=int, default=256, help="codebook: codes per level (default: 256)")
    parser.add_argument("--shared_codes", action="store_true",
                        help="codebook: one set of code tokens for every level (default: tokens per level)")
    parser.add_argument("--seed", type=int, default=0, help="k-means seed (default: 0)")
    parser.add_argument("--nredo", type=int, default=1,
                        help="k-means runs per split, the best kept (default: 1; each run costs the same)")
    parser.add_argument("--embeddings", default=None,
                        help=f"embedding cache (.npy); default: DATA_DIR/{EMBEDDINGS_FILENAME}")
    parser.add_argument("--no_embeddings_cache", action="store_true", help="keep the embeddings in memory only")
    parser.add_argument("--batch_size", type=int, default=4096, help="texts read per encoder call (default: 4096)")
    parser.add_argument("--encoder_batch_size", type=int, default=128,
                        help="texts per jitted forward pass (default: 128)")
    parser.add_argument("--no_progress", action="store_true", help="no progress bars")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    args = _parse_args(argv)
    embeddings_path = None if args.no_embeddings_cache else (
        args.embeddings or pathlib.Path(args.data_dir) / EMBEDDINGS_FILENAME)
    return run_tool(lambda: build(data_dir=args.data_dir, scheme=args.scheme, k=args.k, c=args.c, seed=args.seed,
                                  nredo=args.nredo, embeddings_path=embeddings_path, batch_size=args.batch_size,
                                  encoder_batch_size=args.encoder_batch_size, show_progress=not args.no_progress,
                                  levels=args.levels, codes=args.codes, shared_codes=args.shared_codes))


if __name__ == "__main__":
    main()
