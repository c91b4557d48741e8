"""The generative family (a T5.1.1 encoder-decoder decoding docids, or doc2query's query text): its data, network
and loss, and the live objects built from them (`gr_jax.family`: the training setup and run every family shares).

Train, eval, infer and search build the same `Experiment` from the same gin (training writes it to
`model_dir/config.gin`), so their states and shardings agree. `Experiment.build()` reads the run's docid space once
and hands that value to task registration, the model builder and the retriever.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Container, Iterator, Sequence
from typing import Any, Optional, Protocol

import jax
import numpy as np

from gr_jax import losses
from gr_jax import network
from gr_jax import warm_start
from gr_jax.data.examples import input_vocabulary
from gr_jax.data.fingerprint import input_fingerprint
from gr_jax.dense.towers import Tower
from gr_jax.docids import DocidSpace
from gr_jax.docids.identifiers import DocumentIdentifiers
from gr_jax.family import BuiltRun, ModelFamily, TrainingData
from gr_jax.heads import OutputHead, StandardHead
from gr_jax.models import EncoderDecoderModel
from gr_jax.retrievers import ParametricRetriever
from gr_jax.retrievers.generative import DocidGenerator, GenerativeRetriever
from gr_jax.retrievers.settings import RetrievalSettings
from gr_jax.run_dir import RunDir
from gr_jax.trainer import TrainableModel, TrainState
from gr_jax.vocabulary import load_vocabulary, vocabulary_file

logger = logging.getLogger(__name__)


class RunData(TrainingData, Protocol):
    """What an Experiment trains on: a data dir (`TrainingData`'s lengths and eval split), its seqio mixture and, for
    retrieval, its docid space."""

    @property
    def name(self) -> str: ...

    @property
    def vocabulary_path(self) -> Optional[str]: ...

    def docid_space(self) -> Optional[DocidSpace]:
        """The run's docids (read once per run), or None when the targets are no docids (doc2query)."""

    def register(self, docid_space: Optional[DocidSpace], *, input_vocabulary_dir: Optional[str] = None
                 ) -> list[str]:
        """Registers the seqio tasks this data trains on (none for host-made batches); returns their names.
        input_vocabulary_dir: a WordPiece folder that tokenises the inputs (a tower encoder's, `Tower.
        input_vocabulary_dir`), None for the run's SentencePiece vocabulary; data that cannot raises ValueError."""

    def train_batches(self, *, docid_space: Optional[DocidSpace], batch_size: int, seed: int, start_batch: int,
                      shard_index: int, num_shards: int, input_vocabulary_dir: Optional[str] = None
                      ) -> Iterator[dict]:
        """This process's rows of the global training batches from `start_batch` on, as the model's features, the
        inputs tokenised as `register`'s `input_vocabulary_dir` says (given again here: the same value). An
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

    def train_batches(self: RunData, *, docid_space: Optional[DocidSpace], batch_size: int, seed: int,
                      start_batch: int, shard_index: int, num_shards: int,
                      input_vocabulary_dir: Optional[str] = None) -> Iterator[dict]:
        del docid_space, input_vocabulary_dir  # the registered tasks hold both
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
    # Keep each task's tokenized examples in memory after the first epoch (`tasks.register_dataset`); off for one
    # pass over a corpus too large for it (`python -m gr_jax.tools.preprocess` turns it off).
    cache_in_memory: bool = True

    def docid_space(self) -> DocidSpace:
        from gr_jax import tasks  # seqio and TensorFlow: only for runs that train on the tasks
        return tasks.load_docid_space(data_dir=self.data_dir, docid_scheme=self.docid_scheme,
                                      input_length=self.input_length, target_length=self.target_length,
                                      vocabulary_path=self.vocabulary_path)

    def register(self, docid_space: Optional[DocidSpace], *, input_vocabulary_dir: Optional[str] = None
                 ) -> list[str]:
        from gr_jax import tasks
        if docid_space is None:
            raise ValueError(f"{self.name}: retrieval data needs its docid space")
        return tasks.register_dataset(name=self.name, data_dir=self.data_dir, docid_space=docid_space,
                                      input_vocabulary_dir=input_vocabulary_dir,
                                      input_length=self.input_length, target_length=self.target_length,
                                      vocabulary_path=self.vocabulary_path, daq_num_chunks=self.daq_num_chunks,
                                      daq_seed=self.daq_seed, d2q_path=self.d2q_path,
                                      d2q_queries_per_passage=self.d2q_queries_per_passage,
                                      d2q_selection=self.d2q_selection, d2q_seed=self.d2q_seed, rows=(self.row,),
                                      cache_in_memory=self.cache_in_memory)

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
    cache_in_memory: bool = True  # as DatasetConfig's

    def docid_space(self) -> None:
        return None

    def register(self, docid_space: Optional[DocidSpace], *, input_vocabulary_dir: Optional[str] = None
                 ) -> list[str]:
        del docid_space
        if input_vocabulary_dir is not None:
            raise ValueError(f"{self.name}: doc2query's inputs are the SentencePiece vocabulary's (its targets are "
                             f"query text in it), not {input_vocabulary_dir}'s: no tower encoder here")
        from gr_jax.tasks import doc2query
        return [doc2query.register_doc2query(name=self.name, data_dir=self.data_dir, input_length=self.input_length,
                                             target_length=self.target_length, vocabulary_path=self.vocabulary_path,
                                             cache_in_memory=self.cache_in_memory)]

    @property
    def mixture_name(self) -> str:
        from gr_jax.tasks import doc2query
        return doc2query.doc2query_task_name(name=self.name)


def build_model(*, config: network.T5Config, model_vocab_size: int, loss: losses.Loss = losses.TokenCrossEntropy(),
                docid_token_range: Optional[tuple[int, int]] = None, head: OutputHead = StandardHead(),
                encoder_tower: Optional[Tower] = None, train_encoder_tower: bool = True) -> EncoderDecoderModel:
    """The model of a run: its `head` given the docid token range [start, stop) (`DocidSpace.docid_token_range`)
    where it needs one and gin left it unset; its input embedding sized to the ids the head embeds out of the run's
    `model_vocab_size` (`OutputHead.embedded_vocab_size`: all of them, or for atomic docids only the text's), rounded
    up to a multiple of 128, unless gin fixed it, in which case a too-small size is an error. encoder_tower: a
    pretrained tower as the encoder (`EncoderDecoderModel`)."""
    head = head.with_docid_range(docid_token_range)
    embedded = head.embedded_vocab_size(config, model_vocab_size=model_vocab_size)
    if config.vocab_size is None:
        config = config.with_vocab_size(embedded)
    elif config.vocab_size < embedded:
        raise ValueError(f"T5Config.vocab_size={config.vocab_size} is smaller than the {embedded} token ids "
                         f"the vocabulary and docids need (head={head!r})")
    return EncoderDecoderModel(config=config, loss=loss, head=head, encoder_tower=encoder_tower,
                               train_encoder_tower=train_encoder_tower)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GenerativeFamily(ModelFamily):
    """A family whose model generates docids from the seqio tasks' examples (its run is a `Built`): the run's data,
    the training objective and where its parameters start. The encoder-decoder `Experiment` and the decoder-only
    family (`gr_jax.decoder_only.experiment`)."""
    dataset: RunData
    loss: losses.Loss = losses.TokenCrossEntropy()
    # Where the run's parameters start: a gr_jax model dir (e.g. continued span-corruption pretraining on the
    # corpus, see gr_jax.warm_start), or for the encoder-decoder a Hugging Face T5.1.1 dir (config.json +
    # safetensors), as the study.
    init_checkpoint: Optional[str] = None

    def input_vocabulary_dir(self) -> Optional[str]:
        """The WordPiece folder that tokenises the inputs where a tower encodes them, else None (the run's own
        vocabulary): what `dataset.register` is given, and part of the input fingerprint."""
        return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Experiment(GenerativeFamily):
    """A generative encoder-decoder run: `network_config` and `loss` trained on `dataset` (the training setup:
    `ModelFamily`)."""
    network_config: network.T5Config
    head: OutputHead = StandardHead()  # the output head and its settings (gin: HEAD, gin_configs/decoders/*.gin)
    # A pretrained tower (gin: ENCODER_TOWER, gin_configs/encoders/minilm.gin) as the encoder instead of T5.1.1's,
    # its states bridged to the decoder (`gr_jax.tower_encoder`); the inputs are then tokenised as the tower's.
    # train_encoder_tower=False: the tower stays as loaded (no gradient, its updates zeroed).
    encoder_tower: Optional[Tower] = None
    train_encoder_tower: bool = True

    def __post_init__(self):
        if self.encoder_tower is not None and self.init_checkpoint:
            raise ValueError(f"init_checkpoint {self.init_checkpoint} and encoder_tower {self.encoder_tower}: a run "
                             "starts from one or the other (the tower brings its own pretrained encoder)")

    def _tower(self) -> Optional[Tower]:
        return self.encoder_tower.for_data(data_dir=self.dataset.data_dir) if self.encoder_tower else None

    def input_vocabulary_dir(self) -> Optional[str]:
        tower = self._tower()
        return tower.input_vocabulary_dir() if tower is not None else None

    def generative_model(self) -> tuple[Any, Optional[DocidSpace], EncoderDecoderModel]:
        """(input vocabulary, docid space, model): reads the vocabularies and docid space, registers the tasks and
        builds the model for them (no parameter is allocated). The input vocabulary is what queries are tokenised
        with: the run's SentencePiece vocabulary, or the encoder tower's WordPiece vocabulary."""
        vocabulary = load_vocabulary(vocabulary_file(self.dataset))
        tower = self._tower()
        input_vocabulary_dir = tower.input_vocabulary_dir() if tower is not None else None
        docid_space = self.dataset.docid_space()
        self.dataset.register(docid_space, input_vocabulary_dir=input_vocabulary_dir)
        model = build_model(config=self.network_config, loss=self.loss, head=self.head, encoder_tower=tower,
                            train_encoder_tower=self.train_encoder_tower,
                            model_vocab_size=docid_space.model_vocab_size if docid_space else vocabulary.vocab_size,
                            docid_token_range=docid_space.docid_token_range if docid_space else None)
        if input_vocabulary_dir is not None:
            vocabulary = input_vocabulary(self.dataset, input_vocabulary_dir=input_vocabulary_dir)
        return vocabulary, docid_space, model

    def build(self, *, keep_checkpoints: int = 3) -> Built:
        """The model (`generative_model`), its mesh and trainer (no parameter is allocated)."""
        vocabulary, docid_space, model = self.generative_model()
        mesh, trainer, checkpointer = self.training_parts(model, keep_checkpoints=keep_checkpoints,
                                                          frozen=model.frozen_parameters)
        return Built(experiment=self, vocabulary=vocabulary, docid_space=docid_space, model=model, mesh=mesh,
                     trainer=trainer, checkpointer=checkpointer)


class GenerativeModel(TrainableModel, DocidGenerator, Protocol):
    """A generative run's model: trained on the seqio tasks' features, decoding docids. The encoder-decoder
    (`EncoderDecoderModel`) and the decoder-only family's (`gr_jax.decoder_only.model.DecoderOnlyModel`)."""

    @property
    def encoder_tower(self) -> Optional[Tower]: ...

    @property
    def frozen_parameters(self) -> Optional[str]: ...

    def pretrained_params(self, *, abstract: Any) -> Any: ...

    def params_from_checkpoint(self, *, checkpoint_dir: str, fresh: Any, shardings: Any) -> Any: ...


@dataclasses.dataclass(kw_only=True)
class Built(BuiltRun):
    """A generative run's live objects (the encoder-decoder `Experiment`'s, and other families' whose model is a
    `GenerativeModel` over the same tasks)."""
    experiment: GenerativeFamily
    model: GenerativeModel
    vocabulary: Any
    docid_space: Optional[DocidSpace]

    def init_checkpoint(self) -> Optional[str]:
        return self.experiment.init_checkpoint

    def input_fingerprint(self) -> dict[str, str]:
        """sha256 of the vocabulary file, of the inputs' WordPiece vocab.txt where a tower encodes them, and of the
        docid table's token ids [docids, length] (computed once: every checkpoint saves it)."""
        fingerprint = self.__dict__.get("_input_fingerprint")
        if fingerprint is None:
            tower = self.model.encoder_tower
            fingerprint = input_fingerprint(
                vocabulary_file=vocabulary_file(self.experiment.dataset), docid_space=self.docid_space,
                input_vocabulary_dir=tower.input_vocabulary_dir() if tower is not None else None)
            self.__dict__["_input_fingerprint"] = fingerprint
        return dict(fingerprint)

    def init_state(self) -> TrainState:
        """A fresh train state: the encoder tower's pretrained weights where it has one; its parameters from
        `init_checkpoint` when set (a gr_jax run dir: warm start; else a Hugging Face T5.1.1 dir)."""
        experiment, trainer = self.experiment, self.trainer
        given = self.model.pretrained_params(abstract=trainer.abstract_state.params)
        state = trainer.init_state(jax.random.PRNGKey(experiment.seed), given=given)
        if experiment.init_checkpoint and RunDir.of(experiment.init_checkpoint).is_run():
            state = warm_start.initialize_from_run(state=state, trainer=trainer, model_dir=experiment.init_checkpoint,
                                                   seed=experiment.seed)
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
            start_batch=start_batch, shard_index=jax.process_index(), num_shards=jax.process_count(),
            input_vocabulary_dir=self.experiment.input_vocabulary_dir())

    @property
    def tokens_per_batch(self) -> int:
        dataset = self.experiment.dataset
        return self.experiment.batch_size * (dataset.input_length + dataset.target_length)

    def retriever(self, params: Any = None, *, settings: RetrievalSettings, show_progress: bool = False,
                  step: Optional[int] = None) -> ParametricRetriever:
        """The model with `params` as a retriever over the run's docid space (`docid_retriever`). `step`, the
        checkpoint the params come from, matters to retrievers that keep per-checkpoint state (a dense run's corpus
        index), not to this one."""
        del step
        return self.docid_retriever(params, settings=settings, show_progress=show_progress)

    def docid_retriever(self, params: Any = None, *, settings: RetrievalSettings,
                        show_progress: bool = False) -> GenerativeRetriever:
        """The model with `params` as a retriever of the docids it generates (its decoding compiled on first use),
        decoding as `settings` say (batch_size, num_beams, constrained); a family whose documents are found
        otherwise from them wraps it (n-gram spans)."""
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
        if self.docid_space is None:
            raise ValueError(f"{self.experiment.dataset.mixture_name!r} has no docids")
        return self.docid_space.table.rows_of(docids)
