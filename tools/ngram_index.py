"""Builds the span index of a data dir for n-gram identifiers (`gr_jax.ngrams.index`).

    python -m gr_jax.tools.ngram_index --data_dir DIR [--width 10] [--vocabulary_path PATH] [--overwrite]

Writes `{data_dir}/ngrams.w{width}.npz` and prints one JSON line: documents, words, distinct windows, tokens per
window, and the size of the trie that constrains decoding to them (states, bytes).
"""
from __future__ import annotations

import argparse
import pathlib
from collections.abc import Sequence
from typing import Optional

import numpy as np

from gr_jax.data.readers import open_dataset
from gr_jax.entry_point import run_tool
from gr_jax.vocabulary import MODEL_FILENAME, load_vocabulary


def build(*, data_dir: str, width: int, vocabulary_path: Optional[str], overwrite: bool) -> dict:
    from gr_jax.docids.trie import Trie
    from gr_jax.ngrams.index import build_span_index, index_path
    out = index_path(data_dir, width=width)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists: pass --overwrite to rebuild it")
    vocabulary = load_vocabulary(vocabulary_path or pathlib.Path(data_dir) / MODEL_FILENAME)
    index = build_span_index(open_dataset(data_dir), vocabulary=vocabulary, width=width)
    index.save(out)
    trie = Trie.build(index.table.tokens, vocab_size=vocabulary.vocab_size)
    lengths = index.table.lengths
    return {"index": str(out), "documents": len(index.docids), "words": int(len(index.window_ids)),
            "distinct_windows": len(index.table), "width": width,
            "tokens_per_window": {"mean": float(np.mean(lengths)), "max": int(lengths.max())},
            "trie_states": int(trie.num_states), "trie_bytes": int(trie.nbytes)}


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.ngram_index", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--width", type=int, default=10, help="words per span (default 10, MINDER's)")
    parser.add_argument("--vocabulary_path", default=None, help="default: {data_dir}/spm.model")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    if args.width < 1:
        parser.error(f"--width must be >= 1, got {args.width}")
    return run_tool(lambda: build(data_dir=args.data_dir, width=args.width, vocabulary_path=args.vocabulary_path,
                                  overwrite=args.overwrite))


if __name__ == "__main__":
    main()
