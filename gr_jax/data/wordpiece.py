"""A pretrained tower's WordPiece vocabulary as a seqio vocabulary: what a generative run's inputs are tokenised
with when all-MiniLM-L6-v2 encodes them (`gr_jax.tower_encoder`), in its tasks and at retrieval time alike.

BERT's convention, as the tower was trained: `[CLS] pieces [SEP]`, PAD 0. seqio appends EOS to the `inputs`
feature after trimming (`add_eos=True`), as `gr_jax.vocabulary.encode_inputs` does for queries, so `eos_id` is
`[SEP]` and `encode` gives `[CLS] pieces`: a trimmed input keeps `[SEP]` last, as Hugging Face's truncation does
(`gr_jax.dense.towers.WordPieceTokenizer`, the tower's own tokenizer). Host encoding is the `tokenizers` library's
(the folder's tokenizer.json: sentence-transformers' tokenisation exactly); TensorFlow encoding (inside seqio tasks)
is tensorflow-text's BertTokenizer over the same vocab.txt, lower-cased with accents stripped, the same pieces on
every text the tests compare (tests/test_tower_encoder.py).
"""
from __future__ import annotations

import functools
import os
import pathlib
from collections.abc import Iterable, Sequence

import numpy as np
import seqio
import tensorflow as tf

from gr_jax.vocabulary import wordpiece_tokenizer

PathLike = str | os.PathLike


class WordPieceVocabulary(seqio.Vocabulary):
    """The WordPiece vocabulary of a tokenizer folder (tokenizer.json and vocab.txt, e.g. a sentence-transformers
    model dir). Ids are the tower's: its embedding table reads them."""

    def __init__(self, model_dir: PathLike):
        self.model_dir = pathlib.Path(model_dir).resolve()
        for name in ("tokenizer.json", "vocab.txt"):
            if not (self.model_dir / name).is_file():
                raise FileNotFoundError(f"{self.model_dir / name}: a WordPiece vocabulary needs tokenizer.json and "
                                        "vocab.txt (a sentence-transformers model dir)")
        pieces = (self.model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
        ids = {piece: i for i, piece in enumerate(pieces)}
        for piece in ("[PAD]", "[UNK]", "[CLS]", "[SEP]"):
            if piece not in ids:
                raise ValueError(f"{self.model_dir / 'vocab.txt'}: no {piece} piece (not a BERT WordPiece vocabulary)")
        if ids["[PAD]"] != 0:
            raise ValueError(f"{self.model_dir / 'vocab.txt'}: [PAD] is id {ids['[PAD]']}; inputs pad with 0")
        self._size = len(pieces)
        self._unk, self._cls, self._sep = ids["[UNK]"], ids["[CLS]"], ids["[SEP]"]
        super().__init__(extra_ids=0)

    def __eq__(self, other) -> bool:
        return isinstance(other, WordPieceVocabulary) and other.model_dir == self.model_dir

    def __hash__(self) -> int:
        return hash(self.model_dir)

    def __repr__(self) -> str:
        return f"WordPieceVocabulary({str(self.model_dir)!r})"

    @property
    def eos_id(self) -> int:
        return self._sep

    @property
    def unk_id(self) -> int:
        return self._unk

    @property
    def _base_vocab_size(self) -> int:
        return self._size

    def _encode(self, s: str) -> Sequence[int]:
        pieces = wordpiece_tokenizer(self.model_dir).encode(s.strip(), add_special_tokens=False)
        return [self._cls, *pieces.ids]

    def _decode(self, ids: Iterable[int]) -> str:
        return wordpiece_tokenizer(self.model_dir).decode(
            [int(i) for i in ids if 0 <= int(i) < self._size], skip_special_tokens=True)

    @functools.cached_property
    def _tf_tokenizer(self):
        import tensorflow_text
        with tf.init_scope():  # its lookup table lives outside whichever tf.data graph first asks for it
            return tensorflow_text.BertTokenizer(str(self.model_dir / "vocab.txt"), token_out_type=tf.int64,
                                                 lower_case=True, unknown_token="[UNK]")

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        """A scalar string -> int32[n]: `[CLS]` and the pieces."""
        if s.shape.rank != 0:
            raise ValueError(f"WordPieceVocabulary encodes one string at a time (as seqio's tokenize), got shape "
                             f"{s.shape}")
        pieces = self._tf_tokenizer.tokenize(tf.reshape(s, [1])).merge_dims(0, -1)
        return tf.concat([tf.constant([self._cls], tf.int32), tf.cast(pieces, tf.int32)], axis=0)

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        def decode(row: np.ndarray) -> bytes:
            return self._decode(row.tolist()).encode("utf-8")
        return tf.numpy_function(decode, [ids], tf.string, stateful=False)
