"""BM25 (and BM25 + doc2query-T5 expansion) baselines with bm25s.

The study's sparse baselines: Lucene-variant BM25 (bm25s ``method="lucene"``) with the Anserini MS MARCO passage
parameters k1=0.82, b=0.68, English stopwords and the Snowball English stemmer (PyStemmer). On the shared
msmarco_mini dev split this gives MRR@10 0.408. The "BM25 w/ doc2query-T5" row appends each passage's synthetic
queries to its text before indexing (Nogueira & Lin, docTTTTTquery).

    python -m tools.bm25 --data_dir DIR --split dev [--d2q_file FILE] [--run_file OUT] [--k 100]

prints one JSON line with ``gr_jax.evaluation.retrieval_metrics`` and, with ``--run_file``, writes a TREC run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence

import bm25s
import Stemmer

from gr_jax.data.readers import DataFormatError, open_dataset
from gr_jax.data.readers import _lines as read_lines  # (line number, line): splits on \n only, names bad UTF-8
from gr_jax.evaluation import retrieval_metrics, scored_to_ranked, write_trec_run

DEFAULT_K1 = 0.82
DEFAULT_B = 0.68


def _unique_ids(pairs: Iterable[tuple[str, str]], *, what: str) -> tuple[list[str], list[str]]:
    ids: list[str] = []
    texts: list[str] = []
    seen: set[str] = set()
    for identifier, text in pairs:
        if identifier in seen:
            raise ValueError(f"{what} id {identifier!r} occurs twice")
        seen.add(identifier)
        ids.append(identifier)
        texts.append(text)
    return ids, texts


def bm25_run(
    *,
    documents: Iterable[tuple[str, str]],
    queries: Iterable[tuple[str, str]],
    k: int = 100,
    k1: float = DEFAULT_K1,
    b: float = DEFAULT_B,
    expansions: Mapping[str, Sequence[str]] | None = None,
    show_progress: bool = False,
) -> dict[str, list[tuple[str, float]]]:
    """Top-k BM25 ranking ``{qid: [(docid, score), ...]}``, best first, for every query.

    documents: (docid, text) pairs; queries: (qid, text) pairs; expansions: docid -> synthetic queries appended
    (space-separated) to that document's text before indexing. Only documents that share at least one term with
    the query are returned (as in Lucene/Pyserini), so a ranking can be shorter than k, or empty for a query made
    of stopwords/unknown terms. Equal scores are ordered by position in ``documents`` (jax.lax.top_k is stable).
    show_progress: tqdm bars on stderr (worth it for the 8.8M-passage collection).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    docids, texts = _unique_ids(documents, what="document")
    if not docids:
        raise ValueError("the collection is empty")
    if expansions is not None:
        position = {docid: i for i, docid in enumerate(docids)}
        unknown = [docid for docid in expansions if docid not in position]
        if unknown:
            raise ValueError(
                f"expansions name {len(unknown)} docid(s) that are not in the collection, e.g. {unknown[:5]!r}"
            )
        for docid, synthetic_queries in expansions.items():
            if isinstance(synthetic_queries, str):
                raise TypeError(f"expansions[{docid!r}] must be a sequence of queries, not a string")
            if synthetic_queries:
                texts[position[docid]] = " ".join([texts[position[docid]], *synthetic_queries])
    qids, query_texts = _unique_ids(queries, what="query")
    if not qids:
        return {}

    stemmer = Stemmer.Stemmer("english")
    corpus_tokens = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=show_progress)
    del texts
    retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
    retriever.index(corpus_tokens, show_progress=show_progress)
    del corpus_tokens
    query_tokens = bm25s.tokenize(
        query_texts, stopwords="en", stemmer=stemmer, return_ids=False, show_progress=show_progress
    )
    # indices (into docids): int[num_queries, k'], scores: float32[num_queries, k'] with k' = min(k, num_docs).
    indices, scores = retriever.retrieve(
        query_tokens,
        k=min(k, len(docids)),
        backend_selection="jax",
        show_progress=show_progress,
    )
    run: dict[str, list[tuple[str, float]]] = {}
    for qid, doc_indices, doc_scores in zip(qids, indices.tolist(), scores.tolist()):
        run[qid] = [(docids[i], score) for i, score in zip(doc_indices, doc_scores) if score > 0.0]
    return run


def read_d2q_file(path: str | os.PathLike, *, docids_in_order: Sequence[str]) -> dict[str, list[str]]:
    """Synthetic queries per docid from a docTTTTTquery-style file.

    Two layouts are accepted, decided by the first line:
      * ``pid <TAB> query`` lines, any number per pid, in any order (first line has two fields and its first
        field is a docid of the collection);
      * one line per passage, in collection order, holding that passage's queries separated by tabs (line i is
        ``docids_in_order[i]``; an empty line means no queries). The line count must equal the collection size.
    Returns ``{docid: [query, ...]}`` in file order. Errors raise DataFormatError naming path:line.
    """
    known = set(docids_in_order)
    if len(known) != len(docids_in_order):
        raise ValueError("docids_in_order contains a docid twice")
    lines = [line for _, line in read_lines(path)]
    if not lines:
        raise DataFormatError.at(path, 1, "the doc2query file is empty")
    first_fields = lines[0].split("\t")
    pid_layout = len(first_fields) == 2 and first_fields[0] in known

    expansions: dict[str, list[str]] = {}
    if pid_layout:
        for line_number, line in enumerate(lines, start=1):
            fields = line.split("\t")
            if len(fields) != 2:
                raise DataFormatError.at(
                    path, line_number,
                    f"expected 'pid<TAB>query' (the layout of line 1), found {len(fields)} tab-separated fields",
                )
            pid, query = fields
            if pid not in known:
                raise DataFormatError.at(path, line_number, f"pid {pid!r} is not in the collection")
            if not query.strip():
                raise DataFormatError.at(path, line_number, f"empty query for pid {pid!r}")
            expansions.setdefault(pid, []).append(query)
        return expansions

    for line_number, line in enumerate(lines, start=1):
        if line_number > len(docids_in_order):
            raise DataFormatError.at(
                path, line_number,
                f"more lines than the {len(docids_in_order)} passages of the collection (expected one line per "
                "passage in collection order, or 'pid<TAB>query' lines whose first pid is in the collection)",
            )
        queries = line.split("\t") if line else []
        if any(not query.strip() for query in queries):
            raise DataFormatError.at(path, line_number, "empty query between tabs")
        expansions[docids_in_order[line_number - 1]] = queries
    if len(lines) != len(docids_in_order):
        raise DataFormatError.at(
            path, len(lines),
            f"the file ends after {len(lines)} lines but the collection has {len(docids_in_order)} passages "
            "(expected one line per passage, in collection order)",
        )
    return expansions


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.bm25", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="dataset directory read by gr_jax.data.readers")
    parser.add_argument("--split", default="dev", help="query/qrels split to evaluate (default: dev)")
    parser.add_argument("--d2q_file", default=None, help="doc2query-T5 expansions (docTTTTTquery layout)")
    parser.add_argument("--run_file", default=None, help="write the TREC run here")
    parser.add_argument("--k", type=int, default=100, help="depth of the run (default: 100)")
    parser.add_argument("--k1", type=float, default=DEFAULT_K1)
    parser.add_argument("--b", type=float, default=DEFAULT_B)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, float | int]:
    args = _parse_args(argv)
    dataset = open_dataset(args.data_dir)
    expansions = None
    if args.d2q_file is not None:  # A first pass over the collection for its docids only (8.8M ids fit).
        docids_in_order = [docid for docid, _ in dataset.collection()]
        expansions = read_d2q_file(args.d2q_file, docids_in_order=docids_in_order)
    qrels = dataset.qrels(args.split)
    run = bm25_run(
        documents=dataset.collection(),
        queries=dataset.queries(args.split),
        k=args.k,
        k1=args.k1,
        b=args.b,
        expansions=expansions,
        show_progress=sys.stderr.isatty(),
    )
    tag = "bm25_d2q" if expansions is not None else "bm25"
    if args.run_file is not None:
        write_trec_run(args.run_file, run, tag=tag)
    metrics = retrieval_metrics(run=scored_to_ranked(run), qrels=qrels)
    print(json.dumps({"system": tag, "split": args.split, **metrics}), flush=True)
    return metrics


if __name__ == "__main__":
    main()
