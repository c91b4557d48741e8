"""Holds out a fraction of a dataset's documents, for the new-documents experiment (docs/gdr.md, Experiment 3).

    python -m gr_jax.tools.hold_out --data_dir data/wordnet_food_c93 --out_dir data/wordnet_food_c93_h10 \
        --fraction 0.1 [--seed 0] [--split dev --split valid]

Writes an MS MARCO-layout data dir whose collection lacks a seeded random `--fraction` of the documents, which go to
`new_documents.tsv` (the collection layout, what `gr_jax.tools.gdr_index add` reads): a model trained there never
sees them. Training judgements of held-out documents are dropped (`qrels.train.tsv`), so no training query names
them; every other split's queries and judgements are copied unchanged. Each `--split S` is also divided into
`S_new` (queries whose relevant documents are all held out) and `S_seen` (all kept), so the recall of documents
added after training and of documents seen in training are measured apart (a query judging both kinds is in
neither; the summary counts them). `spm.model` is copied when present. Prints one JSON line of counts, also
written as `hold_out.json`.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil
from collections.abc import Sequence
from typing import Optional

import numpy as np

from gr_jax.entry_point import run_tool

NEW_DOCUMENTS = "new_documents.tsv"


def _judgements(qrels: dict[str, dict[str, int]], keep) -> list[tuple[str, str, int]]:
    return [(qid, docid, rel) for qid, judged in qrels.items() for docid, rel in judged.items() if keep(qid, docid)]


def hold_out(*, data_dir: str, out_dir: str, fraction: float, seed: int = 0, splits: Sequence[str] = ("dev",)) -> dict:
    from gr_jax.data.readers import open_dataset, write_qrels, write_tsv
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"--fraction must be in (0, 1), got {fraction}")
    dataset = open_dataset(data_dir)
    if dataset.layout != "msmarco":
        raise ValueError(f"{data_dir}: hold_out writes the MS MARCO layout and reads it only (found {dataset.layout})")
    out = pathlib.Path(out_dir)
    if out.resolve() == pathlib.Path(data_dir).resolve():
        raise ValueError("--out_dir must differ from --data_dir (the original is kept)")
    for split in splits:
        dataset.require_split(split, setting="--split")
    out.mkdir(parents=True, exist_ok=True)
    documents = list(dataset.collection())
    held = np.zeros(len(documents), bool)
    held[np.random.default_rng(seed).permutation(len(documents))[:int(round(fraction * len(documents)))]] = True
    held_ids = {docid for (docid, _), h in zip(documents, held) if h}
    counts = {"documents": len(documents) - len(held_ids), "held_out": len(held_ids)}
    write_tsv(out / "collection.tsv", [(d, t) for (d, t), h in zip(documents, held) if not h])
    write_tsv(out / NEW_DOCUMENTS, [(d, t) for (d, t), h in zip(documents, held) if h])
    for split in dataset.splits():
        write_tsv(out / f"queries.{split}.tsv", dataset.queries(split))
        qrels = dataset.qrels(split)
        if split == "train":
            lines = _judgements(qrels, lambda qid, docid: docid not in held_ids)
            counts["train_judgements_dropped"] = sum(map(len, qrels.values())) - len(lines)
        else:
            lines = _judgements(qrels, lambda qid, docid: True)
        write_qrels(out / f"qrels.{split}.tsv", lines)
    for split in splits:
        qrels = dataset.qrels(split)
        relevant = {qid: {d for d, rel in judged.items() if rel > 0} for qid, judged in qrels.items()}
        kinds = {qid: ("new" if docs <= held_ids else "seen" if not docs & held_ids else "mixed")
                 for qid, docs in relevant.items() if docs}
        for kind in ("new", "seen"):
            wanted = {qid for qid, k in kinds.items() if k == kind}
            write_tsv(out / f"queries.{split}_{kind}.tsv", ((q, t) for q, t in dataset.queries(split) if q in wanted))
            write_qrels(out / f"qrels.{split}_{kind}.tsv", _judgements(qrels, lambda qid, docid: qid in wanted))
            counts[f"{split}_{kind}_queries"] = len(wanted)
        counts[f"{split}_mixed_queries"] = sum(k == "mixed" for k in kinds.values())
    vocabulary = pathlib.Path(data_dir) / "spm.model"
    if vocabulary.is_file():
        shutil.copy(vocabulary, out / "spm.model")
    summary = {"data_dir": data_dir, "out_dir": out_dir, "fraction": fraction, "seed": seed, **counts}
    (out / "hold_out.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.hold_out", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", action="append", default=None, help="divided into {split}_new / {split}_seen "
                        "(repeatable; default: dev)")
    args = parser.parse_args(argv)
    return run_tool(lambda: hold_out(data_dir=args.data_dir, out_dir=args.out_dir, fraction=args.fraction,
                                     seed=args.seed, splits=args.split or ("dev",)))


if __name__ == "__main__":
    main()
