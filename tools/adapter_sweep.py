"""GR against DR under model scaling on one decoder-only backbone: per-layer adapters of each size added to both
(`gr_vs_dense_limitations.txt`, Fig. 3; docs/decoder_only.md).

    python -m gr_jax.tools.adapter_sweep --data_dir data/wordnet_food --out_dir runs/adapter_sweep --size p2m \\
        --adapter_dims 0,128,512,1536 --steps 800 [--split train] [--projection_dim 128] [--gin.KEY=VALUE ...]

The paper attaches randomly initialised adapters of one size to every layer of its GR and its DR backbone (Qwen3
0.6B and Qwen3-Embedding 0.6B), trains them jointly with the backbone, and reads the ranking metrics against the
parameters added: GR rises by about 5%, DR by about 1%. Here both sides are the decoder-only network of
`decoder_only/{size}.gin` (`DecoderOnlyConfig.adapter_dim`: x + W_up silu(W_down RMSNorm(x)) after each layer, so
both get exactly L (2 d a + d) new parameters), each trained from scratch for `--steps` steps:

- GR: `experiments/study_cpu.gin` + `decoder_only/experiment.gin` + the size file, the study's row 2a (the
  documents' own text and the labeled queries) with naive docids, ranked by the trie-constrained beam search.
- DR: `dense/decoder_only.gin` + the size file, last-token pooling into a `--projection_dim` embedding (the
  paper's DR uses 128 dimensions in its scaling experiments; empty: the backbone's width), in-batch negatives.

Each run is one `python -m gr_jax.train` process (resumable, reused when finished with the same settings) that
ends with its retrieval metrics on `--split`; the widths run in the order given, GR and DR at each. Output in
`--out_dir`: `{gr,dr}/a{dim}/` run dirs with their logs, `adapter_sweep.json`, `adapter_sweep.md` (the table, and
each metric's change from no adapters) and `adapter_sweep.png` (metrics by added parameters, when matplotlib is
installed).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import pathlib
import shutil
import sys
from collections.abc import Sequence
from typing import Any, Optional

from gr_jax import entry_point
from gr_jax import gin_utils
from gr_jax.run_dir import write_json
from gr_jax.tools import run_study

logger = logging.getLogger(__name__)

METRICS = ("MRR@10", "Recall@1", "Recall@10", "Recall@100")
# family -> (label, gin files before the size file)
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "gr": ("GR (decoder-only, naive ids, constrained beams)",
           ("experiments/study_cpu.gin", "decoder_only/experiment.gin")),
    "dr": ("DR (decoder-only tower, last-token pooling)", ("dense/decoder_only.gin",)),
}


def added_params(size: str, adapter_dim: int) -> int:
    """The parameters adapters of `adapter_dim` add to `decoder_only/{size}.gin` (the same for GR and DR)."""
    def count(dim: int) -> int:
        return gin_utils.decoder_only_config([f"decoder_only/{size}.gin"], vocab_size=128,
                                             adapter_dim=dim).non_embedding_params()
    return count(adapter_dim) - count(0)


@dataclasses.dataclass
class AdapterSweep:
    data_dir: pathlib.Path
    out_dir: pathlib.Path
    size: str
    adapter_dims: Sequence[int]
    steps: int
    split: str = "train"
    projection_dim: Optional[int] = 128
    families: Sequence[str] = ("gr", "dr")
    gin_files: Sequence[str] = ()
    bindings: Sequence[str] = ()
    runner: run_study.CommandRunner = run_study.run_logged
    python: str = sys.executable

    def settings(self, family: str, adapter_dim: int) -> dict[str, Any]:
        """What a run's result depends on (a finished run with other settings is trained again)."""
        return {"family": family, "size": self.size, "adapter_dim": adapter_dim, "steps": self.steps,
                "split": self.split, "data_dir": str(self.data_dir.resolve()),
                "projection_dim": self.projection_dim if family == "dr" else None,
                "gin_files": list(self.gin_files), "bindings": list(self.bindings)}

    def command(self, family: str, adapter_dim: int, model_dir: pathlib.Path) -> list[str]:
        gin_files = [*FAMILIES[family][1], f"decoder_only/{self.size}.gin", *self.gin_files]
        bindings = [f"DATA_DIR = {str(self.data_dir.resolve())!r}", f"MODEL_DIR = {str(model_dir.resolve())!r}",
                    f"DATASET_NAME = {f'adapters_{family}_{adapter_dim}'!r}", f"TRAIN_STEPS = {self.steps}",
                    f"EVAL_SPLIT = {self.split!r}",
                    f"decoder_only_network.DecoderOnlyConfig.adapter_dim = {adapter_dim}"]
        if family == "dr":
            bindings.append(f"PROJECTION_DIM = {self.projection_dim}")
        return [self.python, "-m", "gr_jax.train", *(f"--gin_file={f}" for f in gin_files),
                *(f"--gin_bindings={b}" for b in [*bindings, *self.bindings])]

    def run_one(self, family: str, adapter_dim: int) -> dict[str, Any]:
        """One run's record (`{model_dir}/sweep.json`): its settings, status and metrics; reused when finished."""
        model_dir = self.out_dir / family / f"a{adapter_dim}"
        record_path = model_dir / "sweep.json"
        settings = self.settings(family, adapter_dim)
        saved = run_study._read_json(record_path)
        if saved and saved.get("status") == "ok" and saved.get("settings") == settings:
            return saved
        if saved and saved.get("settings") != settings and model_dir.is_dir():
            logger.info("%s: settings changed, training afresh", model_dir)
            shutil.rmtree(model_dir)
        model_dir.mkdir(parents=True, exist_ok=True)
        logger.info("%s a=%d: training", family, adapter_dim)
        log = model_dir / "train.log"
        returncode = self.runner(self.command(family, adapter_dim, model_dir), log, None)
        metrics = run_study._final_eval_metrics(model_dir) if returncode == 0 else None
        record = {"settings": settings, "added_params": added_params(self.size, adapter_dim),
                  "status": "ok" if metrics else "failed", "metrics": metrics,
                  "reason": None if metrics else run_study.failure_reason(log, returncode)}
        write_json(record_path, record)
        return record

    def run(self) -> dict[str, Any]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        backbone = gin_utils.decoder_only_config([f"decoder_only/{self.size}.gin"],
                                                 vocab_size=128).non_embedding_params()
        # Width by width, both families at each, so that a sweep stopped part-way has paired GR and DR results.
        done = {(dim, family): self.run_one(family, dim) for dim in self.adapter_dims for family in self.families}
        runs = {family: {dim: done[dim, family] for dim in sorted(self.adapter_dims)} for family in self.families}
        results = {"settings": {"data_dir": str(self.data_dir), "size": self.size, "steps": self.steps,
                                "split": self.split, "projection_dim": self.projection_dim,
                                "adapter_dims": list(self.adapter_dims), "gin_files": list(self.gin_files),
                                "bindings": list(self.bindings)},
                   "backbone_params": backbone,
                   "runs": {family: {str(dim): record for dim, record in by_dim.items()}
                            for family, by_dim in runs.items()}}
        write_json(self.out_dir / "adapter_sweep.json", results)
        (self.out_dir / "adapter_sweep.md").write_text(format_markdown(results))
        plot(results, self.out_dir / "adapter_sweep.png")
        return results


def relative_change(records: dict[str, dict[str, Any]], metric: str) -> dict[str, Optional[float]]:
    """Each adapter size's `metric` relative to the run without adapters ('0'), e.g. 0.05 for +5%."""
    base = (records.get("0") or {}).get("metrics") or {}
    out: dict[str, Optional[float]] = {}
    for dim, record in records.items():
        value = (record.get("metrics") or {}).get(metric)
        out[dim] = None if value is None or not base.get(metric) else value / base[metric] - 1.0
    return out


def format_markdown(results: dict[str, Any]) -> str:
    settings = results["settings"]
    lines = [f"# Adapter sweep: decoder-only {settings['size']} ({results['backbone_params']:,} non-embedding "
             f"parameters), {settings['steps']} steps, split {settings['split']}, DR embedding "
             f"{settings['projection_dim'] or 'the backbone width'}", "",
             "| system | adapter width | added parameters | added / backbone | "
             + " | ".join(METRICS) + " | MRR@10 vs none |",
             "|---|---|---|---|" + "---|" * len(METRICS) + "---|"]
    for family, records in results["runs"].items():
        change = relative_change(records, "MRR@10")
        for dim, record in records.items():
            metrics = record.get("metrics") or {}
            values = " | ".join(f"{metrics[m]:.3f}" if m in metrics else "–" for m in METRICS)
            relative = change[dim]
            delta = "–" if relative is None else f"{100 * relative:+.1f}%"
            status = "" if record["status"] == "ok" else f" ({record['status']}: {record.get('reason')})"
            lines.append(f"| {FAMILIES[family][0]}{status} | {dim} | {record['added_params']:,} | "
                         f"{record['added_params'] / results['backbone_params']:.2f} | {values} | {delta} |")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    figure, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 3.4), squeeze=False)
    for family, records in results["runs"].items():
        done = [r for r in records.values() if r["status"] == "ok"]
        for ax, metric in zip(axes[0], METRICS):
            # A GR run reports no Recall@k deeper than its beams (retrieval_metrics' depth): no point there.
            points = [(r["added_params"], r["metrics"][metric]) for r in done if metric in r["metrics"]]
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=family.upper())
            ax.set_xlabel("added parameters")
            ax.set_title(metric)
    axes[0][0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Optional[Sequence[str]] = None, *, runner: run_study.CommandRunner = run_study.run_logged
         ) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.adapter_sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--size", default="p2m", help="a decoder_only/{size}.gin")
    parser.add_argument("--adapter_dims", default="0,128,512,1536", help="comma-separated widths; 0: no adapters")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--split", default="train", help="the split every run is evaluated on")
    parser.add_argument("--projection_dim", default="128", help="DR's embedding size; empty: the backbone's width")
    parser.add_argument("--families", default="gr,dr")
    args, rest = parser.parse_known_args(argv)
    _, gin_files, bindings = gin_utils.parse_args(rest, description=__doc__)
    if not (gin_utils.GIN_CONFIGS_DIR / "decoder_only" / f"{args.size}.gin").is_file():
        parser.error(f"--size {args.size}: no decoder_only/{args.size}.gin")
    try:
        dims = [int(d) for d in run_study._split_list(args.adapter_dims)]
        projection = int(args.projection_dim) if args.projection_dim.strip() else None
    except ValueError:
        parser.error("--adapter_dims and --projection_dim are integers")
    if not dims or min(dims) < 0 or len(set(dims)) != len(dims):
        parser.error(f"--adapter_dims must be distinct widths >= 0, got {args.adapter_dims}")
    families = run_study._split_list(args.families)
    if not families or any(f not in FAMILIES for f in families):
        parser.error(f"--families: choose from {sorted(FAMILIES)}")
    entry_point.setup()
    sweep = AdapterSweep(data_dir=pathlib.Path(args.data_dir), out_dir=pathlib.Path(args.out_dir), size=args.size,
                         adapter_dims=dims, steps=args.steps, split=args.split, projection_dim=projection,
                         families=families, gin_files=gin_files, bindings=bindings, runner=runner)
    results = sweep.run()
    print((sweep.out_dir / "adapter_sweep.md").read_text(), flush=True)
    return results


if __name__ == "__main__":
    main()
