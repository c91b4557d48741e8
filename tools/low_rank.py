"""Reports the low-rank experiment of docs/dense.md: Recall@|set| of dual encoders of dimension r and of a generative
model on a pairs corpus (`gr_jax.tools.synthetic pairs`), against the relevance matrix's spectral tail (Eq. 14).

    python -m gr_jax.tools.low_rank --data_dir data/pairs46 --dense r2=runs/dense/lowrank/dr_r2 ... \\
        --generative runs/dense/lowrank/gr --out runs/dense/lowrank/low_rank.png

Each run dir's latest dev TREC run (`run.dev.{step}.trec`, written by the run's final evaluation) is scored at
Recall@k with k the number of relevant documents per query (2 for pairs). Prints one JSON line and writes the plot:
Recall@k against r for the dual encoders, the free-embedding ceiling of dimension r (`free_embedding_recall`: the
best rank-r scores gradient descent finds with no tower: an estimate of what any tower of dimension r can reach), the
generative model as a line, and 1 - tail(r), the share of the relevance matrix's squared Frobenius norm a rank-r
matrix can hold.
"""
from __future__ import annotations

import argparse
import pathlib
from collections.abc import Sequence
from typing import Optional

import numpy as np

from gr_jax.entry_point import run_tool
from gr_jax.run_dir import RunDir


def latest_run(model_dir: str, split: str) -> pathlib.Path:
    runs = RunDir.of(model_dir).trec_runs(split)
    if not runs:
        raise FileNotFoundError(f"{model_dir} has no run.{split}.*.trec: train (and evaluate) it first")
    return list(runs.values())[-1]


def report(*, data_dir: str, dense: dict[int, str], generative: Optional[str], split: str,
           out: Optional[str], free_embedding_steps: int = 2000) -> dict:
    from gr_jax.data.readers import open_dataset
    from gr_jax.dense.spectral import free_embedding_recall, relevance_matrix, spectral_tail
    from gr_jax.evaluation import read_trec_run, retrieval_metrics, scored_to_ranked
    data = open_dataset(data_dir)
    qrels = data.qrels(split)
    k = max(sum(r >= 1 for r in judged.values()) for judged in qrels.values())
    qids = [qid for qid, _ in data.queries(split)]
    matrix = relevance_matrix(qrels=qrels, qids=qids, docids=[d for d, _ in data.collection()])
    tail = spectral_tail(matrix, sorted(dense))

    def recall(model_dir: str) -> float:
        run = scored_to_ranked(read_trec_run(latest_run(model_dir, split)))
        return retrieval_metrics(run=run, qrels=qrels, ks=(k,))[f"Recall@{k}"]

    def free(r: int) -> dict:
        if not free_embedding_steps:
            return {}
        return {"free_embedding_recall": free_embedding_recall(matrix, rank=r, steps=free_embedding_steps)}

    summary = {"data_dir": data_dir, "k": k, "queries": len(qids), "documents": matrix.shape[1],
               "relevance_rank": int(np.linalg.matrix_rank(matrix)),
               "dense": {r: {"recall": recall(d), "spectral_tail": tail[r], **free(r)}
                         for r, d in sorted(dense.items())},
               "generative": recall(generative) if generative else None}
    if out:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        ranks = sorted(dense)
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        ax.plot(ranks, [summary["dense"][r]["recall"] for r in ranks], marker="o", label="dual encoder (dim r)")
        if free_embedding_steps:
            ax.plot(ranks, [summary["dense"][r]["free_embedding_recall"] for r in ranks], marker="s",
                    color="tab:green", label="free embeddings: best rank-r Q D^T found, no tower")
        ax.plot(ranks, [1 - tail[r] for r in ranks], linestyle="--", color="gray",
                label="1 - spectral tail(r) (Eq. 14)")
        if generative:
            ax.axhline(summary["generative"], color="tab:red", label="generative (T5.1.1-tiny)")
        ax.axhline(k / matrix.shape[1], color="black", linewidth=0.5, linestyle=":", label="chance")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ranks, [str(r) for r in ranks])
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("embedding dimension r")
        ax.set_ylabel(f"Recall@{k}")
        ax.set_title(f"{matrix.shape[1]} documents, {len(qids)} queries of {k} relevant each")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out, dpi=120)
        plt.close(fig)
        summary["plot"] = out
    return summary


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.low_rank", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--dense", nargs="+", action="extend", default=[], help="r=MODEL_DIR pairs (repeatable)")
    parser.add_argument("--generative", default=None, help="a generative run's model dir")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--out", default=None, help="PNG to write")
    parser.add_argument("--free_embedding_steps", type=int, default=2000,
                        help="Adam steps of the free-embedding ceiling at each r (0: skip)")
    args = parser.parse_args(argv)
    dense = {}
    for item in args.dense:
        r, sep, model_dir = item.partition("=")
        r = r.lstrip("r")
        if not sep or not r.isdigit():
            parser.error(f"--dense takes r=MODEL_DIR (e.g. 8=runs/dr_r8), got {item!r}")
        if int(r) in dense:
            parser.error(f"--dense names r={r} twice")
        dense[int(r)] = model_dir
    return run_tool(lambda: report(data_dir=args.data_dir, dense=dense, generative=args.generative, split=args.split,
                                   out=args.out, free_embedding_steps=args.free_embedding_steps))


if __name__ == "__main__":
    main()
