"""Entry point: rank documents for a file of queries and write a TREC run (no qrels needed).

python -m gr_jax.infer --model_dir runs/demo --queries queries.tsv --output run.trec [--num_beams 40] [--top_k 10]
    [--step N]

The model is rebuilt from `model_dir/config.gin` (written by training) with any `--gin.KEY=VALUE` overrides and
restored at its latest checkpoint, or `--step` (one model selection kept in `best/` too); queries are `qid \t text`
lines (MS MARCO layout). Nothing is written into `model_dir` but a dual encoder's corpus index of that step.
"""
from __future__ import annotations

import argparse
import sys

from gr_jax import entry_point
from gr_jax import evaluation
from gr_jax import search
from gr_jax.data.readers import read_queries
from gr_jax.retrievers.settings import EvalConfig


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--queries", required=True, help="qid \\t query lines")
    parser.add_argument("--output", required=True, help="TREC run file to write")
    parser.add_argument("--num_beams", type=int, default=40, help="beams of a generative model's search")
    parser.add_argument("--top_k", type=int, default=None, help="documents per query (default: --num_beams)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--unconstrained", action="store_true", help="decode without the docid trie")
    parser.add_argument("--step", type=int, default=None, help="the checkpoint to rank with (default: the latest)")
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    entry_point.setup()

    def body() -> None:
        queries = list(read_queries(args.queries))
        settings = EvalConfig(num_beams=args.num_beams, constrained=not args.unconstrained,
                              batch_size=args.batch_size, ranking_depth=args.top_k)
        _, retriever = search.restore_retriever(args.model_dir, gin_args=rest, settings=settings, step=args.step,
                                                show_progress=sys.stderr.isatty())
        ranking = retriever.rank([text for _, text in queries], k=settings.depth)
        evaluation.write_trec_run(args.output, ranking.run([qid for qid, _ in queries]), tag="gr_jax")
        print(f"wrote {len(queries)} rankings to {args.output}")

    entry_point.run(body)


if __name__ == "__main__":
    main()
