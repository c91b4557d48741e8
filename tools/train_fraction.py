"""Data dirs with a fraction of another's training queries, for data-size scaling laws (docs/scaling.md).

    python -m gr_jax.tools.train_fraction --data_dir data/wordnet_nouns --fractions 0.2,0.4,0.6,0.8 [--seed 0]
        [--out_dir DIR ...]

For each fraction f, writes `{data_dir}_q{100 f}` (or the matching `--out_dir`): the first round(f n) of the n
training queries in one seeded permutation, so the sets are nested (the 20% queries are among the 40% ones), with
their judgements (`queries.train.tsv`, `qrels.train.tsv`); every other file of the data dir (the collection, the
other splits, spm.model, docid tables) is linked, not copied, so every fraction has the same documents, docids,
vocabulary and evaluation queries. Prints one JSON line with each fraction's counts (queries, judged pairs), also
written as `train_fraction.json` in each dir.
"""
from __future__ import annotations

import argparse
import json
import pathlib
from collections.abc import Sequence
from typing import Optional

import numpy as np

from gr_jax.data.training_view import view_source, write_view
from gr_jax.entry_point import run_tool


def fraction_dir_name(data_dir: str, fraction: float) -> str:
    return f"{str(data_dir).rstrip('/')}_q{round(100 * fraction):d}"


def write_fraction(*, data_dir: str, out_dir: str, fraction: float, seed: int = 0) -> dict:
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"a fraction must be in (0, 1], got {fraction}")
    dataset = view_source(data_dir=data_dir, out_dir=out_dir, tool="train_fraction")
    queries = list(dataset.queries("train"))
    order = np.random.default_rng(seed).permutation(len(queries))
    kept = sorted(order[:int(round(fraction * len(queries)))].tolist())
    qrels = dataset.qrels("train")
    chosen = [queries[i] for i in kept]
    judged = [(qid, docid, rel) for qid, _ in chosen for docid, rel in qrels.get(qid, {}).items()]
    write_view(dataset=dataset, out_dir=out_dir, queries=chosen, judgements=judged, own_files=("train_fraction.json",))
    out = pathlib.Path(out_dir)
    summary = {"data_dir": str(data_dir), "out_dir": str(out_dir), "fraction": fraction, "seed": seed,
               "train_queries": len(chosen), "of_train_queries": len(queries), "train_judgements": len(judged)}
    (out / "train_fraction.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.train_fraction",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--fractions", required=True, help="comma-separated, each in (0, 1]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out_dir", action="append", default=None,
                        help="one per fraction, in order (default: {data_dir}_q{100 f})")
    args = parser.parse_args(argv)
    try:
        fractions = [float(f) for f in args.fractions.split(",") if f.strip()]
    except ValueError:
        parser.error(f"--fractions {args.fractions!r}: comma-separated numbers")
    out_dirs = args.out_dir or [fraction_dir_name(args.data_dir, f) for f in fractions]
    if len(out_dirs) != len(fractions):
        parser.error(f"{len(fractions)} fractions but {len(out_dirs)} --out_dir")

    return run_tool(lambda: {"fractions": [write_fraction(data_dir=args.data_dir, out_dir=o, fraction=f,
                                                          seed=args.seed) for f, o in zip(fractions, out_dirs)]})


if __name__ == "__main__":
    main()
