"""Teacher-forced losses of candidate docids per query, in jitted sharded batches: what CGL (`gr_jax.scaling.cgl`)
and SToICaL's ranking metrics (`gr_jax.ranking.evaluation`) score.

L(q, I) is the mean per-token cross entropy of I's tokens, EOS included and padding masked
(`token_reduction='mean'`: minus the paper's length-normalised score), or the sequence's negative log-likelihood
('sum'). Each query is encoded once and its C candidates decoded together (`EncoderDecoderModel.score_candidates`),
with the trainer's parameter shardings over the run's mesh.
"""
from __future__ import annotations

from typing import Any, Literal

import jax
import numpy as np
import tqdm

from gr_jax import partitioning

TokenReduction = Literal["mean", "sum"]


def generation_losses(log_likelihood: np.ndarray, positions: np.ndarray, *,
                      token_reduction: TokenReduction) -> np.ndarray:
    """L(q, I) from `CandidateScorer.scores`: minus the mean token log-likelihood ('mean') or the sequence's ('sum')."""
    if token_reduction not in ("mean", "sum"):
        raise ValueError(f"token_reduction must be 'mean' or 'sum', got {token_reduction!r}")
    return -log_likelihood / positions if token_reduction == "mean" else -log_likelihood


def _trimmed(candidates: np.ndarray) -> np.ndarray:
    """candidates [B, C, T] cut to the positions their longest sequence uses, rounded up to a multiple of 8 (so few
    shapes compile): a table padded to a rare long sequence (n-gram windows: mean 10 tokens, longest 38) would
    otherwise decode mostly padding. Scores are unchanged: padding positions score nothing."""
    used = int(np.max(np.nonzero(candidates.any(axis=(0, 1)))[0], initial=0)) + 1
    return candidates[:, :, :min(candidates.shape[2], -(-used // 8) * 8)]


class CandidateScorer:
    """built: a generative run (`gr_jax.experiment.Built`) with a docid space; batch_size: queries per compiled
    call (rounded up to a multiple of the data axis)."""

    def __init__(self, built: Any, *, batch_size: int = 8):
        if getattr(built, "docid_space", None) is None:
            raise ValueError("candidate scoring needs a generative run with a docid space")
        self.built = built
        self.table = built.docid_space.table
        trainer = built.trainer
        self.batch_size = partitioning.data_axis_multiple(batch_size, trainer.mesh)
        self._batch_sharding = partitioning.batch_sharding(trainer.mesh)
        self._scores = jax.jit(built.model.score_candidates,
                               in_shardings=(trainer.state_shardings.params, self._batch_sharding,
                                             self._batch_sharding),
                               out_shardings=partitioning.host_readable_sharding(trainer.mesh))

    def scores(self, params, tokens: np.ndarray, rows: np.ndarray, *, show_progress: bool = False,
               desc: str = "scoring") -> tuple[np.ndarray, np.ndarray]:
        """(log-likelihood float32[Q, C], scored positions float32[Q, C]) of docid-table rows int64[Q, C] (-1:
        padding, scored as the first row and to be masked by the caller) for query tokens int32[Q, input_length]
        (`EncoderDecoderModel.score_candidates`); `generation_losses` turns them into L(q, I)."""
        candidates = self.table.tokens[np.maximum(rows, 0)].astype(np.int32)  # [Q, C, T]
        trainer = self.built.trainer
        out = []
        put = lambda x: jax.device_put(x, self._batch_sharding)  # noqa: E731
        with partitioning.partitioning_context(mesh=trainer.mesh, rules=trainer.rules):
            chunks = zip(partitioning.padded_batches(tokens, self.batch_size),
                         partitioning.padded_batches(candidates, self.batch_size))
            for (query_chunk, real), (candidate_chunk, _) in tqdm.tqdm(
                    chunks, total=-(-len(tokens) // self.batch_size), desc=desc, unit="batch", leave=False,
                    disable=not show_progress):
                log_likelihood, positions = jax.device_get(self._scores(params, put(query_chunk),
                                                                        put(_trimmed(candidate_chunk))))
                out.append((np.asarray(log_likelihood)[:real], np.asarray(positions)[:real]))
        if not out:
            empty = np.zeros((0, rows.shape[1]), np.float32)
            return empty, empty
        return np.concatenate([o[0] for o in out]), np.concatenate([o[1] for o in out])
