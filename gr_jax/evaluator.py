"""Retrieval evaluation of a generative model: beam search over a query set, docids back from tokens, metrics.

Queries are tokenised exactly as the seqio tasks tokenise inputs (SentencePiece, trimmed to `input_length - 1`,
then EOS), decoded in fixed-size batches by one compiled predict function (the last batch is padded with empty
queries whose outputs are discarded), and mapped back to docids through the DocidTable. With `constrained=True`
the docid trie restricts the beam; without it, outputs that are no docid count towards `invalid_docid_rate`.
"""
from __future__ import annotations

import time
from typing import Any, Iterable, Optional, Sequence

import jax
import numpy as np
import tqdm
from jax.sharding import Mesh

from gr_jax import evaluation
from gr_jax import partitioning
from gr_jax.docids import DocidTable
from gr_jax.models import EncoderDecoderModel
from gr_jax.trie import Trie

EOS_ID = 1


def encode_queries(texts: Sequence[str], *, vocabulary: Any, input_length: int) -> np.ndarray:
    """int32[len(texts), input_length]: tokens trimmed to input_length - 1, EOS appended, PAD after (as seqio)."""
    out = np.zeros((len(texts), input_length), np.int32)
    for i, text in enumerate(texts):
        ids = list(vocabulary.encode(text))[:input_length - 1] + [EOS_ID]
        out[i, :len(ids)] = ids
    return out


class RetrievalEvaluator:
    """Ranks docids for every query of a split and scores the run against its qrels."""

    def __init__(self, *, model: EncoderDecoderModel, queries: Iterable[tuple[str, str]],
                 qrels: dict[str, dict[str, int]], docid_table: DocidTable, vocabulary: Any, input_length: int,
                 mesh: Mesh, param_shardings: Any, batch_size: int = 32, num_beams: int = 40,
                 constrained: bool = True, rules=partitioning.LOGICAL_AXIS_RULES):
        queries = list(queries)
        self.qids = [qid for qid, _ in queries]
        self.qrels = qrels
        self.docid_table = docid_table
        self.valid_docids = frozenset(docid_table.docids)
        self.model = model
        self.mesh = mesh
        self.rules = rules
        data_size = mesh.shape[partitioning.DATA_AXIS]
        self.batch_size = -(-batch_size // data_size) * data_size
        self.num_beams = num_beams
        self.max_decode_len = docid_table.max_length
        self.tokens = encode_queries([text for _, text in queries], vocabulary=vocabulary,
                                     input_length=input_length)
        self.trie = (Trie.build(docid_table.tokens, vocab_size=model.config.logits_vocab_size)
                     if constrained else None)
        self.batch_sharding = partitioning.batch_sharding(mesh)
        self._predict = jax.jit(self._predict_impl, in_shardings=(param_shardings, self.batch_sharding, None),
                                out_shardings=(self.batch_sharding, self.batch_sharding))

    def _predict_impl(self, params, tokens, trie):
        result = self.model.predict_batch(params, tokens, num_beams=self.num_beams,
                                          max_decode_len=self.max_decode_len, trie=trie)
        return result.sequences, result.scores

    def rank(self, params, *, progress: bool = True) -> dict[str, list[tuple[str, float]]]:
        """qid -> [(docid or decoded-token string for invalid outputs, log-likelihood)], best first."""
        run: dict[str, list[tuple[str, float]]] = {}
        n = len(self.qids)
        start = time.perf_counter()
        bar = tqdm.tqdm(total=n, desc="retrieval eval", unit="query", disable=not progress, leave=False)
        with partitioning.partitioning_context(mesh=self.mesh, rules=self.rules):
            for lo in range(0, n, self.batch_size):
                chunk = self.tokens[lo:lo + self.batch_size]
                real = len(chunk)
                if real < self.batch_size:
                    chunk = np.concatenate([chunk, np.zeros((self.batch_size - real, chunk.shape[1]), np.int32)])
                sequences, scores = jax.device_get(self._predict(params, jax.device_put(chunk, self.batch_sharding), self.trie))
                for i in range(real):
                    ranking = []
                    for seq, score in zip(sequences[i], scores[i]):
                        if not np.isfinite(score):
                            continue
                        docid = self.docid_table.lookup(seq)
                        ranking.append((docid if docid is not None else _invalid_name(seq), float(score)))
                    run[self.qids[lo + i]] = ranking
                bar.update(real)
        bar.close()
        self.last_queries_per_second = n / max(time.perf_counter() - start, 1e-9)
        return run

    def evaluate(self, params, *, progress: bool = True) -> tuple[dict[str, float], dict]:
        run = self.rank(params, progress=progress)
        metrics = evaluation.retrieval_metrics(run=run, qrels=self.qrels, valid_docids=self.valid_docids)
        metrics = dict(metrics, queries_per_second=self.last_queries_per_second)
        return metrics, run


def _invalid_name(tokens: np.ndarray) -> str:
    """A readable, unique stand-in for a decoded sequence that is no docid (kept so invalid outputs are counted)."""
    ids = [int(t) for t in tokens if t > 0]
    return "<invalid:" + "-".join(map(str, ids)) + ">"
