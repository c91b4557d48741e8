"""What a docid scheme is, and the registry of schemes by name (`DocidSpace.scheme`, gin's `DOCID_SCHEME`).

A scheme turns a dataset and a vocabulary into a `DocidTable`. Each scheme is one module of
`gr_jax.docids.schemes` (importing that package registers every module in it); a scheme defined elsewhere
registers when its module is imported, e.g. by a gin file's `from my_package import my_scheme`.

Tables that are cheap to build (naive, atomic) are cached in `{data_dir}/docids.{scheme}.tsv` and re-checked
against the vocabulary when read (`check`); prebuilt schemes (k-means ids) are built offline by a tool that writes
the same file, which is then only read and checked, never rewritten (`prebuilt_command` names that tool).
"""
from __future__ import annotations

import abc
import os
from typing import TYPE_CHECKING, ClassVar, TypeVar

import numpy as np

if TYPE_CHECKING:
    import seqio

    from gr_jax.data.readers import RetrievalDataset
    from gr_jax.docids.table import DocidTable


class DocidScheme(abc.ABC):
    """How a dataset's docids become token sequences (see the module docstring)."""

    name: ClassVar[str]
    #: Built offline by `prebuilt_command`; read from `docids.{name}.tsv` and never written here.
    prebuilt: ClassVar[bool] = False

    @abc.abstractmethod
    def build(self, *, dataset: RetrievalDataset, vocabulary: seqio.SentencePieceVocabulary) -> DocidTable:
        """The table of every document of `dataset`, in collection order."""

    def check(self, table: DocidTable, *, vocabulary: seqio.SentencePieceVocabulary,
              rows: np.ndarray) -> str | None:
        """Why a stored table is not this scheme's for `vocabulary` (looking at `rows` where a full check would
        be costly), or None. A cached table with a problem is rebuilt; a prebuilt one is an error."""
        del table, vocabulary, rows
        return None

    def prebuilt_command(self, data_dir: str | os.PathLike) -> str:
        """The command that writes `docids.{name}.tsv` (prebuilt schemes)."""
        raise NotImplementedError(f"docid scheme {self.name!r} is built when a run needs it")


SCHEMES: dict[str, DocidScheme] = {}

SchemeType = TypeVar("SchemeType", bound=type[DocidScheme])


def register_scheme(cls: SchemeType) -> SchemeType:
    """Class decorator: registers one instance of a scheme under its `name`."""
    if cls.name in SCHEMES and type(SCHEMES[cls.name]) is not cls:
        raise ValueError(f"docid scheme {cls.name!r} is already registered by {type(SCHEMES[cls.name]).__module__}")
    SCHEMES[cls.name] = cls()
    return cls


def get_scheme(name: str) -> DocidScheme:
    from gr_jax.docids import schemes  # noqa: F401  (registers the built-in schemes)

    if name not in SCHEMES:
        raise ValueError(f"unknown docid scheme {name!r}; known: {sorted(SCHEMES)}")
    return SCHEMES[name]
