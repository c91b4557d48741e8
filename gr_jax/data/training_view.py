"""A data dir that is another's with other training queries: the same documents, docids, vocabulary and evaluation
splits (linked, not copied), its own `queries.train.tsv` and `qrels.train.tsv` (`tools/train_fraction`: a fraction
of them; `tools/distill`: them plus labeled pseudo-queries; `tools/valid_split`: them less a new valid split)."""
from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable, Sequence

from gr_jax.data.readers import PathLike, RetrievalDataset, open_dataset, write_qrels, write_tsv

TRAIN_FILES = ("queries.train.tsv", "qrels.train.tsv")


def view_source(*, data_dir: PathLike, out_dir: PathLike, tool: str) -> RetrievalDataset:
    """`data_dir`'s dataset, checked before any work: the MS MARCO layout (the one with training files to replace),
    and an `out_dir` that is not `data_dir` itself."""
    source = pathlib.Path(data_dir).resolve()
    dataset = open_dataset(source)
    if dataset.layout != "msmarco":
        raise ValueError(f"{data_dir}: {tool} reads and writes the MS MARCO layout (found {dataset.layout})")
    if pathlib.Path(out_dir).resolve() == source:
        raise ValueError("the output dir must differ from --data_dir (the original is kept)")
    return dataset


def write_view(*, dataset: RetrievalDataset, out_dir: PathLike, queries: Iterable[tuple[str, str]],
               judgements: Iterable[tuple[str, str, int]], own_files: Sequence[str] = ()) -> None:
    """Writes `out_dir`'s training queries `(qid, text)` and judgements `(qid, docid, relevance)`, and links every
    other file of `dataset`'s dir there but `own_files` (the tool's report, written by the tool)."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_tsv(out / TRAIN_FILES[0], queries)
    write_qrels(out / TRAIN_FILES[1], judgements)
    for path in pathlib.Path(dataset.data_dir).resolve().iterdir():
        target = out / path.name
        if path.name in TRAIN_FILES or path.name in own_files or not path.is_file():
            continue
        if target.is_symlink() or target.exists():
            target.unlink()
        os.symlink(path, target)
