"""What a GDR run is (the generative cluster decoder, its query encoder, the clustered index it ranks, its data,
optimizer, batch and mesh) and its live objects.

A model family (`gr_jax.family`) beside the generative and dense ones: `build()` gives a `GdrBuilt`, which the same
training loop, checkpoints, evaluation actions and entry points (`gr_jax.train`, `gr_jax.eval`, `gr_jax.infer`,
`gr-jax search`) use through `gr_jax.family.BuiltRun`. gin: `gin_configs/gdr/`.

The document vectors are frozen: they are the clustered index's (`gr_jax.gdr.index`), made by a dense run's
document encoder. A run records that encoder's fingerprint (`model_dir/document_encoder.json`) when it starts, and
refuses an index whose vectors another encoder made.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Container, Sequence
from typing import Any, Optional

import jax
import numpy as np

from gr_jax import network
from gr_jax.data.readers import DataFormatError, open_dataset
from gr_jax.dense.run_tower import DenseRunTower
from gr_jax.dense.towers import SentencePieceTokenizer, Tokenizer, Tower
from gr_jax.docids import DocidSpace
from gr_jax.docids.schemes.semantic import digit_token_ids
from gr_jax.experiment import build_model
from gr_jax.family import ModelFamily, SampledBatchesRun
from gr_jax.gdr.clusters import cluster_id_table
from gr_jax.gdr.data import GdrBatchSource, GdrData, training_examples
from gr_jax.gdr.index import ClusteredIndex
from gr_jax.gdr.losses import GdrLoss
from gr_jax.gdr.model import GdrModel
from gr_jax.heads import OutputHead, StandardHead
from gr_jax.retrievers.gdr import GdrRetriever
from gr_jax.retrievers.settings import RetrievalSettings
from gr_jax.run_dir import RunDir
from gr_jax.trainer import TrainState
from gr_jax.vocabulary import load_vocabulary, vocabulary_file

CLUSTER_SCHEME = "gdr_clusters"


@dataclasses.dataclass(frozen=True, kw_only=True)
class GdrExperiment(ModelFamily):
    """A GDR run (see the module docstring).

    network_config: the T5.1.1 of the cluster decoder (size gin) and, when
    `query_tower` is None, of the query encoder. query_tower: a dual-encoder tower (`gr_jax.dense.towers`) as the
    query encoder instead; its weights are its pretrained ones, or with `query_tower_from_document_encoder` those
    of the dense run that encoded the documents (its query tower at the index's step); train_query_tower=False
    keeps them as loaded (no backward pass through the tower, its updates zeroed: the cheap setting of `make demo`).
    temperature: tau of S_intra; cluster_weight: the weight of log p(cluster | q) in the retriever's combined score.
    head: the cluster decoder's output head (standard or PAWA; gin: HEAD, gin_configs/decoders/*.gin).
    The training setup: `ModelFamily`.
    """
    dataset: GdrData
    network_config: network.T5Config
    query_tower: Optional[Tower] = None
    query_tower_from_document_encoder: bool = False
    train_query_tower: bool = True
    temperature: float = 0.05
    cluster_weight: float = 0.0
    loss: GdrLoss = GdrLoss()
    head: OutputHead = StandardHead()

    def __post_init__(self):
        if self.query_tower_from_document_encoder and self.query_tower is None:
            raise ValueError("query_tower_from_document_encoder needs a query_tower (the T5 encoder has no dense "
                             "run to start from)")

    def build(self, *, keep_checkpoints: int = 3) -> GdrBuilt:
        """Reads the vocabulary and the clustered index, builds the cluster-id space, model, mesh and trainer (no
        parameter is allocated)."""
        dataset = self.dataset
        vocabulary = load_vocabulary(vocabulary_file(dataset))
        index = ClusteredIndex.load(dataset.index_dir)
        check_document_encoder(self.model_dir, index)
        table = cluster_id_table(index.clusters, digit_tokens=digit_token_ids(vocabulary))
        table.check_fits(dataset.target_length)
        space = DocidSpace.from_table(table, scheme=CLUSTER_SCHEME, text_vocab_size=vocabulary.vocab_size)
        # The cluster decoder is a generative model's network, sized as one (its head's docid range, its vocabulary).
        decoder = build_model(config=self.network_config, model_vocab_size=space.model_vocab_size,
                              docid_token_range=space.docid_token_range, head=self.head)
        tower = self.query_tower.for_data(data_dir=dataset.data_dir) if self.query_tower is not None else None
        if tower is not None and self.query_tower_from_document_encoder:
            # The query tower starts as the dense run that encoded the index's documents.
            tower = DenseRunTower(tower=tower, model_dir=index.encoder["model_dir"], step=int(index.encoder["step"]))
        model = GdrModel(config=decoder.config, head=decoder.head, encoder_tower=tower, document_dim=index.dim,
                         temperature=self.temperature, gdr_loss=self.loss, train_encoder_tower=self.train_query_tower)
        mesh, trainer, checkpointer = self.training_parts(model, keep_checkpoints=keep_checkpoints,
                                                          frozen=model.frozen_parameters)
        tokenizer = tower.tokenizer(data_dir=dataset.data_dir) if tower is not None else SentencePieceTokenizer(
            vocabulary)
        return GdrBuilt(experiment=self, model=model, mesh=mesh, trainer=trainer, checkpointer=checkpointer,
                        vocabulary=vocabulary, cluster_space=space, index=index, tokenizer=tokenizer)


def check_document_encoder(model_dir: str, index: ClusteredIndex) -> None:
    """Raises when `model_dir` was trained against document vectors of another encoder than `index`'s."""
    path = RunDir.of(model_dir).document_encoder
    if path.is_file():
        trained = json.loads(path.read_text())
        if trained != index.encoder:
            where = index.directory or "the clustered index"
            raise DataFormatError(f"{where}: its document vectors come from the encoder {index.encoder}, but the run "
                                  f"{model_dir} was trained against {trained} ({path}): an index of another encoder")


@dataclasses.dataclass(kw_only=True)
class GdrBuilt(SampledBatchesRun):
    """A GdrExperiment's live objects."""
    experiment: GdrExperiment
    model: GdrModel
    vocabulary: Any
    cluster_space: DocidSpace
    index: ClusteredIndex
    tokenizer: Tokenizer

    def init_state(self) -> TrainState:
        """A fresh train state: the query tower's weights loaded (see `GdrExperiment`), and the document encoder's
        fingerprint recorded in the model dir."""
        experiment = self.experiment
        given = self.model.pretrained_params(abstract=self.trainer.abstract_state.params)
        state = self.trainer.init_state(jax.random.PRNGKey(experiment.seed), given=given)
        path = RunDir.of(experiment.model_dir).document_encoder
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.index.encoder, indent=1))
        return state

    @property
    def tokens_per_batch(self) -> int:
        return self.experiment.batch_size * self.experiment.dataset.tokens_per_example

    @functools.cached_property
    def batch_source(self) -> GdrBatchSource:
        experiment = self.experiment
        return GdrBatchSource(data=experiment.dataset, index=self.index,
                              examples=training_examples(data=experiment.dataset, index=self.index),
                              cluster_tokens=np.asarray(self.cluster_space.table.tokens), tokenizer=self.tokenizer,
                              batch_size=experiment.batch_size, seed=experiment.seed)

    def retriever(self, params: Any = None, *, settings: RetrievalSettings, show_progress: bool = False,
                  step: Optional[int] = None) -> GdrRetriever:
        """The model with `params` as a GDR retriever: settings.num_beams clusters recalled per query, their
        documents ranked (any depth)."""
        del step
        return GdrRetriever(model=self.model, params=params, cluster_space=self.cluster_space, index=self.index,
                            tokenizer=self.tokenizer, input_length=self.experiment.dataset.input_length,
                            mesh=self.mesh, param_shardings=self.trainer.state_shardings.params,
                            batch_size=settings.batch_size, num_beams=settings.num_beams,
                            cluster_weight=self.experiment.cluster_weight, rules=self.trainer.rules,
                            show_progress=show_progress)

    def known_docids(self) -> Optional[Container[str]]:
        return self.index

    @functools.cached_property
    def _corpus(self):
        from gr_jax.dense.data import CorpusDocuments
        return CorpusDocuments(open_dataset(self.experiment.dataset.data_dir))

    def collection_rows(self, docids: Sequence[str]) -> np.ndarray:
        """Each docid's row in the data dir's collection (-1: an added document, or none)."""
        return self._corpus.rows_of(docids)
