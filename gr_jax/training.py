"""The training loop: a flat loop over train steps that calls periodic actions (`gr_jax.actions`).

Every argument is a plain keyword: gin binds them at the entry point (`python -m gr_jax.train`), never here.
Resuming restores the latest checkpoint *and* the number of batches consumed, and the input pipeline restarts
exactly there, so after a restart no training example is skipped or repeated.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import time
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import jax
import numpy as np
import tqdm

from gr_jax import metric_writers
from gr_jax import warm_start
from gr_jax.actions import (Action, EvaluateRetrieval, SaveCheckpoint, SelectModel, StopOnNonFiniteLoss,
                            TrainingProgress, TrainingRun, WriteTrainMetrics)
from gr_jax.data import pipeline
from gr_jax.evaluation import write_trec_run
from gr_jax.evaluator import RetrievalEvaluator
from gr_jax.experiment import Built, Experiment
from gr_jax.retrievers.generative import GenerativeRetriever
from gr_jax.trainer import summarize_metrics

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Retrieval evaluation during training: every_steps > 0 periodically, 0 only at the end, -1 never.

    num_beams: the beams of the search and the depth of the ranking; batch_size: queries decoded at once;
    constrained: decode through the docid trie; max_queries: rank only the split's first queries.

    Model selection (early stopping on a held-out metric): with `select_split`, the periodic evaluations and
    one at the last step rank that split instead of the eval split; the state with the best `select_metric`
    is kept in `model_dir/best/`, training stops after `patience` evaluations without improvement (None:
    never), and the final evaluation ranks the eval split with that best state. Select on a split other than
    the one you report (e.g. WordNet's `valid`: definitions of documents without a training query).
    """
    every_steps: int = 0
    num_beams: int = 40
    constrained: bool = True
    batch_size: int = 32
    max_queries: Optional[int] = None
    select_split: Optional[str] = None
    select_metric: str = "MRR@10"
    patience: Optional[int] = None

    def __post_init__(self):
        if self.select_split is not None and self.every_steps <= 0:
            raise ValueError(f"select_split={self.select_split!r} needs periodic evaluation (every_steps > 0), "
                             f"got every_steps={self.every_steps}")
        if self.patience is not None and (self.select_split is None or self.patience < 1):
            raise ValueError(f"patience={self.patience} needs a select_split and must be >= 1")

    def retriever(self, built: Built, params: Any = None, *, show_progress: bool = False) -> GenerativeRetriever:
        """The run's model as a retriever with these decoding settings."""
        return built.retriever(params, batch_size=self.batch_size, num_beams=self.num_beams,
                               constrained=self.constrained, show_progress=show_progress)

    def evaluator(self, built: Built, split: str) -> RetrievalEvaluator:
        """The split's first `max_queries` queries, ranked `num_beams` deep."""
        return built.evaluator(split=split, k=self.num_beams, max_queries=self.max_queries)

    def actions(self, built: Built, *, show_progress: bool = False) -> list[Action]:
        """The evaluation actions of a run: none, the eval split's, or model selection and the final evaluation,
        sharing one retriever (one trie, one compiled decoding)."""
        if self.every_steps < 0:
            return []
        retriever = self.retriever(built, show_progress=show_progress)
        split = built.experiment.dataset.eval_split
        final = EvaluateRetrieval(retriever=retriever, evaluator=self.evaluator(built, split), split=split,
                                  every_steps=0 if self.select_split else self.every_steps)
        if self.select_split is None:
            return [final]
        select = SelectModel(retriever=retriever, evaluator=self.evaluator(built, self.select_split),
                             split=self.select_split, metric=self.select_metric, every_steps=self.every_steps,
                             patience=self.patience)
        return [select, final]


def initial_state(built: Built) -> tuple[Any, int]:
    """(train state, batches consumed): the latest checkpoint's, or a fresh state (from `init_checkpoint` if set)."""
    experiment, trainer, checkpointer = built.experiment, built.trainer, built.checkpointer
    latest = checkpointer.latest_step()
    if latest is not None:
        state, input_state = checkpointer.restore(latest, abstract_state=trainer.abstract_state)
        logger.info("resumed from step %d (batch %d)", latest, input_state["batches_consumed"])
        return state, int(input_state["batches_consumed"])
    state = trainer.init_state(jax.random.PRNGKey(experiment.seed))
    if experiment.init_checkpoint and warm_start.is_run_dir(experiment.init_checkpoint):
        state = warm_start.initialize_from_run(state=state, trainer=trainer, model_dir=experiment.init_checkpoint)
        logger.info("initialised from the run %s", experiment.init_checkpoint)
    elif experiment.init_checkpoint:
        from gr_jax import pretrained
        state = pretrained.initialize_from_pretrained(state=state, trainer=trainer,
                                                      checkpoint_dir=experiment.init_checkpoint)
        logger.info("initialised from %s", experiment.init_checkpoint)
    return state, 0


def summarize_steps(pending: Sequence[Mapping[str, Any]], *, seconds: float,
                    tokens_per_batch: int) -> dict[str, float]:
    """The training metrics of the steps since the last report: sums over steps (`summarize_metrics`), the last
    step's learning rate and gradient norm, and steps and tokens per second."""
    if not pending:
        return {}
    pending = jax.device_get(list(pending))
    total = {k: float(np.sum([m[k] for m in pending])) for k in pending[0]}
    total["learning_rate"] = float(pending[-1]["learning_rate"])
    total["grad_norm"] = float(pending[-1]["grad_norm"])
    summary = summarize_metrics(total)
    summary["steps_per_second"] = len(pending) / seconds
    summary["tokens_per_second"] = len(pending) * tokens_per_batch / seconds
    return summary


def training_loop(*, run: TrainingRun, state: Any, num_train_steps: int, actions: Sequence[Action],
                  report_every_steps: int, progress: bool = True) -> tuple[Any, dict[str, float]]:
    """Steps the trainer until `num_train_steps` or until an action stops it; returns (state, the run's report).

    Reports (see `gr_jax.actions`) at every `report_every_steps`-th step, the last step, and wherever an action
    with a period is due.
    """
    built, experiment = run.built, run.built.experiment
    dataset = experiment.dataset
    batches = pipeline.train_batches(
        mixture_or_task_name=dataset.mixture_name, batch_size=experiment.batch_size,
        input_length=dataset.input_length, target_length=dataset.target_length, seed=experiment.seed,
        start_batch=run.start_batch, shard_index=jax.process_index(), num_shards=jax.process_count())
    tokens_per_batch = experiment.batch_size * (dataset.input_length + dataset.target_length)
    rng = jax.random.PRNGKey(experiment.seed + 1)
    step = run.start_step
    stop = any([action.start(run) for action in actions])  # every action starts, even when one stops the run
    pending: list[Mapping[str, Any]] = []
    last_report = time.perf_counter()
    bar = tqdm.tqdm(total=num_train_steps, initial=step, desc="train", unit="step", disable=not progress)
    try:
        while step < num_train_steps and not stop:
            state, metrics = built.trainer.train_step(state, next(batches), rng)
            step += 1
            pending.append(metrics)
            bar.update(1)
            last = step == num_train_steps
            due = [action for action in actions if action.due(step, last=last)]
            if not (last or step % report_every_steps == 0 or any(a.every_steps is not None for a in due)):
                continue
            now = time.perf_counter()
            summary = summarize_steps(pending, seconds=max(now - last_report, 1e-9),
                                      tokens_per_batch=tokens_per_batch)
            pending, last_report = [], now
            if summary:
                bar.set_postfix(loss=f"{summary['loss']:.3f}", acc=f"{summary['token_accuracy']:.3f}")
            report = TrainingProgress(step=step, state=state, summary=summary, last=last)
            for action in due:
                stop = action(run, report) or stop
        final = TrainingProgress(step=step, state=state, summary={}, last=True)
        for action in actions:
            action.end(run, final)
    finally:
        bar.close()
        built.checkpointer.wait_until_finished()
        run.writer.flush()
    return state, run.report


def train(*, experiment: Experiment, num_train_steps: int, checkpoint_every_steps: int = 1000,
          keep_checkpoints: int = 3, log_every_steps: int = 50, eval_config: EvalConfig = EvalConfig(),
          actions: Sequence[Action] = (), gin_config_str: str = "", progress: bool = True) -> dict[str, float]:
    """Trains until `num_train_steps` (resuming from the experiment's model_dir); returns the final metrics.

    The loop's actions, in order: the non-finite loss guard, the train metric writer, checkpoints every
    `checkpoint_every_steps`, `eval_config`'s evaluation (and model selection), then `actions` (new objectives'
    evaluations, e.g. from gin: `training.train.actions = [...]`).
    """
    model_dir = pathlib.Path(experiment.model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    built = experiment.build(keep_checkpoints=keep_checkpoints)
    logger.info("model: %s, %d parameters", built.model.config, built.trainer.param_count())
    if gin_config_str:
        (model_dir / "config.gin").write_text(gin_config_str)
    state, start_batch = initial_state(built)
    run = TrainingRun(built=built, writer=metric_writers.create_writer(model_dir),
                      start_step=int(jax.device_get(state.step)), start_batch=start_batch)
    if gin_config_str and run.start_step == 0:
        run.writer.write_texts(0, {"config": gin_config_str})
    all_actions = [StopOnNonFiniteLoss(), WriteTrainMetrics(), SaveCheckpoint(every_steps=checkpoint_every_steps),
                   *eval_config.actions(built, show_progress=progress), *actions]
    _, report = training_loop(run=run, state=state, num_train_steps=num_train_steps, actions=all_actions,
                              report_every_steps=log_every_steps, progress=progress)
    (model_dir / "final_metrics.json").write_text(json.dumps(report, indent=1))
    return report


def evaluate(*, experiment: Experiment, eval_config: EvalConfig = EvalConfig(), split: Optional[str] = None,
             step: Optional[int] = None, progress: bool = True) -> dict[str, float]:
    """Evaluates a checkpoint on a split's queries; writes `run.{split}.{step}.trec` and `eval.{split}.{step}.json`."""
    built = experiment.build()
    params, step = built.restore_params(step)
    split = split or experiment.dataset.eval_split
    metrics, run = eval_config.evaluator(built, split).evaluate(
        eval_config.retriever(built, params, show_progress=progress))
    model_dir = pathlib.Path(experiment.model_dir)
    write_trec_run(model_dir / f"run.{split}.{step}.trec", run, tag=f"gr_jax-{step}")
    (model_dir / f"eval.{split}.{step}.json").write_text(json.dumps(metrics, indent=1))
    return metrics
