"""Digests of the inputs that give token ids their meaning: the vocabulary file, a tower's WordPiece vocabulary, the
docid table. Checkpoints save them (`family.BuiltRun.input_fingerprint`) and preprocessed records do
(`gr_jax.data.records`), so neither is ever read with a rebuilt vocabulary or docid table."""
from __future__ import annotations

import hashlib
import os
import pathlib
from typing import Any, Optional

import numpy as np


def input_fingerprint(*, vocabulary_file: str | os.PathLike, docid_space: Any = None,
                      input_vocabulary_dir: Optional[str | os.PathLike] = None) -> dict[str, str]:
    """{name: sha256 hex}: "vocabulary" (the file's bytes), "input vocabulary" (`input_vocabulary_dir`/vocab.txt,
    where a tower's WordPiece tokenises the inputs) and "docid table" (the token ids int[docids, length] of
    `docid_space.table`, with their shape), each where given."""
    fingerprint = {"vocabulary": hashlib.sha256(pathlib.Path(vocabulary_file).read_bytes()).hexdigest()}
    if input_vocabulary_dir is not None:
        wordpiece = (pathlib.Path(input_vocabulary_dir) / "vocab.txt").read_bytes()
        fingerprint["input vocabulary"] = hashlib.sha256(wordpiece).hexdigest()
    if docid_space is not None:
        tokens = np.ascontiguousarray(docid_space.table.tokens, np.int64)
        fingerprint["docid table"] = hashlib.sha256(repr(tokens.shape).encode() + tokens.tobytes()).hexdigest()
    return fingerprint
