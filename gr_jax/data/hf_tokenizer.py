"""A Hugging Face checkpoint's tokenizer (its tokenizer.json, read by the `tokenizers` library) as a seqio
vocabulary: what a decoder-only run that starts from a Llama, Mistral or Qwen checkpoint tokenises its queries and
naive docids with (`DatasetConfig.vocabulary_path` = the checkpoint's tokenizer.json; `gr_jax.vocabulary.
load_vocabulary` reads a `.json` vocabulary as this class).

Ids are the tokenizer's shifted up by `id_offset` (2). Every docid table, trie, loss mask and decoder start in
gr_jax keeps the T5 convention PAD 0 and EOS 1 (`gr_jax.vocabulary`), while in these vocabularies 0 and 1 are
ordinary tokens ('!' and '"' in Qwen's, `<unk>` and `<s>` in Llama's): without the shift a query holding '!' would
be masked as padding. The model's rows 0 and 1 are new; the checkpoint's rows follow them
(`gr_jax.decoder_only.pretrained.load_params(token_offset=)`), then the docid tokens. `vocab_size` covers the
checkpoint's embedding rows (config.json's `vocab_size` beside tokenizer.json, often more than the tokenizer's ids),
so no docid token appended after it lands on a row of the checkpoint.

Text is encoded without the tokenizer's post-processing (Llama's tokenizer adds `<s>` before every text): a query
sits between the prompt template's prefix and suffix and a docid after them, so a BOS belongs at the start of the
prefix, where a special token written in it (e.g. prefix '<s>query:') encodes as that token. Inside seqio tasks
(TensorFlow) the same tokenizer runs through `tf.numpy_function`.
"""
from __future__ import annotations

import functools
import json
import os
import pathlib
from collections.abc import Iterable, Sequence

import numpy as np
import seqio
import tensorflow as tf

from gr_jax.run_dir import hugging_face_checkpoint

PathLike = str | os.PathLike
TOKENIZER_FILENAME = "tokenizer.json"


def checkpoint_tokenizer(checkpoint_dir: PathLike) -> str:
    """The tokenizer.json of a Hugging Face checkpoint dir, or of the one a gr_jax run started from
    (`run_dir.hugging_face_checkpoint`): what gin's `decoder_only/from_checkpoint.gin` gives
    `DatasetConfig.vocabulary_path`."""
    path = hugging_face_checkpoint(checkpoint_dir) / TOKENIZER_FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: a run that tokenises with a Hugging Face checkpoint's "
                                f"vocabulary reads its {TOKENIZER_FILENAME} (the `tokenizers` library's format)")
    return str(path)


@functools.lru_cache(maxsize=4)
def _tokenizer(path: pathlib.Path):
    import tokenizers
    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises its own exception types for each kind of bad file
        raise ValueError(f"{path}: not a `tokenizers` tokenizer file ({e})") from e
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


class HFTokenizerVocabulary(seqio.Vocabulary):
    """The tokenizer.json at `path`, its ids shifted by `id_offset` past PAD (`pad_id`) and EOS (`eos_id`), the ids
    every gr_jax run reserves (`gr_jax.vocabulary` passes them in)."""

    def __init__(self, path: PathLike, *, pad_id: int, eos_id: int):
        self.path = pathlib.Path(path).resolve()
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no tokenizer file")
        if sorted((pad_id, eos_id)) != [0, 1]:
            raise ValueError(f"PAD and EOS must be ids 0 and 1 (shifted past), got {pad_id} and {eos_id}")
        self._pad, self._eos = pad_id, eos_id
        self.id_offset = max(pad_id, eos_id) + 1
        tokenizer = _tokenizer(self.path)
        self.tokenizer_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.checkpoint_rows = self._checkpoint_rows()
        super().__init__(extra_ids=0)

    def _checkpoint_rows(self) -> int:
        """config.json's `vocab_size` where the tokenizer sits in a checkpoint dir, else the tokenizer's ids."""
        config = self.path.parent / "config.json"
        if not config.is_file():
            return self.tokenizer_size
        try:
            rows = json.loads(config.read_text(encoding="utf-8")).get("vocab_size")
        except json.JSONDecodeError as e:
            raise ValueError(f"{config}: not JSON ({e}); the tokenizer's checkpoint config is unreadable") from e
        if not isinstance(rows, int) or rows < self.tokenizer_size:
            raise ValueError(f"{config}: vocab_size {rows!r} does not hold the {self.tokenizer_size} ids of "
                             f"{self.path}")
        return rows

    def __eq__(self, other) -> bool:
        return isinstance(other, HFTokenizerVocabulary) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"HFTokenizerVocabulary({str(self.path)!r})"

    @property
    def pad_id(self) -> int:
        return self._pad

    @property
    def eos_id(self) -> int:
        return self._eos

    @property
    def unk_id(self) -> None:
        """None: ids past the vocabulary are dropped when decoding (byte-level BPE has no unknown token)."""
        return None

    @property
    def _base_vocab_size(self) -> int:
        return self.id_offset + self.checkpoint_rows

    @property
    def tokenizer(self) -> "_ShiftedBatchEncoder":
        """`encode(list of texts) -> list of id lists`, as `sentencepiece`'s processor (naive docid tables)."""
        return _ShiftedBatchEncoder(self)

    def _encode(self, s: str) -> Sequence[int]:
        return [i + self.id_offset for i in _tokenizer(self.path).encode(s, add_special_tokens=False).ids]

    def _decode(self, ids: Iterable[int]) -> str:
        tokens = [int(i) - self.id_offset for i in ids
                  if self.id_offset <= int(i) < self.id_offset + self.tokenizer_size]
        return _tokenizer(self.path).decode(tokens, skip_special_tokens=True)

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        """A scalar string -> int32[n]."""
        if s.shape.rank != 0:
            raise ValueError(f"HFTokenizerVocabulary encodes one string at a time (as seqio's tokenize), got shape "
                             f"{s.shape}")

        def encode(text: bytes | np.ndarray) -> np.ndarray:  # bytes in a graph, a 0-d array of them eagerly
            raw = text.item() if isinstance(text, np.ndarray) else text
            return np.asarray(self._encode(raw.decode("utf-8")), np.int32)

        ids = tf.numpy_function(encode, [s], tf.int32, stateful=False)
        return tf.ensure_shape(ids, [None])

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        def decode(row: np.ndarray) -> bytes:
            return self._decode(row.tolist()).encode("utf-8")
        return tf.numpy_function(decode, [ids], tf.string, stateful=False)


class _ShiftedBatchEncoder:
    def __init__(self, vocabulary: HFTokenizerVocabulary):
        self._vocabulary = vocabulary

    def encode(self, texts: list[str]) -> list[list[int]]:
        offset = self._vocabulary.id_offset
        encodings = _tokenizer(self._vocabulary.path).encode_batch(texts, add_special_tokens=False)
        return [[i + offset for i in encoding.ids] for encoding in encodings]
