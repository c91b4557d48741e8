"""Compares systems' TREC runs on one split: each one's metrics and the paired significance of every pair.

    python -m gr_jax.tools.compare --data_dir DIR --split dev --run gr runs/gr/run.dev.750.trec \
        --run teacher runs/teacher/run.dev.400.trec [--metric MRR@10] [--test fisher] [--permutations 10000]

Prints one JSON line: `metrics` (`retrieval_metrics` of each run) and `p_values` (`{a: {b: p}}`, two-sided, on
`--metric`; `gr_jax.significance`): whether a margin between two systems is more than the split's noise.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from gr_jax.data.readers import open_dataset
from gr_jax.entry_point import run_tool
from gr_jax.evaluation import read_trec_run, retrieval_metrics
from gr_jax.significance import TESTS, paired_p_values


def compare_runs(*, data_dir: str, split: str, runs: Sequence[Sequence[str]], metric: str, test: str,
                 permutations: int, seed: int) -> dict[str, Any]:
    """The report `main` prints; `runs`: (name, TREC file) pairs."""
    names = [name for name, _ in runs]
    if len(set(names)) != len(names) or len(names) < 2:
        raise ValueError(f"--run needs two or more distinct names, got {names}")
    dataset = open_dataset(data_dir)
    dataset.require_split(split, setting="--split")
    qrels = dataset.qrels(split)
    read = {name: read_trec_run(path) for name, path in runs}
    return {"split": split, "metric": metric, "test": test, "permutations": permutations, "seed": seed,
            "metrics": {name: retrieval_metrics(run=run, qrels=qrels) for name, run in read.items()},
            "p_values": paired_p_values(qrels=qrels, runs=read, metric=metric, test=test, permutations=permutations,
                                        seed=seed)}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="dataset directory read by gr_jax.data.readers")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--run", nargs=2, action="append", required=True, metavar=("NAME", "TREC_RUN"))
    parser.add_argument("--metric", default="MRR@10", help="a retrieval_metrics name: MRR@10, nDCG@10, Recall@K")
    parser.add_argument("--test", default="fisher", choices=TESTS)
    parser.add_argument("--permutations", type=int, default=10_000, help="Fisher's randomisation test's resamples")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return run_tool(lambda: compare_runs(data_dir=args.data_dir, split=args.split, runs=args.run, metric=args.metric,
                                         test=args.test, permutations=args.permutations, seed=args.seed))


if __name__ == "__main__":
    main()
