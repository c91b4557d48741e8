"""The training loop: a flat loop over train steps that calls periodic actions (`gr_jax.actions`).

Every argument is a plain keyword: gin binds them at the entry point (`python -m gr_jax.train`), never here.
Resuming restores the latest checkpoint *and* the number of batches consumed, and the input pipeline restarts
exactly there, so after a restart no training example is skipped or repeated: the seqio pipeline from the tf.data
iterator state saved with that checkpoint (`restore_input`, time independent of the step), the host-made sources
by addressing the batch directly.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import pathlib
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any, Optional

import jax
import numpy as np
import tqdm

from gr_jax import checkpoints
from gr_jax import logs
from gr_jax import metric_writers
from gr_jax import partitioning
from gr_jax.actions import (Action, SaveCheckpoint, StopOnNonFiniteLoss, TrainingProgress, TrainingRun,
                            WriteTrainMetrics, evaluation_actions)
from gr_jax.evaluation import write_trec_run
from gr_jax.family import BuiltRun, ModelFamily, TrainingSetup
# gin names the retrieval settings `training.EvalConfig` (the gin files, every run's config.gin): one class, two names.
from gr_jax.retrievers.settings import EvalConfig
from gr_jax.run_dir import RunDir, write_json
from gr_jax.trainer import summarize_steps

logger = logging.getLogger(__name__)


def initial_state(built: BuiltRun) -> tuple[Any, int, Optional[int]]:
    """(train state, batches consumed, the checkpoint step whose saved input iterator state continues the input or
    None): the newest intact checkpoint's (`resume_position`; newer damaged ones are moved aside with a warning), or a
    fresh state (`built.init_state()`) at batch 0."""
    latest = built.checkpointer.newest_intact_step()
    if latest is None:
        return built.init_state(), 0, None
    state, input_state = built.restore(latest)  # checks the saved input fingerprint
    start_batch, same_batches = resume_position(input_state, experiment=built.experiment,
                                                where=f"{built.checkpointer.directory / str(latest)}")
    logger.info("resumed from step %d (batch %d)", latest, start_batch)
    return state, start_batch, latest if same_batches else None


def resume_position(input_state: Mapping[str, Any], *, experiment: TrainingSetup, where: str) -> tuple[int, bool]:
    """(the batch this run resumes at, whether the saved input iterator state applies) from a checkpoint's input
    state: never a position that is not where the saved run stopped. Another seed is another example stream, with
    no such position: an error. Another global batch size resumes at the same example (re-reading the input, with a
    warning) when the examples consumed fill whole new batches, else is an error. Older checkpoints do not record
    the batch size: it is taken as unchanged."""
    consumed = int(input_state["batches_consumed"])
    saved_seed = input_state.get("seed")
    if saved_seed is not None and saved_seed != experiment.seed:
        raise ValueError(f"{where}: the run consumed {consumed} batches of the seed-{saved_seed} example stream; this "
                         f"run's seed is {experiment.seed}, whose stream has no place to continue it. Set the seed "
                         f"back to {saved_seed}, or train in a new model_dir (Experiment.init_checkpoint can start it "
                         f"from this run)")
    saved_batch = input_state.get("batch_size")
    if saved_batch is None or saved_batch == experiment.batch_size:
        return consumed, True
    examples = consumed * int(saved_batch)
    if examples % experiment.batch_size:
        raise ValueError(f"{where}: the run consumed {consumed} batches of {saved_batch} examples ({examples}), not a "
                         f"whole number of this run's batches of {experiment.batch_size}: no batch starts where it "
                         f"stopped. Resume with batch_size={saved_batch} (or a divisor of {examples})")
    start = examples // experiment.batch_size
    logger.warning("%s: the global batch size changed from %s to %d; resuming at batch %d (the same example, "
                   "%d) by re-reading the input, since the saved iterator state is for batches of %s", where,
                   saved_batch, experiment.batch_size, start, examples, saved_batch)
    return start, False


def restore_input(run: TrainingRun, batches: Iterator) -> None:
    """Puts a checkpointable input (`checkpoints.CheckpointableInput`: the seqio pipeline) where the checkpoint
    the run resumed from left it, from the iterator state saved with it, in time independent of the step. A
    checkpoint without that state (saved before gr_jax kept one) leaves the input to re-read its consumed batches:
    exact too, with a warning, as it takes time linear in the step. Other inputs (dense, GDR and host-made sources)
    start at `run.start_batch` themselves: they address batch b directly, in time independent of b."""
    if run.input_checkpoint is None or not isinstance(batches, checkpoints.CheckpointableInput):
        return
    checkpointer = run.built.checkpointer
    if not checkpointer.has_input_iterator(run.input_checkpoint):
        logger.warning("checkpoint %d in %s has no input iterator state (saved before gr_jax kept one): resuming "
                       "the input by re-reading the %d batches it consumed, in time linear in the step",
                       run.input_checkpoint, checkpointer.directory, run.start_batch)
        return
    checkpointer.restore_input_iterator(run.input_checkpoint, input_iterator=batches)


def example_fingerprints(batch: Mapping[str, Any]) -> list[str]:
    """One short hash per row of a batch: every feature's bytes of that row (features in name order), so two runs
    trained on the same examples in the same order record the same strings."""
    arrays = [np.asarray(batch[name]) for name in sorted(batch)]
    return [hashlib.sha256(b"".join(a[row].tobytes() for a in arrays)).hexdigest()[:16]
            for row in range(len(arrays[0]))]


def training_loop(*, run: TrainingRun, state: Any, num_train_steps: int, actions: Sequence[Action],
                  report_every_steps: int, progress: bool = True,
                  record_examples: bool = False) -> tuple[Any, dict[str, float]]:
    """Steps the trainer until `num_train_steps` or until an action stops it; returns (state, the run's report).

    Reports (see `gr_jax.actions`) at every `report_every_steps`-th step, the last step, and wherever an action
    with a period is due. `record_examples` appends `{"step": s, "examples": example_fingerprints(batch)}` per step
    to `model_dir/train_examples-{process}-of-{count}.jsonl` (flushed each step), to check which examples a run
    trained on in which order, e.g. across restarts (steps re-run after a restart appear again: the last record
    of a step is the one the final state saw).
    """
    built, experiment = run.built, run.built.experiment
    batches = built.train_batches(start_batch=run.start_batch)
    restore_input(run, batches)
    run = dataclasses.replace(run, batches=batches)  # what the actions read: the input whose state checkpoints save
    record = None
    if record_examples:
        path = run.run_dir.examples_record(process=jax.process_index(), count=jax.process_count())
        record = open(path, "a+")
        if record.tell():
            record.seek(record.tell() - 1)
            if record.read(1) != "\n":
                record.write("\n")  # a line cut by a killed run stays alone on its line
    tokens_per_batch = built.tokens_per_batch
    rng = jax.random.PRNGKey(experiment.seed + 1)
    step = run.start_step
    stop = any([action.start(run) for action in actions])  # every action starts, even when one stops the run
    pending: list[Mapping[str, Any]] = []
    last_report = time.perf_counter()
    # The bar counts computed steps, not dispatched ones (its rate and ETA would otherwise show the dispatch rate,
    # then wait): each step's result is waited for once the next step is dispatched, so one step stays in flight.
    bar = tqdm.tqdm(total=num_train_steps, initial=step, desc="train", unit="step", disable=not progress)
    in_flight = None
    try:
        while step < num_train_steps and not stop:
            batch = next(batches)
            state, metrics = built.trainer.train_step(state, batch, rng)
            step += 1
            if record is not None:
                record.write(json.dumps({"step": step, "examples": example_fingerprints(batch)}) + "\n")
                record.flush()
            pending.append(metrics)
            if in_flight is not None:
                jax.block_until_ready(in_flight)
                bar.update(1)
            in_flight = metrics
            last = step == num_train_steps
            due = [action for action in actions if action.due(step, last=last)]
            if not (last or step % report_every_steps == 0 or any(a.every_steps is not None for a in due)):
                continue
            now = time.perf_counter()
            summary = summarize_steps(pending, seconds=max(now - last_report, 1e-9),
                                      tokens_per_batch=tokens_per_batch)  # fetches every pending step's result
            pending, last_report, in_flight = [], now, None
            bar.update(1)
            if summary:  # the loss, and an accuracy where the loss reports one
                accuracy = summary.get("token_accuracy", summary.get("sequence_accuracy"))
                shown = {"loss": f"{summary['loss']:.3f}"}
                if accuracy is not None:
                    shown["acc"] = f"{accuracy:.3f}"
                bar.set_postfix(**shown)
            report = TrainingProgress(step=step, state=state, summary=summary, last=last)
            for action in due:
                stop = action(run, report) or stop
        if in_flight is not None:  # stopped between reports
            jax.block_until_ready(in_flight)
            bar.update(1)
        final = TrainingProgress(step=step, state=state, summary={}, last=True)
        for action in actions:
            action.end(run, final)
    finally:
        if isinstance(batches, Generator):  # a host-made input's prefetching thread stops here, not at exit
            batches.close()
        if record is not None:
            record.close()
        bar.close()
        built.checkpointer.wait_until_finished()
        run.writer.flush()
    found: dict[str, float] = {}
    for action in actions:  # what each action found, after every action ended
        found.update(action.report())
    return state, found


def train(*, experiment: ModelFamily, num_train_steps: int, checkpoint_every_steps: int = 1000,
          checkpoint_every_seconds: Optional[float] = 300.0,
          keep_checkpoints: int = 3, log_every_steps: int = 50, eval_config: EvalConfig = EvalConfig(),
          actions: Sequence[Action] = (), gin_config_str: str = "", progress: bool = True,
          record_examples: bool = False) -> dict[str, float]:
    """Trains until `num_train_steps` (resuming from the experiment's model_dir); returns the final metrics.

    The loop's actions, in order: the non-finite loss guard, the train metric writer, checkpoints every
    `checkpoint_every_steps` and at the first step `checkpoint_every_seconds` after the previous save (None: by
    steps only; a kill loses at most about that long plus a step, whatever a step costs), `eval_config`'s
    evaluation (and model selection), then `actions` (new objectives' evaluations, e.g. from gin:
    `training.train.actions = [...]`). `record_examples` (off by default; gin: `training.train.record_examples =
    True`) writes each step's example fingerprints (see `training_loop`).
    """
    for name, value, least in (("num_train_steps (TRAIN_STEPS)", num_train_steps, 0),
                               ("checkpoint_every_steps", checkpoint_every_steps, 1),
                               ("log_every_steps", log_every_steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"training.train.{name} must be a whole number >= {least}, got {value!r}")
    if checkpoint_every_seconds is not None and (isinstance(checkpoint_every_seconds, bool) or not isinstance(
            checkpoint_every_seconds, (int, float)) or not checkpoint_every_seconds > 0):
        raise ValueError(f"training.train.checkpoint_every_seconds must be a number > 0 or None, got "
                         f"{checkpoint_every_seconds!r}")
    run_dir = RunDir.of(experiment.model_dir, process=jax.process_index())
    run_dir.path.mkdir(parents=True, exist_ok=True)
    with logs.run_log(run_dir.log(run_dir.process)) as log:
        return _train(experiment=experiment, run_dir=run_dir, log=log, num_train_steps=num_train_steps,
                      checkpoint_every_steps=checkpoint_every_steps,
                      checkpoint_every_seconds=checkpoint_every_seconds, keep_checkpoints=keep_checkpoints,
                      log_every_steps=log_every_steps, eval_config=eval_config, actions=actions,
                      gin_config_str=gin_config_str, progress=progress, record_examples=record_examples)


def _train(*, experiment: ModelFamily, run_dir: RunDir, log: pathlib.Path, num_train_steps: int,
           checkpoint_every_steps: int, checkpoint_every_seconds: Optional[float], keep_checkpoints: int,
           log_every_steps: int, eval_config: EvalConfig,
           actions: Sequence[Action], gin_config_str: str, progress: bool, record_examples: bool) -> dict[str, float]:
    built = experiment.build(keep_checkpoints=keep_checkpoints)
    logger.info("model: %s parameters; the full log is in %s", f"{built.trainer.param_count():,}", log)
    logger.info("model: %s", getattr(built.model, "config", built.model), extra=logs.FILE_ONLY)
    if gin_config_str:
        run_dir.write_config(gin_config_str)
    run_dir.check_start(seed=built.experiment.seed, init_checkpoint=built.init_checkpoint())
    run_dir.write_start(seed=built.experiment.seed, init_checkpoint=built.init_checkpoint(),
                        frozen=built.trainer.frozen)
    state, start_batch, input_checkpoint = initial_state(built)
    run = TrainingRun(built=built, writer=metric_writers.create_writer(run_dir.path),
                      start_step=int(jax.device_get(state.step)), start_batch=start_batch,
                      input_checkpoint=input_checkpoint)
    if gin_config_str and run.start_step == 0:
        run.writer.write_texts(0, {"config": gin_config_str})
    all_actions = [StopOnNonFiniteLoss(), WriteTrainMetrics(),
                   SaveCheckpoint(every_steps=checkpoint_every_steps, every_seconds=checkpoint_every_seconds),
                   *evaluation_actions(eval_config, built, show_progress=progress), *actions]
    _, report = training_loop(run=run, state=state, num_train_steps=num_train_steps, actions=all_actions,
                              report_every_steps=log_every_steps, progress=progress, record_examples=record_examples)
    report = run_dir.write_final_metrics(report)
    logger.info("step %d: final metrics in %s, checkpoints in %s", built.checkpointer.latest_step() or 0,
                run_dir.final_metrics, run_dir.checkpoints)
    return report


def evaluate(*, experiment: ModelFamily, eval_config: EvalConfig = EvalConfig(), step: Optional[int] = None,
             progress: bool = True) -> dict[str, float]:
    """Evaluates a checkpoint on the run's eval split (gin: EVAL_SPLIT); writes `run.{split}.{step}.trec` and
    `eval.{split}.{step}.json`."""
    built = experiment.build()
    params, step = built.restore_params(step)
    run_dir = RunDir.of(experiment.model_dir)
    with logs.run_log(run_dir.log(jax.process_index())):  # a run's directory: it has a checkpoint
        split = experiment.dataset.eval_split
        evaluator = built.evaluator(split=split, k=eval_config.depth, max_queries=eval_config.max_queries)
        metrics, run = evaluator.evaluate(
            built.retriever(params, settings=eval_config, show_progress=progress, step=step))
        if partitioning.is_primary_process():
            write_trec_run(run_dir.trec_run(split, step), run, tag=f"gr_jax-{step}")
            write_json(run_dir.eval_metrics(split, step), metrics)
    return metrics
