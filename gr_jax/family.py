"""One run of any model family: a training setup, the run's data and a model family, and the live objects built
from them.

An experiment (the `EXPERIMENT` gin binds) is a `ModelFamily` subclass: the `TrainingSetup` fields every run has
(optimizer, learning-rate schedule, batch, microbatches, seed, mesh, rules: declared here once), its `model_dir` and
`dataset`, and the family's own fields (a generative run's network and loss, a dual encoder's towers, ...). Its
`build()` reads the run's data, builds the family's model and calls `training_parts`, which makes the mesh, the
`Trainer` and the `Checkpointer` of every family. What it returns is a `BuiltRun`: what training, evaluation and
search use of a run, the family's parts being its abstract methods (the state, the batches, the retriever).

Families: the generative T5 (`gr_jax.experiment.Experiment`, doc2query included), n-gram spans
(`gr_jax.ngrams.experiment`), the dual encoder (`gr_jax.dense.experiment`) and GDR (`gr_jax.gdr.experiment`). A new
family is one package with its `ModelFamily`, its `BuiltRun` and its gin files.
"""
from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Container, Iterator, Sequence
from typing import Any, NamedTuple, Optional, Protocol

import jax
import numpy as np
import optax
from jax.sharding import Mesh

from gr_jax import checkpoints
from gr_jax import optimizers
from gr_jax import partitioning
from gr_jax.data.readers import EVAL_SPLIT_SETTING, open_dataset
from gr_jax.evaluator import RetrievalEvaluator
from gr_jax.retrievers import ParametricRetriever
from gr_jax.retrievers.settings import RetrievalSettings
from gr_jax.run_dir import RunDir
from gr_jax.trainer import TrainableModel, Trainer, TrainState


class TrainingData(Protocol):
    """What every family's `dataset` has: its data dir, the split it is evaluated on, and the token lengths of its
    inputs and targets (the trainer's shapes)."""

    @property
    def data_dir(self) -> str: ...

    @property
    def eval_split(self) -> str: ...

    @property
    def input_length(self) -> int: ...

    @property
    def target_length(self) -> int: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingSetup:
    """How a run trains, whatever its model: the optimizer (`optimizer_factory(learning_rate=...)`) and its schedule,
    the global batch and its microbatches (gradients accumulated over them), the seed of the initialisation, dropout
    and example order, the ('data', 'model') mesh and the logical axis -> mesh axis rules."""
    learning_rate: optax.Schedule
    optimizer_factory: Callable[..., optax.GradientTransformation] = optimizers.make_optimizer
    batch_size: int = 32
    num_microbatches: int = 1
    seed: int = 0
    mesh_data: int = -1
    mesh_model: int = 1
    rules: partitioning.LogicalAxisRules = partitioning.LOGICAL_AXIS_RULES


class RunParts(NamedTuple):
    """What every built run has, whatever its family (`ModelFamily.training_parts`)."""
    mesh: Mesh
    trainer: Trainer
    checkpointer: checkpoints.Checkpointer


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelFamily(TrainingSetup, abc.ABC):
    """An experiment: a training setup (the inherited fields), the run's directory and data, and a model family (a
    subclass: its fields, and how they become a model and a `BuiltRun`). gin binds a subclass by its own name
    (`experiment.Experiment.batch_size`, `dense.experiment.DenseExperiment.model`, ...)."""
    model_dir: str
    dataset: TrainingData

    @abc.abstractmethod
    def build(self, *, keep_checkpoints: int = 3) -> BuiltRun:
        """Reads what the run's data define (vocabulary, docid space, index), builds the family's model for them and,
        through `training_parts`, its trainer; no parameter is allocated."""

    def training_parts(self, model: TrainableModel, *, keep_checkpoints: int,
                       frozen: Optional[str] = None) -> RunParts:
        """The mesh, trainer and checkpointer of any family's `model`: this setup's mesh, optimizer (the parameters
        whose path the regex `frozen` matches are neither differentiated nor updated, and hold no optimizer state:
        `Trainer(frozen=)`), learning rate, batch and microbatches; inputs and targets of the dataset's lengths;
        checkpoints in `model_dir/checkpoints`."""
        mesh = partitioning.make_mesh(data=self.mesh_data, model=self.mesh_model)
        trainer = Trainer(model=model, optimizer=self.optimizer_factory(learning_rate=self.learning_rate), mesh=mesh,
                          input_length=self.dataset.input_length, target_length=self.dataset.target_length,
                          batch_size=self.batch_size, num_microbatches=self.num_microbatches,
                          learning_rate_fn=self.learning_rate, rules=self.rules, frozen=frozen)
        checkpointer = checkpoints.Checkpointer(RunDir.of(self.model_dir).checkpoints, max_to_keep=keep_checkpoints)
        return RunParts(mesh=mesh, trainer=trainer, checkpointer=checkpointer)


@dataclasses.dataclass(kw_only=True)
class BuiltRun(abc.ABC):
    """A built run (`ModelFamily.build`): its model, mesh, trainer and checkpoints, and evaluators over its data. A
    family's subclass adds its parts: the abstract methods, and where it differs from the defaults here, the input
    fingerprint, the documents it can retrieve and what its retriever keeps per checkpoint."""
    experiment: ModelFamily
    model: TrainableModel
    mesh: Mesh
    trainer: Trainer
    checkpointer: checkpoints.Checkpointer

    # --- The family's parts ---------------------------------------------------------------------------------------

    @abc.abstractmethod
    def init_state(self) -> TrainState:
        """A fresh train state (from `experiment.seed`), with pretrained weights where the family starts from some."""

    @abc.abstractmethod
    def train_batches(self, *, start_batch: int) -> Iterator[dict]:
        """This process's rows of the global training batches from `start_batch` on, as the model's features. An
        iterator that is also a `checkpoints.CheckpointableInput` has its state saved with every checkpoint and is
        put back from it on resume (`training.restore_input`); any other must reach `start_batch` in time
        independent of it (host-made batches address batch b directly)."""

    @property
    @abc.abstractmethod
    def tokens_per_batch(self) -> int:
        """Tokens of one global batch (the training log's tokens_per_second)."""

    @abc.abstractmethod
    def retriever(self, params: Any = None, *, settings: RetrievalSettings, show_progress: bool = False,
                  step: Optional[int] = None) -> ParametricRetriever:
        """The model with `params` as a retriever ranking as `settings` say. `step`, the checkpoint the params come
        from, matters to retrievers that keep per-checkpoint state (a dense run's corpus index)."""

    @abc.abstractmethod
    def collection_rows(self, docids: Sequence[str]) -> np.ndarray:
        """Each docid's row in the data dir's collection (-1: not a document of it), for printing documents."""

    def known_docids(self) -> Optional[Container[str]]:
        """The documents this run can retrieve (for the qrels check of `evaluator`); None: not checked."""
        return None

    def input_fingerprint(self) -> dict[str, str]:
        """Digests of the inputs that give the parameters their meaning (e.g. the vocabulary file's bytes): saved
        with every checkpoint and compared on restore, so a checkpoint is never read with a rebuilt vocabulary or
        docid table. Runs without such inputs return {}."""
        return {}

    def retriever_kept_at(self, retriever: Any, *, step: int) -> Any:
        """`retriever` (this run's `retriever(...)`) for the parameters of checkpoint `step`, keeping what it builds
        from them in the run dir, where later commands on that checkpoint find it (a dense run: its corpus index,
        `index/{step}`). Training's final evaluation ranks through it. Nothing is kept here."""
        del step
        return retriever

    # --- Every run's --------------------------------------------------------------------------------------------

    def _checkpoint_step(self, step: Optional[int]) -> int:
        """`step`, or the latest checkpoint's; a clear error when there is none."""
        step = self.checkpointer.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.checkpointer.directory}: train first "
                                    f"(python -m gr_jax.train ... --gin.MODEL_DIR={self.experiment.model_dir})")
        return step

    def check_inputs(self, saved: dict, *, where: str) -> None:
        """Raises when the input fingerprint saved at `where` (a checkpoint's input state; older checkpoints have
        none) disagrees with this run's: the checkpoint's token ids would mean other pieces or documents."""
        current = self.input_fingerprint()
        changed = [name for name, digest in saved.get("inputs", {}).items()
                   if name in current and current[name] != digest]
        if changed:
            raise ValueError(f"{where}: the checkpoint was trained on other {' and '.join(changed)} than this run "
                             f"reads (sha256 {[saved['inputs'][n][:12] for n in changed]} then, "
                             f"{[current[n][:12] for n in changed]} now): the data dir was rebuilt since. Point the "
                             "run at the original files (DatasetConfig.vocabulary_path, the docid table) or retrain")

    def init_checkpoint(self) -> Optional[str]:
        """What the run's parameters start from besides its seed (a gr_jax run dir, or a Hugging Face checkpoint
        dir), or None: recorded in the run dir (`RunDir.write_start`) for warm starts from this run."""
        return None

    def checkpoint_state(self, state: TrainState) -> TrainState:
        """What a checkpoint of `state` holds: all of it, but the frozen parameters (`Trainer(frozen=)`: LoRA's base,
        a frozen tower), which the run's own reference gives back on restore (`frozen_base`)."""
        return dataclasses.replace(state, params=self.trainer.saved_params(state.params))

    def frozen_base(self) -> Any:
        """The parameters a checkpoint does not hold, as this run starts them (`init_state`: the seed, the
        pretrained tower, `init_checkpoint`). Made anew at each call: a kept copy would be donated with the state
        it joins at the next train step. Refused when it is not the base the checkpoints were trained on
        (`RunDir.check_start`)."""
        RunDir.of(self.experiment.model_dir).check_start(seed=self.experiment.seed,
                                                         init_checkpoint=self.init_checkpoint())
        return self.init_state().params

    def read_params(self, checkpointer: checkpoints.Checkpointer, step: int) -> Any:
        """The full parameters of `checkpointer`'s step (no optimizer state), the frozen ones from `frozen_base`."""
        trainer = self.trainer
        saved = checkpointer.restore_params(step, abstract_params=trainer.saved_params(trainer.abstract_state.params))
        return saved if trainer.frozen is None else trainer.with_frozen(saved, base=self.frozen_base())

    def restore(self, step: Optional[int] = None):
        """(state, input_state) of `step` (default: latest), after `check_inputs`."""
        step = self._checkpoint_step(step)
        trainer = self.trainer
        abstract = self.checkpoint_state(trainer.abstract_state)
        state, input_state = self.checkpointer.restore(step, abstract_state=abstract)
        self.check_inputs(input_state, where=str(self.checkpointer.directory / str(step)))
        if trainer.frozen is not None:
            state = dataclasses.replace(state, params=trainer.with_frozen(state.params, base=self.frozen_base()))
        return state, input_state

    def restore_params(self, step: Optional[int] = None) -> tuple[Any, int]:
        """(params, step) of `step` (default: latest), without reading the optimizer state. A step that rotated
        out of `checkpoints/` is read from `best/` when model selection kept it there. A damaged latest step is an
        error, not a fallback: what is evaluated is the step asked for."""
        latest = step is None
        step = self._checkpoint_step(step)
        checkpointer = self.checkpointer
        if step not in checkpointer.all_steps():
            best_dir = RunDir.of(self.experiment.model_dir).best
            best = checkpoints.Checkpointer(best_dir, max_to_keep=1) if best_dir.is_dir() else None
            if best is None or step not in best.all_steps():
                raise FileNotFoundError(f"no checkpoint of step {step} in {checkpointer.directory} (it has "
                                        f"{checkpointer.all_steps()}) or in {best_dir}")
            checkpointer = best
        self.check_inputs(checkpointer.input_state(step), where=str(checkpointer.directory / str(step)))
        try:
            return self.read_params(checkpointer, step), step
        except checkpoints.CheckpointDamagedError as e:
            if not latest:
                raise
            raise checkpoints.CheckpointDamagedError(
                e.directory, e.step, f"{e.detail}. It is the latest step; read another by naming it (the entry "
                f"point's step setting, e.g. --gin.training.evaluate.step=N for gr_jax.eval; steps on disk: "
                f"{checkpointer.all_steps()})") from None

    def evaluator(self, *, split: str, k: int, max_queries: Optional[int] = None,
                  setting: str = EVAL_SPLIT_SETTING) -> RetrievalEvaluator:
        """The split's queries (the first `max_queries`) and qrels (missing: an error naming `setting`, the option
        that picks the split); judgements naming documents the run cannot retrieve, and judged queries the queries
        file lacks, are counted in warnings."""
        data = open_dataset(self.experiment.dataset.data_dir)
        data.require_split(split, setting=setting)
        queries = list(data.queries(split))
        qrels = data.qrels(split)
        data.check_judged_queries(split, qrels=qrels, qids={qid for qid, _ in queries})
        if max_queries:
            queries = queries[:max_queries]
        known = self.known_docids()
        if known is not None:
            data.check_qrels(split, docids=known, qrels={qid: qrels[qid] for qid, _ in queries if qid in qrels})
        return RetrievalEvaluator(queries=queries, qrels=qrels, k=k)


class HostBatches(Protocol):
    """Training batches made on the host, any one addressed directly (`gr_jax.data.batches.sharded_batches`)."""

    def batches(self, *, start_batch: int, shard_index: int, num_shards: int) -> Iterator[dict]: ...


class SampledBatchesRun(BuiltRun):
    """A run whose training batches its own `batch_source` samples on the host (the dense and GDR runs)."""

    @property
    @abc.abstractmethod
    def batch_source(self) -> HostBatches:
        """The run's training batches (read once per run)."""

    def train_batches(self, *, start_batch: int) -> Iterator[dict]:
        """This process's rows of the global batches from `start_batch` on."""
        return self.batch_source.batches(start_batch=start_batch, shard_index=jax.process_index(),
                                         num_shards=jax.process_count())
