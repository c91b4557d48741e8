"""A decoder-only network as a dense retriever's tower (Qwen3-Embedding's recipe): the causal stack's final states,
pooled at the last token (`gr_jax.dense.model.last_token_pool`), which is the only position that has read the whole
text.

Why: `gr_vs_dense_limitations.txt` compares GR and DR on one backbone (Qwen3-0.6B and Qwen3-Embedding-0.6B). With
this tower the dense family (`gr_jax.dense`) trains the same `DecoderOnlyConfig` that the generative decoder-only
family (`gr_jax.decoder_only.experiment`) trains, on the run's SentencePiece pieces (EOS appended, so the last token
is EOS as in Qwen3-Embedding). gin: `gin_configs/dense/decoder_only.gin` with a decoder-only size file.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import flax.linen as nn

from gr_jax.decoder_only.network import DecoderOnlyConfig, DecoderOnlyTransformer, left_padded_positions
from gr_jax.dense.towers import SentencePieceTokenizer, Tokenizer, run_vocabulary


class _DecoderOnlyStates(nn.Module):
    """The network's final-norm states (`DecoderOnlyTransformer.states`); the output layer is never applied."""
    config: DecoderOnlyConfig

    def setup(self):
        self.transformer = DecoderOnlyTransformer(self.config)
        nn.share_scope(self, self.transformer)

    def token_states(self, ids, mask, deterministic: bool = True):
        """ids int32[n, length], mask bool[n, length] (right- or left-padded) -> float32[n, length, emb_dim]."""
        return self.transformer.states(ids, positions=left_padded_positions(mask), valid=mask,
                                       enable_dropout=not deterministic)


@dataclasses.dataclass(frozen=True)
class DecoderOnlyTower:
    """The decoder-only network of `config` (a size file: gin_configs/decoder_only/*.gin) over the data dir's
    SentencePiece vocabulary (`{data_dir}/spm.model`, or `vocabulary_path`), trained from its initialiser.
    `config.vocab_size` None is filled from the vocabulary (rounded up to a multiple of 128)."""
    config: DecoderOnlyConfig
    vocabulary_path: Optional[str] = None

    @property
    def hidden_size(self) -> int:
        return self.config.emb_dim

    def for_data(self, *, data_dir: str) -> "DecoderOnlyTower":
        if self.config.vocab_size is not None:
            return self
        return dataclasses.replace(self, config=self.config.with_vocab_size(self._vocabulary(data_dir).vocab_size))

    def _vocabulary(self, data_dir: str):
        return run_vocabulary(data_dir=data_dir, vocabulary_path=self.vocabulary_path)

    def module(self) -> nn.Module:
        if self.config.vocab_size is None:
            raise ValueError("DecoderOnlyTower.config.vocab_size is unset: build the tower with for_data()")
        return _DecoderOnlyStates(self.config)

    def tokenizer(self, *, data_dir: str) -> Tokenizer:
        return SentencePieceTokenizer(self._vocabulary(data_dir))

    def input_vocabulary_dir(self) -> Optional[str]:
        return None

    def load_params(self, *, abstract: Any) -> Optional[Any]:
        del abstract
        return None
