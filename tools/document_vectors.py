"""Writes a dense run's document vectors in the collection's order: the columns of the document-vector atomic head
(`gr_jax.heads.document_vectors`, gin DOCUMENT_VECTORS) from a trained dense space instead of zero-shot MiniLM's.

    python -m gr_jax.tools.document_vectors --data_dir DIR --index_dir DENSE_RUN/index/STEP --out FILE.npy

The index is the one a dense run's evaluation writes (`gr_jax.eval`, or `gr_jax.tools.dense_index`); its documents
must be DIR's collection, in order, or nothing is written. Prints one JSON line: the file, its rows and width.
"""
from __future__ import annotations

import argparse
import os
import pathlib
from collections.abc import Sequence

import numpy as np

from gr_jax.data.readers import open_dataset
from gr_jax.entry_point import run_tool
from gr_jax.tools.semantic_ids import index_embeddings


def write(*, data_dir: str, index_dir: str, out: str) -> dict:
    embedded = index_embeddings(dataset=open_dataset(data_dir), index_dir=index_dir)
    vectors = np.ascontiguousarray(embedded.embeddings, np.float32)
    path = pathlib.Path(out)
    partial = path.with_name(path.name + ".partial.npy")
    np.save(partial, vectors)
    os.replace(partial, path)
    return {"out": str(path), "documents": int(vectors.shape[0]), "dim": int(vectors.shape[1]),
            "index_dir": str(index_dir)}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.document_vectors",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="the collection the vectors must follow, in order")
    parser.add_argument("--index_dir", required=True, help="a dense run's corpus index (RUN/index/STEP)")
    parser.add_argument("--out", required=True, help="the .npy to write: float32[documents, dim]")
    args = parser.parse_args(argv)
    return run_tool(lambda: write(data_dir=args.data_dir, index_dir=args.index_dir, out=args.out))


if __name__ == "__main__":
    main()
