"""What a run is: its data, network, loss, optimizer, batch and mesh, and the live objects built from them.

Train, eval, infer and search build the same `Experiment` from the same gin (training writes it to
`model_dir/config.gin`), so their states and shardings agree. `Experiment.build()` reads the run's docid space once
and hands that value to task registration, the model builder and the retriever.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Container, Iterator, Sequence
from typing import Any, Optional, Protocol

import jax
import numpy as np
import optax

from gr_jax import checkpoints
from gr_jax import losses
from gr_jax import network
from gr_jax import optimizers
from gr_jax import partitioning
from gr_jax import warm_start
from gr_jax.data.readers import EVAL_SPLIT_SETTING, open_dataset
from gr_jax.docids import DocidSpace
from gr_jax.docids.identifiers import DocumentIdentifiers
from gr_jax.evaluator import RetrievalEvaluator
from gr_jax.heads import OutputHead, StandardHead
from gr_jax.models import EncoderDecoderModel
from gr_jax.retrievers.generative import GenerativeRetriever
from gr_jax.run_dir import RunDir
from gr_jax.trainer import Trainer
from gr_jax.vocabulary import load_vocabulary, vocabulary_file

logger = logging.getLogger(__name__)


class RunData(Protocol):
    """What an Experiment trains on: a data dir, its seqio mixture and, for retrieval, its docid space."""

    name: str
    data_dir: str
    input_length: int
    target_length: int
    eval_split: str
    vocabulary_path: Optional[str]

    def docid_space(self) -> Optional[DocidSpace]:
        """The run's docids (read once per run), or None when the targets are no docids (doc2query)."""

    def register(self, docid_space: Optional[DocidSpace]) -> list[str]:
        """Registers the seqio tasks this data trains on (none for host-made batches); returns their names."""

    def train_batches(self, *, docid_space: Optional[DocidSpace], batch_size: int, seed: int, start_batch: int,
                      shard_index: int, num_shards: int) -> Iterator[dict]:
        """This process's rows of the global training batches from `start_batch` on, as the model's features. An
        iterator that is also a `checkpoints.CheckpointableInput` has its state saved with every checkpoint and, on
        resume, is put back where the checkpoint left it from that state (`training.restore_input`) before it reads
        anything, so resuming takes time independent of `start_batch`; any other iterator must reach `start_batch`
        in such time itself (host-made batches address batch b directly)."""

    @property
    def mixture_name(self) -> str:
        """What the run trains on, by name (its seqio mixture or task)."""


class SeqioExamplesData:
    """What a `RunData` whose examples are a registered seqio mixture (`mixture_name`) shares: its training batches
    come from `gr_jax.data.pipeline.train_batches` (the registered tasks hold the docid space), a checkpointable
    tf.data iterator (`pipeline.TrainBatches`)."""

    def train_batches(self, *, docid_space: Optional[DocidSpace], batch_size: int, seed: int, start_batch: int,
                      shard_index: int, num_shards: int) -> Iterator[dict]:
        del docid_space
        from gr_jax.data import pipeline  # TensorFlow: only for runs that train
        return pipeline.train_batches(
            mixture_or_task_name=self.mixture_name, batch_size=batch_size, input_length=self.input_length,
            target_length=self.target_length, seed=seed, start_batch=start_batch, shard_index=shard_index,
            num_shards=num_shards)


@dataclasses.dataclass(frozen=True)
class DatasetConfig(SeqioExamplesData):
    """Retrieval data: which data dir, which study row (mixture) and which docid scheme to train on."""
    name: str
    data_dir: str
    row: str = "firstp_labeled"
    docid_scheme: str = "naive"
    eval_split: str = "dev"
    input_length: int = 64
    target_length: int = 16
    vocabulary_path: Optional[str] = None  # default {data_dir}/spm.model; a pretrained spiece.model works too
    # Document representations (see gr_jax.tasks.register_dataset): DaQ chunks, D2Q synthetic queries.
    daq_num_chunks: int = 10
    daq_seed: int = 0
    d2q_path: Optional[str] = None  # default {data_dir}/d2q.tsv when it exists
    d2q_queries_per_passage: int = 10
    d2q_selection: str = "first"
    d2q_seed: int = 0

    def docid_space(self) -> DocidSpace:
        from gr_jax import tasks  # seqio and TensorFlow: only for runs that train on the tasks
        return tasks.load_docid_space(data_dir=self.data_dir, docid_scheme=self.docid_scheme,
                                      input_length=self.input_length, target_length=self.target_length,
                                      vocabulary_path=self.vocabulary_path)

    def register(self, docid_space: Optional[DocidSpace]) -> list[str]:
        from gr_jax import tasks
        return tasks.register_dataset(name=self.name, data_dir=self.data_dir, docid_space=docid_space,
                                      input_length=self.input_length, target_length=self.target_length,
                                      vocabulary_path=self.vocabulary_path, daq_num_chunks=self.daq_num_chunks,
                                      daq_seed=self.daq_seed, d2q_path=self.d2q_path,
                                      d2q_queries_per_passage=self.d2q_queries_per_passage,
                                      d2q_selection=self.d2q_selection, d2q_seed=self.d2q_seed, rows=(self.row,))

    @property
    def mixture_name(self) -> str:
        from gr_jax import tasks
        return tasks.mixture_name(name=self.name, row=self.row, docid_scheme=self.docid_scheme)


@dataclasses.dataclass(frozen=True)
class Doc2QueryData(SeqioExamplesData):
    """doc2query data: a document -> one of its labeled queries (the task `{name}.doc2query`,
    `gr_jax.tasks.doc2query`). The targets are query text, not docids: the run has no docid space, and its
    retrieval evaluation must be off (`training.EvalConfig.every_steps = -1`, set by experiments/doc2query.gin)."""
    name: str
    data_dir: str
    input_length: int = 64
    target_length: int = 32
    eval_split: str = "dev"
    vocabulary_path: Optional[str] = None

    def docid_space(self) -> None:
        return None

    def register(self, docid_space: Optional[DocidSpace]) -> list[str]:
        del docid_space
        from gr_jax.tasks import doc2query
        return [doc2query.register_doc2query(name=self.name, data_dir=self.data_dir, input_length=self.input_length,
                                             target_length=self.target_length, vocabulary_path=self.vocabulary_path)]

    @property
    def mixture_name(self) -> str:
        from gr_jax.tasks import doc2query
        return doc2query.doc2query_task_name(name=self.name)


def build_model(*, config: network.T5Config, model_vocab_size: int, loss: losses.Loss = losses.TokenCrossEntropy(),
                docid_token_range: Optional[tuple[int, int]] = None,
                head: OutputHead = StandardHead()) -> EncoderDecoderModel:
    """The model of a run: its `head` given the docid token range [start, stop) (`DocidSpace.docid_token_range`)
    where it needs one and gin left it unset; its input embedding sized to the ids the head embeds out of the run's
    `model_vocab_size` (`OutputHead.embedded_vocab_size`: all of them, or for atomic docids only the text's), rounded
    up to a multiple of 128, unless gin fixed it, in which case a too-small size is an error."""
    head = head.with_docid_range(docid_token_range)
    embedded = head.embedded_vocab_size(config, model_vocab_size=model_vocab_size)
    if config.vocab_size is None:
        config = config.with_vocab_size(embedded)
    elif config.vocab_size < embedded:
        raise ValueError(f"T5Config.vocab_size={config.vocab_size} is smaller than the {embedded} token ids "
                         f"the vocabulary and docids need (head={head!r})")
    return EncoderDecoderModel(config=config, loss=loss, head=head)


@dataclasses.dataclass(frozen=True)
class Experiment:
    """What a run is (see the module docstring)."""
    model_dir: str
    dataset: RunData
    network_config: network.T5Config
    learning_rate: optax.Schedule
    optimizer_factory: Callable[..., optax.GradientTransformation] = optimizers.make_optimizer
    loss: losses.Loss = losses.TokenCrossEntropy()
    head: OutputHead = StandardHead()  # the output head and its settings (gin: HEAD, gin_configs/decoders/*.gin)
    batch_size: int = 32
    num_microbatches: int = 1
    seed: int = 0
    mesh_data: int = -1
    mesh_model: int = 1
    rules: partitioning.LogicalAxisRules = partitioning.LOGICAL_AXIS_RULES  # logical axis -> mesh axis
    # A Hugging Face T5.1.1 dir (config.json + safetensors), as the study, or a gr_jax model dir (e.g. continued
    # span-corruption pretraining on the corpus, see gr_jax.warm_start): the run's parameters start from it.
    init_checkpoint: Optional[str] = None

    def build(self, *, keep_checkpoints: int = 3) -> Built:
        """Reads the vocabulary and docid space, registers the tasks, builds model, mesh and trainer (no
        parameter is allocated)."""
        vocabulary = load_vocabulary(vocabulary_file(self.dataset))
        docid_space = self.dataset.docid_space()
        self.dataset.register(docid_space)
        model = build_model(config=self.network_config, loss=self.loss, head=self.head,
                            model_vocab_size=docid_space.model_vocab_size if docid_space else vocabulary.vocab_size,
                            docid_token_range=docid_space.docid_token_range if docid_space else None)
        mesh, trainer, checkpointer = training_parts(self, model=model, keep_checkpoints=keep_checkpoints)
        return Built(experiment=self, vocabulary=vocabulary, docid_space=docid_space, model=model, mesh=mesh,
                     trainer=trainer, checkpointer=checkpointer)


def training_parts(experiment: Any, *, model: Any, keep_checkpoints: int
                   ) -> tuple[Any, Trainer, checkpoints.Checkpointer]:
    """(mesh, trainer, checkpointer) of any experiment (generative or dense): its mesh, optimizer, learning rate,
    batch and microbatches; inputs and targets of its dataset's lengths; checkpoints in `model_dir/checkpoints`."""
    mesh = partitioning.make_mesh(data=experiment.mesh_data, model=experiment.mesh_model)
    trainer = Trainer(model=model, optimizer=experiment.optimizer_factory(learning_rate=experiment.learning_rate),
                      mesh=mesh, input_length=experiment.dataset.input_length,
                      target_length=experiment.dataset.target_length, batch_size=experiment.batch_size,
                      num_microbatches=experiment.num_microbatches, learning_rate_fn=experiment.learning_rate,
                      rules=experiment.rules)
    checkpointer = checkpoints.Checkpointer(RunDir.of(experiment.model_dir).checkpoints,
                                            max_to_keep=keep_checkpoints)
    return mesh, trainer, checkpointer


class RetrievalSettings(Protocol):
    """How a run's model ranks when it is evaluated or searched (`gr_jax.training.EvalConfig` is one): a retriever
    reads the fields it needs. batch_size: queries at once; num_beams / constrained: a generative model's beam
    search; depth: how many documents a ranking holds."""
    batch_size: int
    num_beams: int
    constrained: bool

    @property
    def depth(self) -> int: ...


class BuiltRun:
    """What every built run has (a generative `Built`, a dense `gr_jax.dense.experiment.DenseBuilt`): its
    checkpoints, and evaluators over its data. A subclass adds the model's own parts: `init_state` (a fresh state,
    with pretrained weights where the run starts from some), `train_batches`, `tokens_per_batch`, `retriever` and
    `collection_rows`."""

    experiment: Any
    trainer: Trainer
    checkpointer: checkpoints.Checkpointer

    def _checkpoint_step(self, step: Optional[int]) -> int:
        """`step`, or the latest checkpoint's; a clear error when there is none."""
        step = self.checkpointer.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.checkpointer.directory}: train first "
                                    f"(python -m gr_jax.train ... --gin.MODEL_DIR={self.experiment.model_dir})")
        return step

    def input_fingerprint(self) -> dict[str, str]:
        """Digests of the inputs that give the parameters their meaning (e.g. the vocabulary file's bytes): saved
        with every checkpoint and compared on restore, so a checkpoint is never read with a rebuilt vocabulary or
        docid table. Runs without such inputs return {}."""
        return {}

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

    def restore(self, step: Optional[int] = None):
        """(state, input_state) of `step` (default: latest), after `check_inputs`."""
        step = self._checkpoint_step(step)
        state, input_state = self.checkpointer.restore(step, abstract_state=self.trainer.abstract_state)
        self.check_inputs(input_state, where=str(self.checkpointer.directory / str(step)))
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
            return checkpointer.restore_params(step, abstract_params=self.trainer.abstract_state.params), step
        except checkpoints.CheckpointDamagedError as e:
            if not latest:
                raise
            raise checkpoints.CheckpointDamagedError(
                e.directory, e.step, f"{e.detail}. It is the latest step; read another by naming it (the entry "
                f"point's step setting, e.g. --gin.training.evaluate.step=N for gr_jax.eval; steps on disk: "
                f"{checkpointer.all_steps()})") from None

    def known_docids(self) -> Optional[Container[str]]:
        """The documents this run can retrieve (for the qrels check of `evaluator`); None: not checked."""
        return None

    def retriever_kept_at(self, retriever: Any, *, step: int) -> Any:
        """`retriever` (this run's `retriever(...)`) for the parameters of checkpoint `step`, keeping what it builds
        from them in the run dir, where later commands on that checkpoint find it (a dense run: its corpus index,
        `index/{step}`). Training's final evaluation ranks through it. Nothing is kept here."""
        del step
        return retriever

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


class SampledBatchesRun(BuiltRun):
    """A run whose training batches its own `batch_source` samples on the host (the dense and GDR runs:
    `gr_jax.data.batches.sharded_batches`), and whose dataset knows its `tokens_per_example`."""

    batch_source: Any

    def train_batches(self, *, start_batch: int) -> Iterator[dict]:
        """This process's rows of the global batches from `start_batch` on."""
        return self.batch_source.batches(start_batch=start_batch, shard_index=jax.process_index(),
                                         num_shards=jax.process_count())

    @property
    def tokens_per_batch(self) -> int:
        return self.experiment.batch_size * self.experiment.dataset.tokens_per_example


@dataclasses.dataclass
class Built(BuiltRun):
    """A generative Experiment's live objects."""
    experiment: Experiment
    vocabulary: Any
    docid_space: Optional[DocidSpace]
    model: EncoderDecoderModel
    mesh: Any
    trainer: Trainer
    checkpointer: checkpoints.Checkpointer

    def input_fingerprint(self) -> dict[str, str]:
        """sha256 of the vocabulary file and of the docid table's token ids [docids, length] (computed once: every
        checkpoint saves it)."""
        fingerprint = self.__dict__.get("_input_fingerprint")
        if fingerprint is None:
            vocabulary = vocabulary_file(self.experiment.dataset).read_bytes()
            fingerprint = {"vocabulary": hashlib.sha256(vocabulary).hexdigest()}
            if self.docid_space is not None:
                tokens = np.ascontiguousarray(self.docid_space.table.tokens, np.int64)
                fingerprint["docid table"] = hashlib.sha256(repr(tokens.shape).encode() + tokens.tobytes()).hexdigest()
            self.__dict__["_input_fingerprint"] = fingerprint
        return dict(fingerprint)

    def init_state(self):
        """A fresh train state, its parameters from `init_checkpoint` when set (a gr_jax run dir: warm start; else a
        Hugging Face T5.1.1 dir)."""
        experiment, trainer = self.experiment, self.trainer
        state = trainer.init_state(jax.random.PRNGKey(experiment.seed))
        if experiment.init_checkpoint and RunDir.of(experiment.init_checkpoint).is_run():
            state = warm_start.initialize_from_run(state=state, trainer=trainer, model_dir=experiment.init_checkpoint)
            logger.info("initialised from the run %s", experiment.init_checkpoint)
        elif experiment.init_checkpoint:
            state = warm_start.initialize_from_pretrained(state=state, trainer=trainer,
                                                          checkpoint_dir=experiment.init_checkpoint)
            logger.info("initialised from %s", experiment.init_checkpoint)
        return state

    def train_batches(self, *, start_batch: int) -> Iterator[dict]:
        """This process's share of the training batches from `start_batch` on (the dataset's `train_batches`)."""
        return self.experiment.dataset.train_batches(
            docid_space=self.docid_space, batch_size=self.experiment.batch_size, seed=self.experiment.seed,
            start_batch=start_batch, shard_index=jax.process_index(), num_shards=jax.process_count())

    @property
    def tokens_per_batch(self) -> int:
        dataset = self.experiment.dataset
        return self.experiment.batch_size * (dataset.input_length + dataset.target_length)

    def retriever(self, params: Any = None, *, settings: RetrievalSettings, show_progress: bool = False,
                  step: Optional[int] = None) -> GenerativeRetriever:
        """The model with `params` as a retriever over the run's docid space (its decoding compiled on first use),
        decoding as `settings` say (batch_size, num_beams, constrained). `step`, the checkpoint the params come
        from, matters to retrievers that keep per-checkpoint state (a dense run's corpus index), not to this one."""
        del step
        if self.docid_space is None:
            raise ValueError(f"{self.experiment.dataset.mixture_name!r} has no docids to retrieve (its targets are "
                             "not docids)")
        if settings.depth > settings.num_beams:
            raise ValueError(f"a ranking {settings.depth} deep needs at least as many beams, got "
                             f"num_beams={settings.num_beams}")
        return GenerativeRetriever(model=self.model, params=params, docid_space=self.docid_space,
                                   vocabulary=self.vocabulary, input_length=self.experiment.dataset.input_length,
                                   mesh=self.mesh, param_shardings=self.trainer.state_shardings.params,
                                   batch_size=settings.batch_size, num_beams=settings.num_beams,
                                   constrained=settings.constrained, rules=self.trainer.rules,
                                   show_progress=show_progress)

    def known_docids(self) -> Optional[Container[str]]:
        return None if self.docid_space is None else self.docid_space.table

    def document_identifiers(self) -> DocumentIdentifiers:
        """Every document and the docid-table rows that name it: one each, its docid."""
        if self.docid_space is None:
            raise ValueError(f"{self.experiment.dataset.mixture_name!r} has no docids")
        return DocumentIdentifiers.one_each(self.docid_space.table)

    def collection_rows(self, docids: Sequence[str]) -> np.ndarray:
        """Each docid's row in the collection (-1: not a document of the run)."""
        return self.docid_space.table.rows_of(docids)
