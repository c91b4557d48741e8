"""The docid space of a data dir as the tasks use it; no TensorFlow, so host-made datasets share it."""
from __future__ import annotations

import os
import pathlib

from gr_jax import docids
from gr_jax.data.readers import open_dataset
from gr_jax.data.span_corruption import num_sentinels
from gr_jax.docids import DocidSpace
from gr_jax.vocabulary import MODEL_FILENAME, load_vocabulary


def load_docid_space(*, data_dir: str | os.PathLike, docid_scheme: str = "naive", input_length: int = 64,
                     target_length: int = 16, vocabulary_path: str | os.PathLike | None = None) -> DocidSpace:
    """The docid space of `data_dir` as the tasks use it: the scheme's table (`gr_jax.docids.load_docid_space`)
    over the data dir's vocabulary, with the span corruption sentinels of these lengths reserved after its pieces."""
    data_dir = pathlib.Path(data_dir).resolve()
    vocabulary_path = pathlib.Path(vocabulary_path or data_dir / MODEL_FILENAME).resolve()
    vocabulary = load_vocabulary(vocabulary_path)
    return docids.load_docid_space(
        dataset=open_dataset(data_dir), scheme=docid_scheme, vocabulary=vocabulary, vocabulary_path=vocabulary_path,
        reserved_tokens=num_sentinels(input_length=input_length, target_length=target_length))
