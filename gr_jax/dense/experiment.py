"""The dense family: a dual encoder, its data and corpus index (the training setup: `gr_jax.family`), and its live
objects.

`build()` gives a `DenseBuilt`, which the same training loop, checkpoints, evaluation actions and entry points
(`gr_jax.train`, `gr_jax.eval`, `gr_jax.infer`, `gr-jax search`) use through `gr_jax.family.BuiltRun`. gin:
`gin_configs/dense/*.gin` bind `EXPERIMENT` to one.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import pathlib
from collections.abc import Container, Sequence
from typing import Any, Optional

import jax
import numpy as np

from gr_jax.data.readers import open_dataset
from gr_jax.dense import data as dense_data
from gr_jax.dense import losses as dense_losses
from gr_jax.dense.index import IndexConfig
from gr_jax.dense.model import DualEncoderConfig, DualEncoderModel
from gr_jax.family import ModelFamily, SampledBatchesRun
from gr_jax.retrievers.dense import DenseRetriever
from gr_jax.retrievers.settings import RetrievalSettings
from gr_jax.run_dir import RunDir
from gr_jax.trainer import TrainState


def stable_repr(value: Any) -> str:
    """`repr` of a config that is the same in every process: dataclasses field by field, and functions (a pooling,
    an activation) by module and name, where `repr` would print their address (different in each process, which
    made a saved corpus index look stale to the next one)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(f"{field.name}={stable_repr(getattr(value, field.name))}"
                           for field in dataclasses.fields(value))
        return f"{type(value).__qualname__}({fields})"
    if isinstance(value, (list, tuple)):
        return type(value).__name__ + "(" + ", ".join(stable_repr(item) for item in value) + ")"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', None)}.{value.__qualname__}"
    return repr(value)

@dataclasses.dataclass(frozen=True, kw_only=True)
class DenseExperiment(ModelFamily):
    """A dual-encoder run: `model` trained on `dataset`'s training pairs with `loss` (the training setup:
    `ModelFamily`); `index` is how its corpus index is built for evaluation and search (faiss exact inner product by
    default)."""
    dataset: dense_data.DenseData
    model: DualEncoderConfig
    loss: dense_losses.DenseLoss = dense_losses.SampledSoftmax()
    index: IndexConfig = IndexConfig()

    def build(self, *, keep_checkpoints: int = 3) -> DenseBuilt:
        """Builds model, mesh and trainer (no parameter is allocated; the corpus is read when first needed)."""
        config = dataclasses.replace(self.model, tower=self.model.tower.for_data(data_dir=self.dataset.data_dir))
        model = DualEncoderModel(config=config, loss=self.loss)
        mesh, trainer, checkpointer = self.training_parts(model, keep_checkpoints=keep_checkpoints)
        return DenseBuilt(experiment=self, model=model, mesh=mesh, trainer=trainer, checkpointer=checkpointer,
                          tokenizer=config.tower.tokenizer(data_dir=self.dataset.data_dir))


@dataclasses.dataclass(kw_only=True)
class DenseBuilt(SampledBatchesRun):
    """A DenseExperiment's live objects."""
    experiment: DenseExperiment
    model: DualEncoderModel
    tokenizer: dense_data.Tokenizer

    @functools.cached_property
    def corpus(self) -> dense_data.CorpusDocuments:
        """The collection's docids and texts by row, read once per run."""
        return dense_data.CorpusDocuments(open_dataset(self.experiment.dataset.data_dir))

    def init_state(self) -> TrainState:
        """A fresh train state whose towers hold their pretrained weights (MiniLM's; a T5 checkpoint's)."""
        given = self.model.pretrained_tower_params(abstract=self.trainer.abstract_state.params)
        return self.trainer.init_state(jax.random.PRNGKey(self.experiment.seed), given=given)

    @functools.cached_property
    def batch_source(self) -> dense_data.BatchSource:
        """The training batches (`gr_jax.dense.data`), their pairs and negatives read once per run."""
        experiment = self.experiment
        return dense_data.BatchSource(
            data=experiment.dataset, corpus=self.corpus,
            pairs=dense_data.training_pairs(data=experiment.dataset, corpus=self.corpus), tokenizer=self.tokenizer,
            batch_size=experiment.batch_size, seed=experiment.seed)

    @property
    def tokens_per_batch(self) -> int:
        return self.experiment.batch_size * self.experiment.dataset.tokens_per_example

    def fingerprint(self, step: Optional[int]) -> dict:
        """What identifies this encoder in a corpus index's manifest."""
        return {"model_dir": str(pathlib.Path(self.experiment.model_dir).resolve()), "step": step,
                "config_sha1": hashlib.sha1(stable_repr(self.model.config).encode()).hexdigest()}

    def retriever(self, params: Any = None, *, settings: RetrievalSettings, show_progress: bool = False,
                  step: Optional[int] = None) -> DenseRetriever:
        """The dual encoder with `params` as a retriever (`settings`: batch_size; its depth is the evaluator's k).
        With `step` (the checkpoint the params come from) its corpus index lives in `model_dir/index/{step}`, read
        when it is there and written when it is not; without, it is built in memory when first needed."""
        index_dir = None if step is None else RunDir.of(self.experiment.model_dir).index(step)
        return DenseRetriever(model=self.model, params=params, tokenizer=self.tokenizer, corpus=self.corpus,
                              input_length=self.experiment.dataset.input_length,
                              target_length=self.experiment.dataset.target_length, mesh=self.mesh,
                              param_shardings=self.trainer.state_shardings.params, rules=self.trainer.rules,
                              batch_size=settings.batch_size, index_config=self.experiment.index,
                              index_dir=index_dir, fingerprint=self.fingerprint(step), show_progress=show_progress)

    def retriever_kept_at(self, retriever: DenseRetriever, *, step: int) -> DenseRetriever:
        """The corpus index of checkpoint `step` kept in `model_dir/index/{step}` (see `BuiltRun`): training's final
        evaluation writes it, `gr_jax.eval`, `gr_jax.infer`, search and the tools of that step read it."""
        return retriever.kept_in(RunDir.of(self.experiment.model_dir).index(step), fingerprint=self.fingerprint(step))

    def known_docids(self) -> Optional[Container[str]]:
        return self.corpus

    def collection_rows(self, docids: Sequence[str]) -> np.ndarray:
        return self.corpus.rows_of(docids)
