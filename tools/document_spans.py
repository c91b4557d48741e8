"""Pseudo-queries cut from the documents themselves: sentences, or windows of words, of every document.

    python -m gr_jax.tools.document_spans --data_dir data/msmarco_mini_v50 --out spans.tsv [--per_document 1]
        [--min_words 4] [--window_words N] [--seed 0]

The in-domain pseudo-queries `tools/distill` labels with a teacher's top documents (docs/quality.md), where no query
generator exists: for each document, `--per_document` of its sentences (split after `.`, `!` or `?` followed by
white space; sentences of fewer than `--min_words` words are not candidates), or with `--window_words N` that many
windows of N consecutive words, drawn without replacement by a generator seeded with `--seed`. A document with fewer
candidates gives all it has (one with none gives nothing; both are counted). Writes `qid \\t text` lines in
collection order, qid `{docid}.s{i}` for the i-th sentence (`.w{i}` for the window starting at word i), and prints
one JSON line of counts.
"""
from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from gr_jax.data.readers import open_dataset, write_tsv
from gr_jax.entry_point import run_tool

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def candidate_spans(text: str, *, min_words: int, window_words: Optional[int]) -> list[tuple[str, str]]:
    """A document's candidate pseudo-queries as (qid suffix, text): its sentences of at least `min_words` words, or
    every window of `window_words` consecutive words (the whole text when it is shorter than one window)."""
    if window_words is None:
        return [(f"s{i}", sentence) for i, sentence in enumerate(_SENTENCE_END.split(text.strip()))
                if len(sentence.split()) >= min_words]
    words = text.split()
    if len(words) < min_words:
        return []
    return [(f"w{i}", " ".join(words[i:i + window_words])) for i in range(max(1, len(words) - window_words + 1))]


def document_spans(*, data_dir: str, out: str, per_document: int = 1, min_words: int = 4,
                   window_words: Optional[int] = None, seed: int = 0) -> dict[str, Any]:
    """Writes `out` and returns its counts."""
    if per_document < 1:
        raise ValueError(f"--per_document must be >= 1, got {per_document}")
    if min_words < 1:
        raise ValueError(f"--min_words must be >= 1, got {min_words}")
    if window_words is not None and window_words < min_words:
        raise ValueError(f"--window_words ({window_words}) must be >= --min_words ({min_words})")
    rng = np.random.default_rng(seed)
    rows: list[tuple[str, str]] = []
    documents = without_any = with_fewer = 0
    for docid, text in open_dataset(data_dir).collection():
        documents += 1
        candidates = candidate_spans(text, min_words=min_words, window_words=window_words)
        if not candidates:
            without_any += 1
            continue
        if len(candidates) < per_document:
            with_fewer += 1
        chosen = sorted(rng.choice(len(candidates), size=min(per_document, len(candidates)), replace=False))
        rows.extend((f"{docid}.{candidates[i][0]}", candidates[i][1]) for i in chosen)
    write_tsv(out, rows)
    return {"data_dir": data_dir, "out": out, "unit": "sentence" if window_words is None else f"{window_words} words",
            "per_document": per_document, "min_words": min_words, "seed": seed, "documents": documents,
            "pseudo_queries": len(rows), "documents_without_a_span": without_any,
            "documents_with_fewer_spans": with_fewer}


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.document_spans",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="the collection (MS MARCO layout)")
    parser.add_argument("--out", required=True, help="the `qid \\t text` file written")
    parser.add_argument("--per_document", type=int, default=1, help="spans drawn from each document")
    parser.add_argument("--min_words", type=int, default=4, help="shorter sentences are not candidates")
    parser.add_argument("--window_words", type=int, default=None, help="windows of this many words, not sentences")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return run_tool(lambda: document_spans(data_dir=args.data_dir, out=args.out, per_document=args.per_document,
                                           min_words=args.min_words, window_words=args.window_words,
                                           seed=args.seed))


if __name__ == "__main__":
    main()
