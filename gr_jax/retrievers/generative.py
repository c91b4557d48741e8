"""A generative model as a retriever: beam search (or the head's own ranking) from query text to docids.

Queries are tokenised exactly as the seqio tasks tokenise inputs (`gr_jax.vocabulary.encode_inputs`) and decoded
in fixed-size batches by one compiled function per number of beams (the last batch is padded with empty queries
whose outputs are discarded), so a retriever answers any number of later queries without recompiling, and a
training run's periodic evaluations reuse one compilation across parameter updates (`with_params`). With
`constrained=True` the docid trie restricts the beams; without it, outputs that are no docid are returned under
stand-in names (`invalid_output_name`) and listed in `Ranking.invalid`.

Each ranking reports the probability of its rank-1 docid for the Brier score (`Ranking.top1_probability`):
`sequence`, the model's likelihood of the sequence (each step a softmax over the whole vocabulary), and
`trie_masked`, the trie-constrained model's (each step renormalised over the docid tokens the trie allows, so the
probabilities of all docids sum to 1; NaN for an unconstrained output that is no docid). Both come from one extra
teacher-forced decode of the rank-1 sequence inside the same compiled function.

Decoded sequences are mapped back to documents on the device, inside the same compiled function: the trie of all
docids (built in either mode) gives each beam's row in the DocidTable (`Trie.leaf_indices`, -1 for a sequence that
is no docid), and the host only indexes `table.docids` with those rows. So no Python dict or set over the corpus is
built (8.8M MS MARCO docids would cost ~1GB of host memory and tens of seconds), and the host work per batch is
O(batch * beams).
"""
from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any, Optional, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from jax.sharding import Mesh

from gr_jax import partitioning
from gr_jax.decoding import BeamSearchResult, SequenceScores
from gr_jax.docids import DocidSpace, Trie
from gr_jax.retrievers import Ranking
from gr_jax.vocabulary import EOS_ID, encode_inputs

# Stand-in names of decoded sequences that are no docid start with this (see `invalid_output_name`).
INVALID_PREFIX = "<invalid:"


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


class DocidGenerator(Protocol):
    """What the retriever decodes with: an encoder-decoder (`gr_jax.models.EncoderDecoderModel`) or a decoder-only
    model (`gr_jax.decoder_only.model.DecoderOnlyModel`), each from its query tokens [batch, input_length]."""

    @property
    def logits_vocab_size(self) -> int: ...

    def predict_batch(self, params: Any, encoder_input_tokens: jax.Array, *, num_beams: int, max_decode_len: int,
                      trie: Optional[Trie] = None, length_penalty: float = 0.0) -> BeamSearchResult: ...

    def score_docids(self, params: Any, encoder_input_tokens: jax.Array, sequences: jax.Array, *,
                     trie: Trie) -> SequenceScores: ...


class GenerativeRetriever:
    """params + model + DocidSpace as a `gr_jax.retrievers.Retriever`.

    batch_size: queries decoded at once, rounded up to a multiple of the mesh's 'data' axis.
    num_beams: beams per query; None decodes `k` beams for `rank(..., k=k)`. `k` may not exceed it.
    constrained: decode through the docid trie (only docids can come out).
    """

    def __init__(self, *, model: DocidGenerator, params: Any, docid_space: DocidSpace, vocabulary: Any,
                 input_length: int, mesh: Mesh, param_shardings: Any, batch_size: int = 32,
                 num_beams: Optional[int] = None, constrained: bool = True,
                 rules: partitioning.LogicalAxisRules = partitioning.LOGICAL_AXIS_RULES,
                 show_progress: bool = False):
        if batch_size < 1 or (num_beams is not None and num_beams < 1):
            raise ValueError(f"batch_size and num_beams must be positive, got {batch_size} and {num_beams}")
        largest = docid_space.docid_token_range[1] - 1
        if largest >= model.logits_vocab_size:
            raise ValueError(f"the docid table holds token id {largest} >= vocab_size {model.logits_vocab_size} "
                             "of the model's output: it cannot decode every docid (build the model from this docid "
                             "space, gr_jax.experiment.build_model)")
        if not constrained:
            clash = next((d for d in docid_space.table.docids if d.startswith(INVALID_PREFIX)), None)
            if clash is not None:
                raise ValueError(f"docid {clash!r} has the form of an invalid output's name ({INVALID_PREFIX}...>); "
                                 "rename it so that unconstrained outputs can be told from documents")
        self.model = model
        self.params = params
        self.docid_space = docid_space
        self.vocabulary = vocabulary
        self.input_length = input_length
        self.mesh = mesh
        self.rules = rules
        self.param_shardings = param_shardings
        self.batch_size = partitioning.data_axis_multiple(batch_size, mesh)
        self.num_beams = num_beams
        self.constrained = constrained
        self.show_progress = show_progress
        self.batch_sharding = partitioning.batch_sharding(mesh)
        self._compiled: dict[int, Any] = {}  # num_beams -> executable; shared by `with_params` copies

    def with_params(self, params: Any) -> GenerativeRetriever:
        """The same retriever (and its compiled decoding) for other parameters of the same shapes."""
        copy = object.__new__(GenerativeRetriever)
        copy.__dict__.update(self.__dict__, params=params)
        return copy

    @property
    def trie(self) -> Trie:
        return self.docid_space.trie

    def _predict_impl(self, params, tokens: jax.Array, trie: Trie, *, num_beams: int
                      ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """tokens int32[batch, input_length] -> (rows int32[batch, beams]: DocidTable row or -1,
        scores float32[batch, beams], sequences int32[batch, beams, max_decode_len], best first, and the rank-1
        sequence's log-probabilities float32[batch, 2]: the model's, and the trie-constrained model's)."""
        result = self.model.predict_batch(params, tokens, num_beams=num_beams,
                                          max_decode_len=self.docid_space.table.max_length,
                                          trie=trie if self.constrained else None)
        batch, beams, length = result.sequences.shape
        rows = trie.leaf_indices(result.sequences.reshape(batch * beams, length)).reshape(batch, beams)
        top1 = self.model.score_docids(params, tokens, result.sequences[:, 0], trie=trie)
        return rows, result.scores, result.sequences, jnp.stack([top1.log_probs, top1.trie_log_probs], axis=1)

    def _executable(self, params, tokens: jax.Array, num_beams: int) -> tuple[Any, float]:
        """The compiled decoding for `num_beams` (compiled ahead of time on first use) and the seconds it took."""
        if num_beams in self._compiled:
            return self._compiled[num_beams], 0.0
        start = time.perf_counter()
        predict = jax.jit(functools.partial(self._predict_impl, num_beams=num_beams),
                          in_shardings=(self.param_shardings, self.batch_sharding, None),
                          out_shardings=partitioning.host_readable_sharding(self.mesh))
        executable = predict.lower(params, tokens, self.trie).compile()
        self._compiled[num_beams] = executable
        return executable, time.perf_counter() - start

    def rank(self, queries: Sequence[str], *, k: int) -> Ranking:
        """The `k` best docids of each query text, by log-likelihood (see `Ranking`); empty beams are left out."""
        num_beams = self.num_beams or k
        if not 1 <= k <= num_beams:
            raise ValueError(f"k={k} must be in [1, num_beams={num_beams}]")
        tokens = encode_inputs(queries, vocabulary=self.vocabulary, input_length=self.input_length)
        docids = self.docid_space.table.docids
        ids: list[list[str]] = []
        scores: list[list[float]] = []
        invalid: set[str] = set()
        top1: dict[str, list[float]] = {"sequence": [], "trie_masked": []}
        compile_seconds = 0.0
        params = jax.device_put(self.params, self.param_shardings)  # a no-op for params placed as the trainer does
        bar = tqdm.tqdm(total=len(queries), desc="ranking", unit="query", leave=False,
                        disable=not self.show_progress)
        with partitioning.partitioning_context(mesh=self.mesh, rules=self.rules):
            start = time.perf_counter()
            for chunk, real in partitioning.padded_batches(tokens, self.batch_size):  # padding rows: outputs dropped
                chunk = jax.device_put(chunk, self.batch_sharding)
                predict, seconds = self._executable(params, chunk, num_beams)
                compile_seconds += seconds
                rows, beam_scores, sequences, top1_log_probs = jax.device_get(predict(params, chunk, self.trie))
                for i in range(real):
                    empty = beam_scores[i, 0] == -np.inf
                    top1["sequence"].append(np.nan if empty else float(np.exp(top1_log_probs[i, 0])))
                    top1["trie_masked"].append(np.nan if empty else float(np.exp(top1_log_probs[i, 1])))
                    query_ids: list[str] = []
                    query_scores: list[float] = []
                    for row, score, sequence in zip(rows[i].tolist(), beam_scores[i].tolist(), sequences[i]):
                        if score == -np.inf or len(query_ids) == k:  # an empty slot (fewer results than beams)
                            continue
                        if row >= 0:
                            query_ids.append(docids[row])
                        else:
                            name = invalid_output_name(sequence)
                            invalid.add(name)
                            query_ids.append(name)
                        query_scores.append(score)
                    ids.append(query_ids)
                    scores.append(query_scores)
                bar.update(real)
            seconds = time.perf_counter() - start - compile_seconds
        bar.close()
        return Ranking(ids=ids, scores=scores, invalid=frozenset(invalid), seconds=seconds,
                       compile_seconds=compile_seconds, top1_probability=top1)
