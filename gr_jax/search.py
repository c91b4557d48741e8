"""Interactive retrieval with a trained model: `gr-jax search --model_dir runs/demo ["query" ...]`.

Rebuilds the run from `model_dir/config.gin`, restores its latest checkpoint, and prints the top-k docids of each
query with their scores (a generative model's log-likelihoods, a dual encoder's S(q, d)) and document texts.
Without query arguments it reads queries from standard input, one per line, and answers each as it arrives with its
latency: decoding (or query encoding) is compiled once, for the first query, and every later query reuses it; a
dual encoder's corpus index is loaded from, or built into, `model_dir/index/{step}`.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Optional

import gin

from gr_jax import entry_point
from gr_jax import gin_utils
from gr_jax.data.readers import DocumentLookup, open_dataset
from gr_jax.family import BuiltRun
from gr_jax.retrievers import Ranking, Retriever
from gr_jax.retrievers.settings import EvalConfig, RetrievalSettings


def restore_run(model_dir: str, *, gin_args: Sequence[str] = ()) -> BuiltRun:
    """The run of `model_dir` (generative or dense: its config's `EXPERIMENT`), rebuilt from its `config.gin` with
    `gin_args` (`--gin.KEY=VALUE`, `--gin_file`)."""
    gin_utils.parse_run_config(model_dir, gin_args=gin_args, missing=f"is {model_dir} a gr_jax training directory?")
    return gin.query_parameter("%EXPERIMENT").scoped_configurable_fn().build()


def restore_retriever(model_dir: str, *, gin_args: Sequence[str] = (), settings: RetrievalSettings,
                      step: Optional[int] = None, show_progress: bool = False) -> tuple[BuiltRun, Retriever]:
    """The run of `model_dir` and its checkpoint (latest, or `step`) as a retriever ranking as `settings` say
    (`gr_jax.retrievers.settings.EvalConfig`: batch_size, ranking depth, and for a generative model num_beams and
    constrained)."""
    built = restore_run(model_dir, gin_args=gin_args)
    params, step = built.restore_params(step)
    return built, built.retriever(params, settings=settings, show_progress=show_progress, step=step)


def print_results(queries: Sequence[str], ranking: Ranking, *, built: BuiltRun, documents: DocumentLookup) -> None:
    """Each query's ranking with its documents' texts (first 100 characters)."""
    for query, ids, scores in zip(queries, ranking.ids, ranking.scores):
        rows = built.collection_rows(ids)
        texts = dict(documents.texts([int(r) for r in rows if r >= 0]))
        print(f"\nquery: {query}")
        for rank, (docid, score) in enumerate(zip(ids, scores), start=1):
            print(f"{rank:3d}. {docid}  {score:8.3f}  {texts.get(docid, '(not a docid of the corpus)')[:100]}")


def answer_stream(lines: Iterable[str], *, retriever: Retriever, built: BuiltRun, documents: DocumentLookup,
                  top_k: int) -> list[float]:
    """Answers one query per non-empty line as it arrives; prints its results and latency; returns the latencies.
    A blank line is answered on stderr (nothing to rank), not ranked."""
    latencies = []
    for number, line in enumerate(lines, start=1):
        query = line.strip()
        if not query:
            print(f"line {number} is blank: nothing to rank", file=sys.stderr, flush=True)
            continue
        start = time.perf_counter()
        ranking = retriever.rank([query], k=top_k)
        latencies.append(time.perf_counter() - start)
        print_results([query], ranking, built=built, documents=documents)
        print(f"latency: {1000 * latencies[-1]:.1f} ms" + (
            f" (compiled decoding: {1000 * ranking.compile_seconds:.0f} ms)" if ranking.compile_seconds else ""),
            flush=True)
    return latencies


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="gr-jax search", description=__doc__)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--top_k", type=int, default=10)
    parser.add_argument("--num_beams", type=int, default=40)
    parser.add_argument("--unconstrained", action="store_true")
    parser.add_argument("queries", nargs="*", help="query texts (default: one per line from standard input)")
    args, rest = parser.parse_known_args(argv)
    blank = [i for i, query in enumerate(args.queries, start=1) if not query.strip()]
    if blank:  # before any work: a blank query would be ranked like any other
        parser.error(f"query {blank[0]} of {len(args.queries)} is empty or blank")
    entry_point.setup()

    def body() -> None:
        settings = EvalConfig(num_beams=args.num_beams, constrained=not args.unconstrained,
                              batch_size=8 if args.queries else 1, ranking_depth=args.top_k)
        built, retriever = restore_retriever(args.model_dir, gin_args=rest, settings=settings)
        documents = DocumentLookup(open_dataset(built.experiment.dataset.data_dir))
        if args.queries:
            print_results(args.queries, retriever.rank(args.queries, k=args.top_k), built=built, documents=documents)
        else:
            answer_stream(sys.stdin, retriever=retriever, built=built, documents=documents, top_k=args.top_k)

    entry_point.run(body)
