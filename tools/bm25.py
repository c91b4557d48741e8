"""BM25 (and BM25 + doc2query-T5 expansion) baselines with bm25s.

The study's sparse baselines: Lucene-variant BM25 (bm25s ``method="lucene"``) with the Anserini MS MARCO passage
parameters k1=0.82, b=0.68, English stopwords and the Snowball English stemmer (PyStemmer). On the shared
msmarco_mini dev split this gives MRR@10 0.408. The "BM25 w/ doc2query-T5" row appends each passage's synthetic
queries to its text before indexing (Nogueira & Lin, docTTTTTquery).

    python -m gr_jax.tools.bm25 --data_dir DIR --split dev [--d2q_file FILE] [--run_file OUT] [--k 100]

prints one JSON line with ``gr_jax.evaluation.retrieval_metrics`` and, with ``--run_file``, writes a TREC run.
Bad input (a duplicate document id, a malformed line) ends with one line naming the file and line.
"""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence

import bm25s
import Stemmer

from gr_jax.data.d2q import read_d2q_file
from gr_jax.data.readers import open_dataset
from gr_jax.entry_point import run_tool
from gr_jax.evaluation import retrieval_metrics, scored_to_ranked, write_trec_run

DEFAULT_K1 = 0.82
DEFAULT_B = 0.68


def _unique_ids(pairs: Iterable[tuple[str, str]], *, what: str) -> tuple[list[str], list[str]]:
    """The ids and texts of `pairs`, checked distinct once all are read: a file reader's own check, which names the
    line and runs when its pass ends (`gr_jax.data.readers.DistinctIds`), speaks first."""
    ids: list[str] = []
    texts: list[str] = []
    for identifier, text in pairs:
        ids.append(identifier)
        texts.append(text)
    seen: set[str] = set()
    for identifier in ids:
        if identifier in seen:
            raise ValueError(f"{what} id {identifier!r} occurs twice")
        seen.add(identifier)
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


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.bm25", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="dataset directory read by gr_jax.data.readers")
    parser.add_argument("--split", default="dev", help="query/qrels split to evaluate (default: dev)")
    parser.add_argument("--d2q_file", default=None, help="doc2query-T5 expansions (docTTTTTquery layout)")
    parser.add_argument("--run_file", default=None, help="write the TREC run here")
    parser.add_argument("--k", type=int, default=100, help="depth of the run (default: 100)")
    parser.add_argument("--k1", type=float, default=DEFAULT_K1)
    parser.add_argument("--b", type=float, default=DEFAULT_B)
    return parser.parse_args(argv)


def evaluate(*, data_dir: str, split: str, d2q_file: str | None = None, run_file: str | None = None, k: int = 100,
             k1: float = DEFAULT_K1, b: float = DEFAULT_B) -> dict[str, float | int]:
    """BM25 (with doc2query expansions when `d2q_file` is given) on `split`: its metrics and, optionally, its run.

    Judgements naming documents that are not in the collection can never be retrieved; they are counted in a
    warning (`RetrievalDataset.check_qrels`), and they count as unretrieved in Recall; so are judged queries the
    queries file lacks, which score 0.
    """
    dataset = open_dataset(data_dir)
    dataset.require_split(split, setting="--split")
    expansions = None
    if d2q_file is not None:  # A first pass over the collection for its docids only (8.8M ids fit).
        docids_in_order = [docid for docid, _ in dataset.collection()]
        expansions = read_d2q_file(d2q_file, docids_in_order=docids_in_order)
    qrels = dataset.qrels(split)
    docids: set[str] = set()

    def documents():
        for docid, text in dataset.collection():
            docids.add(docid)
            yield docid, text

    queries = list(dataset.queries(split))
    run = bm25_run(documents=documents(), queries=queries, k=k, k1=k1, b=b, expansions=expansions,
                   show_progress=sys.stderr.isatty())
    dataset.check_qrels(split, docids=docids, qrels=qrels)
    dataset.check_judged_queries(split, qrels=qrels, qids={qid for qid, _ in queries})
    if run_file is not None:
        write_trec_run(run_file, run, tag=system_name(d2q_file))
    return retrieval_metrics(run=scored_to_ranked(run), qrels=qrels)


def system_name(d2q_file: str | None) -> str:
    return "bm25" if d2q_file is None else "bm25_d2q"


def main(argv: Sequence[str] | None = None) -> dict[str, float | int]:
    """Prints `{"system", "split", **metrics}` as one JSON line; returns the metrics."""
    args = _parse_args(argv)
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs each indexing stage at DEBUG
    return run_tool(lambda: evaluate(data_dir=args.data_dir, split=args.split, d2q_file=args.d2q_file,
                                     run_file=args.run_file, k=args.k, k1=args.k1, b=args.b),
                    report=lambda metrics: {"system": system_name(args.d2q_file), "split": args.split, **metrics})


if __name__ == "__main__":
    main()
