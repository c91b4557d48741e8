"""A new model family is one module: this file adds a bag-of-words family (hashed query words -> a linear map -> a
softmax over the collection's documents) without editing any library file, trains it through `training.train` (the
loop, checkpoints, the evaluation actions) and evaluates it through the run's normal retrieval evaluation and
`training.evaluate`, whose rankings and metrics a brute-force ranking of the trained weights reproduces."""
from __future__ import annotations

import dataclasses
import functools
import json
import time
import zlib
from collections.abc import Container, Iterator, Sequence
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gr_jax import evaluation, training
from gr_jax.data.batches import SeededEpochs
from gr_jax.data.readers import open_dataset
from gr_jax.family import BuiltRun, ModelFamily
from gr_jax.metrics import Average
from gr_jax.retrievers import Ranking
from gr_jax.retrievers.settings import EvalConfig, RetrievalSettings
from gr_jax.run_dir import RunDir
from gr_jax.tools import call_path
from gr_jax.trainer import TrainState

# --- The family: data, model, retriever, experiment, built run ---------------------------------------------------


def bag_of_words(texts: Sequence[str], *, features: int) -> np.ndarray:
    """float32[texts, features]: each text's words hashed (crc32) into `features` buckets, L2-normalised."""
    x = np.zeros((len(texts), features), np.float32)
    for row, text in enumerate(texts):
        for word in text.lower().split():
            x[row, zlib.crc32(word.encode()) % features] += 1.0
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-9)


@dataclasses.dataclass(frozen=True)
class BagOfWordsData:
    """Training pairs of a data dir: every judged (train query, document) and each document's own text."""
    data_dir: str
    features: int = 256
    eval_split: str = "dev"
    train_split: str = "train"

    @property
    def input_length(self) -> int:
        return self.features

    @property
    def target_length(self) -> int:
        return 1

    @functools.cached_property
    def documents(self) -> list[tuple[str, str]]:
        return list(open_dataset(self.data_dir).collection())

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(float32[pairs, features], int32[pairs] document rows)."""
        dataset = open_dataset(self.data_dir)
        rows = {docid: row for row, (docid, _) in enumerate(self.documents)}
        queries = dict(dataset.queries(self.train_split))
        texts, targets = [text for _, text in self.documents], list(range(len(self.documents)))
        for qid, judged in sorted(dataset.qrels(self.train_split).items()):
            for docid, grade in sorted(judged.items()):
                if grade > 0 and docid in rows and qid in queries:
                    texts.append(queries[qid])
                    targets.append(rows[docid])
        return bag_of_words(texts, features=self.features), np.asarray(targets, np.int32)


@dataclasses.dataclass(frozen=True)
class BagOfWordsModel:
    """logits[b, documents] = x[b, features] @ w[features, documents]; the loss: cross entropy to the document."""
    num_documents: int

    def init(self, rng, *, input_length, target_length):
        del rng, target_length
        return {"params": {"w": jnp.zeros((input_length, self.num_documents), jnp.float32)}}

    def loss_fn(self, params, batch, dropout_rng):
        del dropout_rng
        logits = batch["x"] @ params["w"]
        loss = jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]))
        return loss, {"loss": Average(total=loss, count=jnp.float32(batch["y"].shape[0]))}


class BagOfWordsRetriever:
    """Ranks every document by its logit."""

    def __init__(self, *, params: Any, docids: Sequence[str], features: int):
        self.params, self.docids, self.features = params, list(docids), features

    def with_params(self, params: Any) -> BagOfWordsRetriever:
        return BagOfWordsRetriever(params=params, docids=self.docids, features=self.features)

    def rank(self, queries: Sequence[str], *, k: int) -> Ranking:
        start = time.perf_counter()
        logits = bag_of_words(queries, features=self.features) @ np.asarray(self.params["w"])
        order = np.argsort(-logits, axis=1, kind="stable")[:, :k]
        return Ranking(ids=[[self.docids[d] for d in row] for row in order],
                       scores=[[float(logits[q, d]) for d in row] for q, row in enumerate(order)],
                       seconds=time.perf_counter() - start)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BagOfWordsExperiment(ModelFamily):
    """The family's experiment: the training setup's fields (inherited), `model_dir`, and its data."""
    dataset: BagOfWordsData

    def build(self, *, keep_checkpoints: int = 3) -> BagOfWordsRun:
        model = BagOfWordsModel(num_documents=len(self.dataset.documents))
        mesh, trainer, checkpointer = self.training_parts(model, keep_checkpoints=keep_checkpoints)
        return BagOfWordsRun(experiment=self, model=model, mesh=mesh, trainer=trainer, checkpointer=checkpointer)


@dataclasses.dataclass(kw_only=True)
class BagOfWordsRun(BuiltRun):
    experiment: BagOfWordsExperiment

    def init_state(self) -> TrainState:
        return self.trainer.init_state(jax.random.PRNGKey(self.experiment.seed))

    def train_batches(self, *, start_batch: int) -> Iterator[dict]:
        x, y = self.experiment.dataset.pairs()
        epochs = SeededEpochs(num_examples=len(y), batch_size=self.experiment.batch_size, seed=self.experiment.seed)
        for b in range(start_batch, 1 << 30):
            rows = epochs.indices(b)[jax.process_index()::jax.process_count()]
            yield {"x": x[rows], "y": y[rows]}

    @property
    def tokens_per_batch(self) -> int:
        return self.experiment.batch_size * self.experiment.dataset.features

    def retriever(self, params: Any = None, *, settings: RetrievalSettings, show_progress: bool = False,
                  step: Optional[int] = None) -> BagOfWordsRetriever:
        del settings, show_progress, step
        return BagOfWordsRetriever(params=params, docids=self.docids, features=self.experiment.dataset.features)

    @property
    def docids(self) -> list[str]:
        return [docid for docid, _ in self.experiment.dataset.documents]

    def known_docids(self) -> Optional[Container[str]]:
        return set(self.docids)

    def collection_rows(self, docids: Sequence[str]) -> np.ndarray:
        rows = {docid: row for row, docid in enumerate(self.docids)}
        return np.asarray([rows.get(docid, -1) for docid in docids], np.int64)


# --- The proof ---------------------------------------------------------------------------------------------------


def test_a_family_of_one_module_trains_resumes_and_is_evaluated_like_every_run(fixtures_dir, tmp_path):
    experiment = BagOfWordsExperiment(model_dir=str(tmp_path / "run"),
                                      dataset=BagOfWordsData(data_dir=str(fixtures_dir / "msmarco")),
                                      learning_rate=optax.constant_schedule(0.5), optimizer_factory=optax.adam,
                                      batch_size=8)
    settings = EvalConfig(every_steps=0, ranking_depth=5)
    report = training.train(experiment=experiment, num_train_steps=60, checkpoint_every_steps=30,
                            eval_config=settings, progress=False)
    run_dir = RunDir.of(experiment.model_dir)
    assert report["train/loss"] < np.log(len(experiment.dataset.documents)) / 4  # from log(12) at w = 0
    # Every document's own text retrieves it first: the indexing pairs were learnt.
    built = experiment.build()
    params, step = built.restore_params()
    assert step == 60
    texts = [text for _, text in experiment.dataset.documents]
    assert [ids[0] for ids in built.retriever(params, settings=settings).rank(texts, k=1).ids] == built.docids

    # The final evaluation's metrics and TREC run are those of a brute-force ranking of the trained weights.
    dataset = open_dataset(experiment.dataset.data_dir)
    queries = list(dataset.queries("dev"))
    logits = bag_of_words([text for _, text in queries], features=256) @ np.asarray(params["w"])
    brute = {qid: [(built.docids[d], float(logits[q, d])) for d in np.argsort(-logits[q], kind="stable")[:5]]
             for q, (qid, _) in enumerate(queries)}
    trec = evaluation.read_trec_run(run_dir.trec_run("dev", 60))
    assert {qid: [d for d, _ in ranked] for qid, ranked in trec.items()} == {
        qid: [d for d, _ in ranked] for qid, ranked in brute.items()}
    qrels = dataset.qrels("dev")
    expected = evaluation.retrieval_metrics(run=brute, qrels={qid: qrels.get(qid, {}) for qid in brute},
                                            valid_docids=set(built.docids), depth=5)
    assert expected["MRR@10"] > 0
    for name, value in expected.items():
        assert report[f"eval/{name}"] == pytest.approx(value), name
    assert json.loads(run_dir.final_metrics.read_text())["eval/MRR@10"] == pytest.approx(expected["MRR@10"])

    # gr_jax.eval's path: the checkpoint restored and ranked by the same evaluator.
    metrics = training.evaluate(experiment=experiment, eval_config=settings, progress=False)
    for name, value in expected.items():
        assert metrics[name] == pytest.approx(value), name

    # Resuming: nothing is left to train, the checkpoint of step 60 stays the run's end.
    training.train(experiment=experiment, num_train_steps=60, eval_config=EvalConfig(every_steps=-1), progress=False)
    resumed, step = experiment.build().restore_params()
    assert step == 60
    np.testing.assert_array_equal(np.asarray(resumed["w"]), np.asarray(params["w"]))


def test_the_training_loop_hands_control_to_six_library_modules_besides_the_family(fixtures_dir, tmp_path):
    """`training.py`'s reach (docs/architecture.md, at most 8 modules with a generative family's): the toy family's
    parts are outside the library, so what is counted is the training loop's own machinery, and `family` for the
    default answer to where the run starts (`BuiltRun.init_checkpoint`, recorded in the run's start.json)."""
    experiment = BagOfWordsExperiment(model_dir=str(tmp_path / "run"),
                                      dataset=BagOfWordsData(data_dir=str(fixtures_dir / "msmarco")),
                                      learning_rate=optax.constant_schedule(0.5), optimizer_factory=optax.adam,
                                      batch_size=8)
    calls = call_path.library_calls(caller=training.__file__, run=lambda: training.train(
        experiment=experiment, num_train_steps=2, eval_config=EvalConfig(every_steps=0, ranking_depth=5),
        gin_config_str="# a config\n", progress=False))
    assert set(calls) == {"gr_jax.run_dir", "gr_jax.trainer", "gr_jax.checkpoints", "gr_jax.metric_writers",
                          "gr_jax.actions", "gr_jax.family"}
    assert call_path.collapsed(["a", "a", "b", "a"]) == ["a", "b", "a"]
