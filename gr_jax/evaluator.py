"""Retrieval evaluation of a generative model: beam search over a query set, docids back from tokens, metrics.

Queries are tokenised exactly as the seqio tasks tokenise inputs (SentencePiece, trimmed to `input_length - 1`,
then EOS) and decoded in fixed-size batches by one compiled function (the last batch is padded with empty
queries whose outputs are discarded). With `constrained=True` the docid trie restricts the beam; without it,
outputs that are no docid count towards `invalid_docid_rate`.

Decoded sequences are mapped back to documents on the device, inside the same compiled function: the trie of
all docids (built in either mode) gives each beam's row in the DocidTable (`Trie.leaf_indices`, -1 for a
sequence that is no docid), and the host only indexes `docid_table.docids` with those rows. So no Python
dict or set over the corpus is ever built (8.8M MS MARCO docids would cost ~1GB of host memory and tens of
seconds), and the host work per batch is O(batch * beams).
"""
from __future__ import annotations

import time
from collections.abc import Container, Iterable, Sequence
from typing import Any

import jax
import numpy as np
import tqdm
from jax.sharding import Mesh

from gr_jax import evaluation
from gr_jax import partitioning
from gr_jax.docids import DocidTable
from gr_jax.models import EncoderDecoderModel
from gr_jax.trie import Trie
from gr_jax.vocabulary import EOS_ID

# Stand-in names of decoded sequences that are no docid start with this (see `invalid_output_name`).
INVALID_PREFIX = "<invalid:"

Run = dict[str, list[tuple[str, float]]]


def encode_queries(texts: Sequence[str], *, vocabulary: Any, input_length: int) -> np.ndarray:
    """int32[len(texts), input_length]: tokens trimmed to input_length - 1, EOS appended, PAD after (as seqio)."""
    out = np.zeros((len(texts), input_length), np.int32)
    for i, text in enumerate(texts):
        ids = list(vocabulary.encode(text))[:input_length - 1] + [EOS_ID]
        out[i, :len(ids)] = ids
    return out


def invalid_output_name(tokens: np.ndarray) -> str:
    """A readable stand-in for a decoded sequence that is no docid (kept so invalid outputs are counted).

    tokens: int[L], a decoded sequence. The name spells the tokens before the first EOS (`[7, 9, EOS, PAD]` ->
    `<invalid:7-9>`), or all L tokens and "..." for a sequence that never reached EOS (`<invalid:7-0-9...>`),
    so distinct outputs of one decoding length get distinct names.
    """
    tokens = np.asarray(tokens)
    eos = np.flatnonzero(tokens == EOS_ID)
    content = tokens[:eos[0]] if eos.size else tokens
    return INVALID_PREFIX + "-".join(map(str, content.tolist())) + (">" if eos.size else "...>")


class _AllDocidsBut(Container[str]):
    """The valid docids of a run as the complement of its invalid outputs' names: no set over the corpus."""

    def __init__(self, invalid_names: frozenset[str]):
        self.invalid_names = invalid_names

    def __contains__(self, docid: object) -> bool:
        return docid not in self.invalid_names


class RetrievalEvaluator:
    """Ranks docids for every query of a split and scores the run against its qrels.

    queries: (qid, text) pairs, qids unique; qrels: qid -> {docid: relevance}.
    batch_size is rounded up to a multiple of the mesh's 'data' axis. `rank` returns, per qid, up to
    `num_beams` (docid, log-likelihood) pairs, best first; an unconstrained output that is no docid appears
    under its `invalid_output_name`.
    """

    def __init__(self, *, model: EncoderDecoderModel, queries: Iterable[tuple[str, str]],
                 qrels: dict[str, dict[str, int]], docid_table: DocidTable, vocabulary: Any, input_length: int,
                 mesh: Mesh, param_shardings: Any, batch_size: int = 32, num_beams: int = 40,
                 constrained: bool = True, rules: partitioning.LogicalAxisRules = partitioning.LOGICAL_AXIS_RULES):
        queries = list(queries)
        self.qids = [qid for qid, _ in queries]
        if len(set(self.qids)) != len(self.qids):
            first: dict[str, int] = {}
            for i, qid in enumerate(self.qids):
                if qid in first:
                    raise ValueError(f"query id {qid!r} appears twice (queries {first[qid]} and {i}): the run "
                                     "would keep only one of them")
                first[qid] = i
        if batch_size < 1 or num_beams < 1:
            raise ValueError(f"batch_size and num_beams must be positive, got {batch_size} and {num_beams}")
        self.qrels = qrels
        self.docid_table = docid_table
        self.model = model
        self.mesh = mesh
        self.rules = rules
        data_size = mesh.shape[partitioning.DATA_AXIS]
        self.batch_size = -(-batch_size // data_size) * data_size
        self.num_beams = num_beams
        self.constrained = constrained
        self.max_decode_len = docid_table.max_length
        self.tokens = encode_queries([text for _, text in queries], vocabulary=vocabulary,
                                     input_length=input_length)
        # Built in both modes: unconstrained outputs are mapped to docids through it too.
        self.trie = Trie.build(docid_table.tokens, vocab_size=model.config.logits_vocab_size)
        self.batch_sharding = partitioning.batch_sharding(mesh)
        self.param_shardings = param_shardings
        self._predict = jax.jit(self._predict_impl, in_shardings=(param_shardings, self.batch_sharding, None),
                                out_shardings=self.batch_sharding)
        self._compiled_predict = None
        self.last_invalid_names: frozenset[str] = frozenset()
        self.last_queries_per_second = float("nan")
        self.last_compile_seconds = 0.0

    def _predict_impl(self, params, tokens: jax.Array, trie: Trie) -> tuple[jax.Array, jax.Array, jax.Array]:
        """tokens int32[batch, input_length] -> (rows int32[batch, beams]: DocidTable row or -1,
        scores float32[batch, beams], sequences int32[batch, beams, max_decode_len]), best first."""
        result = self.model.predict_batch(params, tokens, num_beams=self.num_beams,
                                          max_decode_len=self.max_decode_len,
                                          trie=trie if self.constrained else None)
        batch, beams, length = result.sequences.shape
        rows = trie.leaf_indices(result.sequences.reshape(batch * beams, length)).reshape(batch, beams)
        return rows, result.scores, result.sequences

    def _compile(self, params, tokens: jax.Array):
        """Compiles the predict function once (ahead of time), so that queries/s measures decoding only."""
        if self._compiled_predict is None:
            start = time.perf_counter()
            self._compiled_predict = self._predict.lower(params, tokens, self.trie).compile()
            self.last_compile_seconds = time.perf_counter() - start
        return self._compiled_predict

    def rank(self, params, *, progress: bool = True) -> Run:
        """qid -> [(docid or `invalid_output_name`, log-likelihood)], best first; empty beams (-inf) are left out."""
        run: Run = {}
        invalid_names: set[str] = set()
        self.last_compile_seconds = 0.0
        docids = self.docid_table.docids
        n = len(self.qids)
        bar = tqdm.tqdm(total=n, desc="retrieval eval", unit="query", disable=not progress, leave=False)
        params = jax.device_put(params, self.param_shardings)  # a no-op for params placed as the trainer places them
        with partitioning.partitioning_context(mesh=self.mesh, rules=self.rules):
            predict = None
            start = time.perf_counter()
            for lo in range(0, n, self.batch_size):
                chunk = self.tokens[lo:lo + self.batch_size]
                real = len(chunk)
                if real < self.batch_size:  # empty queries (all PAD) fill the last batch; their outputs are dropped
                    chunk = np.concatenate([chunk, np.zeros((self.batch_size - real, chunk.shape[1]), np.int32)])
                chunk = jax.device_put(chunk, self.batch_sharding)
                if predict is None:
                    predict = self._compile(params, chunk)
                    start = time.perf_counter()
                rows, scores, sequences = jax.device_get(predict(params, chunk, self.trie))
                for i in range(real):
                    ranking = []
                    for row, score, sequence in zip(rows[i].tolist(), scores[i].tolist(), sequences[i]):
                        if score == -np.inf:  # an empty slot (fewer results than beams)
                            continue
                        if row >= 0:
                            ranking.append((docids[row], score))
                        else:
                            name = invalid_output_name(sequence)
                            invalid_names.add(name)
                            ranking.append((name, score))
                    run[self.qids[lo + i]] = ranking
                bar.update(real)
            elapsed = time.perf_counter() - start
        bar.close()
        self.last_queries_per_second = n / max(elapsed, 1e-9)
        self.last_invalid_names = frozenset(invalid_names)
        return run

    def valid_docids(self) -> Container[str]:
        """The docids that count as valid in the last run: all but its invalid outputs' stand-in names.

        Raises if a real docid looks like one of those names (it would be miscounted as invalid).
        """
        if not self.last_invalid_names.isdisjoint(self.docid_table.docids):  # one C-level pass, only if needed
            clash = sorted(self.last_invalid_names.intersection(self.docid_table.docids))[0]
            raise ValueError(f"docid {clash!r} has the form of an invalid output's name ({INVALID_PREFIX}...>); "
                             "rename it so that invalid outputs can be counted")
        return _AllDocidsBut(self.last_invalid_names)

    def evaluate(self, params, *, progress: bool = True) -> tuple[dict[str, float], Run]:
        """(metrics, run): `evaluation.retrieval_metrics` plus queries_per_second (decoding and mapping,
        compilation excluded) and compile_seconds (0 when this evaluator had compiled already)."""
        run = self.rank(params, progress=progress)
        metrics = evaluation.retrieval_metrics(run=run, qrels=self.qrels, valid_docids=self.valid_docids())
        metrics = dict(metrics, queries_per_second=self.last_queries_per_second,
                       compile_seconds=self.last_compile_seconds)
        return metrics, run
