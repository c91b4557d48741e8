"""The files of a run's directory (`model_dir`), each named once: whatever writes or reads a run asks its `RunDir`.

    config.gin                          the gin config the run was trained with (evaluation and search rebuild it)
    start.json                          where its parameters started (seed, init_checkpoint) and which of them its
                                        checkpoints leave out (the frozen ones): what a warm start from it reads
    checkpoints/{step}/                 training states (`gr_jax.checkpoints`)
    best/{step}/                        the state model selection kept, with selection.json its record
    final_metrics.json                  the training run's report
    run.{split}.{step}.trec             the ranking of a split's queries by the checkpoint of a step
    eval.{split}.{step}.json            its retrieval metrics when evaluated after training
    ranking.{split}.{step}.json, cgl.{split}.{step}.json, eval.doc2query.validation.{step}.json
                                        other measures of a checkpoint (SToICaL's rankings, CGL, doc2query's loss)
    index/{step}/                       a dense run's corpus index, encoded by that checkpoint
    document_encoder.json               a GDR run's fingerprint of the encoder of its document vectors
    train_examples-{p}-of-{n}.jsonl     each step's example fingerprints, per process (when recorded)
    log.txt, log.{p}.txt                every log record of training and evaluation, tracebacks included
                                        (`gr_jax.logs`), of process 0 and of each other process
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class RunDir:
    """A run's directory as one process of its job sees it: the primary process (0) writes the run's own files."""
    path: pathlib.Path
    process: int = 0

    @classmethod
    def of(cls, model_dir: str | os.PathLike, *, process: int = 0) -> RunDir:
        return cls(path=pathlib.Path(model_dir), process=process)

    @property
    def config(self) -> pathlib.Path:
        return self.path / "config.gin"

    @property
    def start(self) -> pathlib.Path:
        return self.path / "start.json"

    @property
    def checkpoints(self) -> pathlib.Path:
        return self.path / "checkpoints"

    @property
    def best(self) -> pathlib.Path:
        return self.path / "best"

    @property
    def selection(self) -> pathlib.Path:
        return self.path / "selection.json"

    @property
    def final_metrics(self) -> pathlib.Path:
        return self.path / "final_metrics.json"

    @property
    def document_encoder(self) -> pathlib.Path:
        return self.path / "document_encoder.json"

    def log(self, process: int) -> pathlib.Path:
        return self.path / ("log.txt" if process == 0 else f"log.{process}.txt")

    def index(self, step: int) -> pathlib.Path:
        return self.path / "index" / str(step)

    def trec_run(self, split: str, step: int) -> pathlib.Path:
        return self.path / f"run.{split}.{step}.trec"

    def trec_runs(self, split: str) -> dict[int, pathlib.Path]:
        """step -> the TREC run of `split` by that step's checkpoint, in step order."""
        runs = {}
        for path in self.path.glob(f"run.{split}.*.trec"):
            step = path.name[len(f"run.{split}."):-len(".trec")]
            if step.isdigit():
                runs[int(step)] = path
        return dict(sorted(runs.items()))

    def eval_metrics(self, split: str, step: int) -> pathlib.Path:
        return self.path / f"eval.{split}.{step}.json"

    def ranking_metrics(self, split: str, step: int) -> pathlib.Path:
        """SToICaL's ranking metrics of a checkpoint (`gr_jax.ranking.evaluation`)."""
        return self.path / f"ranking.{split}.{step}.json"

    def cgl(self, split: str, step: int) -> pathlib.Path:
        """The contrastive generalisation loss of a checkpoint (`gr_jax.scaling.cgl`)."""
        return self.path / f"cgl.{split}.{step}.json"

    def doc2query_validation(self, step: int) -> pathlib.Path:
        """A doc2query run's loss on its validation pairs (`gr_jax.tools.doc2query`)."""
        return self.path / f"eval.doc2query.validation.{step}.json"

    def examples_record(self, *, process: int, count: int) -> pathlib.Path:
        return self.path / f"train_examples-{process}-of-{count}.jsonl"

    def write_config(self, gin_config: str) -> None:
        """Writes the gin config the run trains with. Every process calls it; the primary one writes."""
        if self.process == 0:
            self.config.write_text(gin_config)

    def write_start(self, *, seed: int, init_checkpoint: str | os.PathLike | None, frozen: str | None) -> None:
        """Records where the run's parameters start (and `start_fingerprint` of it) and the regex of those its
        checkpoints leave out (None: they hold every parameter), so that a run warm-started from this one can
        rebuild them. The primary process writes."""
        if self.process == 0:
            start = None if init_checkpoint is None else str(pathlib.Path(init_checkpoint).resolve())
            write_json(self.start, {"seed": int(seed), "init_checkpoint": start, "frozen": frozen,
                                    "fingerprint": start_fingerprint(init_checkpoint)})

    def check_start(self, *, seed: int, init_checkpoint: str | os.PathLike | None) -> None:
        """Raises when this run's checkpoints leave parameters out (a LoRA run's base) and the start they were
        trained on (`start.json`) is not the one given: the adapters would be applied to another base. A start
        that moved but holds the same files is the same start; a run without a record, or whose checkpoints hold
        every parameter, is not checked."""
        if not self.start.is_file() or not any(p.name.isdigit() for p in self.checkpoints.glob("*")):
            return
        recorded = self.read_start()
        if not recorded.get("frozen"):
            return
        if recorded["init_checkpoint"] is None and init_checkpoint is None:
            same, now = int(recorded["seed"]) == int(seed), f"seed {seed}"
        else:
            fingerprint = start_fingerprint(init_checkpoint)
            same, now = recorded.get("fingerprint") == fingerprint, f"{init_checkpoint} ({(fingerprint or '')[:12]})"
        if not same:
            then = (f"seed {recorded['seed']}" if recorded["init_checkpoint"] is None else
                    f"{recorded['init_checkpoint']} ({(recorded.get('fingerprint') or '')[:12]})")
            raise ValueError(f"{self.start}: the checkpoints of {self.path} hold only the parameters it trains "
                             f"(the rest, {recorded['frozen']!r}, are its base), trained on {then}; this run's "
                             f"base is {now}. Point init_checkpoint back at the base it was trained on, or train in "
                             "a new model_dir")

    def read_start(self) -> dict[str, Any]:
        """`write_start`'s record; a FileNotFoundError when the run has none (it was trained before runs wrote it)."""
        if not self.start.is_file():
            raise FileNotFoundError(f"{self.start} is missing: the run records where its parameters start when it "
                                    "begins training (runs trained before that have none)")
        return json.loads(self.start.read_text())

    def write_final_metrics(self, report: Mapping[str, Any]) -> dict[str, Any]:
        """Writes the training run's report (atomically) over an earlier attempt's, keeping what this one does not
        measure again: a rerun of a finished run trains no step, so its report has no training metrics, and would
        otherwise replace them. Returns the report written. Every process calls it; the primary one reads and writes
        the file, the others return `report`."""
        if self.process != 0:
            return dict(report)
        previous = json.loads(self.final_metrics.read_text()) if self.final_metrics.is_file() else {}
        merged = {**previous, **report}
        write_json(self.final_metrics, merged)
        return merged

    def is_run(self) -> bool:
        """Whether this is a gr_jax run (it has checkpoints/) rather than, e.g., a Hugging Face checkpoint dir."""
        return self.checkpoints.is_dir()


def start_fingerprint(init_checkpoint: str | os.PathLike | None) -> str | None:
    """A digest of what a run starts from, independent of where it lies (None: from a seed). A Hugging Face
    checkpoint dir: its config.json and the names and sizes of its weight files (reading the weights would cost as
    much as loading them); a gr_jax run: its own start's fingerprint and its latest checkpoint step."""
    if init_checkpoint is None:
        return None
    directory = pathlib.Path(init_checkpoint)
    digest = hashlib.sha256()
    if RunDir.of(directory).is_run():
        start = RunDir.of(directory).read_start() if RunDir.of(directory).start.is_file() else {}
        steps = [int(p.name) for p in RunDir.of(directory).checkpoints.iterdir() if p.name.isdigit()]
        digest.update(json.dumps([start.get("fingerprint"), start.get("seed"), max(steps, default=None)]).encode())
    else:
        config = directory / "config.json"
        digest.update(config.read_bytes() if config.is_file() else b"")
        for weights in sorted(directory.glob("*.safetensors")):
            digest.update(f"{weights.name}:{weights.stat().st_size};".encode())
    return digest.hexdigest()


def hugging_face_checkpoint(path: str | os.PathLike) -> pathlib.Path:
    """The Hugging Face checkpoint dir `path` stands for: itself, or for a gr_jax run, the checkpoint its
    parameters started from (through `start.json`, run after run). A ValueError when a run's chain starts elsewhere
    (from a seed)."""
    directory = pathlib.Path(path)
    seen = []
    while RunDir.of(directory).is_run():
        seen.append(str(directory))
        start = RunDir.of(directory).read_start()
        if start["init_checkpoint"] is None:
            raise ValueError(f"{' <- '.join(seen)} started from seed {start['seed']}, not from a Hugging Face "
                             "checkpoint")
        directory = pathlib.Path(start["init_checkpoint"])
    return directory


def write_json(path: pathlib.Path, value: Any) -> None:
    """`value` as indented JSON, whole or not at all: written to a temporary file beside `path`, then renamed over
    it, so a crash leaves the previous file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)
