"""Runs the study's tables at any scale: rows (document representations) x docid schemes, per data dir.

    python -m gr_jax.tools.run_study --data_dir data/wordnet_food --rows 1a,2a --schemes naive --size tiny \\
        --steps 300 --out_dir runs/study_wordnet [--data_dir DIR2 ...] [--gin_file F] [--gin.KEY=VALUE ...] \\
        [--dense_baselines all --dense_steps 500] [--gdr all --gdr_steps 1000 --gdr_branching 8,8]

Each cell (data dir x row x docid scheme) is one `python -m gr_jax.train` process, the normal gin entry point
(`experiments/study_cpu.gin`, then `models/t5_1_1/{size}.gin` or with `--family decoder_only` the decoder-only
network's matched size, `FAMILIES`, the row's variant gins, `--gin_file`s and the
cell's bindings), so cells are isolated and a crash stays in its cell. Training ends with the retrieval evaluation
of the eval split (constrained beam search), whose metrics are the cell's result. Baselines come first: BM25 and,
when `{data_dir}/d2q.tsv` exists (`python -m gr_jax.tools.doc2query generate`), BM25 over documents expanded with it
(`python -m gr_jax.tools.bm25`), then the dual encoders of `--dense_baselines` (`DENSE_BASELINES`, or `all`):
all-MiniLM-L6-v2 zero-shot, MiniLM fine-tuned on the data dir's training queries for `--dense_steps`, and a
T5.1.1-encoder dual encoder of the study's `--size` trained from scratch as long; each a `gr_jax.train` run of
`gin_configs/dense/` with only its own bindings (the `--gin_file`s and `--gin.KEY=VALUE`s are the cells'),
evaluated on the study's split. Then the GDR-style systems of `--gdr` (`GDR_SYSTEMS`, or `all`; docs/gdr.md): each
chains three commands, the document vectors of its dense baseline's last state (`python -m gr_jax.tools.dense_index`,
the baseline runs first whether or not `--dense_baselines` names it), their clusters (`python -m
gr_jax.tools.gdr_index build --branching {--gdr_branching}`) and a `gr_jax.train` run of `gin_configs/gdr/` whose
cluster decoder is the study's `--size`, trained `--gdr_steps` steps (default: `--steps`). `--no_baselines` skips
them all.

Rows are the study's table ids (Pradeep et al. 2023, Tables 2-3; `STUDY_ROWS`), optionally with variants:
`2a+unconstrained` evaluates without the docid trie (`VARIANTS`). A row whose mixture is not registered for a
data dir (e.g. D2Q rows without a d2q.tsv, or a row that is not implemented yet) is a failed cell with the reason;
a failing cell never stops the others.

Output in `--out_dir`:
    results.json                     every cell and baseline: status, metrics, reason, time (rewritten as cells end)
    results.md                       Tables 2-3 layout: MRR@10, R@1, R@10 per row x docid scheme, baselines on top
    {dataset}.metric_by_row.png      bars per row and scheme, baselines as lines (matplotlib, if installed)
    metric_by_corpus_size.png        with several (nested) data dirs: each cell's metrics against corpus size
    {dataset}/{row}.{scheme}/        the cell's model dir: train.log, cell.json, checkpoints, TREC run
    {dataset}/baselines/             bm25[_d2q].{log,json}, TREC runs; {dense baseline}/ model dirs and .json;
                                     {gdr system}/ model dirs, .json, {gdr system}.clusters/ and the chain's logs

Resumable: a cell whose `cell.json` holds final metrics for the same settings is not run again; a cell that
stopped part-way resumes from its last checkpoint (the trainer restores it and its input position).
Baselines likewise, per `baselines/{system}.json`; a dense baseline's or GDR system's model dir is cleared when its
settings (steps, gin files with the size gin, bindings, split; for GDR also the branching and its dense baseline's
settings) change.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import pathlib
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

from gr_jax import entry_point
from gr_jax import gin_utils
from gr_jax.data import d2q
from gr_jax.data.readers import open_dataset
from gr_jax.run_dir import RunDir, write_json
from gr_jax.tools import model_stats
from gr_jax.tools.doc2query import default_dataset_name

logger = logging.getLogger(__name__)

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
STUDY_GIN = "experiments/study_cpu.gin"


def _t5_non_embedding_params(size: str) -> int:
    return model_stats.non_embedding_param_count(dataclasses.replace(model_stats.size_config(size), vocab_size=128))


def _decoder_only_non_embedding_params(size: str) -> int:
    return gin_utils.decoder_only_config([f"decoder_only/{size}.gin"], vocab_size=128).non_embedding_params()


@dataclasses.dataclass(frozen=True)
class GenerativeFamily:
    """A family a cell can train (`--family`): its label, the gin files of a size (after the study's) and the
    non-embedding parameters of a size (the P of the scaling laws, independent of the vocabulary)."""
    label: str
    size_gins: Callable[[str], list[str]]
    non_embedding_params: Callable[[str], int]


# The decoder-only sizes are the T5 grid's matched in non-embedding parameters (docs/decoder_only.md, experiment 1).
FAMILIES: dict[str, GenerativeFamily] = {
    "t5": GenerativeFamily("T5.1.1", lambda size: [f"models/t5_1_1/{size}.gin"], _t5_non_embedding_params),
    "decoder_only": GenerativeFamily(
        "decoder-only", lambda size: ["decoder_only/experiment.gin", f"decoder_only/{size}.gin"],
        _decoder_only_non_embedding_params)}


def family_gin_files(family: str, size: str) -> list[str]:
    """The gin files of `family` at `size`; a ValueError names the family or size file that does not exist."""
    if family not in FAMILIES:
        raise ValueError(f"no generative family {family!r}; choose from {sorted(FAMILIES)}")
    files = FAMILIES[family].size_gins(size)
    missing = [f for f in files if not (gin_utils.GIN_CONFIGS_DIR / f).is_file()]
    if missing:
        raise ValueError(f"size {size!r} of the {family} family: no {gin_utils.GIN_CONFIGS_DIR / missing[0]}")
    return files


BASELINE_DASHES = ("--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (8, 2)))  # the plots' baseline lines
# (column title, key of gr_jax.evaluation.retrieval_metrics)
METRICS: tuple[tuple[str, str], ...] = (("MRR@10", "MRR@10"), ("R@1", "Recall@1"), ("R@10", "Recall@10"))


@dataclasses.dataclass(frozen=True)
class StudyRow:
    """A row of the study's tables: its id, its label there, and the mixture row of `tasks` that trains it."""
    id: str
    label: str
    mixture_row: str


STUDY_ROWS: dict[str, StudyRow] = {r.id: r for r in (
    StudyRow("1a", "Labeled Queries (No Indexing)", "labeled_only"),
    StudyRow("2a", "FirstP + Labeled Queries (DSI)", "firstp_labeled"),
    StudyRow("2b", "DaQ + Labeled Queries", "daq_labeled"),
    StudyRow("3a", "DaQ + D2Q + Labeled Queries", "daq_d2q_labeled"),
    StudyRow("3b", "FirstP + DaQ + D2Q + Labeled Queries", "firstp_daq_d2q_labeled"),
    StudyRow("6a", "DaQ only (No Labeled Queries)", "daq_only"),
    StudyRow("6b", "D2Q only (No Labeled Queries)", "d2q_only"),
)}


@dataclasses.dataclass(frozen=True)
class Variant:
    """A change to a row's model or decoding: extra gin files (under gin_configs/) and bindings."""
    name: str
    label: str
    gin_files: tuple[str, ...] = ()
    bindings: tuple[str, ...] = ()


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("unconstrained", "unconstrained decoding", bindings=("training.EvalConfig.constrained = False",)),
    # PAWA reads 2D semantic ids: use it with the semantic2d scheme.
    Variant("pawa", "PAWA decoder", gin_files=("decoders/pawa.gin",)),
    Variant("atomic", "atomic docid head", gin_files=("decoders/atomic.gin",)),
    Variant("consistency", "consistency loss", gin_files=("losses/consistency.gin",)),  # NCI's, weight 0.15
)}


@dataclasses.dataclass(frozen=True)
class DenseBaseline:
    """A dual-encoder baseline row (`gr_jax.dense`): one `gr_jax.train` run of its gin files (under gin_configs/) and
    bindings; `trains`: it trains `--dense_steps` steps on the data dir's training queries (else it is evaluated as
    it starts, 0 steps); `sized`: its network is the study's `--size` (models/t5_1_1/{size}.gin, after its gins)."""
    name: str
    label: str  # may name {size}
    gin_files: tuple[str, ...]
    trains: bool
    sized: bool = False
    bindings: tuple[str, ...] = ()


DENSE_BASELINES: dict[str, DenseBaseline] = {b.name: b for b in (
    DenseBaseline("minilm_zero_shot", "MiniLM zero-shot (dual encoder)", ("dense/minilm.gin",), trains=False),
    DenseBaseline("minilm_finetuned", "MiniLM fine-tuned (dual encoder)", ("dense/minilm.gin",), trains=True),
    DenseBaseline("t5_dual_encoder", "T5.1.1-{size} dual encoder (scratch)", ("dense/t5.gin",), trains=True,
                  sized=True),
)}


@dataclasses.dataclass(frozen=True)
class GdrSystem:
    """A GDR-style row (`gr_jax.gdr`): the clustered document vectors of the dense baseline `document_encoder`, and
    one `gr_jax.train` run of its gin files with the study's `--size` as the cluster decoder (and as the query
    encoder when the gins name no tower)."""
    name: str
    label: str  # may name {size}
    document_encoder: str  # a DENSE_BASELINES name
    gin_files: tuple[str, ...]
    bindings: tuple[str, ...] = ()


GDR_SYSTEMS: dict[str, GdrSystem] = {g.name: g for g in (
    GdrSystem("gdr_minilm", "GDR-style (MiniLM tower, T5.1.1-{size} cluster decoder)", "minilm_finetuned",
              ("gdr/minilm.gin",)),
    GdrSystem("gdr_t5", "GDR-style (T5.1.1-{size}, scratch; MiniLM document vectors)", "minilm_finetuned",
              ("gdr/train.gin",)),
)}
# Docid schemes whose cells need a decoder gin: the study's atomic ids have their own output head.
SCHEME_GIN_FILES: dict[str, tuple[str, ...]] = {"atomic": ("decoders/atomic.gin",)}


@dataclasses.dataclass(frozen=True)
class RowSpec:
    """A requested row: `2a` or `2a+unconstrained+pawa`."""
    key: str
    row: StudyRow
    variants: tuple[Variant, ...] = ()

    @property
    def label(self) -> str:
        extra = "".join(f" + {v.label}" for v in self.variants)
        return f"({self.row.id}) {self.row.label}{extra}"


def parse_row(key: str) -> RowSpec:
    row_id, *variant_names = key.strip().split("+")
    if row_id not in STUDY_ROWS:
        raise ValueError(f"unknown study row {row_id!r} in {key!r}; rows: {sorted(STUDY_ROWS)}")
    unknown = [name for name in variant_names if name not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown} in {key!r}; variants: {sorted(VARIANTS)}")
    return RowSpec(key=key.strip(), row=STUDY_ROWS[row_id], variants=tuple(VARIANTS[n] for n in variant_names))


@dataclasses.dataclass(frozen=True)
class Dataset:
    name: str
    data_dir: pathlib.Path


@dataclasses.dataclass(frozen=True)
class Cell:
    dataset: Dataset
    row: RowSpec
    scheme: str

    @property
    def key(self) -> str:
        return f"{self.dataset.name}/{self.row.key}.{self.scheme}"


# --- Running commands -----------------------------------------------------------------------------------------

# (argv, log file, timeout in seconds or None) -> exit status. Output (stdout and stderr) goes to the log file.
CommandRunner = Callable[[Sequence[str], pathlib.Path, Optional[float]], int]
TIMED_OUT = 124


def run_logged(argv: Sequence[str], log_path: pathlib.Path, timeout: Optional[float] = None) -> int:
    """Runs `argv` from the repository root with stdout and stderr appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n# {datetime.datetime.now().isoformat(timespec='seconds')} $ {' '.join(argv)}\n")
        log.flush()
        try:
            return subprocess.run(list(argv), stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                  timeout=timeout, check=False).returncode
        except subprocess.TimeoutExpired:
            log.write(f"\n# killed after {timeout} s (--cell_timeout)\n")
            return TIMED_OUT


_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)|KeyboardInterrupt)\b(:.*)?$")


def failure_reason(log_path: pathlib.Path, returncode: int) -> str:
    """The last exception line of a failed command's log (Python tracebacks end with it), else its last line."""
    try:
        lines = [line.rstrip() for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        lines = []
    if returncode == TIMED_OUT and lines and "killed after" in lines[-1]:
        return lines[-1].lstrip("# ")
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line):
            return f"{line} (exit status {returncode}; log {log_path})"
    tail = next((line for line in reversed(lines) if line.strip()), "no output")
    return f"exit status {returncode}; last log line: {tail} (log {log_path})"


# --- Which rows a data dir has ----------------------------------------------------------------------------------


def registered_rows(*, data_dir: pathlib.Path, scheme: str) -> set[str]:
    """Mixture row names that `tasks.register_dataset` registers for `data_dir` and `scheme` (a dry run in this
    process under a throwaway name). Raises what registration raises (unknown scheme, missing prebuilt ids...)."""
    from gr_jax import tasks
    name = "run_study_preflight"
    # Row availability does not depend on lengths; a generous target length only skips the fit check.
    space = tasks.load_docid_space(data_dir=data_dir, docid_scheme=scheme, target_length=1024)
    names = tasks.register_dataset(name=name, data_dir=data_dir, docid_space=space, target_length=1024)
    try:
        return {row for row in tasks.MIXTURE_ROWS
                if tasks.mixture_name(name=name, row=row, docid_scheme=scheme) in names}
    finally:
        tasks.unregister_dataset(name=name, docid_scheme=scheme)


Preflight = Callable[..., set[str]]


# --- Results --------------------------------------------------------------------------------------------------


def _read_json(path: pathlib.Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _final_eval_metrics(model_dir: pathlib.Path) -> Optional[dict]:
    """The `eval/*` metrics of a training run's final_metrics.json, prefix stripped (None: none written)."""
    final = _read_json(RunDir.of(model_dir).final_metrics)
    metrics = {k[len("eval/"):]: v for k, v in (final or {}).items() if k.startswith("eval/")}
    return metrics if "MRR@10" in metrics else None


def _last_json_line(log_path: pathlib.Path) -> Optional[dict]:
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and "MRR@10" in value:
                return value
    return None


@dataclasses.dataclass
class Study:
    """One study: its cells, how to run them and where results go (see the module docstring)."""

    datasets: Sequence[Dataset]
    rows: Sequence[RowSpec]
    schemes: Sequence[str]
    size: str
    steps: int
    out_dir: pathlib.Path
    family: str = "t5"  # the cells' generative family (FAMILIES); baselines and GDR keep their own networks
    gin_files: Sequence[str] = ()
    bindings: Sequence[str] = ()
    split: str = "dev"
    baselines: bool = True
    dense_baselines: Sequence[str] = ()
    dense_steps: int = 500
    gdr_systems: Sequence[str] = ()
    gdr_steps: Optional[int] = None  # None: `steps`
    gdr_branching: tuple[int, ...] = (8, 8)
    cell_timeout: Optional[float] = None
    plots: bool = True  # the PNG plots of the results (a study run inside another tool may leave them to it)
    runner: CommandRunner = run_logged
    preflight: Preflight = registered_rows
    python: str = sys.executable

    def __post_init__(self):
        self.out_dir = pathlib.Path(self.out_dir)
        self.results_path = self.out_dir / "results.json"
        self.results: dict[str, Any] = {}
        self._available: dict[tuple[str, str], set[str] | str] = {}

    # --- Settings ---

    def settings(self) -> dict[str, Any]:
        """What every cell's result depends on besides its row and scheme (steps may grow on a rerun)."""
        return {"size": self.size, "family": self.family, "gin_files": [STUDY_GIN, *self.gin_files],
                "bindings": list(self.bindings), "split": self.split}

    def cell_dir(self, cell: Cell) -> pathlib.Path:
        return self.out_dir / cell.dataset.name / f"{cell.row.key}.{cell.scheme}"

    def train_command(self, cell: Cell) -> list[str]:
        variant_files = [f for v in cell.row.variants for f in v.gin_files]
        scheme_files = [f for f in SCHEME_GIN_FILES.get(cell.scheme, ()) if f not in variant_files]
        gin_files = [STUDY_GIN, *FAMILIES[self.family].size_gins(self.size), *scheme_files, *variant_files,
                     *self.gin_files]
        bindings = [f"DATA_DIR = {str(cell.dataset.data_dir)!r}", f"DATASET_NAME = {cell.dataset.name!r}",
                    f"MODEL_DIR = {str(self.cell_dir(cell).resolve())!r}", f"TRAIN_STEPS = {self.steps}",
                    f"MIXTURE_ROW = {cell.row.row.mixture_row!r}", f"DOCID_SCHEME = {cell.scheme!r}",
                    f"EVAL_SPLIT = {self.split!r}",
                    *(b for v in cell.row.variants for b in v.bindings), *self.bindings]
        return [self.python, "-m", "gr_jax.train", *(f"--gin_file={f}" for f in gin_files),
                *(f"--gin_bindings={b}" for b in bindings)]

    # --- Baselines ---

    def run_baselines(self, dataset: Dataset) -> dict[str, Any]:
        """BM25 (and BM25 over D2Q-expanded documents when the data dir has a d2q.tsv), then the dense baselines
        asked for; each is cached in `baselines/{system}.json` and rerun only when its settings change."""
        out = self.out_dir / dataset.name / "baselines"
        out.mkdir(parents=True, exist_ok=True)
        d2q_file = d2q.default_path(dataset.data_dir)
        expansions = {"bm25": ("BM25", None)}
        if d2q_file.is_file():
            expansions["bm25_d2q"] = ("BM25 w/ doc2query-T5", d2q_file)
        results = {}
        for system, (label, expansion) in expansions.items():
            settings = {"split": self.split, "d2q": None if expansion is None else {
                "d2q_file": str(expansion), "d2q_mtime_ns": expansion.stat().st_mtime_ns}}
            argv = [self.python, "-m", "gr_jax.tools.bm25", "--data_dir", str(dataset.data_dir), "--split", self.split,
                    "--run_file", str(out / f"{system}.{self.split}.trec"),
                    *(["--d2q_file", str(expansion)] if expansion is not None else [])]
            results[system] = self._baseline(out, system, label=label, settings=settings, argv=argv,
                                             metrics=_last_json_line)
        if "bm25_d2q" not in expansions:
            results["bm25_d2q"] = {"label": "BM25 w/ doc2query-T5", "status": "skipped",
                                   "reason": f"no {d2q_file} (python -m gr_jax.tools.doc2query train/generate "
                                             "makes one)"}
        for name in self.dense_baselines_run():
            settings, argv = self.dense_command(dataset, DENSE_BASELINES[name])
            model_dir = self.dense_dir(dataset, name)
            results[name] = self._baseline(
                out, name, label=DENSE_BASELINES[name].label.format(size=self.size), argv=argv, settings=settings,
                model_dir=model_dir, metrics=lambda log, model_dir=model_dir: _final_eval_metrics(model_dir))
        for name in self.gdr_systems:
            system = GDR_SYSTEMS[name]
            label = system.label.format(size=self.size)
            encoder = results[system.document_encoder]
            if encoder["status"] != "ok":
                results[name] = {"label": label, "split": self.split, "status": "failed",
                                 "reason": f"its document encoder, the dense baseline {system.document_encoder}, "
                                           f"failed: {encoder.get('reason', '')}"}
                continue
            settings, prepare, argv = self.gdr_commands(dataset, system)
            model_dir = self.dense_dir(dataset, name)
            results[name] = self._baseline(out, name, label=label, argv=argv, settings=settings, prepare=prepare,
                                           model_dir=model_dir,
                                           metrics=lambda log, model_dir=model_dir: _final_eval_metrics(model_dir))
        return results

    def dense_baselines_run(self) -> list[str]:
        """`dense_baselines`, then the document encoders of `gdr_systems` not among them."""
        needed = [GDR_SYSTEMS[name].document_encoder for name in self.gdr_systems]
        return list(dict.fromkeys([*self.dense_baselines, *needed]))

    def dense_dir(self, dataset: Dataset, name: str) -> pathlib.Path:
        return self.out_dir / dataset.name / "baselines" / name

    def dense_command(self, dataset: Dataset, baseline: DenseBaseline) -> tuple[dict[str, Any], list[str]]:
        """(settings, argv) of a dense baseline: its gins and bindings, the data dir, its model dir, its steps and
        the study's split; not the study's `--gin_file`s and bindings, which configure the generative cells."""
        steps = self.dense_steps if baseline.trains else 0
        gin_files = [*baseline.gin_files, *([f"models/t5_1_1/{self.size}.gin"] if baseline.sized else [])]
        bindings = [f"DATA_DIR = {str(dataset.data_dir)!r}", f"DATASET_NAME = {dataset.name!r}",
                    f"MODEL_DIR = {str(self.dense_dir(dataset, baseline.name).resolve())!r}",
                    f"TRAIN_STEPS = {steps}", f"EVAL_SPLIT = {self.split!r}", *baseline.bindings]
        settings = {"split": self.split, "steps": steps, "gin_files": gin_files, "bindings": list(baseline.bindings)}
        return settings, [self.python, "-m", "gr_jax.train", *(f"--gin_file={f}" for f in gin_files),
                          *(f"--gin_bindings={b}" for b in bindings)]

    def gdr_commands(self, dataset: Dataset, system: GdrSystem
                     ) -> tuple[dict[str, Any], list[tuple[str, list[str]]], list[str]]:
        """(settings, the commands before training as (log name, argv), the training argv) of a GDR system: its
        dense baseline's vectors at its last step, their clusters, then `gr_jax.train` of its gins with the size
        gin and its own bindings (not the study's `--gin_file`s and bindings, which configure the generative cells)."""
        encoder_settings, _ = self.dense_command(dataset, DENSE_BASELINES[system.document_encoder])
        encoder_dir = self.dense_dir(dataset, system.document_encoder).resolve()
        clusters_dir = self.dense_dir(dataset, f"{system.name}.clusters").resolve()
        steps = self.steps if self.gdr_steps is None else self.gdr_steps
        branching = ",".join(str(b) for b in self.gdr_branching)
        prepare = [
            ("vectors", [self.python, "-m", "gr_jax.tools.dense_index", "--model_dir", str(encoder_dir),
                         "--step", str(encoder_settings["steps"])]),
            ("clusters", [self.python, "-m", "gr_jax.tools.gdr_index", "build", "--index_dir",
                          str(RunDir.of(encoder_dir).index(encoder_settings["steps"])), "--branching", branching,
                          "--out_dir", str(clusters_dir)])]
        gin_files = [*system.gin_files, f"models/t5_1_1/{self.size}.gin"]
        bindings = [f"DATA_DIR = {str(dataset.data_dir)!r}", f"DATASET_NAME = {dataset.name!r}",
                    f"MODEL_DIR = {str(self.dense_dir(dataset, system.name).resolve())!r}",
                    f"TRAIN_STEPS = {steps}", f"GDR_INDEX = {str(clusters_dir)!r}",
                    f"EVAL_SPLIT = {self.split!r}", *system.bindings]
        settings = {"split": self.split, "steps": steps, "gin_files": gin_files, "bindings": list(system.bindings),
                    "branching": list(self.gdr_branching),
                    "document_encoder": {"name": system.document_encoder, **encoder_settings}}
        return settings, prepare, [self.python, "-m", "gr_jax.train", *(f"--gin_file={f}" for f in gin_files),
                                   *(f"--gin_bindings={b}" for b in bindings)]

    def _baseline(self, out: pathlib.Path, system: str, *, label: str, settings: dict, argv: list[str],
                  metrics: Callable[[pathlib.Path], Optional[dict]], model_dir: Optional[pathlib.Path] = None,
                  prepare: Sequence[tuple[str, list[str]]] = ()) -> dict[str, Any]:
        """Runs one baseline command (or reuses its result for the same settings); `metrics(log)` reads its metrics
        after a successful run (None: there are none). A training baseline's `model_dir` resumes a run with the same
        settings (one that stopped part-way) and is cleared for other settings: its checkpoints would be restored.
        `prepare`: (name, argv) commands run first, in order, each logged to `{system}.{name}.log`; the first that
        fails is the baseline's failure."""
        saved = _read_json(out / f"{system}.json")
        if saved and saved.get("status") == "ok" and saved.get("settings") == settings:
            return saved
        if model_dir is not None:
            if model_dir.exists() and (saved or {}).get("settings") != settings:
                logger.info("baseline %s: settings changed, clearing %s", system, model_dir)
                shutil.rmtree(model_dir)
            RunDir.of(model_dir).final_metrics.unlink(missing_ok=True)  # Only this run's metrics count.
        result = {"label": label, "split": self.split, "settings": settings}
        write_json(out / f"{system}.json", {**result, "status": "running"})  # Which settings model_dir holds.
        start = time.perf_counter()
        for name, command in prepare:
            log = out / f"{system}.{name}.log"
            returncode = self.runner(command, log, self.cell_timeout)
            if returncode != 0:
                result.update(status="failed", reason=f"{name}: {failure_reason(log, returncode)}",
                              seconds=time.perf_counter() - start)
                write_json(out / f"{system}.json", result)
                return result
        log = out / f"{system}.log"
        returncode = self.runner(argv, log, self.cell_timeout)
        found = metrics(log) if returncode == 0 else None
        result["seconds"] = time.perf_counter() - start
        if found is None:
            result.update(status="failed", reason=failure_reason(log, returncode) if returncode else
                          f"no metrics in {log}" if model_dir is None else
                          f"training ended without retrieval metrics in {RunDir.of(model_dir).final_metrics}")
        else:
            result.update(status="ok", metrics={k: v for k, v in found.items() if k not in ("system", "split")})
        write_json(out / f"{system}.json", result)
        return result

    # --- Cells ---

    def available_rows(self, dataset: Dataset, scheme: str) -> set[str] | str:
        """The preflight's registered rows, or why registration failed (asked once per data dir and scheme)."""
        key = (dataset.name, scheme)
        if key not in self._available:
            try:
                self._available[key] = self.preflight(data_dir=dataset.data_dir, scheme=scheme)
            except Exception as e:  # noqa: BLE001 - reported in each cell of this scheme; the others go on
                self._available[key] = (f"registering {dataset.data_dir} with docid scheme {scheme!r} failed: "
                                        f"{type(e).__name__}: {e}")
        return self._available[key]

    def run_cell(self, cell: Cell) -> dict[str, Any]:
        cell_dir = self.cell_dir(cell)
        record = {"dataset": cell.dataset.name, "row": cell.row.key, "label": cell.row.label,
                  "mixture_row": cell.row.row.mixture_row, "scheme": cell.scheme, "steps": self.steps,
                  "settings": self.settings(), "model_dir": str(cell_dir), "log": str(cell_dir / "train.log")}
        saved = _read_json(cell_dir / "cell.json")
        if saved and saved.get("settings") != record["settings"] and any(RunDir.of(cell_dir).checkpoints.glob("*")):
            return {**record, "status": "failed", "reason": (
                f"{cell_dir} holds a run with other settings ({saved.get('settings')}); use another --out_dir")}
        if saved and saved.get("status") == "ok" and saved.get("steps") == self.steps:
            return {**saved, "cached": True}
        if saved and saved.get("steps", 0) > self.steps and saved.get("status") == "ok":
            return {**record, "status": "failed",
                    "reason": f"{cell_dir} is already trained to {saved['steps']} steps (> {self.steps})"}
        available_rows = self.available_rows(cell.dataset, cell.scheme)
        if isinstance(available_rows, str):
            return {**record, "status": "failed", "reason": available_rows}
        if cell.row.row.mixture_row not in available_rows:
            return {**record, "status": "failed", "reason": (
                f"mixture row {cell.row.row.mixture_row!r} is not registered for {cell.dataset.data_dir} with "
                f"docid scheme {cell.scheme!r} (registered: {sorted(available_rows)}); D2Q rows need "
                f"{d2q.default_path(cell.dataset.data_dir)}")}
        missing = [f for v in cell.row.variants for f in v.gin_files if not (gin_utils.GIN_CONFIGS_DIR / f).is_file()]
        if missing:
            return {**record, "status": "failed", "reason": f"variant gin file(s) {missing} do not exist under "
                                                            f"{gin_utils.GIN_CONFIGS_DIR}"}

        cell_dir.mkdir(parents=True, exist_ok=True)
        RunDir.of(cell_dir).final_metrics.unlink(missing_ok=True)  # Only this run's metrics count.
        start = time.perf_counter()
        returncode = self.runner(self.train_command(cell), cell_dir / "train.log", self.cell_timeout)
        record["seconds"] = time.perf_counter() - start
        final = _read_json(RunDir.of(cell_dir).final_metrics) if returncode == 0 else None
        metrics = {k[len("eval/"):]: v for k, v in (final or {}).items() if k.startswith("eval/")}
        if returncode != 0:
            record.update(status="failed", reason=failure_reason(cell_dir / "train.log", returncode))
        elif "MRR@10" not in metrics:
            record.update(status="failed", reason=f"training ended without retrieval metrics in "
                                                  f"{RunDir.of(cell_dir).final_metrics}")
        else:
            record.update(status="ok", metrics=metrics,
                          train={k: v for k, v in final.items() if k.startswith("train/")})
        write_json(cell_dir / "cell.json", record)
        return record

    # --- The whole study ---

    def run(self) -> dict[str, Any]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.results = {"settings": {**self.settings(), "steps": self.steps, "rows": [r.key for r in self.rows],
                                     "schemes": list(self.schemes), "dense_baselines": self.dense_baselines_run(),
                                     "dense_steps": self.dense_steps, "gdr_systems": list(self.gdr_systems),
                                     "gdr_steps": self.steps if self.gdr_steps is None else self.gdr_steps,
                                     "gdr_branching": list(self.gdr_branching)},
                        "datasets": {}, "cells": []}
        for dataset in self.datasets:
            self.results["datasets"][dataset.name] = {"data_dir": str(dataset.data_dir), **corpus_stats(dataset,
                                                                                                       self.split)}
            if self.baselines:
                self.results["datasets"][dataset.name]["baselines"] = self.run_baselines(dataset)
                self._save()
        for dataset in self.datasets:
            for scheme in self.schemes:
                for row in self.rows:
                    cell = Cell(dataset=dataset, row=row, scheme=scheme)
                    logger.info("cell %s: starting", cell.key)
                    result = self.run_cell(cell)
                    logger.info("cell %s: %s %s", cell.key, result["status"],
                                result.get("metrics", {}).get("MRR@10", result.get("reason", "")))
                    self.results["cells"].append(result)
                    self._save()
        (self.out_dir / "results.md").write_text(format_markdown(self.results))
        self.results["plots"] = write_plots(self.results, self.out_dir) if self.plots else []
        self._save()
        return self.results

    def _save(self) -> None:
        write_json(self.results_path, self.results)


def corpus_stats(dataset: Dataset, split: str) -> dict[str, int]:
    """Documents in the collection and queries judged in `split` (the denominators of the table)."""
    data = open_dataset(dataset.data_dir)
    stats = {"documents": sum(1 for _ in data.collection())}
    if split in data.splits():
        stats["queries"] = len(data.qrels(split))
    return stats


# --- Tables and plots -----------------------------------------------------------------------------------------


def _format(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.3f}"


def format_markdown(results: dict[str, Any]) -> str:
    """One table per data dir, the study's layout: baselines, then rows; per docid scheme MRR@10, R@1, R@10."""
    settings = results["settings"]
    schemes = settings["schemes"]
    dense = (f"; dense baselines that train: {settings['dense_steps']} steps" if any(
        DENSE_BASELINES[name].trains for name in settings.get("dense_baselines", ()) if name in DENSE_BASELINES)
        else "")
    gdr = (f"; GDR systems: {settings['gdr_steps']} steps, {'x'.join(map(str, settings['gdr_branching']))} clusters"
           if settings.get("gdr_systems") else "")
    family = FAMILIES[settings.get("family", "t5")].label
    lines = [f"# Study: {family}-{settings['size']}, {settings['steps']} steps, split {settings['split']}{dense}{gdr}",
             ""]
    for name, info in results["datasets"].items():
        lines += [f"## {name}: {info.get('documents', '?')} documents, {info.get('queries', '?')} "
                  f"{settings['split']} queries", ""]
        header = ["Method", *(f"{scheme} {title}" for scheme in schemes for title, _ in METRICS)]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for system in info.get("baselines", {}).values():
            metrics = system.get("metrics", {})
            values = [_format(metrics.get(key)) if system["status"] == "ok" else system["status"]
                      for _ in schemes for _, key in METRICS]
            lines.append("| " + " | ".join([system["label"], *values]) + " |")
        cells = {(c["row"], c["scheme"]): c for c in results["cells"] if c["dataset"] == name}
        failures = []
        for row in settings["rows"]:
            label = next((c["label"] for (r, _), c in cells.items() if r == row), row)
            values = []
            for scheme in schemes:
                cell = cells.get((row, scheme))
                if cell is None:
                    values += ["–"] * len(METRICS)
                elif cell["status"] == "ok":
                    values += [_format(cell["metrics"].get(key)) for _, key in METRICS]
                else:
                    values += ["failed"] * len(METRICS)
                    failures.append(f"- {label}, {scheme}: {cell.get('reason', '')}")
            lines.append("| " + " | ".join([label, *values]) + " |")
        if failures:
            lines += ["", "Failed cells:", *failures]
        skipped = [f"- {s['label']}: {s['reason']}" for s in info.get("baselines", {}).values()
                   if s["status"] != "ok"]
        if skipped:
            lines += ["", "Baselines not run:", *skipped]
        lines.append("")
    return "\n".join(lines)


def write_plots(results: dict[str, Any], out_dir: pathlib.Path) -> list[str]:
    """PNG plots (see the module docstring); none, with a warning, when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no plots (pip install matplotlib); results.md has the numbers")
        return []
    settings = results["settings"]
    schemes, rows = settings["schemes"], settings["rows"]
    ok = [c for c in results["cells"] if c["status"] == "ok"]
    written = []
    for name, info in results["datasets"].items():
        baselines = list(info.get("baselines", {}).values())
        handles = {}
        fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS) + 1 + 2.5 * bool(baselines), 3.5),
                                 squeeze=False)
        width = 0.8 / max(len(schemes), 1)
        for ax, (title, key) in zip(axes[0], METRICS):
            for s, scheme in enumerate(schemes):
                values = [next((c["metrics"].get(key, 0.0) for c in ok if c["dataset"] == name and c["row"] == row
                                and c["scheme"] == scheme), 0.0) for row in rows]
                ax.bar([i + (s - (len(schemes) - 1) / 2) * width for i in range(len(rows))], values, width,
                       label=scheme)
            for b, system in enumerate(baselines):
                # A colour and dash pattern each, named in the legend: baselines often tie on a small corpus.
                if system["status"] == "ok" and key in system["metrics"]:
                    line = ax.axhline(system["metrics"][key], linewidth=1, color=plt.get_cmap("Dark2")(b % 8),
                                      linestyle=BASELINE_DASHES[b % len(BASELINE_DASHES)])
                    handles.setdefault(system["label"], line)
            ax.set_xticks(range(len(rows)), rows)
            ax.set_title(title)
            ax.set_ylim(0, 1)
        axes[0][0].legend(title="docids", fontsize=7)
        if handles:
            axes[0][-1].legend(handles.values(), handles.keys(), title="baselines", fontsize=7, loc="upper left",
                               bbox_to_anchor=(1.02, 1.0))
        fig.suptitle(f"{name} ({info.get('documents', '?')} documents)")
        fig.tight_layout()
        path = out_dir / f"{name}.metric_by_row.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(str(path))
    sizes = {name: info.get("documents") for name, info in results["datasets"].items()}
    if len(sizes) > 1 and all(sizes.values()):
        fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS) + 1, 3.5), squeeze=False)
        for ax, (title, key) in zip(axes[0], METRICS):
            for row in rows:
                for scheme in schemes:
                    points = sorted((sizes[c["dataset"]], c["metrics"].get(key, 0.0)) for c in ok
                                    if c["row"] == row and c["scheme"] == scheme)
                    if points:
                        ax.plot(*zip(*points), marker="o", label=f"{row} {scheme}")
            ax.set_xscale("log")
            ax.set_xlabel("documents in the corpus")
            ax.set_title(title)
            ax.set_ylim(0, 1)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / "metric_by_corpus_size.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(str(path))
    return written


# --- Command line ---------------------------------------------------------------------------------------------


def _split_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def main(argv: Optional[Sequence[str]] = None, *, runner: CommandRunner = run_logged,
         preflight: Preflight = registered_rows) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.run_study", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", action="append", required=True,
                        help="a data dir (MS MARCO or BEIR layout, with spm.model); repeat for nested corpora")
    parser.add_argument("--rows", required=True, help=f"comma-separated row ids {sorted(STUDY_ROWS)}, "
                                                      f"optionally +variant ({sorted(VARIANTS)})")
    parser.add_argument("--schemes", default="naive", help="comma-separated docid schemes")
    parser.add_argument("--size", default="tiny", help="models/t5_1_1/{size}.gin (or decoder_only/{size}.gin)")
    parser.add_argument("--family", default="t5", choices=sorted(FAMILIES),
                        help="the cells' generative family: T5.1.1, or the decoder-only network at the matched size")
    parser.add_argument("--steps", type=int, required=True, help="training steps per cell")
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--split", default="dev", help="evaluation split of every cell and baseline")
    parser.add_argument("--no_baselines", action="store_true", help="skip BM25, BM25 + D2Q and the dense baselines")
    parser.add_argument("--dense_baselines", default="",
                        help=f"comma-separated dual-encoder baselines {sorted(DENSE_BASELINES)}, or 'all'")
    parser.add_argument("--dense_steps", type=int, default=500,
                        help="training steps of the dense baselines that train (default: 500)")
    parser.add_argument("--gdr", default="", help=f"comma-separated GDR-style systems {sorted(GDR_SYSTEMS)}, or 'all'")
    parser.add_argument("--gdr_steps", type=int, default=None, help="training steps of the GDR systems (default: "
                                                                    "--steps)")
    parser.add_argument("--gdr_branching", default="8,8", help="clusters per level of the GDR cluster ids")
    parser.add_argument("--cell_timeout", type=float, default=None, help="seconds before a cell is killed")
    args, rest = parser.parse_known_args(argv)
    gin_args, gin_files, bindings = gin_utils.parse_args(rest, description=__doc__)
    if gin_args.gin_search_path:
        parser.error("--gin_search_path is not passed to cells; give gin files by path instead")
    try:
        family_gin_files(args.family, args.size)
    except ValueError as e:
        parser.error(f"--size {args.size}: {e}")
    rows = [parse_row(key) for key in _split_list(args.rows)]
    dense_baselines = (list(DENSE_BASELINES) if args.dense_baselines.strip() == "all"
                       else _split_list(args.dense_baselines))
    unknown = [name for name in dense_baselines if name not in DENSE_BASELINES]
    if unknown:
        parser.error(f"unknown dense baseline(s) {unknown}; choose from {sorted(DENSE_BASELINES)} or 'all'")
    gdr_systems = list(GDR_SYSTEMS) if args.gdr.strip() == "all" else _split_list(args.gdr)
    unknown = [name for name in gdr_systems if name not in GDR_SYSTEMS]
    if unknown:
        parser.error(f"unknown GDR system(s) {unknown}; choose from {sorted(GDR_SYSTEMS)} or 'all'")
    try:
        gdr_branching = tuple(int(b) for b in _split_list(args.gdr_branching))
    except ValueError:
        parser.error(f"--gdr_branching {args.gdr_branching!r}: comma-separated integers, e.g. 8,8")
    if not gdr_branching or min(gdr_branching) < 2:
        parser.error(f"--gdr_branching {args.gdr_branching!r}: every level needs at least 2 clusters")
    names = [default_dataset_name(d) for d in args.data_dir]
    if len(set(names)) != len(names):
        parser.error(f"data dirs must have distinct folder names (they name the tasks): {names}")
    datasets = [Dataset(name=name, data_dir=pathlib.Path(d).resolve()) for name, d in zip(names, args.data_dir)]
    entry_point.setup()
    study = Study(datasets=datasets, rows=rows, schemes=_split_list(args.schemes), size=args.size, steps=args.steps,
                  out_dir=pathlib.Path(args.out_dir), family=args.family, gin_files=[str(pathlib.Path(f).resolve())
                                                                 if pathlib.Path(f).is_file() else f
                                                                 for f in gin_files],
                  bindings=bindings, split=args.split, baselines=not args.no_baselines,
                  dense_baselines=dense_baselines, dense_steps=args.dense_steps, gdr_systems=gdr_systems,
                  gdr_steps=args.gdr_steps, gdr_branching=gdr_branching,
                  cell_timeout=args.cell_timeout, runner=runner, preflight=preflight)
    results = study.run()
    print((study.out_dir / "results.md").read_text())
    failed = [c for c in results["cells"] if c["status"] != "ok"]
    print(f"{len(results['cells']) - len(failed)} of {len(results['cells'])} cells ok; results in "
          f"{study.results_path}", flush=True)
    return results


if __name__ == "__main__":
    main()
