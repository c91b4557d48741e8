"""Distillation data from a retriever: pseudo-queries labeled with a teacher's top documents, added to a data dir's
training queries, so a generative student learns the teacher's mapping for documents no training query names.

    python -m gr_jax.tools.distill --data_dir data/wordnet_food_c93 --teacher_dir runs/dense/minilm_zero_shot \
        --pseudo_queries data/wordnet_plant_animal/queries.train.tsv [--pseudo_queries FILE ...] [--d2q_file FILE] \
        [--labels 1] [--teacher_step N] --out_dir data/wordnet_food_c93_distilled

The teacher is any trained run (`gr_jax.search.restore_retriever`: dense, generative, GDR) over `--data_dir`'s
collection; pseudo-queries are `qid \\t text` files (another set's queries, spans of the documents:
`tools/document_spans`) and doc2query outputs (`--d2q_file`, either layout `gr_jax.data.d2q` reads: a document's j-th
synthetic query becomes `{docid}.q{j}`). Each pseudo-query becomes the training query `pseudo-{qid}` judged relevant to
the teacher's `--labels` top documents (relevance `--labels - rank + 1`: the top one highest, for rank-aware targets).
The out dir gets the original training queries plus these (`queries.train.tsv`, `qrels.train.tsv`); every other file of
`--data_dir` (collection, valid/dev splits, vocabulary, docid tables) is linked. A pseudo-query whose text is one of the
evaluation splits' queries is left out and counted, never trained on. Prints one JSON line (also `distill.json`): the
teacher, the counts, how many distinct documents the labels reach and how many of those no original training query
names.
"""
from __future__ import annotations

import argparse
import json
import pathlib
from collections.abc import Iterator, Sequence
from typing import Any, Optional

from gr_jax.data.d2q import read_d2q_file
from gr_jax.data.readers import read_queries
from gr_jax.data.training_view import view_source, write_view
from gr_jax.entry_point import run_tool

REPORT = "distill.json"
PSEUDO_PREFIX = "pseudo-"


def pseudo_query_rows(*, pseudo_queries: Sequence[str], d2q_files: Sequence[str],
                      docids_in_order: Sequence[str]) -> Iterator[tuple[str, str, str]]:
    """(file, qid, text) of every pseudo-query: the `qid \\t text` files', then each doc2query file's."""
    for path in pseudo_queries:
        yield from ((path, qid, text) for qid, text in read_queries(path))
    for path in d2q_files:
        for docid, queries in read_d2q_file(path, docids_in_order=docids_in_order).items():
            yield from ((path, f"{docid}.q{j}", text) for j, text in enumerate(queries))


def distill(*, data_dir: str, teacher_dir: str, pseudo_queries: Sequence[str], out_dir: str, labels: int = 1,
            d2q_files: Sequence[str] = (), teacher_step: Optional[int] = None,
            batch_size: int = 256) -> dict[str, Any]:
    """Writes the distilled data dir; returns the report."""
    from gr_jax.retrievers.settings import EvalConfig
    from gr_jax.search import restore_retriever

    if labels < 1:
        raise ValueError(f"--labels must be >= 1, got {labels}")
    dataset = view_source(data_dir=data_dir, out_dir=out_dir, tool="distill")
    held_out = {text.strip().lower() for split in dataset.judged_splits() if split != "train"
                for _, text in dataset.queries(split)}
    pseudo: list[tuple[str, str]] = []
    seen: set[str] = set()
    leaked = 0
    collection = {docid: None for docid, _ in dataset.collection()}
    for path, qid, text in pseudo_query_rows(pseudo_queries=pseudo_queries, d2q_files=d2q_files,
                                             docids_in_order=list(collection)):
        if qid in seen:
            raise ValueError(f"{path}: query id {qid!r} occurs twice among the pseudo-queries")
        seen.add(qid)
        if text.strip().lower() in held_out:
            leaked += 1
            continue
        pseudo.append((f"{PSEUDO_PREFIX}{qid}", text))
    if not pseudo:
        raise ValueError(f"no pseudo-queries to label in {[*pseudo_queries, *d2q_files]}")
    train_queries = list(dataset.queries("train", setting=None))
    train_qrels = dataset.qrels("train", setting=None)
    if any(qid.startswith(PSEUDO_PREFIX) for qid, _ in train_queries):
        raise ValueError(f"{data_dir}: its training queries already hold {PSEUDO_PREFIX}* ids (distilled data?)")
    _, teacher = restore_retriever(teacher_dir, settings=EvalConfig(batch_size=batch_size, ranking_depth=labels),
                                   step=teacher_step)
    ranking = teacher.rank([text for _, text in pseudo], k=labels)
    judged: list[tuple[str, str, int]] = []
    labeled: list[tuple[str, str]] = []
    for (qid, text), ids in zip(pseudo, ranking.ids):
        unknown = [docid for docid in ids if docid not in collection]
        if unknown:
            raise ValueError(f"the teacher {teacher_dir} ranks {unknown[0]!r}, not a document of {data_dir}: it "
                             f"retrieves from another collection")
        if ids:
            labeled.append((qid, text))
            judged.extend((qid, docid, labels - rank) for rank, docid in enumerate(ids))
    write_view(dataset=dataset, out_dir=out_dir, queries=[*train_queries, *labeled], own_files=(REPORT,),
               judgements=[*((qid, docid, rel) for qid, docs in train_qrels.items() for docid, rel in docs.items()),
                           *judged])
    named = {docid for docs in train_qrels.values() for docid, rel in docs.items() if rel >= 1}
    reached = {docid for _, docid, _ in judged}
    report = {"data_dir": str(data_dir), "out_dir": str(out_dir), "teacher_dir": str(teacher_dir),
              "teacher_step": teacher_step, "pseudo_queries": list(pseudo_queries), "d2q_files": list(d2q_files),
              "labels": labels, "train_queries": len(train_queries), "pseudo_queries_labeled": len(labeled),
              "pseudo_queries_unranked": len(pseudo) - len(labeled), "left_out_as_eval_queries": leaked,
              "documents_labeled": len(reached), "documents_labeled_without_a_train_query": len(reached - named),
              "documents": len(collection)}
    (pathlib.Path(out_dir) / REPORT).write_text(json.dumps(report, indent=1))
    return report


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.distill", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="the corpus and its training queries (MS MARCO layout)")
    parser.add_argument("--teacher_dir", required=True, help="a trained run over --data_dir's collection")
    parser.add_argument("--teacher_step", type=int, default=None, help="its checkpoint (default: the latest)")
    parser.add_argument("--pseudo_queries", action="append", default=[], help="a `qid \\t text` file")
    parser.add_argument("--d2q_file", action="append", default=[], help="doc2query outputs (gr_jax.data.d2q)")
    parser.add_argument("--labels", type=int, default=1, help="the teacher's top documents each query is judged to")
    parser.add_argument("--batch_size", type=int, default=256, help="queries the teacher ranks at once")
    parser.add_argument("--out_dir", required=True)
    args = parser.parse_args(argv)
    return run_tool(lambda: distill(data_dir=args.data_dir, teacher_dir=args.teacher_dir,
                                    pseudo_queries=args.pseudo_queries, d2q_files=args.d2q_file,
                                    out_dir=args.out_dir, labels=args.labels,
                                    teacher_step=args.teacher_step, batch_size=args.batch_size))


if __name__ == "__main__":
    main()
