"""Moves a seeded random set of a data dir's training queries into a `valid` split, for a data dir without one.

    python -m gr_jax.tools.valid_split --data_dir ../shared/data/msmarco_mini --out_dir data/msmarco_mini_v50 \
        --queries 50 [--seed 0]

Model selection and fusion weights are chosen on `valid`, never on the split a result is reported on (docs/
quality.md); MS MARCO-style data dirs ship only `train` and `dev`. The out dir (MS MARCO layout) holds the training
queries and judgements less the chosen ones, which become `queries.valid.tsv` / `qrels.valid.tsv`; the collection
and every other split are symbolic links to the original's files, so a large collection is not copied, and
`spm.model` is copied. Prints one JSON line of counts, also written as `valid_split.json`.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np

from gr_jax.data.readers import open_dataset, write_tsv
from gr_jax.entry_point import run_tool

SPLIT = "valid"
VOCABULARY = "spm.model"


def valid_split(*, data_dir: str, out_dir: str, queries: int, seed: int = 0) -> dict[str, Any]:
    """Writes `out_dir` and returns its counts; refuses a data dir that already has a `valid` split."""
    dataset = open_dataset(data_dir)
    if dataset.layout != "msmarco":
        raise ValueError(f"{data_dir}: valid_split reads and writes the MS MARCO layout only (found {dataset.layout})")
    if SPLIT in dataset.splits():
        raise ValueError(f"{data_dir} already has a {SPLIT!r} split ({dataset.data_dir / 'queries.valid.tsv'})")
    out = pathlib.Path(out_dir)
    if out.resolve() == pathlib.Path(data_dir).resolve():
        raise ValueError("--out_dir must differ from --data_dir (the original is kept)")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out_dir {out} is not empty: valid_split writes a new data dir")
    train = list(dataset.queries("train", setting=None))
    judged = dataset.qrels("train", setting=None)
    candidates = [qid for qid, _ in train if qid in judged]
    if not 0 < queries < len(candidates):
        raise ValueError(f"--queries must be in [1, {len(candidates) - 1}]: {data_dir}'s train split has "
                         f"{len(candidates)} judged queries, got {queries}")
    chosen = {candidates[i] for i in np.random.default_rng(seed).permutation(len(candidates))[:queries]}
    out.mkdir(parents=True, exist_ok=True)
    for name, keep in (("train", lambda qid: qid not in chosen), (SPLIT, lambda qid: qid in chosen)):
        write_tsv(out / f"queries.{name}.tsv", [(qid, text) for qid, text in train if keep(qid)])
        write_tsv(out / f"qrels.{name}.tsv", [(qid, "0", docid, str(rel)) for qid, docs in judged.items() if keep(qid)
                                              for docid, rel in docs.items()])
    source = dataset.data_dir.resolve()
    linked = [dataset.collection_path.name] + [f"{kind}.{split}.tsv" for split in dataset.splits() if split != "train"
                                               for kind in ("queries", "qrels")]
    for name in linked:
        if (source / name).is_file():
            os.symlink(source / name, out / name)
    if (source / VOCABULARY).is_file():  # a copy: writing a new vocabulary here must not replace the original's
        shutil.copy(source / VOCABULARY, out / VOCABULARY)
    summary = {"data_dir": data_dir, "out_dir": out_dir, "seed": seed, "train_queries": len(train) - len(chosen),
               "valid_queries": len(chosen), "linked": sorted(name for name in linked if (out / name).exists())}
    (out / "valid_split.json").write_text(json.dumps(summary, indent=1))
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
