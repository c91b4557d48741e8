"""Training examples made on the host as arrays, and their batches for the trainer.

Why not seqio: these examples carry what seqio's EncDecFeatureConverter drops (per-example loss weights, soft targets
of shape [target_length, K]) or are sampled from structures of their own (ranked lists, document spans). Batches are
a pure function of (seed, batch index) (`gr_jax.data.batches`): resuming at any step costs nothing, and
every host computes the same global batch and keeps its own rows.

Features: encoder_input_tokens int32[b, input_length]; decoder_target_tokens and decoder_input_tokens
int32[b, target_length] (targets shifted right, start 0, as seqio's EncDecFeatureConverter); decoder_loss_weights
float32[b, target_length] = the example's weight on its target tokens (EOS included), 0 on padding; with soft
targets, decoder_soft_target_tokens int32 / decoder_soft_target_mass float32 [b, target_length, K]
(`gr_jax.data.features`).
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any, Optional

import numpy as np

from gr_jax.data.batches import SeededEpochs, sharded_batches
from gr_jax.data.features import SOFT_TARGET_MASS, SOFT_TARGET_TOKENS, decoder_inputs
from gr_jax.vocabulary import PAD_ID, load_vocabulary, vocabulary_file

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, eq=False)
class Examples:
    """inputs int32[N, input_length]; targets int32[N, target_length]; weights float32[N] (each example's loss weight);
    soft_tokens int32[N, target_length, K] and soft_mass float32[N, target_length, K], or None (one-hot)."""
    inputs: np.ndarray
    targets: np.ndarray
    weights: np.ndarray
    soft_tokens: Optional[np.ndarray] = None
    soft_mass: Optional[np.ndarray] = None

    def __post_init__(self):
        if (self.soft_tokens is None) != (self.soft_mass is None):
            raise ValueError("Examples: soft_tokens and soft_mass come together (both arrays or both None)")

    def __len__(self) -> int:
        return len(self.inputs)


class ExampleBatches:
    """Global batch b of the endless seeded sequence of `examples` (see the module docstring)."""

    def __init__(self, *, examples: Examples, batch_size: int, seed: int):
        self.examples = examples
        self.batch_size = batch_size
        self._epochs = SeededEpochs(num_examples=len(examples), batch_size=batch_size, seed=seed)

    def batch(self, batch: int, *, shard_index: int = 0, num_shards: int = 1) -> dict[str, np.ndarray]:
        share = self.batch_size // num_shards
        rows = self._epochs.indices(batch)[shard_index * share:(shard_index + 1) * share]
        ex = self.examples
        targets = ex.targets[rows]
        out = {"encoder_input_tokens": ex.inputs[rows], "decoder_target_tokens": targets,
               "decoder_input_tokens": decoder_inputs(targets),
               "decoder_loss_weights": ex.weights[rows, None] * (targets != PAD_ID)}
        if ex.soft_tokens is not None and ex.soft_mass is not None:  # both or neither (__post_init__)
            out[SOFT_TARGET_TOKENS] = ex.soft_tokens[rows]
            out[SOFT_TARGET_MASS] = ex.soft_mass[rows]
        return out

    def batches(self, *, start_batch: int = 0, shard_index: int = 0, num_shards: int = 1,
                prefetch: int = 2) -> Iterator[dict[str, np.ndarray]]:
        return sharded_batches(self.batch, batch_size=self.batch_size, start_batch=start_batch,
                               shard_index=shard_index, num_shards=num_shards, prefetch=prefetch)


class HostExamplesData:
    """What a `gr_jax.experiment.RunData` whose examples are made on the host shares: no seqio task to register,
    and training batches of its `examples` (`ExampleBatches`). A subclass (a frozen dataclass with the RunData
    fields) defines `examples` and `mixture_name`. `examples` is given the inputs' vocabulary: the run's
    SentencePiece one, or the WordPiece one of a tower that encodes the inputs (`input_vocabulary_dir`)."""

    def examples(self, *, docid_space: Any, vocabulary: Any) -> Examples:
        raise NotImplementedError

    @property
    def mixture_name(self) -> str:
        raise NotImplementedError

    def register(self, docid_space: Any, *, input_vocabulary_dir: Optional[str] = None) -> list[str]:
        del docid_space, input_vocabulary_dir  # nothing to register: `train_batches` tokenises
        return []

    def train_batches(self, *, docid_space: Any, batch_size: int, seed: int, start_batch: int, shard_index: int,
                      num_shards: int, input_vocabulary_dir: Optional[str] = None
                      ) -> Iterator[dict[str, np.ndarray]]:
        examples = self.examples(docid_space=docid_space,
                                 vocabulary=input_vocabulary(self, input_vocabulary_dir=input_vocabulary_dir))
        logger.info("%s: %d examples (summed weight %.1f)", self.mixture_name, len(examples),
                    float(examples.weights.sum()))
        return ExampleBatches(examples=examples, batch_size=batch_size, seed=seed).batches(
            start_batch=start_batch, shard_index=shard_index, num_shards=num_shards)


def input_vocabulary(data: Any, *, input_vocabulary_dir: Optional[str]) -> Any:
    """What `data`'s inputs are tokenised with: the WordPiece vocabulary of `input_vocabulary_dir` (a tower's), else
    the run's SentencePiece vocabulary (`data.vocabulary_path` or the data dir's)."""
    if input_vocabulary_dir is None:
        return load_vocabulary(vocabulary_file(data))
    from gr_jax.data.wordpiece import WordPieceVocabulary  # seqio: only for runs with a WordPiece tower
    return WordPieceVocabulary(input_vocabulary_dir)
