"""What a docid scheme is, and the registry of schemes by name (`DocidSpace.scheme`, gin's `DOCID_SCHEME`).

A scheme turns a dataset and a vocabulary into a `DocidTable`. Each scheme is one module of
`gr_jax.docids.schemes` (importing that package registers every module in it); a scheme defined elsewhere
registers when its module is imported, e.g. by a gin file's `from my_package import my_scheme`.

Tables that are cheap to build (naive, atomic) are cached in `{data_dir}/docids.{scheme}.tsv` and re-checked
against the vocabulary when read (`check`). A `PrebuiltScheme` (k-means ids, codebooks, sparse codes) is built
offline from the collection's embeddings by `python -m gr_jax.tools.semantic_ids --scheme NAME`, which writes the
same file, then only read and checked, never rewritten. The scheme brings that builder: `from_embeddings` makes its
table from the embeddings, and its `settings_type` (a dataclass whose fields are declared with `option`) gives the
tool's command-line options, so a new prebuilt scheme is one module and the tool names none.
"""
from __future__ import annotations

import abc
import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np

from gr_jax.docids.table import ExtendedDocidTable

if TYPE_CHECKING:
    import seqio

    from gr_jax.data.readers import RetrievalDataset
    from gr_jax.docids.table import DocidTable


class DocidScheme(abc.ABC):
    """How a dataset's docids become token sequences (see the module docstring)."""

    name: ClassVar[str]
    #: One line for a list of schemes (the tool's `--scheme` help).
    description: ClassVar[str] = ""
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


def option(default: Any, help: str) -> Any:
    """A field of a prebuilt scheme's settings dataclass: its default and the tool's help text for `--{field}`."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class PrebuiltTable:
    """What a prebuilt scheme's offline build returns: the table with the number of token ids it appends after the
    vocabulary, and the diagnostics the tool prints as JSON (collisions, balance)."""

    extended: ExtendedDocidTable
    diagnostics: Mapping[str, Any]


SettingsT = TypeVar("SettingsT")


class PrebuiltScheme(DocidScheme, Generic[SettingsT]):
    """A scheme whose table is built offline from the collection's embeddings (see the module docstring).

    settings_type: a frozen dataclass of the offline build's settings, every field with a default (`option`);
      each field is the tool's `--{field}` option (a bool field a `--{field}/--no-{field}` flag).
    """

    prebuilt = True
    settings_type: type[SettingsT]

    @abc.abstractmethod
    def from_embeddings(self, *, docids: Sequence[str], embeddings: np.ndarray,
                        vocabulary: seqio.SentencePieceVocabulary, settings: SettingsT,
                        show_progress: bool = False) -> PrebuiltTable:
        """The table of the documents `docids` whose embeddings are the rows of `embeddings` float[N, dim] (an array
        or a read-only memmap), in that order."""

    def settings(self, options: Mapping[str, Any]) -> SettingsT:
        """`settings_type` from the options given by name (the others keep their defaults)."""
        names = [field.name for field in dataclasses.fields(self.settings_type)]  # type: ignore[arg-type]
        unknown = sorted(set(options) - set(names))
        if unknown:
            raise ValueError(f"docid scheme {self.name!r} has no option {', '.join(map(repr, unknown))} (its options: "
                             f"{', '.join(names) or 'none'})")
        return self.settings_type(**options)

    def prebuilt_command(self, data_dir: str | os.PathLike) -> str:
        return f"python -m gr_jax.tools.semantic_ids --data_dir {data_dir} --scheme {self.name}"

    def build(self, *, dataset, vocabulary) -> DocidTable:
        raise FileNotFoundError(f"{self.name} docids are built offline from the collection's embeddings by "
                                f"`{self.prebuilt_command(dataset.data_dir)}`")


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
