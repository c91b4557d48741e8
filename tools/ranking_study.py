"""SToICaL's comparison of training losses for generative ranking, with the paper's table baselines (docs/ranking.md).

    python -m gr_jax.tools.ranking_study --data_dir data/hypernyms_mammal_ic --out_dir runs/ranking/mammal_ic \\
        --variants ntp,frac2,trie2,combined2,stepwise --size p2m --steps 800 --input_length 160 --target_length 24 \\
        [--splits dev,train] [--baseline_dims 4,8,16,32] [--baseline_steps 5000] [--baseline_batch 2048]
        [--family decoder_only] [--gin_file F] [--gin.KEY=VALUE]

1. Each variant (`VARIANTS`: its gin files under `gin_configs/ranking/` and bindings) is one `python -m gr_jax.train`
   process on `experiments/study_cpu.gin` + `ranking/ranked_lists.gin` + the family's size gin (`--family t5`:
   `models/t5_1_1/{size}.gin`; `decoder_only`: `decoder_only/experiment.gin` + `decoder_only/{size}.gin`, the
   scaling grid's decoder-only sizes matched to T5's), into `{out_dir}/{variant}/`,
   skipped when its `final_metrics.json` exists (the run ends with its beam-search retrieval metrics on dev, nDCG@10
   with the graded qrels among them).
2. `python -m gr_jax.ranking_eval` per variant and split (cached as the run's `ranking.{split}.{step}.json`): CVR,
   nDCG with log gold gains and the set-overlap R@1..R@5 over each query's gold list and its negative.
3. The lookup-table dual encoder (Eq. 13) and MLP cross encoder (Eq. 14) at each `--baseline_dims` size, trained
   on the training lists with lambda = top-1 and lambda = 1/r^2, scored on the same candidate sets (items are the
   collection's documents; a query is the item named by the first word of its text, the synset name of the
   WordNet hypernym task).
Output: `ranking_study.json` (everything), `ranking_study.md` (one table per split) and `recall_by_k.{split}.png`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import pathlib
import sys
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from gr_jax import entry_point
from gr_jax import gin_utils
from gr_jax.data.readers import open_dataset
from gr_jax.run_dir import RunDir
from gr_jax.tools import run_study

logger = logging.getLogger(__name__)

STUDY_GIN = "experiments/study_cpu.gin"
# name -> (label, gin files after ranking/ranked_lists.gin, bindings)
VARIANTS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "ntp": ("NTP (top-1)", (), ()),
    "frac1": ("1/r^1", ("ranking/fractional.gin",), ("ALPHA = 1.0",)),
    "frac2": ("1/r^2", ("ranking/fractional.gin",), ()),
    "frac3": ("1/r^3", ("ranking/fractional.gin",), ("ALPHA = 3.0",)),
    "stepwise": ("stepwise", ("ranking/stepwise.gin",), ()),
    "trie1": ("trie beta=1", ("ranking/trie.gin",), ("BETA = 1.0",)),
    "trie2": ("trie beta=2", ("ranking/trie.gin",), ()),
    "trie3": ("trie beta=3", ("ranking/trie.gin",), ("BETA = 3.0",)),
    "combined2": ("1/r^2 + trie_r beta=2", ("ranking/combined.gin",), ()),
}
MAX_K = 5


@dataclasses.dataclass
class RankingStudy:
    data_dir: str
    out_dir: pathlib.Path
    variants: Sequence[str]
    size: str
    steps: int
    input_length: int
    target_length: int
    family: str = "t5"
    splits: Sequence[str] = ("dev", "train")
    baseline_dims: Sequence[int] = (4, 8, 16, 32)
    baseline_steps: int = 5000
    baseline_batch: int = 2048
    gin_files: Sequence[str] = ()
    bindings: Sequence[str] = ()
    python: str = sys.executable
    runner: Any = run_study.run_logged

    def train_command(self, variant: str) -> list[str]:
        _, files, bindings = VARIANTS[variant]
        model_dir = self.out_dir / variant
        gins = [STUDY_GIN, "ranking/ranked_lists.gin", *files, *run_study.FAMILIES[self.family].size_gins(self.size),
                *self.gin_files]
        binds = [f"DATA_DIR = {self.data_dir!r}", f"DATASET_NAME = {'rank_' + variant!r}",
                 f"MODEL_DIR = {str(model_dir)!r}", f"TRAIN_STEPS = {self.steps}",
                 f"INPUT_LENGTH = {self.input_length}", f"TARGET_LENGTH = {self.target_length}", *bindings,
                 *self.bindings]
        return ([self.python, "-m", "gr_jax.train"] + [f"--gin_file={g}" for g in gins]
                + [f"--gin_bindings={b}" for b in binds])

    def run_variant(self, variant: str) -> dict[str, Any]:
        run_dir = RunDir.of(self.out_dir / variant)
        final = run_dir.final_metrics
        if not final.is_file():
            if self.runner(self.train_command(variant), self.out_dir / f"{variant}.train.log", None) != 0:
                reason = run_study.failure_reason(self.out_dir / f"{variant}.train.log", 1)
                logger.warning("variant %s failed: %s", variant, reason)
                return {"variant": variant, "status": "failed", "reason": reason}
        result = {"variant": variant, "label": VARIANTS[variant][0], "status": "done",
                  "retrieval": json.loads(final.read_text()), "ranking": {}}
        for split in self.splits:
            cached = sorted(run_dir.path.glob(f"ranking.{split}.*.json"))
            if not cached:
                argv = [self.python, "-m", "gr_jax.ranking_eval", f"--gin_file={run_dir.config}",
                        f"--gin_bindings=RANKING_SPLIT = {split!r}"]
                if self.runner(argv, self.out_dir / f"{variant}.ranking.{split}.log", None) != 0:
                    logger.warning("ranking_eval of %s on %s failed", variant, split)
                    continue
                cached = sorted(run_dir.path.glob(f"ranking.{split}.*.json"))
            result["ranking"][split] = json.loads(cached[-1].read_text())
        return result

    def baselines(self) -> list[dict[str, Any]]:
        from gr_jax.ranking import baselines, evaluation
        from gr_jax.ranking.data import ranked_lists
        from gr_jax.ranking.targets import Fractional, TopOne
        from gr_jax.dense.data import CorpusDocuments
        dataset = open_dataset(self.data_dir)
        items = CorpusDocuments(dataset)  # the table's items: the collection's documents by row

        def item_of(text: str) -> int:
            row = int(items.rows_of([text.split()[0]])[0])
            if row < 0:
                raise ValueError(f"{text.split()[0]!r} is not a document of {dataset.collection_path}: the table "
                                 "baselines need every query to be an item (the hypernym task's query names a synset)")
            return row

        lists = ranked_lists(dataset, split="train")
        texts = dict(dataset.queries("train"))
        triples = {"ntp": TopOne(), "frac2": Fractional(alpha=2.0)}
        out = []
        candidates = {split: evaluation.ranking_candidates(dataset, split=split, table=items)
                      for split in self.splits}
        for weights_name, weights in triples.items():
            queries, documents, lam = [], [], []
            for qid, docids in lists.items():
                rows = items.rows_of(docids)
                n = len(rows)
                queries += [item_of(texts[qid])] * n
                documents += rows.tolist()
                lam += np.asarray(weights(np.arange(1, n + 1), np.full(n, n))).tolist()
            for dim in self.baseline_dims:
                for name, ranker in (("DE", baselines.DualEncoderTable(num_items=len(items), dim=dim)),
                                     ("CE", baselines.CrossEncoderTable(num_items=len(items), dim=dim))):
                    params = baselines.train(ranker, queries=np.asarray(queries), documents=np.asarray(documents),
                                             weights=np.asarray(lam), steps=self.baseline_steps,
                                             batch_size=self.baseline_batch)
                    row = {"baseline": name, "dim": dim, "weights": weights_name, "ranking": {}}
                    for split, cand in candidates.items():
                        query_items = np.asarray([item_of(text) for text in cand.texts])
                        pairs_q = np.broadcast_to(query_items[:, None], cand.rows.shape)
                        scores = np.asarray(ranker.score(params, pairs_q, np.maximum(cand.rows, 0)))
                        row["ranking"][split] = evaluation.ranking_metrics(scores, cand.valid, max_k=MAX_K)
                    logger.info("%s n=%d lambda=%s nDCG: %s", name, dim, weights_name,
                                {split: round(r["ndcg"], 4) for split, r in row["ranking"].items()})
                    out.append(row)
        return out

    def run(self) -> dict[str, Any]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        results = {"data_dir": self.data_dir, "family": self.family, "size": self.size, "steps": self.steps,
                   "eval_split": "dev",
                   "variants": [self.run_variant(v) for v in self.variants]}
        cached = self.out_dir / "baselines.json"
        settings = {"dims": list(self.baseline_dims), "steps": self.baseline_steps, "batch": self.baseline_batch,
                    "splits": list(self.splits)}
        results["baselines"] = []
        if self.baseline_dims:  # none asked for: the cache of another invocation is left as it is
            previous = json.loads(cached.read_text()) if cached.is_file() else None
            if previous is None or previous.get("settings") != settings:
                previous = {"settings": settings, "rows": self.baselines()}
                cached.write_text(json.dumps(previous, indent=1))
            results["baselines"] = previous["rows"]
        (self.out_dir / "ranking_study.json").write_text(json.dumps(results, indent=1))
        (self.out_dir / "ranking_study.md").write_text(report(results, splits=self.splits))
        for split in self.splits:
            plot_recall_by_k(results, split=split, path=self.out_dir / f"recall_by_k.{split}.png")
        return results


def _fmt(value: Optional[float], scale: float = 100.0) -> str:
    return "-" if value is None or value != value else f"{scale * value:.1f}"


def report(results: dict[str, Any], *, splits: Sequence[str]) -> str:
    lines = [f"# Ranking study: {results['data_dir']}, {results['family']} {results['size']}, {results['steps']} "
             "steps", ""]
    for split in splits:
        lines += [f"## {split}", "", "| system | CVR % | nDCG | " + " | ".join(f"R@{k}" for k in range(1, MAX_K + 1))
                  + " | beam nDCG@10 | beam MRR@10 |", "|---" * (MAX_K + 5) + "|"]
        for v in results["variants"]:
            if v["status"] != "done" or split not in v["ranking"]:
                continue
            r, retrieval = v["ranking"][split], v["retrieval"]
            beam = (f"{_fmt(retrieval.get('eval/nDCG@10'))} | {_fmt(retrieval.get('eval/MRR@10'))}"
                    if split == results["eval_split"] else "- | -")
            lines.append(f"| {v['label']} | {_fmt(r['cvr'])} | {_fmt(r['ndcg'])} | "
                         + " | ".join(_fmt(r[f"R@{k}"]) for k in range(1, MAX_K + 1)) + f" | {beam} |")
        for b in results["baselines"]:
            r = b["ranking"][split]
            lines.append(f"| {b['baseline']} n={b['dim']} lambda={b['weights']} | {_fmt(r['cvr'])} | "
                         f"{_fmt(r['ndcg'])} | " + " | ".join(_fmt(r[f"R@{k}"]) for k in range(1, MAX_K + 1))
                         + " | - | - |")
        lines += ["", f"{split}, the candidates ranked by log-likelihood (the sum, as beam search ranks) instead:", "",
                  "| system | CVR % | nDCG | " + " | ".join(f"R@{k}" for k in range(1, MAX_K + 1)) + " |",
                  "|---" * (MAX_K + 3) + "|"]
        for v in results["variants"]:
            r = v.get("ranking", {}).get(split, {}).get("by_log_likelihood")
            if r:
                lines.append(f"| {v['label']} | {_fmt(r['cvr'])} | {_fmt(r['ndcg'])} | "
                             + " | ".join(_fmt(r[f"R@{k}"]) for k in range(1, MAX_K + 1)) + " |")
        lines.append("")
    return "\n".join(lines)


def plot_recall_by_k(results: dict[str, Any], *, split: str, path: pathlib.Path) -> None:
    """R@k by k for every variant and the best baseline of each kind (largest n)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ks = np.arange(1, MAX_K + 1)
    for v in results["variants"]:
        if v["status"] == "done" and split in v["ranking"]:
            ax.plot(ks, [100 * v["ranking"][split][f"R@{k}"] for k in ks], marker="o", label=v["label"])
    if results["baselines"]:
        largest = max(b["dim"] for b in results["baselines"])
        for b in results["baselines"]:
            if b["dim"] == largest:
                ax.plot(ks, [100 * b["ranking"][split][f"R@{k}"] for k in ks], linestyle="--",
                        label=f"{b['baseline']} n={largest} lambda={b['weights']}")
    ax.set_xlabel("k")
    ax.set_ylabel(f"set-overlap R@k (%), {split}")
    ax.set_xticks(ks)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None, *, runner: Any = run_study.run_logged) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.ranking_study",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--variants", default="ntp,frac2,trie2,combined2,stepwise",
                        help=f"comma-separated, of {','.join(VARIANTS)}")
    parser.add_argument("--family", default="t5", choices=sorted(run_study.FAMILIES),
                        help="the generative family: T5.1.1, or the decoder-only network at the matched size")
    parser.add_argument("--size", default="p2m", help="a models/t5_1_1/{size}.gin or decoder_only/{size}.gin name")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--input_length", type=int, default=160)
    parser.add_argument("--target_length", type=int, default=24)
    parser.add_argument("--splits", default="dev,train")
    parser.add_argument("--baseline_dims", default="4,8,16,32", help="empty: no table baselines")
    parser.add_argument("--baseline_steps", type=int, default=5000,
                        help="SGD / AdamW steps of each table baseline "
                             "(the paper: 50k / 20k at batch 2k over 82k items)")
    parser.add_argument("--baseline_batch", type=int, default=2048)
    args, rest = parser.parse_known_args(argv)
    _, gin_files, bindings = gin_utils.parse_args(rest, description=__doc__)
    variants = run_study._split_list(args.variants)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    try:
        dims = [int(d) for d in run_study._split_list(args.baseline_dims)]
    except ValueError:
        parser.error(f"--baseline_dims must be comma-separated integers, got {args.baseline_dims!r}")
    entry_point.setup()
    study = RankingStudy(data_dir=args.data_dir, out_dir=pathlib.Path(args.out_dir), variants=variants,
                         size=args.size, family=args.family, steps=args.steps, input_length=args.input_length,
                         target_length=args.target_length, splits=run_study._split_list(args.splits),
                         baseline_dims=dims, baseline_steps=args.baseline_steps,
                         baseline_batch=args.baseline_batch, gin_files=gin_files,
                         bindings=bindings, runner=runner)
    results = study.run()
    print((study.out_dir / "ranking_study.md").read_text(), flush=True)
    return results


if __name__ == "__main__":
    main()
