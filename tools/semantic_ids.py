"""Builds a dataset's docid table for a registered scheme: a prebuilt one (semantic, semantic2d, codebook, ...) from
the collection's all-MiniLM-L6-v2 embeddings.

    python -m gr_jax.tools.semantic_ids --data_dir DIR [--scheme NAME] [the scheme's options]
                                 [--embeddings FILE | --no_embeddings_cache | --index_dir DENSE_RUN/index/STEP]

    e.g. --scheme semantic [--k 10 --c 100 --seed 0 --nredo 1]; --scheme codebook [--levels 8 --codes 256
    --shared_codes --seed 0]; `--help` lists every scheme's options.

A prebuilt scheme (`gr_jax.docids.scheme.PrebuiltScheme`) brings its own build: the tool streams the collection
through the encoder (batched, progress bar with documents/s) into `DIR/embeddings.minilm.npy` (reused by later runs
while it is newer than the collection: embedding is the costly step), hands the embeddings and the scheme's settings
(each field of its `settings_type` is an option `--{field}`) to the scheme's `from_embeddings`, writes
`DIR/docids.{scheme}.tsv` (`DocidTable.save`, the table file that `gr_jax.docids.load_docid_table` reads) and prints
one JSON line: the table's size, the vocabulary size the model needs, timings, the settings and the scheme's
diagnostics. Any other scheme (atomic, naive) is built as a run would build it, and written.

`--index_dir` clusters a dense run's encoded collection instead (`gr_jax.tools.dense_index`, or the index a dense
run's evaluation writes): docids from a trained dense space, as GDR's "-ours" clusters, rather than zero-shot
MiniLM's. Its documents must be the collection's, in its order. A data dir holds one table per scheme, so keep the
zero-shot table beside it by building into a second data dir whose files link to the first's.
"""
from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gr_jax.data.readers import RetrievalDataset, open_dataset
from gr_jax.docids import SCHEMES, DocidSpace, ExtendedDocidTable, docid_table_path, get_scheme
from gr_jax.docids.scheme import PrebuiltScheme
from gr_jax.encoders import Encoder
from gr_jax.encoders.collection import CollectionEmbeddings, collection_embeddings
from gr_jax.entry_point import run_tool
from gr_jax.vocabulary import load_vocabulary

EMBEDDINGS_FILENAME = "embeddings.minilm.npy"


def build(*, data_dir: str | pathlib.Path, scheme: str, options: Mapping[str, Any] | None = None,
          embeddings_path: str | pathlib.Path | None, batch_size: int, encoder_batch_size: int = 128,
          show_progress: bool = False, encoder: Encoder | None = None,
          index_dir: str | pathlib.Path | None = None) -> dict:
    """Builds and writes `data_dir/docids.{scheme}.tsv`; returns the JSON report.

    options: a prebuilt scheme's settings by name (its `settings_type`'s fields; the others keep their defaults).
    encoder: any `list[str] -> float32[n, dim]` (default: all-MiniLM-L6-v2 with `encoder_batch_size`).
    index_dir: a dense run's corpus index whose document vectors are clustered instead of the encoder's.
    """
    definition = get_scheme(scheme)
    options = dict(options or {})
    if isinstance(definition, PrebuiltScheme):
        settings = definition.settings(options)  # before the costly embedding: a wrong name fails at once
    elif options:
        raise ValueError(f"docid scheme {scheme!r} has no options, got {sorted(options)}")
    dataset = open_dataset(data_dir)
    vocabulary = load_vocabulary(dataset.data_dir)
    report: dict = {"data_dir": str(dataset.data_dir), "scheme": scheme}
    diagnostics = None
    if isinstance(definition, PrebuiltScheme):
        if index_dir is not None:
            embedded = index_embeddings(dataset=dataset, index_dir=index_dir)
            embeddings_path = None
        else:
            if encoder is None:
                from gr_jax.encoders import load_minilm  # Imports jax: only for the prebuilt schemes.

                encoder = load_minilm(batch_size=encoder_batch_size)
            embedded = collection_embeddings(dataset=dataset, encoder=encoder, cache_path=embeddings_path,
                                             batch_size=batch_size, show_progress=show_progress)
        start = time.perf_counter()
        built = definition.from_embeddings(docids=embedded.docids, embeddings=embedded.embeddings,
                                           vocabulary=vocabulary, settings=settings, show_progress=show_progress)
        report.update(embeddings=str(embeddings_path) if embeddings_path else None,
                      index_dir=str(index_dir) if index_dir is not None else None,
                      embeddings_cached=embedded.cached, embed_s=round(embedded.seconds, 2),
                      embed_documents_per_s=embedded.documents_per_s and round(embedded.documents_per_s, 1),
                      cluster_s=round(time.perf_counter() - start, 2), **dataclasses.asdict(settings))
        extended, diagnostics = built.extended, dict(built.diagnostics)
    else:
        table = definition.build(dataset=dataset, vocabulary=vocabulary)
        space = DocidSpace.from_table(table, scheme=scheme, text_vocab_size=vocabulary.vocab_size)
        extended = ExtendedDocidTable(table=table, vocab_size=vocabulary.vocab_size,
                                      num_extra_tokens=space.model_vocab_size - vocabulary.vocab_size)
    path = docid_table_path(dataset.data_dir, scheme)
    extended.table.save(path)
    report.update(docid_table=str(path), num_docids=len(extended.table), max_length=extended.table.max_length,
                  vocab_size=extended.vocab_size, num_extra_tokens=extended.num_extra_tokens,
                  model_vocab_size=extended.model_vocab_size)
    if diagnostics is not None:
        report["diagnostics"] = diagnostics
    return report


def index_embeddings(*, dataset: RetrievalDataset, index_dir: str | pathlib.Path) -> CollectionEmbeddings:
    """The document vectors of a dense run's corpus index, checked to be `dataset`'s collection in its order."""
    from gr_jax.dense.index import MANIFEST, CorpusIndex  # Imports jax: only with --index_dir.

    index = CorpusIndex.load(index_dir, expect=lambda manifest, path: None)
    where = pathlib.Path(index_dir) / MANIFEST
    if index.multi_vector:
        raise ValueError(f"{where}: several vectors a document (MaxSim); a docid scheme clusters one a document")
    docids = tuple(docid for docid, _ in dataset.collection())
    indexed = tuple(docid.decode() if isinstance(docid, bytes) else str(docid) for docid in index.docids)
    if indexed != docids:
        first = next((i for i, (a, b) in enumerate(zip(indexed, docids)) if a != b), min(len(indexed), len(docids)))
        raise ValueError(f"{where}: its {len(indexed)} documents are not {dataset.collection_path}'s {len(docids)} in "
                         f"order (first difference at row {first})")
    return CollectionEmbeddings(docids=docids, embeddings=np.asarray(index.embeddings, np.float32), cached=True,
                                seconds=0.0)


@dataclasses.dataclass(frozen=True)
class SchemeOption:
    """One command-line option `--{name}` and the prebuilt schemes whose settings have a field of that name.

    kind: the field's type, the same in every scheme that has it; uses: (schemes, help, default) for each distinct
    help text and default.
    """

    name: str
    kind: type
    uses: tuple[tuple[tuple[str, ...], str, Any], ...]

    @property
    def schemes(self) -> frozenset[str]:
        return frozenset(name for schemes, _, _ in self.uses for name in schemes)

    @property
    def help(self) -> str:
        return "; ".join(f"{', '.join(schemes)}: {text} (default: {default})" for schemes, text, default in self.uses)


def scheme_options(schemes: Mapping[str, Any] | None = None) -> dict[str, SchemeOption]:
    """Every option of the prebuilt schemes' settings (default: every registered scheme), by name.

    Schemes may share an option (`--seed`) with their own default and help; a name with two types is an error.
    """
    fields: dict[str, list[tuple[str, type, dataclasses.Field]]] = {}
    for scheme_name, scheme in (SCHEMES if schemes is None else schemes).items():
        if not isinstance(scheme, PrebuiltScheme):
            continue
        types = typing.get_type_hints(scheme.settings_type)
        for field in dataclasses.fields(scheme.settings_type):  # type: ignore[arg-type]
            if field.default is dataclasses.MISSING:
                raise TypeError(f"docid scheme {scheme_name!r}: setting {field.name!r} has no default")
            fields.setdefault(field.name, []).append((scheme_name, types[field.name], field))
    options = {}
    for name, users in fields.items():
        kinds = {kind for _, kind, _ in users}
        if len(kinds) > 1:
            raise TypeError(f"option --{name} has several types: "
                            f"{', '.join(f'{scheme}: {kind.__name__}' for scheme, kind, _ in users)}")
        uses: dict[tuple[str, Any], list[str]] = {}
        for scheme_name, _, field in users:
            uses.setdefault((field.metadata.get("help", ""), field.default), []).append(scheme_name)
        options[name] = SchemeOption(name=name, kind=kinds.pop(), uses=tuple(
            (tuple(sorted(schemes)), text, default) for (text, default), schemes in uses.items()))
    return options


def _parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, dict[str, Any]]:
    """The tool's arguments, and the options given for the chosen scheme (an option of another scheme is an error)."""
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.semantic_ids", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", required=True, help="dataset directory (gr_jax.data.readers) with spm.model")
    parser.add_argument("--scheme", choices=sorted(SCHEMES), default="semantic",
                        help="; ".join(f"{name}: {SCHEMES[name].description}" for name in sorted(SCHEMES)))
    options = scheme_options()
    group = parser.add_argument_group("the schemes' options (each scheme's own default when not given)")
    for option in options.values():
        if option.kind is bool:
            group.add_argument(f"--{option.name}", action=argparse.BooleanOptionalAction, default=None,
                               help=option.help)
        else:
            group.add_argument(f"--{option.name}", type=option.kind, default=None, help=option.help)
    parser.add_argument("--embeddings", default=None,
                        help=f"embedding cache (.npy); default: DATA_DIR/{EMBEDDINGS_FILENAME}")
    parser.add_argument("--no_embeddings_cache", action="store_true", help="keep the embeddings in memory only")
    parser.add_argument("--index_dir", default=None,
                        help="cluster this dense run's index/{step} document vectors instead of zero-shot MiniLM's")
    parser.add_argument("--batch_size", type=int, default=4096, help="texts read per encoder call (default: 4096)")
    parser.add_argument("--encoder_batch_size", type=int, default=128,
                        help="texts per jitted forward pass (default: 128)")
    parser.add_argument("--no_progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    given = {name: getattr(args, name) for name in options if getattr(args, name) is not None}
    foreign = sorted(name for name in given if args.scheme not in options[name].schemes)
    if foreign:
        own = sorted(name for name, option in options.items() if args.scheme in option.schemes)
        parser.error(f"{', '.join(f'--{name}' for name in foreign)}: not an option of --scheme {args.scheme} "
                     f"(its options: {', '.join(f'--{name}' for name in own) or 'none'})")
    return args, given


def main(argv: Sequence[str] | None = None) -> dict:
    args, options = _parse_args(argv)
    embeddings_path = None if args.no_embeddings_cache else (
        args.embeddings or pathlib.Path(args.data_dir) / EMBEDDINGS_FILENAME)
    return run_tool(lambda: build(data_dir=args.data_dir, scheme=args.scheme, options=options,
                                  embeddings_path=embeddings_path, batch_size=args.batch_size,
                                  encoder_batch_size=args.encoder_batch_size, show_progress=not args.no_progress,
                                  index_dir=args.index_dir))


if __name__ == "__main__":
    main()
