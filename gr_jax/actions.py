"""Periodic actions of the training loop, as t5x's `EarlyStoppingAction` / `TerminateOnNanAction` and clu's
`periodic_actions`: the loop (`gr_jax.training.training_loop`) only steps the trainer and calls them.

After a step, the loop *reports* when an action with its own period is due, at every `report_every_steps`-th step
and at the last step: it fetches the training metrics accumulated since the previous report (one device transfer)
and calls, in list order, every action that is due. An action's `every_steps` is its period; None means "at every
report" (the non-finite loss guard, the metric writer). An action returns True to stop training after this step
(early stopping); `start` may stop a run before its first step (a resumed run that already stopped), and `end` runs
once after the loop (the final evaluation, the save of a state where training stopped). Actions share nothing
mutable: what each found for the run's report it returns from `report()`, which the loop merges once the run ended,
and an action that needs another's finding is given that action (the final evaluation, model selection's best
state), so their order in the list does not matter.

New objectives and evaluations (a contrastive loss's metrics, CGL evaluation, SToICaL's ranking metrics) are new
`Action`s passed to `training.train(actions=...)` (gin: `training.train.actions = [@MyAction()]`): the loop is
never edited.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import logging
import math
import pathlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Optional

import jax

from gr_jax import checkpoints
from gr_jax import partitioning
from gr_jax.data.readers import EVAL_SPLIT_SETTING
from gr_jax.evaluation import write_trec_run
from gr_jax.evaluator import RetrievalEvaluator
from gr_jax.family import BuiltRun
from gr_jax.retrievers.settings import EvalConfig
from gr_jax.run_dir import RunDir

if TYPE_CHECKING:
    from gr_jax.metric_writers import MetricWriter
    from gr_jax.retrievers import ParametricRetriever
    from gr_jax.trainer import TrainState

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """What a training run's actions read, set up once before the first step (a value: no action writes to it).

    start_batch: the input position the run starts at (batches of the fresh run consumed before its first step).
    input_checkpoint: the checkpoint step whose saved input iterator state continues the input (`training.
      restore_input`); None: none (a fresh run, or one whose input config changed).
    batches: the training input, once the loop made it (the loop's own copy of the run); a
      `checkpoints.CheckpointableInput` (the seqio pipeline) has its state saved with every checkpoint.
    """
    built: BuiltRun
    writer: MetricWriter
    start_step: int
    start_batch: int
    input_checkpoint: Optional[int] = None
    batches: Optional[Iterator] = None

    @property
    def run_dir(self) -> RunDir:
        return RunDir.of(self.built.experiment.model_dir)

    def input_state(self, step: int) -> dict:
        """The input position of `step`, saved with its checkpoint (exact resume), and the config that position
        means something in (`training.resume_position` checks it on restart)."""
        consumed = self.start_batch + (step - self.start_step)
        if isinstance(self.batches, checkpoints.CheckpointableInput) and self.batches.batches_consumed != consumed:
            raise RuntimeError(f"the input iterator consumed {self.batches.batches_consumed} batches at step {step}, "
                               f"expected {consumed} (one per step from batch {self.start_batch} at step "
                               f"{self.start_step}): its saved state would resume elsewhere")
        experiment = self.built.experiment
        return {"batches_consumed": consumed, "seed": experiment.seed, "batch_size": experiment.batch_size,
                "num_processes": jax.process_count(), "inputs": self.built.input_fingerprint()}

    def checkpointable_input(self) -> Optional[checkpoints.CheckpointableInput]:
        """The input whose state each checkpoint saves, if it can save one."""
        return self.batches if isinstance(self.batches, checkpoints.CheckpointableInput) else None


@dataclasses.dataclass(frozen=True)
class TrainingProgress:
    """The loop at a report: the step just taken, the state after it, the training metrics since the previous
    report (`gr_jax.metrics.summarize`, plus steps_per_second and tokens_per_second), and whether
    it is the last step of the run."""
    step: int
    state: TrainState
    summary: Mapping[str, float]
    last: bool


class Action:
    """A periodic action (see the module docstring)."""

    every_steps: Optional[int] = None

    def due(self, step: int, *, last: bool) -> bool:
        return self.every_steps is None or last or (self.every_steps > 0 and step % self.every_steps == 0)

    def start(self, run: TrainingRun) -> bool:
        """Called once before the first step; returns True when the run has nothing left to train."""
        del run
        return False

    def __call__(self, run: TrainingRun, progress: TrainingProgress) -> bool:
        """Acts at a due step; returns True to stop training after it."""
        raise NotImplementedError

    def end(self, run: TrainingRun, progress: TrainingProgress) -> None:
        """Called once after the loop, with the last step (also when an action stopped training early)."""
        del run, progress

    def report(self) -> Mapping[str, float]:
        """What this action found for the run's report (`model_dir/final_metrics.json`), asked once after every
        action's `end`: its latest value of each metric it measured. Nothing by default."""
        return {}


class NonFiniteLossError(FloatingPointError):
    """A training metric became NaN/inf; nothing after the last good checkpoint was saved."""


class StopOnNonFiniteLoss(Action):
    """Ends training with `NonFiniteLossError` as soon as a reported metric is NaN or inf. It runs first at every
    report, so no later action (a checkpoint save) ever sees a state whose loss went non-finite."""

    def __call__(self, run, progress):
        bad = {name: value for name, value in progress.summary.items() if not math.isfinite(value)}
        if bad:
            latest = run.built.checkpointer.latest_step()
            kept = (f"the last good checkpoint (step {latest}) is kept in {run.built.checkpointer.directory}"
                    if latest is not None else "no checkpoint was saved before it")
            raise NonFiniteLossError(
                f"non-finite training metrics at step {progress.step}: "
                f"{', '.join(f'{name}={value}' for name, value in bad.items())}. Training stopped; {kept}.")
        return False


class WriteTrainMetrics(Action):
    """Writes the reported training metrics as `train/*` scalars (TensorBoard and the log) and reports the last
    value of each."""

    def __init__(self):
        self.found: dict[str, float] = {}

    def __call__(self, run, progress):
        if progress.summary:
            scalars = {f"train/{k}": v for k, v in progress.summary.items()}
            run.writer.write_scalars(progress.step, scalars)
            self.found.update(scalars)
        return False

    def report(self):
        return dict(self.found)


# Decisions in the coordination service's key-value store: one key prefix per decider (a SaveCheckpoint), numbered in
# construction order, which is the same in every process of a job (each builds the same actions in the same order).
_DECISION_IDS = itertools.count()
_DECISION_TIMEOUT_MS = 3_600_000  # process 0 may be writing an evaluation's files meanwhile
_DECISIONS_KEPT = 16  # the processes run at most a step or two apart (every step syncs them): older keys are deleted


class ProcessZeroDecides:
    """A yes/no that every process of a multi-host job takes alike at each step: process 0 decides (by its own
    clock) and posts the answer to the coordination service's key-value store, the others wait for it there, as
    orbax's `ContinuousCheckpointingPolicy` does. Host to host: no device collective, so the step in flight is not
    waited for. With one process, just the decision.

    client: the `jax.distributed` key-value client (default: the job's, fetched on first use); process_index,
    process_count: default jax's.
    """

    def __init__(self, name: str, *, client: Any = None, process_index: Optional[int] = None,
                 process_count: Optional[int] = None):
        self.prefix = f"gr_jax/{name}/{next(_DECISION_IDS)}"
        self._client = client
        self.process_index = jax.process_index() if process_index is None else process_index
        self.process_count = jax.process_count() if process_count is None else process_count
        self._posted: collections.deque[str] = collections.deque()

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = partitioning.distributed_client()
        return self._client

    def __call__(self, step: int, decide: Callable[[], bool]) -> bool:
        if self.process_count == 1:
            return decide()
        key = f"{self.prefix}/{step}"
        if self.process_index != 0:
            return self.client.blocking_key_value_get(key, _DECISION_TIMEOUT_MS) == "1"
        decision = bool(decide())
        self.client.key_value_set(key, "1" if decision else "0", allow_overwrite=True)
        self._posted.append(key)
        if len(self._posted) > _DECISIONS_KEPT:
            self.client.key_value_delete(self._posted.popleft())
        return decision


class SaveCheckpoint(Action):
    """Saves the state, its input position and, for a checkpointable input (the seqio pipeline), the input
    iterator's state every `every_steps` steps, at the last step, and where training stopped early (a checkpoint
    is never written twice for one step).

    With `every_seconds`, also at the first step that ends `every_seconds` or more after the previous save (or the
    run's start): a step count alone cannot bound the work a kill loses when a step takes milliseconds in one run
    and 35 s in another; this bounds it by about `every_seconds` plus one step. The wall-clock decision is process
    0's, shared with the others (`ProcessZeroDecides`), so all save at the same step; a save at any step resumes
    exactly, as the input position (and iterator state) of that step is saved with it. `clock`: seconds, monotonic;
    `decider`: who takes the wall-clock decision (default: process 0 for all).
    """

    def __init__(self, *, every_steps: int, every_seconds: Optional[float] = None,
                 clock: Callable[[], float] = time.monotonic, decider: Optional[ProcessZeroDecides] = None):
        if every_steps < 1:
            raise ValueError(f"checkpoint every_steps must be >= 1, got {every_steps}")
        if every_seconds is not None and (isinstance(every_seconds, bool) or not every_seconds > 0):
            raise ValueError(f"checkpoint every_seconds must be > 0 or None, got {every_seconds!r}")
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.clock = clock
        self.last_save = clock()
        self.decider = None if every_seconds is None else decider or ProcessZeroDecides("save_checkpoint")

    def start(self, run):
        self.last_save = self.clock()  # the run's start: what a kill before the first save would lose
        return False

    def due(self, step, *, last):
        if super().due(step, last=last):
            return True
        every_seconds = self.every_seconds
        if self.decider is None or every_seconds is None:  # no decider without every_seconds
            return False
        return self.decider(step, lambda: self.clock() - self.last_save >= every_seconds)

    def __call__(self, run, progress):
        run.built.checkpointer.save(progress.step, state=run.built.checkpoint_state(progress.state),
                                    input_state=run.input_state(progress.step),
                                    input_iterator=run.checkpointable_input())
        self.last_save = self.clock()
        return False

    def end(self, run, progress):
        run.built.checkpointer.save(progress.step, state=run.built.checkpoint_state(progress.state),
                                    input_state=run.input_state(progress.step),
                                    input_iterator=run.checkpointable_input(), force=True)
        run.built.checkpointer.wait_until_finished()


def evaluate_retrieval(run: TrainingRun, *, retriever: ParametricRetriever, evaluator: RetrievalEvaluator, split: str,
                       step: int, params: Any, prefix: str) -> dict[str, float]:
    """Ranks the split with `params` (`retriever.with_params`: a generative retriever's compiled decoding reused, a
    dense one's corpus encoded again); writes `{prefix}/*` scalars and `run.{split}.{step}.trec`; returns the
    metrics."""
    metrics, ranked = evaluator.evaluate(retriever.with_params(params))
    run.writer.write_scalars(step, {f"{prefix}/{k}": v for k, v in metrics.items()})
    if partitioning.is_primary_process():
        write_trec_run(run.run_dir.trec_run(split, step), ranked, tag=f"gr_jax-{step}")
    return metrics  # the writer logged them


class EvaluateRetrieval(Action):
    """Ranks the eval split every `every_steps` steps (0: only at the end) and, once training ends, with the
    final state (or the one `reported` chooses), whose metrics are the run's `eval/*` report.

    kept_at: `(retriever, *, step) -> retriever` for the reported checkpoint's step (`BuiltRun.retriever_kept_at`):
    what the final ranking builds for those parameters (a dense run's corpus index) stays in the run dir, where
    `gr_jax.eval` of that step reuses it. None: nothing kept. reported: `(run) -> (step, params) or None`, the state
    the final ranking reports instead of the last one (model selection's best: `SelectModel.best_state`)."""

    every_steps: int  # set (0: only at the end), never None

    def __init__(self, *, retriever: ParametricRetriever, evaluator: RetrievalEvaluator, split: str,
                 every_steps: int = 0, kept_at: Optional[Callable[..., ParametricRetriever]] = None,
                 reported: Optional[Callable[[TrainingRun], Optional[tuple[int, Any]]]] = None):
        self.retriever = retriever
        self.evaluator = evaluator
        self.split = split
        self.every_steps = every_steps
        self.kept_at = kept_at
        self.reported = reported
        self.found: dict[str, float] = {}

    def due(self, step, *, last):
        return self.every_steps > 0 and step % self.every_steps == 0 and not last  # the last: `end`

    def _evaluate(self, run: TrainingRun, step: int, params: Any) -> None:
        metrics = evaluate_retrieval(run, retriever=self.retriever, evaluator=self.evaluator, split=self.split,
                                     step=step, params=params, prefix="eval")
        self.found.update({f"eval/{k}": v for k, v in metrics.items()})

    def __call__(self, run, progress):
        self._evaluate(run, progress.step, progress.state.params)
        return False

    def end(self, run, progress):
        chosen = self.reported(run) if self.reported is not None else None
        step, params = chosen or (progress.step, progress.state.params)
        if self.kept_at is not None:
            self.retriever = self.kept_at(self.retriever, step=step)
        self._evaluate(run, step, params)

    def report(self):
        return dict(self.found)


@dataclasses.dataclass
class ModelSelection:
    """Model selection's record, kept in `model_dir/selection.json` so that a resumed run goes on with it.

    history: (step, value of `metric` on `split`) per selection evaluation; best_step / best_value: the
    state kept in `model_dir/best/`; patience: evaluations without improvement that stop training (None: never).
    """
    path: pathlib.Path
    split: str
    metric: str
    patience: Optional[int] = None
    history: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    best_step: Optional[int] = None
    best_value: float = -math.inf

    @classmethod
    def load(cls, path: pathlib.Path, *, split: str, metric: str, resumed_step: int,
             patience: Optional[int] = None) -> ModelSelection:
        """A fresh record, or the saved one with the evaluations after `resumed_step` (the checkpoint the run
        resumes from) dropped, since the run will redo them; the best state on disk stays the best."""
        if not path.exists():
            return cls(path=path, split=split, metric=metric, patience=patience)
        saved = json.loads(path.read_text())
        if (saved["split"], saved["metric"]) != (split, metric):
            raise ValueError(f"{path} selects on {saved['metric']} of split {saved['split']!r}, this run on "
                             f"{metric} of {split!r}: use a new model_dir, or delete {path} and {path.parent}/best")
        history = [(int(step), float(value)) for step, value in saved["history"] if step <= resumed_step]
        best_step = saved["best_step"]
        return cls(path=path, split=split, metric=metric, patience=patience, history=history, best_step=best_step,
                   best_value=-math.inf if best_step is None else float(saved["best_value"]))

    @property
    def evaluations_since_best(self) -> int:
        return sum(step > (self.best_step or 0) for step, _ in self.history)

    @property
    def stopped(self) -> bool:
        """Patience ran out: training ends (and a resumed run, whose history is the same, stays ended)."""
        return self.patience is not None and self.evaluations_since_best >= self.patience

    def record(self, step: int, value: float) -> bool:
        """Adds an evaluation; returns whether it is a new best (ties keep the earlier state)."""
        self.history.append((step, value))
        improved = value > self.best_value
        if improved:
            self.best_step, self.best_value = step, value
        return improved

    def save(self) -> None:
        if not partitioning.is_primary_process():
            return
        self.path.write_text(json.dumps({"split": self.split, "metric": self.metric, "best_step": self.best_step,
                                         "best_value": self.best_value, "stopped": self.stopped,
                                         "history": self.history}, indent=1))


class SelectModel(Action):
    """Model selection and early stopping on a held-out split: every `every_steps` steps and at the last step the
    state ranks `evaluator`'s split; the best by `metric` is kept in `model_dir/best/`; training stops after
    `patience` evaluations without improvement; and the final evaluation ranks with the best state (`best_state`,
    given to it as its `reported`)."""

    def __init__(self, *, retriever: ParametricRetriever, evaluator: RetrievalEvaluator, split: str, metric: str,
                 every_steps: int, patience: Optional[int] = None):
        if every_steps < 1:
            raise ValueError(f"model selection needs periodic evaluation (every_steps > 0), got {every_steps}")
        self.retriever = retriever
        self.evaluator = evaluator
        self.split = split
        self.metric = metric
        self.every_steps = every_steps
        self.patience = patience
        self.selection: Optional[ModelSelection] = None
        self.best: Optional[checkpoints.Checkpointer] = None
        self.stopped_at: Optional[int] = None
        self._best_params: Optional[tuple[int, Any]] = None

    def start(self, run):
        self.selection = ModelSelection.load(run.run_dir.selection, split=self.split, metric=self.metric,
                                             resumed_step=run.start_step, patience=self.patience)
        self.best = checkpoints.Checkpointer(run.run_dir.best, max_to_keep=1, asynchronous=False)
        return self.selection.stopped

    def __call__(self, run, progress):
        metrics = evaluate_retrieval(run, retriever=self.retriever, evaluator=self.evaluator, split=self.split,
                                     step=progress.step, params=progress.state.params, prefix="select")
        if self.metric not in metrics:
            raise KeyError(f"select_metric {self.metric!r} is not an evaluation metric: {sorted(metrics)}")
        selection, best = self.selection, self.best
        if selection is None or best is None:
            raise RuntimeError("SelectModel was called before its start(): no selection record or best checkpointer")
        if selection.record(progress.step, metrics[self.metric]):
            best.save(progress.step, state=run.built.checkpoint_state(progress.state),
                      input_state={"selected_on": self.split}, force=True)
        selection.save()
        if selection.stopped:
            logger.info("early stop at step %d: no better %s on %s for %d evaluations (best: step %d)", progress.step,
                        self.metric, self.split, self.patience, selection.best_step)
        return selection.stopped

    def best_state(self, run: TrainingRun) -> Optional[tuple[int, Any]]:
        """(step, params) of the best state kept in `model_dir/best/` (read once per best step), or None before any
        selection evaluation."""
        selection = self.selection
        if selection is None or selection.best_step is None or self.best is None:
            return None
        if self._best_params is None or self._best_params[0] != selection.best_step:
            params = run.built.read_params(self.best, selection.best_step)
            self._best_params = (selection.best_step, params)
        return self._best_params

    def end(self, run, progress):
        self.stopped_at = progress.step

    def report(self):
        selection = self.selection
        if selection is None or selection.best_step is None:
            return {}
        return {"select/best_step": selection.best_step, f"select/best_{selection.metric}": selection.best_value,
                "select/stopped_at": self.stopped_at}


def evaluation_actions(settings: EvalConfig, built: BuiltRun, *, show_progress: bool = False) -> list[Action]:
    """The evaluation actions `settings` ask for: none, the eval split's, or model selection and the final
    evaluation, sharing one retriever (one trie, one compiled decoding)."""
    if settings.every_steps < 0:
        return []
    retriever = built.retriever(settings=settings, show_progress=show_progress)
    split = built.experiment.dataset.eval_split

    def evaluator(split: str, setting: str = EVAL_SPLIT_SETTING) -> RetrievalEvaluator:
        """The split's first `max_queries` queries, ranked `depth` deep (`setting`: what picks the split)."""
        return built.evaluator(split=split, k=settings.depth, max_queries=settings.max_queries, setting=setting)

    if settings.select_split is None:
        return [EvaluateRetrieval(retriever=retriever, evaluator=evaluator(split), split=split,
                                  every_steps=settings.every_steps, kept_at=built.retriever_kept_at)]
    select = SelectModel(retriever=retriever, evaluator=evaluator(
                             settings.select_split, setting="--gin.training.EvalConfig.select_split"),
                         split=settings.select_split, metric=settings.select_metric, every_steps=settings.every_steps,
                         patience=settings.patience)
    final = EvaluateRetrieval(retriever=retriever, evaluator=evaluator(split), split=split, every_steps=0,
                              kept_at=built.retriever_kept_at, reported=select.best_state)
    return [select, final]
