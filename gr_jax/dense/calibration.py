"""The normaliser gap of a dual encoder's training objective (`gr_vs_dense_limitations.txt` Sec. 3.1.1, App. B).

Local normalisation replaces the full-corpus partition function Z(q) = sum_{d in D} exp(S(q, d) / tau) by the
sampled Z_K(q) over the query's K training candidates (its positive, in-batch and hard negatives), and Eq. 9 gives

    log P~(d+ | q) - log P(d+ | q; N) = log Z_K(q) - log Z(q),

so the training loss is blind to g(q) = log Z(q) - log Z_K(q). With negatives drawn from a proposal pi,
g = log(N / K) - delta(q), delta the proposal bias of Eq. 4 (how much more mass pi's documents carry than the
corpus average). The paper's Theorem 3.1 states a bound in the other direction from what its proof (Eq. 12)
gives (see ../shared/papers/NOTES.md, 000.1 item 3), so this measures g rather than assuming a bound: at every
`every_steps`, the queries of a fixed probe of training batches are scored against their batch's candidates
(exactly the training softmax, dropout off) and against the whole corpus, and the action writes

    calibration/log_z, calibration/log_z_k, calibration/gap = mean g(q), calibration/log_n_over_k (K: the mean
    number of candidates per softmax), calibration/proposal_bias = log(N / K) - gap

(log-units of S / tau, averaged over the probe queries). `corpus_sample` estimates Z from a seeded uniform sample of
that many documents, (N / M) sum over the sample, for corpora too large to encode at every evaluation.
"""
from __future__ import annotations

import logging
import math
from typing import Optional

import jax
import numpy as np

from gr_jax import partitioning
from gr_jax.actions import Action
from gr_jax.dense.index import CorpusIndex
from gr_jax.dense.model import DOCUMENT, QUERY
from gr_jax.retrievers.settings import EvalConfig

logger = logging.getLogger(__name__)


class NormaliserGap(Action):
    """See the module docstring. gin: `training.train.actions = [@calibration.NormaliserGap()]`."""

    def __init__(self, *, every_steps: int, probe_batches: int = 4, corpus_sample: Optional[int] = None,
                 seed: int = 0, batch_size: int = 64):
        if every_steps < 1 or probe_batches < 1:
            raise ValueError(f"every_steps and probe_batches must be >= 1, got {every_steps}, {probe_batches}")
        self.every_steps = every_steps
        self.probe_batches = probe_batches
        self.corpus_sample = corpus_sample
        self.seed = seed
        self.batch_size = batch_size
        self.found: dict[str, float] = {}

    def start(self, run):
        built = run.built
        source = built.batch_source
        # The probe: the first training batches (as random as any), this process's rows of them.
        self._probe = [source.batch(b, shard_index=jax.process_index(), num_shards=jax.process_count())
                       for b in range(self.probe_batches)]
        self._rows = None
        if self.corpus_sample is not None and self.corpus_sample < len(built.corpus):
            self._rows = np.sort(np.random.default_rng(self.seed).choice(len(built.corpus), self.corpus_sample,
                                                                         replace=False))
        self._retriever = built.retriever(None, settings=EvalConfig(batch_size=self.batch_size))
        model, trainer = built.model, built.trainer

        def probe(params, batch):
            """(log Z_K float32[b], candidates int32[b], query vectors) of a training batch, dropout off."""
            logits, owner, valid = model.candidate_scores(params, batch, None)
            log_z_k = model.loss.log_normalizer(logits=logits, owner=owner, valid=valid)
            queries = model.encode(params, batch["query_ids"], batch["query_mask"], side=QUERY)
            return log_z_k, model.loss.competing(owner=owner, valid=valid).sum(axis=1), queries

        self._measure_probe = jax.jit(probe, in_shardings=(trainer.state_shardings.params, trainer.batch_sharding))
        return False

    def measure(self, run, params) -> dict[str, float]:
        """The module docstring's quantities for `params`."""
        built, trainer = run.built, run.built.trainer
        with trainer.sharding_context():
            measured = [jax.device_get(self._measure_probe(
                params, partitioning.host_batch_to_global(batch, mesh=trainer.mesh))) for batch in self._probe]
        log_z_k, candidates, vectors = (np.concatenate(parts) for parts in zip(*measured))
        retriever = self._retriever.with_params(params)
        temperature = built.model.config.temperature
        corpus = built.corpus
        if self._rows is None:
            log_z = retriever.index().log_partition(vectors, temperature=temperature)
        else:
            sample = CorpusIndex(docids=corpus.docids[self._rows],
                                 embeddings=retriever.encode(corpus.texts(self._rows), side=DOCUMENT))
            log_z = sample.log_partition(vectors, temperature=temperature) + math.log(len(corpus) / len(self._rows))
        k = float(np.mean(candidates))
        gap = float(np.mean(log_z - log_z_k.astype(np.float64)))
        log_n_over_k = math.log(len(corpus) / k)
        return {"log_z": float(np.mean(log_z)), "log_z_k": float(np.mean(log_z_k)), "gap": gap,
                "log_n_over_k": log_n_over_k, "proposal_bias": log_n_over_k - gap, "candidates": k}

    def __call__(self, run, progress):
        values = self.measure(run, progress.state.params)
        run.writer.write_scalars(progress.step, {f"calibration/{k}": v for k, v in values.items()})
        self.found.update({f"calibration/{k}": v for k, v in values.items()})
        logger.info("step %d normaliser gap: %s", progress.step, values)
        return False

    def report(self):
        return dict(self.found)

