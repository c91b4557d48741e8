"""Fuses two or more systems' TREC runs (`gr_jax.fusion`), its parameters chosen on one split and applied to another.

    python -m gr_jax.tools.fuse --data_dir DIR --select_split valid --split dev --method wsum \
        --system gr runs/gr/run.valid.2000.trec runs/gr/run.dev.2000.trec \
        --system bm25 runs/bm25.valid.trec runs/bm25.dev.trec [--metric mrr@10] [--run_file fused.dev.trec]

Each `--system NAME SELECT_RUN RUN` names one member and its runs on the two splits (`gr_jax.eval` writes
`run.{split}.{step}.trec`, `gr_jax.tools.bm25 --run_file` BM25's). The fusion's parameters (RRF's k, the
interpolation weights) maximise `--metric` on `--select_split`'s qrels; the fused run of `--split` is then scored
once. Prints one JSON line: the chosen fusion, the members' and the fused run's metrics on both splits.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from gr_jax.data.readers import open_dataset
from gr_jax.entry_point import run_tool
from gr_jax.evaluation import read_trec_run, retrieval_metrics, scored_to_ranked, write_trec_run
from gr_jax.fusion import METHODS, NORMS, Fusion


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.fuse", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="dataset directory read by gr_jax.data.readers")
    parser.add_argument("--select_split", default="valid", help="the split the parameters are chosen on")
    parser.add_argument("--split", default="dev", help="the split the chosen fusion is scored on")
    parser.add_argument("--system", nargs=3, action="append", required=True, metavar=("NAME", "SELECT_RUN", "RUN"),
                        help="a member: its name, its TREC run on --select_split, its TREC run on --split")
    parser.add_argument("--method", default="rrf", choices=METHODS)
    parser.add_argument("--norm", default="min-max", choices=[norm for norm in NORMS if norm is not None] + ["none"])
    parser.add_argument("--metric", default="mrr@10", help="ranx's metric name the parameters maximise")
    parser.add_argument("--depth", type=int, default=100, help="documents a fused ranking holds (default: 100)")
    parser.add_argument("--run_file", default=None, help="write the fused TREC run of --split here")
    return parser.parse_args(argv)


def fuse_systems(*, data_dir: str, select_split: str, split: str, systems: Sequence[Sequence[str]], method: str,
                 norm: str | None, metric: str, depth: int, run_file: str | None = None) -> dict[str, Any]:
    """Chooses the fusion on `select_split`, applies it to `split`; the report `main` prints."""
    if select_split == split:
        raise ValueError(f"--select_split and --split are both {split!r}: choose the fusion on another split")
    names = [name for name, _, _ in systems]
    if len(set(names)) != len(names):
        raise ValueError(f"system names repeat: {names}")
    dataset = open_dataset(data_dir)
    for name in (select_split, split):
        dataset.require_split(name, setting="--split")
    qrels = {name: dataset.qrels(name) for name in (select_split, split)}
    runs = {select_split: [read_trec_run(path) for _, path, _ in systems],
            split: [read_trec_run(path) for _, _, path in systems]}
    fusion = Fusion.chosen_on(qrels=qrels[select_split], runs=runs[select_split], method=method, norm=norm,
                              metric=metric)
    report: dict[str, Any] = {"fusion": {"method": fusion.method, "norm": fusion.norm, "params": dict(fusion.params),
                                         "chosen_on": select_split, "metric": metric, "members": names}}
    for name in (select_split, split):
        fused = fusion.fuse(runs[name], depth=depth)
        if name == split and run_file is not None:
            write_trec_run(run_file, fused, tag=f"fused_{fusion.method}")
        report[name] = {
            "fused": retrieval_metrics(run=scored_to_ranked(fused), qrels=qrels[name], depth=depth),
            **{member: retrieval_metrics(run=scored_to_ranked(run), qrels=qrels[name])
               for member, run in zip(names, runs[name])}}
    return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse_args(argv)
    return run_tool(lambda: fuse_systems(
        data_dir=args.data_dir, select_split=args.select_split, split=args.split, systems=args.system,
        method=args.method, norm=None if args.norm == "none" else args.norm, metric=args.metric, depth=args.depth,
        run_file=args.run_file))


if __name__ == "__main__":
    main()
