"""The training loop: data, sharded state, checkpoints with the input position, metrics, periodic evaluation.

Every argument is a plain keyword: gin binds them at the entry point (`python -m gr_jax.train`), never here.
Resuming restores the latest checkpoint *and* the number of batches consumed, and the input pipeline restarts
exactly there, so after a restart no training example is skipped or repeated.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
import time
from typing import Any, Callable, Optional

import jax
import numpy as np
import optax
import tqdm

from gr_jax import checkpoints
from gr_jax import metric_writers
from gr_jax import network
from gr_jax import optimizers
from gr_jax import partitioning
from gr_jax import warm_start
from gr_jax.data import pipeline
from gr_jax.data.readers import open_dataset
from gr_jax.evaluation import write_trec_run
from gr_jax.evaluator import RetrievalEvaluator
from gr_jax.models import EncoderDecoderModel
from gr_jax.trainer import Trainer, summarize_metrics
from gr_jax.vocabulary import load_vocabulary

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DatasetConfig:
    """Which data dir, which study row (mixture) and which docid scheme to train on."""
    name: str
    data_dir: str
    row: str = "firstp_labeled"
    docid_scheme: str = "naive"
    eval_split: str = "dev"
    input_length: int = 64
    target_length: int = 16
    vocabulary_path: Optional[str] = None  # default {data_dir}/spm.model; a pretrained spiece.model works too
    # Document representations (see tasks.register_dataset): DaQ chunks, D2Q synthetic queries.
    daq_num_chunks: int = 10
    daq_seed: int = 0
    d2q_path: Optional[str] = None  # default {data_dir}/d2q.tsv when it exists
    d2q_queries_per_passage: int = 10
    d2q_selection: str = "first"
    d2q_seed: int = 0

    @property
    def vocabulary_file(self) -> pathlib.Path:
        return pathlib.Path(self.vocabulary_path or pathlib.Path(self.data_dir) / "spm.model")

    def register(self) -> list[str]:
        import tasks  # Registers seqio tasks; imported lazily so the library does not require the tasks package.
        return tasks.register_dataset(name=self.name, data_dir=self.data_dir, docid_scheme=self.docid_scheme,
                                      input_length=self.input_length, target_length=self.target_length,
                                      vocabulary_path=self.vocabulary_path, daq_num_chunks=self.daq_num_chunks,
                                      daq_seed=self.daq_seed, d2q_path=self.d2q_path,
                                      d2q_queries_per_passage=self.d2q_queries_per_passage,
                                      d2q_selection=self.d2q_selection, d2q_seed=self.d2q_seed)

    @property
    def mixture_name(self) -> str:
        import tasks
        return tasks.mixture_name(name=self.name, row=self.row, docid_scheme=self.docid_scheme)

    def target_vocab_size(self) -> int:
        """Token ids the targets use (2D semantic and atomic docids go past the SentencePiece pieces)."""
        import tasks
        return tasks.docid_vocab_size(name=self.name, docid_scheme=self.docid_scheme)

    def docid_token_range(self) -> Optional[tuple[int, int]]:
        """[start, stop) of the docid token ids: the output range of an atomic head or a PAWA decoder."""
        import tasks
        return tasks.docid_token_range(name=self.name, docid_scheme=self.docid_scheme)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Retrieval evaluation during training: every_steps > 0 periodically, 0 only at the end, -1 never.

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
             patience: Optional[int] = None) -> "ModelSelection":
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
        self.path.write_text(json.dumps({"split": self.split, "metric": self.metric, "best_step": self.best_step,
                                         "best_value": self.best_value, "stopped": self.stopped,
                                         "history": self.history}, indent=1))


class NonFiniteLossError(FloatingPointError):
    """A training metric became NaN/inf; nothing after the last good checkpoint was saved."""


def build_model(*, config: network.T5Config, vocabulary: Any, z_loss: float = 1e-4, docid_vocab_size: int = 0,
                docid_token_range: Optional[tuple[int, int]] = None) -> EncoderDecoderModel:
    """Sizes the vocabulary from the SentencePiece model and the docid scheme (2D semantic and atomic docids use
    token ids after the SentencePiece pieces), unless gin fixed it; a too-small fixed size is an error.

    An atomic head or PAWA decoder left without its docid range (`docid_vocab_start`/`docid_vocab_size` None, as
    the decoder gins leave it) covers the docid table's tokens, `docid_token_range` = [start, stop); a range fixed
    in gin must contain them.
    """
    if config.decoder_head in ("atomic", "pawa") and docid_token_range is not None:
        start, stop = docid_token_range
        if config.docid_vocab_start is None:
            config = dataclasses.replace(config, docid_vocab_start=start, docid_vocab_size=stop - start)
        elif not config.docid_vocab_start <= start < stop <= config.docid_vocab_start + config.docid_vocab_size:
            raise ValueError(f"the docid tokens [{start}, {stop}) are outside the {config.decoder_head} head's range "
                             f"[{config.docid_vocab_start}, {config.docid_vocab_start + config.docid_vocab_size}) "
                             "set in gin (DOCID_VOCAB_START, DOCID_VOCAB_SIZE); leave those unset to fill them "
                             "from the docid table")
    config.check_docid_range()
    needed = max(vocabulary.vocab_size, docid_vocab_size)
    if config.vocab_size is None:
        config = config.with_vocab_size(needed)
    elif config.vocab_size < needed:
        raise ValueError(f"T5Config.vocab_size={config.vocab_size} is smaller than the {needed} token ids the "
                         f"vocabulary ({vocabulary.vocab_size} pieces) and docids need")
    return EncoderDecoderModel(config=config, z_loss=z_loss)


@dataclasses.dataclass(frozen=True)
class Experiment:
    """What a run is: data, network, optimizer, batch and mesh. Train, eval and search build the same one from
    the same gin (training writes it to `model_dir/config.gin`), so their states and shardings agree."""
    model_dir: str
    dataset: DatasetConfig
    network_config: network.T5Config
    learning_rate: optax.Schedule
    optimizer_factory: Callable[..., optax.GradientTransformation] = optimizers.make_optimizer
    batch_size: int = 32
    num_microbatches: int = 1
    seed: int = 0
    z_loss: float = 1e-4
    mesh_data: int = -1
    mesh_model: int = 1
    # A Hugging Face T5.1.1 dir (config.json + safetensors), as the study, or a gr_jax model dir (e.g. continued
    # span-corruption pretraining on the corpus, see gr_jax.warm_start): the run's parameters start from it.
    init_checkpoint: Optional[str] = None

    def build(self, *, keep_checkpoints: int = 3) -> "Built":
        """Registers the tasks, loads the vocabulary, and builds model, mesh and trainer (no allocation)."""
        self.dataset.register()
        vocabulary = load_vocabulary(self.dataset.vocabulary_file)
        model = build_model(config=self.network_config, vocabulary=vocabulary, z_loss=self.z_loss,
                            docid_vocab_size=self.dataset.target_vocab_size(),
                            docid_token_range=self.dataset.docid_token_range())
        mesh = partitioning.make_mesh(data=self.mesh_data, model=self.mesh_model)
        trainer = Trainer(model=model, optimizer=self.optimizer_factory(learning_rate=self.learning_rate),
                          mesh=mesh, input_length=self.dataset.input_length,
                          target_length=self.dataset.target_length, batch_size=self.batch_size,
                          num_microbatches=self.num_microbatches, learning_rate_fn=self.learning_rate)
        checkpointer = checkpoints.Checkpointer(pathlib.Path(self.model_dir) / "checkpoints",
                                                max_to_keep=keep_checkpoints)
        return Built(experiment=self, vocabulary=vocabulary, model=model, mesh=mesh, trainer=trainer,
                     checkpointer=checkpointer)


@dataclasses.dataclass
class Built:
    """An Experiment's live objects."""
    experiment: Experiment
    vocabulary: Any
    model: EncoderDecoderModel
    mesh: Any
    trainer: Trainer
    checkpointer: checkpoints.Checkpointer

    def docid_table(self):
        import tasks.docid_tables
        data_dir = pathlib.Path(self.experiment.dataset.data_dir)
        return tasks.docid_tables.load_or_build_docid_table(
            dataset=open_dataset(data_dir), scheme=self.experiment.dataset.docid_scheme,
            vocabulary=self.vocabulary, vocabulary_path=self.experiment.dataset.vocabulary_file)

    def restore(self, step: Optional[int] = None):
        """(state, input_state) of `step` (default: latest); a clear error when there is no checkpoint."""
        step = self.checkpointer.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.checkpointer.directory}: train first "
                                    f"(python -m gr_jax.train ... --gin.MODEL_DIR={self.experiment.model_dir})")
        return self.checkpointer.restore(step, abstract_state=self.trainer.abstract_state)

    def evaluator(self, *, split: str, eval_config: EvalConfig) -> RetrievalEvaluator:
        data = open_dataset(self.experiment.dataset.data_dir)
        queries = list(data.queries(split))
        if eval_config.max_queries:
            queries = queries[:eval_config.max_queries]
        qrels = data.qrels(split)
        qrels = {qid: qrels.get(qid, {}) for qid, _ in queries}
        return RetrievalEvaluator(model=self.model, queries=queries, qrels=qrels, docid_table=self.docid_table(),
                                  vocabulary=self.vocabulary, input_length=self.experiment.dataset.input_length,
                                  mesh=self.mesh, param_shardings=self.trainer.state_shardings.params,
                                  batch_size=eval_config.batch_size, num_beams=eval_config.num_beams,
                                  constrained=eval_config.constrained)


def evaluate(*, experiment: Experiment, eval_config: EvalConfig = EvalConfig(), split: Optional[str] = None,
             step: Optional[int] = None, progress: bool = True) -> dict[str, float]:
    """Evaluates a checkpoint on a split's queries; writes `run.{split}.{step}.trec` and `eval.{split}.{step}.json`."""
    built = experiment.build()
    state, _ = built.restore(step)
    step = int(jax.device_get(state.step))
    split = split or experiment.dataset.eval_split
    metrics, run = built.evaluator(split=split, eval_config=eval_config).evaluate(state.params, progress=progress)
    model_dir = pathlib.Path(experiment.model_dir)
    write_trec_run(model_dir / f"run.{split}.{step}.trec", run, tag=f"gr_jax-{step}")
    (model_dir / f"eval.{split}.{step}.json").write_text(json.dumps(metrics, indent=1))
    return metrics


def train(*, experiment: Experiment, num_train_steps: int, checkpoint_every_steps: int = 1000,
          keep_checkpoints: int = 3, log_every_steps: int = 50, eval_config: EvalConfig = EvalConfig(),
          gin_config_str: str = "", progress: bool = True) -> dict[str, float]:
    """Trains until `num_train_steps` (resuming from the experiment's model_dir); returns the final metrics."""
    dataset, seed, batch_size = experiment.dataset, experiment.seed, experiment.batch_size
    model_dir = pathlib.Path(experiment.model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    built = experiment.build(keep_checkpoints=keep_checkpoints)
    model, trainer, checkpointer = built.model, built.trainer, built.checkpointer
    logger.info("model: %s, %d parameters", model.config, trainer.param_count())
    if gin_config_str:
        (model_dir / "config.gin").write_text(gin_config_str)

    latest = checkpointer.latest_step()
    if latest is not None:
        state, input_state = checkpointer.restore(latest, abstract_state=trainer.abstract_state)
        start_batch = int(input_state["batches_consumed"])
        logger.info("resumed from step %d (batch %d)", latest, start_batch)
    else:
        state = trainer.init_state(jax.random.PRNGKey(seed))
        if experiment.init_checkpoint and warm_start.is_run_dir(experiment.init_checkpoint):
            state = warm_start.initialize_from_run(state=state, trainer=trainer,
                                                   model_dir=experiment.init_checkpoint)
            logger.info("initialised from the run %s", experiment.init_checkpoint)
        elif experiment.init_checkpoint:
            from gr_jax import pretrained
            state = pretrained.initialize_from_pretrained(state=state, trainer=trainer,
                                                          checkpoint_dir=experiment.init_checkpoint)
            logger.info("initialised from %s", experiment.init_checkpoint)
        start_batch = 0
    start_step = int(jax.device_get(state.step))

    batches = pipeline.train_batches(
        mixture_or_task_name=dataset.mixture_name, batch_size=batch_size, input_length=dataset.input_length,
        target_length=dataset.target_length, seed=seed, start_batch=start_batch,
        shard_index=jax.process_index(), num_shards=jax.process_count())
    writer = metric_writers.create_writer(model_dir)
    if gin_config_str and start_step == 0:
        writer.write_texts(0, {"config": gin_config_str})
    evaluator = selector = selection = best_checkpointer = None
    if eval_config.every_steps >= 0:
        evaluator = built.evaluator(split=dataset.eval_split, eval_config=eval_config)
    if eval_config.select_split is not None:
        selector = built.evaluator(split=eval_config.select_split, eval_config=eval_config)
        selection = ModelSelection.load(model_dir / "selection.json", split=eval_config.select_split,
                                        metric=eval_config.select_metric, resumed_step=start_step,
                                        patience=eval_config.patience)
        best_checkpointer = checkpoints.Checkpointer(model_dir / "best", max_to_keep=1, asynchronous=False)

    rng = jax.random.PRNGKey(seed + 1)
    pending: list[dict] = []
    last_log = time.perf_counter()
    tokens_per_batch = batch_size * (dataset.input_length + dataset.target_length)
    final: dict[str, float] = {}

    def flush(step: int) -> dict[str, float]:
        nonlocal last_log, pending
        if not pending:
            return {}
        sums = jax.device_get(pending)
        total = {k: float(np.sum([m[k] for m in sums])) for k in sums[0]}
        total["learning_rate"] = float(sums[-1]["learning_rate"])
        total["grad_norm"] = float(sums[-1]["grad_norm"])
        summary = summarize_metrics(total)
        if not all(math.isfinite(v) for v in summary.values()):
            raise NonFiniteLossError(
                f"non-finite training metrics at step {step}: {summary}. Training stopped; the last good "
                f"checkpoint (step {checkpointer.latest_step()}) is kept in {model_dir / 'checkpoints'}.")
        elapsed = time.perf_counter() - last_log
        summary["steps_per_second"] = len(pending) / elapsed
        summary["tokens_per_second"] = len(pending) * tokens_per_batch / elapsed
        writer.write_scalars(step, {f"train/{k}": v for k, v in summary.items()})
        pending = []
        last_log = time.perf_counter()
        return summary

    def run_eval(step: int, params: Any, *, evaluator: RetrievalEvaluator = evaluator,
                 split: str = dataset.eval_split, prefix: str = "eval") -> dict[str, float]:
        metrics, run = evaluator.evaluate(params, progress=progress)
        writer.write_scalars(step, {f"{prefix}/{k}": v for k, v in metrics.items()})
        write_trec_run(model_dir / f"run.{split}.{step}.trec", run, tag=f"gr_jax-{step}")
        logger.info("step %d %s: %s", step, prefix, metrics)
        return {f"{prefix}/{k}": v for k, v in metrics.items()}

    def save_checkpoint(step: int, *, force: bool = False) -> None:
        flush(step)  # Never save a state whose loss went non-finite.
        checkpointer.save(step, state=state, force=force,
                          input_state={"batches_consumed": start_batch + (step - start_step), "seed": seed})

    def select(step: int) -> None:
        """Evaluates the state on the selection split, keeps it if it is the best so far, applies patience."""
        metrics = run_eval(step, state.params, evaluator=selector, split=selection.split, prefix="select")
        if f"select/{selection.metric}" not in metrics:
            raise KeyError(f"select_metric {selection.metric!r} is not an evaluation metric: "
                           f"{sorted(k[len('select/'):] for k in metrics)}")
        if selection.record(step, metrics[f"select/{selection.metric}"]):
            best_checkpointer.save(step, state=state, input_state={"selected_on": selection.split}, force=True)
        selection.save()

    bar = tqdm.tqdm(total=num_train_steps, initial=start_step, desc="train", unit="step", disable=not progress)
    step = start_step
    try:
        while step < num_train_steps and not (selection is not None and selection.stopped):
            batch = next(batches)
            state, metrics = trainer.train_step(state, batch, rng)
            step += 1
            pending.append(metrics)
            bar.update(1)
            if step % log_every_steps == 0 or step == num_train_steps:
                summary = flush(step)
                final.update({f"train/{k}": v for k, v in summary.items()})
                bar.set_postfix(loss=f"{summary['loss']:.3f}", acc=f"{summary['token_accuracy']:.3f}")
            if step % checkpoint_every_steps == 0 or step == num_train_steps:
                save_checkpoint(step)
            if selection is not None and (step % eval_config.every_steps == 0 or step == num_train_steps):
                select(step)
                if selection.stopped:
                    logger.info("early stop at step %d: no better %s on %s for %d evaluations (best: step %d)",
                                step, selection.metric, selection.split, eval_config.patience, selection.best_step)
                    save_checkpoint(step, force=True)
            elif evaluator is not None and eval_config.every_steps > 0 and step % eval_config.every_steps == 0 \
                    and step != num_train_steps:
                final.update(run_eval(step, state.params))
        if selection is not None and selection.best_step is not None:
            best_params = best_checkpointer.restore_params(selection.best_step,
                                                           abstract_params=trainer.abstract_state.params)
            final.update(run_eval(selection.best_step, best_params))
            final.update({"select/best_step": selection.best_step, f"select/best_{selection.metric}":
                          selection.best_value, "select/stopped_at": step})
        elif evaluator is not None:
            final.update(run_eval(step, state.params))
    finally:
        bar.close()
        checkpointer.wait_until_finished()
        writer.flush()
    (model_dir / "final_metrics.json").write_text(json.dumps(final, indent=1))
    return final
