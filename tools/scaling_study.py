"""Scaling laws of generative retrieval on a grid of model sizes x training-data fractions (docs/scaling.md).

    python -m gr_jax.tools.scaling_study --data_dir data/wordnet_nouns --out_dir runs/scaling \\
        --sizes p100k,p800k,p2m,tiny,p16m --fractions 0.2,0.4,0.6,0.8,1.0 --steps 1500 --row 2a --scheme naive \\
        [--steps_with_data] [--cgl_negatives 256] [--beams 1,5,10,20,50,100] [--split dev] [--gin_file F] \\
        [--gin.KEY=VALUE ...]

1. Data: one data dir per fraction under `{out_dir}/data/` (`gr_jax.tools.train_fraction`: nested seeded subsets
   of the training queries; the documents, docids and evaluation queries are the same in all).
2. Cells: per size, `gr_jax.tools.run_study` over the fraction dirs (one `gr_jax.train` process per cell, the size
   gin `models/t5_1_1/{size}.gin`, or with `--family decoder_only` the decoder-only network matched to that T5
   size in non-embedding parameters, `decoder_only/{size}.gin`; resumable per cell, no baselines) into
   `{out_dir}/cells/{size}/`; each cell ends with its retrieval metrics on `--split`. Every cell trains `--steps`
   steps, or with `--steps_with_data` round(fraction x `--steps`): the same number of passes over the labeled pairs
   at every fraction, as the paper's data law (one epoch over D) assumes.
3. CGL: `python -m gr_jax.cgl` per finished cell (`--cgl_negatives` sampled negatives), cached in the cell dir.
4. Laws (`gr_jax.scaling.laws`): CGL against non-embedding parameters P at the largest fraction (Eq. 6), against
   training pairs D at the largest size (Eq. 7), and jointly over every cell (Eq. 8); the monotonicity of CGL in P
   and in D; Spearman and Pearson correlations of CGL with Recall@10 and MRR@10 across cells.
   The data law uses the size measured at the most fractions (the largest of those). `--analyse_only` trains
   nothing and analyses the cells that have finished (a grid grown in parts).
5. Inference compute (T5 only; none with `--beams ''`): the best cell (MRR@10) ranked again with each of
   `--beams` (`gr_jax.eval`), MR@k = 1 - Recall@k for k in 5, 20, 100, against the FLOPs per query of that beam
   size (`gr_jax.tools.model_stats`' counting), and Eq. 12 fitted per k. A beam size below k returns fewer than k
   docids: it has no MR@k (gr_jax.eval does not report such a Recall@k; it would repeat Recall@beams), and each k is
   fitted over the beam sizes >= k.

D counts the judged (query, docid) training pairs of a fraction; a row with indexing examples (e.g. 2a) adds every
document's own example at every fraction, which D leaves out. Output: `scaling.json` (every cell and fit),
`scaling.md` (the tables), and PNGs (`cgl_by_params.png`, `cgl_by_pairs.png`, `cgl_joint.png`,
`cgl_vs_recall.png`, `miss_rate_{k}_by_flops.png`).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from gr_jax import entry_point
from gr_jax import gin_utils
from gr_jax.run_dir import RunDir, write_json
from gr_jax.tools import run_study
from gr_jax.tools.train_fraction import write_fraction

logger = logging.getLogger(__name__)

MISS_RATE_KS = (5, 20, 100)
# (cell dir, beams) -> inference FLOPs per query of the cell's model at that beam size.
FlopsCounter = Callable[[pathlib.Path, int], float]
# size name -> non-embedding parameters.
ParamCounter = Callable[[str], int]


@functools.lru_cache(maxsize=4)
def _cell_model(cell_dir: pathlib.Path) -> tuple[Any, int, int]:
    """(network config, docid length with EOS, input length) of a cell's run, rebuilt once per cell."""
    from gr_jax.search import restore_run
    built = restore_run(str(cell_dir))
    return built.model.config, int(built.docid_space.table.max_length), built.experiment.dataset.input_length


def count_flops(cell_dir: pathlib.Path, num_beams: int) -> float:
    """FLOPs per query of the cell's model with `num_beams` beams (`model_stats.measure`, nothing allocated)."""
    from gr_jax.tools import model_stats
    config, docid_length, input_length = _cell_model(pathlib.Path(cell_dir))
    row = model_stats.Row("cell", str(cell_dir), config, docid_length)
    return model_stats.measure(row, input_length=input_length, num_beams=num_beams).flops


def count_params(size: str, *, family: str = "t5") -> int:
    """Non-embedding parameters of the `family`'s `size` (`run_study.FAMILIES`; independent of the vocabulary)."""
    return run_study.FAMILIES[family].non_embedding_params(size)


@dataclasses.dataclass
class ScalingStudy:
    data_dir: pathlib.Path
    out_dir: pathlib.Path
    sizes: Sequence[str]
    fractions: Sequence[float]
    steps: int
    family: str = "t5"  # the cells' generative family (run_study.FAMILIES)
    steps_with_data: bool = False
    row: str = "2a"
    scheme: str = "naive"
    split: str = "dev"
    cgl_negatives: int = 256
    beams: Sequence[int] = (1, 5, 10, 20, 50, 100)
    gin_files: Sequence[str] = ()
    bindings: Sequence[str] = ()
    seed: int = 0
    analyse_only: bool = False
    runner: run_study.CommandRunner = run_study.run_logged
    preflight: run_study.Preflight = run_study.registered_rows
    flops: FlopsCounter = count_flops
    params: Optional[ParamCounter] = None  # None: count_params of `family`
    python: str = sys.executable

    def param_count(self, size: str) -> int:
        """Non-embedding parameters of `size` (`params`, or `count_params` of the family)."""
        return self.params(size) if self.params is not None else count_params(size, family=self.family)

    def cell_steps(self, fraction: float) -> int:
        """The training steps of a cell at `fraction` (see `steps_with_data`)."""
        return max(1, round(self.steps * fraction)) if self.steps_with_data else self.steps

    def fraction_dirs(self) -> list[tuple[float, pathlib.Path, int]]:
        """(fraction, data dir, training pairs D) per fraction, written on the first call."""
        out = []
        for fraction in self.fractions:
            directory = self.out_dir / "data" / f"{self.data_dir.resolve().name}_q{round(100 * fraction)}"
            summary = run_study._read_json(directory / "train_fraction.json")
            if summary is None or summary.get("fraction") != fraction or summary.get("seed") != self.seed:
                summary = write_fraction(data_dir=str(self.data_dir), out_dir=str(directory), fraction=fraction,
                                         seed=self.seed)
            out.append((fraction, directory.resolve(), int(summary["train_judgements"])))
        return out

    def run_cells(self, fraction_dirs) -> list[dict[str, Any]]:
        """Every (size, fraction) cell; with `analyse_only`, the finished cells only, nothing trained."""
        cells = []
        for size in self.sizes:
            if self.analyse_only:
                for fraction, directory, pairs in fraction_dirs:
                    saved = run_study._read_json(self.out_dir / "cells" / size / directory.name / f"{self.row}."
                                                 f"{self.scheme}" / "cell.json")
                    steps = self.cell_steps(fraction)
                    if saved and saved.get("status") == "ok" and saved.get("steps") == steps:
                        cells.append({"size": size, "params": self.param_count(size), "fraction": fraction,
                                      "pairs": pairs, "steps": steps, **{k: saved.get(k) for k in (
                                          "status", "metrics", "reason", "model_dir")}})
                continue
            # One study per number of steps: all fractions together, or each fraction alone with its own.
            groups: dict[int, list[tuple[float, pathlib.Path, int]]] = {}
            for item in fraction_dirs:
                groups.setdefault(self.cell_steps(item[0]), []).append(item)
            for steps, group in groups.items():
                study = run_study.Study(
                    datasets=[run_study.Dataset(run_study.default_dataset_name(d), d) for _, d, _ in group],
                    rows=[run_study.parse_row(self.row)], schemes=[self.scheme], size=size, steps=steps,
                    family=self.family, out_dir=self.out_dir / "cells" / size, gin_files=self.gin_files,
                    bindings=self.bindings,
                    split=self.split, baselines=False, plots=False, runner=self.runner, preflight=self.preflight,
                    python=self.python)  # one size's cells: the grid's own plots and fits are the results
                results = study.run()
                for (fraction, _, pairs), cell in zip(group, results["cells"]):
                    cells.append({"size": size, "params": self.param_count(size), "fraction": fraction, "pairs": pairs,
                                  "steps": steps, **{k: cell.get(k) for k in ("status", "metrics", "reason",
                                                                                 "model_dir")}})
        return cells

    def cgl(self, cell: dict[str, Any]) -> Optional[dict[str, Any]]:
        """The cell's CGL (`python -m gr_jax.cgl`), reused when measured with the same settings."""
        run_dir = RunDir.of(cell["model_dir"])
        path = run_dir.cgl(self.split, cell["steps"])
        saved = run_study._read_json(path)
        if saved and saved.get("settings", {}).get("num_negatives") == self.cgl_negatives:
            return saved
        argv = [self.python, "-m", "gr_jax.cgl", f"--gin_file={run_dir.config}",
                f"--gin_bindings=CGL_SPLIT = {self.split!r}", f"--gin_bindings=CGL_NEGATIVES = {self.cgl_negatives}",
                f"--gin_bindings=CGL_STEP = {cell['steps']}"]
        log = run_dir.path / "cgl.log"
        if self.runner(argv, log, None) != 0:
            logger.warning("CGL of %s failed: %s", run_dir.path, run_study.failure_reason(log, 1))
            return None
        return run_study._read_json(path)

    def beam_sweep(self, cell: dict[str, Any]) -> list[dict[str, Any]]:
        """MR@k and FLOPs per query of the cell at each beam size (`gr_jax.eval`, one process per beam size)."""
        run_dir = RunDir.of(cell["model_dir"])
        points = []
        for beams in self.beams:
            argv = [self.python, "-m", "gr_jax.eval", f"--gin_file={run_dir.config}",
                    f"--gin_bindings=EVAL_SPLIT = {self.split!r}",
                    f"--gin_bindings=training.EvalConfig.num_beams = {beams}",
                    f"--gin_bindings=training.EvalConfig.ranking_depth = {beams}",
                    f"--gin_bindings=training.evaluate.step = {cell['steps']}"]
            log = run_dir.path / f"beams.{beams}.log"
            metrics = run_study._last_json_line(log) if log.is_file() else None
            if metrics is None:
                if self.runner(argv, log, None) != 0:
                    logger.warning("beam sweep at %d beams failed: %s", beams, run_study.failure_reason(log, 1))
                    continue
                metrics = run_study._last_json_line(log)
            if metrics is None:
                continue
            points.append({"beams": beams, "flops": float(self.flops(run_dir.path, beams)),
                           **{f"MR@{k}": 1.0 - metrics[f"Recall@{k}"] for k in MISS_RATE_KS
                              if k <= beams and f"Recall@{k}" in metrics},  # deeper than the beams: not a Recall@k
                           "MRR@10": metrics["MRR@10"]})
        return points

    def run(self) -> dict[str, Any]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        fraction_dirs = self.fraction_dirs()
        cells = self.run_cells(fraction_dirs)
        for cell in cells:
            if cell["status"] == "ok":
                measured = self.cgl(cell)
                cell["cgl"] = None if measured is None else measured["cgl"]
                cell["cgl_chance"] = None if measured is None else measured["chance"]
        measured = [c for c in cells if c["status"] == "ok" and c.get("cgl") is not None]
        results = {"settings": {"data_dir": str(self.data_dir), "family": self.family, "sizes": list(self.sizes),
                                "fractions": list(self.fractions), "steps": self.steps,
                                "steps_with_data": self.steps_with_data, "row": self.row,
                                "scheme": self.scheme, "split": self.split, "cgl_negatives": self.cgl_negatives,
                                "beams": list(self.beams), "gin_files": list(self.gin_files),
                                "bindings": list(self.bindings), "seed": self.seed},
                   "cells": cells, **analyse(measured, out_dir=self.out_dir)}
        if measured and self.beams:
            best = max(measured, key=lambda c: c["metrics"]["MRR@10"])
            sweep = self.beam_sweep(best)
            results["inference"] = {"cell": {k: best[k] for k in ("size", "fraction", "model_dir")},
                                    "points": sweep, **fit_inference(sweep, out_dir=self.out_dir)}
        write_json(self.out_dir / "scaling.json", results)
        (self.out_dir / "scaling.md").write_text(format_markdown(results))
        return results


def _fit(form, x, y, **plot) -> Optional[dict[str, Any]]:
    from gr_jax.scaling import laws
    if len(y) < len(form.parameters):
        return None
    fit = laws.fit_law(form, x, y)
    out = fit.to_json()
    if plot.get("path") is not None:
        try:
            out["plot"] = laws.plot_fit(fit, **plot)
        except ImportError:
            pass
    return out


def analyse(cells: Sequence[dict[str, Any]], *, out_dir: pathlib.Path) -> dict[str, Any]:
    """The fits, monotonicity and correlations of the measured cells (see the module docstring)."""
    from gr_jax.scaling import laws
    if not cells:
        return {"fits": {}, "monotonic": {}, "correlations": {}}
    largest_fraction = max(c["fraction"] for c in cells)
    # The data law: the size measured at the most fractions (the largest of those), as the paper fixes one model.
    fractions_by_size = {}
    for c in cells:
        fractions_by_size.setdefault(c["params"], set()).add(c["fraction"])
    largest_size = max(fractions_by_size, key=lambda p: (len(fractions_by_size[p]), p))
    by_size = sorted((c for c in cells if c["fraction"] == largest_fraction), key=lambda c: c["params"])
    by_pairs = sorted((c for c in cells if c["params"] == largest_size), key=lambda c: c["pairs"])
    fits = {
        "model_size": _fit(laws.MODEL_SIZE, [c["params"] for c in by_size], [c["cgl"] for c in by_size],
                           path=out_dir / "cgl_by_params.png", xlabel="non-embedding parameters P", ylabel="CGL",
                           title=f"CGL by model size ({round(100 * largest_fraction)}% of the pairs)",
                           labels=[c["size"] for c in by_size]),
        "data_size": _fit(laws.DATA_SIZE, [c["pairs"] for c in by_pairs], [c["cgl"] for c in by_pairs],
                          path=out_dir / "cgl_by_pairs.png", xlabel="training pairs D", ylabel="CGL",
                          title=f"CGL by data size ({by_pairs[-1]['size']})"),
        "joint": _fit(laws.JOINT, [[c["params"], c["pairs"]] for c in cells], [c["cgl"] for c in cells],
                      path=out_dir / "cgl_joint.png", xlabel="non-embedding parameters P", ylabel="CGL",
                      title="CGL by model and data size"),
    }
    return {"fits": fits, "monotonic": monotonicity(cells), "correlations": correlations(cells, out_dir=out_dir)}


def monotonicity(cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Whether CGL falls with P at every fraction and with D at every size: the pairs of neighbours that rise."""
    def rises(key: str, group: str) -> list[list]:
        found = []
        for value in sorted({c[group] for c in cells}):
            ordered = sorted((c for c in cells if c[group] == value), key=lambda c: c[key])
            found += [[value, a[key], b[key]] for a, b in zip(ordered, ordered[1:]) if b["cgl"] > a["cgl"]]
        return found
    in_params, in_pairs = rises("params", "fraction"), rises("pairs", "size")
    return {"falls_with_params": not in_params, "rises_with_params": in_params,
            "falls_with_pairs": not in_pairs, "rises_with_pairs": in_pairs}


def correlations(cells: Sequence[dict[str, Any]], *, out_dir: Optional[pathlib.Path] = None) -> dict[str, Any]:
    """Spearman and Pearson correlations of CGL with Recall@10 and MRR@10 across cells (and their scatter plot)."""
    from scipy import stats
    cgl = np.array([c["cgl"] for c in cells])
    out = {}
    for metric in ("Recall@10", "MRR@10"):
        values = np.array([c["metrics"][metric] for c in cells])
        if len(cells) < 3 or np.ptp(values) == 0 or np.ptp(cgl) == 0:
            out[metric] = {"spearman": None, "pearson": None, "cells": len(cells)}
            continue
        out[metric] = {"spearman": float(stats.spearmanr(cgl, values).statistic),
                       "pearson": float(stats.pearsonr(cgl, values).statistic), "cells": len(cells)}
    if out_dir is not None and len(cells) >= 2:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return out
        figure, axes = plt.subplots(figsize=(6, 4.2))
        for i, metric in enumerate(("Recall@10", "MRR@10")):
            axes.scatter(cgl, [c["metrics"][metric] for c in cells], color=f"C{i}",
                         label=f"{metric} (Spearman {_format(out[metric]['spearman'])})")
        axes.set_xlabel("CGL")
        axes.set_ylabel("metric")
        axes.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(out_dir / "cgl_vs_recall.png", dpi=120)
        plt.close(figure)
    return out


def fit_inference(points: Sequence[dict[str, Any]], *, out_dir: pathlib.Path) -> dict[str, Any]:
    """Eq. 12 per k over the beam sweep, with one plot of MR@k by FLOPs."""
    from gr_jax.scaling import laws
    fits = {}
    for k in MISS_RATE_KS:
        measured = [p for p in points if f"MR@{k}" in p]  # the beam sizes >= k
        x, y = [p["flops"] for p in measured], [p[f"MR@{k}"] for p in measured]
        fits[f"MR@{k}"] = (None if len(set(y)) < 2 else
                           _fit(laws.INFERENCE, x, y, path=out_dir / f"miss_rate_{k}_by_flops.png",
                                xlabel="inference FLOPs per query C", ylabel=f"MR@{k}",
                                title=f"MR@{k} by inference compute",
                                labels=[p["beams"] for p in measured]))
    return {"fits": fits}


def _format(value) -> str:
    if value is None:
        return "–"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_markdown(results: dict[str, Any]) -> str:
    settings = results["settings"]
    steps = (f"round(fraction x {settings['steps']}) steps" if settings.get("steps_with_data")
             else f"{settings['steps']} steps")
    family = run_study.FAMILIES[settings.get("family", "t5")].label
    lines = [f"# Scaling study: {family}, row {settings['row']}, {settings['scheme']} ids, {steps}, "
             f"split {settings['split']}, CGL with {settings['cgl_negatives']} negatives", "",
             "| size | P (non-embedding) | fraction | D (pairs) | CGL | Recall@10 | MRR@10 |",
             "|---|---|---|---|---|---|---|"]
    for cell in results["cells"]:
        metrics = cell.get("metrics") or {}
        lines.append(f"| {cell['size']} | {cell['params']:,} | {cell['fraction']:g} | {cell['pairs']:,} | "
                     f"{_format(cell.get('cgl')) if cell['status'] == 'ok' else cell['status']} | "
                     f"{_format(metrics.get('Recall@10'))} | {_format(metrics.get('MRR@10'))} |")
    lines += ["", "| law | parameters | R^2 | points |", "|---|---|---|---|"]
    for name, fit in {**results.get("fits", {}), **results.get("inference", {}).get("fits", {})}.items():
        if fit is None:
            lines.append(f"| {name} | too few points | – | – |")
            continue
        parameters = ", ".join(f"{k} = {_format(v)}" for k, v in fit["parameters"].items())
        lines.append(f"| {name}: {fit['equation']} | {parameters} | {fit['r2']:.4f} | {fit['points']} |")
    monotonic = results.get("monotonic", {})
    if monotonic:
        lines += ["", f"CGL falls with P at every fraction: {monotonic['falls_with_params']} "
                      f"(rises: {monotonic['rises_with_params']}); with D at every size: "
                      f"{monotonic['falls_with_pairs']} (rises: {monotonic['rises_with_pairs']})."]
    for metric, values in results.get("correlations", {}).items():
        lines.append(f"CGL vs {metric} over {values['cells']} cells: Spearman {_format(values['spearman'])}, "
                     f"Pearson {_format(values['pearson'])}.")
    inference = results.get("inference")
    if inference:
        lines += ["", f"Beam sweep of {inference['cell']['size']} at fraction {inference['cell']['fraction']:g}:", "",
                  "| beams | FLOPs / query | MR@5 | MR@20 | MR@100 | MRR@10 |", "|---|---|---|---|---|---|"]
        for p in inference["points"]:
            miss = " | ".join(f"{p[f'MR@{k}']:.3f}" if f"MR@{k}" in p else "–" for k in MISS_RATE_KS)
            lines.append(f"| {p['beams']} | {p['flops']:.3g} | {miss} | {p['MRR@10']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None, *, runner: run_study.CommandRunner = run_study.run_logged,
         preflight: run_study.Preflight = run_study.registered_rows, flops: FlopsCounter = count_flops,
         params: Optional[ParamCounter] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.scaling_study",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--sizes", required=True, help="comma-separated models/t5_1_1/{size}.gin names (or "
                                                       "decoder_only/{size}.gin with --family decoder_only)")
    parser.add_argument("--family", default="t5", choices=sorted(run_study.FAMILIES),
                        help="the cells' generative family: T5.1.1, or the decoder-only network at the matched size")
    parser.add_argument("--fractions", default="0.2,0.4,0.6,0.8,1.0")
    parser.add_argument("--steps", type=int, required=True, help="per cell (at fraction 1 with --steps_with_data)")
    parser.add_argument("--steps_with_data", action="store_true",
                        help="train round(fraction x --steps) steps per cell: equal passes over the labeled pairs")
    parser.add_argument("--row", default="2a", help="a study row (run_study)")
    parser.add_argument("--scheme", default="naive")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--cgl_negatives", type=int, default=256)
    parser.add_argument("--beams", default="1,5,10,20,50,100",
                        help="beam sizes of the inference sweep of the best cell; empty: no sweep")
    parser.add_argument("--seed", type=int, default=0, help="of the training-query fractions")
    parser.add_argument("--analyse_only", action="store_true",
                        help="train nothing: measure and fit the cells of the grid that have finished")
    args, rest = parser.parse_known_args(argv)
    gin_args, gin_files, bindings = gin_utils.parse_args(rest, description=__doc__)
    sizes = run_study._split_list(args.sizes)
    for size in sizes:
        try:
            run_study.family_gin_files(args.family, size)
        except ValueError as e:
            parser.error(f"--sizes: {e}")
    try:
        fractions = [float(f) for f in run_study._split_list(args.fractions)]
        beams = [int(b) for b in run_study._split_list(args.beams)]
    except ValueError:
        parser.error("--fractions and --beams are comma-separated numbers")
    if not fractions or not all(0 < f <= 1 for f in fractions) or len(set(fractions)) != len(fractions):
        parser.error(f"--fractions must be distinct values in (0, 1], got {args.fractions}")
    if beams and min(beams) < 1:
        parser.error(f"--beams must be positive, got {args.beams}")
    if beams and args.family != "t5":
        parser.error("the inference sweep counts FLOPs with the T5 model (model_stats); pass --beams '' for the "
                     f"{args.family} family")
    try:
        run_study.parse_row(args.row)
    except ValueError as e:
        parser.error(str(e))
    entry_point.setup()
    study = ScalingStudy(data_dir=pathlib.Path(args.data_dir), out_dir=pathlib.Path(args.out_dir), sizes=sizes,
                         family=args.family, fractions=fractions, steps=args.steps,
                         steps_with_data=args.steps_with_data, row=args.row, scheme=args.scheme, split=args.split,
                         cgl_negatives=args.cgl_negatives, beams=beams, seed=args.seed,
                         analyse_only=args.analyse_only,
                         gin_files=[str(pathlib.Path(f).resolve()) if pathlib.Path(f).is_file() else f
                                    for f in gin_files], bindings=bindings,
                         runner=runner, preflight=preflight, flops=flops, params=params)
    results = study.run()
    print((study.out_dir / "scaling.md").read_text(), flush=True)
    return results


if __name__ == "__main__":
    main()
