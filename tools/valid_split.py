"""Moves a seeded random set of a data dir's training queries into a `valid` split, for a data dir without one.

    python -m gr_jax.tools.valid_split --data_dir ../shared/data/msmarco_mini --out_dir data/msmarco_mini_v50 \
        --queries 50 [--seed 0]

Model selection and fusion weights are chosen on `valid`, never on the split a result is reported on (docs/
quality.md); MS MARCO-style data dirs ship only `train` and `dev`. The out dir (MS MARCO layout) holds the training
queries and judgements less the chosen ones, which become `queries.valid.tsv` / `qrels.valid.tsv`; every other
file is a symbolic link to the original's (`gr_jax.data.training_view`, as `tools/distill` and `tools/train_fraction`
make their data dirs), so a large collection is not copied. Prints one JSON line of counts, also written as
`valid_split.json`.
"""
from __future__ import annotations

import argparse
import json
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gr_jax.data.readers import write_qrels, write_tsv
from gr_jax.data.training_view import view_source, write_view
from gr_jax.entry_point import run_tool

SPLIT = "valid"
VALID_FILES = (f"queries.{SPLIT}.tsv", f"qrels.{SPLIT}.tsv")
REPORT = "valid_split.json"


def valid_split(*, data_dir: str, out_dir: str, queries: int, seed: int = 0) -> dict[str, Any]:
    """Writes `out_dir` and returns its counts; refuses a data dir that already has a `valid` split."""
    dataset = view_source(data_dir=data_dir, out_dir=out_dir, tool="valid_split")
    if SPLIT in dataset.splits():
        raise ValueError(f"{data_dir} already has a {SPLIT!r} split ({dataset.data_dir / 'queries.valid.tsv'})")
    out = pathlib.Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out_dir {out} is not empty: valid_split writes a new data dir")
    train = list(dataset.queries("train", setting=None))
    judged = dataset.qrels("train", setting=None)
    candidates = [qid for qid, _ in train if qid in judged]
    if not 0 < queries < len(candidates):
        raise ValueError(f"--queries must be in [1, {len(candidates) - 1}]: {data_dir}'s train split has "
                         f"{len(candidates)} judged queries, got {queries}")
    chosen = {candidates[i] for i in np.random.default_rng(seed).permutation(len(candidates))[:queries]}

    def judgements(keep: Callable[[str], bool]) -> list[tuple[str, str, int]]:
        return [(qid, docid, rel) for qid, docs in judged.items() if keep(qid) for docid, rel in docs.items()]

    write_view(dataset=dataset, out_dir=out, queries=[(q, text) for q, text in train if q not in chosen],
               judgements=judgements(lambda qid: qid not in chosen), own_files=(*VALID_FILES, REPORT))
    write_tsv(out / VALID_FILES[0], [(q, text) for q, text in train if q in chosen])
    write_qrels(out / VALID_FILES[1], judgements(lambda qid: qid in chosen))
    summary = {"data_dir": data_dir, "out_dir": out_dir, "seed": seed, "train_queries": len(train) - len(chosen),
               "valid_queries": len(chosen)}
    (out / REPORT).write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.valid_split", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--queries", type=int, required=True, help="training queries moved to the valid split")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return run_tool(lambda: valid_split(data_dir=args.data_dir, out_dir=args.out_dir, queries=args.queries,
                                        seed=args.seed))


if __name__ == "__main__":
    main()
