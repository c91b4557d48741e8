"""MS MARCO passage subsets of Pradeep et al. (2023), "How Does Generative Retrieval Scale to Millions of Passages?".

The study trains generative retrievers on three corpora cut from the official MS MARCO passage files; this tool
rebuilds them (and any other size) from `collection.tsv`, `queries.{train,dev}.tsv` and `qrels.{train,dev}.tsv`:

    preset        passages   contents                                                            study's coverage
    msmarco100k     100,000  every passage relevant to a dev query, then passages relevant to           92.9%
                             training queries drawn at random
    msmarco1m     1,000,000  every passage relevant to a train or dev query, then random passages       51.6%
    full          8,841,823  the whole collection                                                        5.8%

("coverage": the fraction of passages with at least one training query, the study's Table 1.) MSMarco100k's
92.9% is only reachable by filling it from the training-relevant passages, not from the whole collection
(random passages would give ~6%), hence the `train_relevant` fill below.

Selection. Every passage gets a tier and a seeded key, and a subset of size N is the first N passages by
(tier, key):

    tier 0   relevant (qrels relevance > 0) to a dev query           always kept
    tier 1   relevant to a training query (fill "train_relevant", or when a subset keeps train)
    tier 2   every other passage
    key      a keyed BLAKE2b hash of (seed, pid): the same on every machine and independent of file order

So subsets of one seed are nested (2k ⊂ 6k ⊂ all; msmarco100k ⊂ msmarco1m ⊂ full) and reproducible, and
`--keep train+dev` merely checks that every training-relevant passage made it in. Fill "uniform" leaves training
passages in tier 2 (a random fill, for low-coverage regimes at small sizes).

Streaming: pass 1 reads the collection once to count passages and record tiers and keys (8 + 1 bytes a passage,
plus the reader's set of seen pids); pass 2 streams it again and writes every subset's collection.tsv at once.
Passage text is never held in memory.

Queries and qrels. A subset keeps the queries of a split with at least one relevant passage in the subset, with
their judgements restricted to the subset's passages (`queries.{train,dev}.tsv`, `qrels.{train,dev}.tsv`,
whatever the input split names, e.g. `--dev_split dev.small` for the study's 6,980 dev queries). Queries
without a relevant judgement and queries whose relevant passages all fall outside the subset are dropped and
counted in summary.json and in the printed table, never silently.

    python -m gr_jax.tools.msmarco_subsets --msmarco_dir DIR --out_dir OUT \\
        (--preset msmarco100k[,msmarco1m,full] | --size N | --sizes 2000,6000,all)
        [--keep dev|train+dev] [--fill train_relevant|uniform] [--seed 0] [--train_split train]
        [--dev_split dev] [--overwrite] [--no_progress]

Each subset is written to OUT/<name>/ (names: the preset, or the size as `2k`, `1m`, `11809`, `all`) in the MS
MARCO layout read by `gr_jax.data.readers.open_dataset`, with its summary.json; OUT/summary.json holds all.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import re
import sys
import tempfile
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import numpy as np
import tqdm

from gr_jax.data.readers import RetrievalDataset, open_dataset, read_collection, write_tsv

TRAIN = "train"
DEV = "dev"
KEEP_CHOICES = {"dev": (DEV,), "train+dev": (TRAIN, DEV)}
FILL_CHOICES = ("train_relevant", "uniform")
Fill = Literal["train_relevant", "uniform"]
ALL = "all"

OUTPUT_FILES = ("collection.tsv", "queries.train.tsv", "queries.dev.tsv", "qrels.train.tsv", "qrels.dev.tsv",
                "summary.json")

TIER_KEPT, TIER_TRAIN, TIER_OTHER = 0, 1, 2

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SubsetSpec:
    """One subset to write: its output directory name, its size (None: the whole collection) and the splits
    whose relevant passages must all be in it (a size too small for them is an error, not a silent drop)."""

    name: str
    size: int | None
    keep: tuple[str, ...] = (DEV,)

    def __post_init__(self):
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"subset name {self.name!r} must be a plain directory name")
        if self.size is not None and (isinstance(self.size, bool) or self.size < 1):
            raise ValueError(f"subset {self.name}: size must be a positive number of passages, got {self.size}")
        if DEV not in self.keep or not set(self.keep) <= {TRAIN, DEV}:
            raise ValueError(f"subset {self.name}: keep must be ('dev',) or ('train', 'dev'), got {self.keep}")


PRESETS: Mapping[str, SubsetSpec] = {
    "msmarco100k": SubsetSpec(name="msmarco100k", size=100_000, keep=(DEV,)),
    "msmarco1m": SubsetSpec(name="msmarco1m", size=1_000_000, keep=(TRAIN, DEV)),
    "full": SubsetSpec(name="full", size=None, keep=(TRAIN, DEV)),
}
PRESET_FILL: Fill = "train_relevant"


def size_label(size: int | None) -> str:
    """Directory name of a generic subset: 2000 -> "2k", 1000000 -> "1m", 11809 -> "11809", None -> "all"."""
    if size is None:
        return ALL
    if size % 1_000_000 == 0:
        return f"{size // 1_000_000}m"
    if size % 1000 == 0:
        return f"{size // 1000}k"
    return str(size)


def parse_size(text: str) -> int | None:
    """Parses "2000", "100k", "1m" or "all" (None)."""
    text = text.strip().lower()
    if text == ALL:
        return None
    match = re.fullmatch(r"(\d+)([km]?)", text)
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"invalid subset size {text!r}: expected a positive number (2000, 100k, 1m) or {ALL!r}")
    return int(match.group(1)) * {"": 1, "k": 1000, "m": 1_000_000}[match.group(2)]


def passage_key(pid: str, *, seed: int) -> int:
    """The seeded random key that orders passages within a tier: 64 bits of BLAKE2b keyed by the seed, so the
    order is the same on every machine and Python run and does not depend on the collection's line order."""
    return int.from_bytes(hashlib.blake2b(pid.encode("utf-8"), digest_size=8,
                                          key=f"msmarco_subsets:{seed}".encode("ascii")).digest(), "big")


def selection_positions(*, tiers: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Rank of every passage in the selection order (tier, then key, then line): `int64[passages]`.

    tiers: `int8[passages]`; keys: `uint64[passages]`. The subset of size N is `positions < N`.
    """
    order = np.lexsort((keys, tiers))  # Last key is primary; lexsort is stable, so equal keys keep line order.
    positions = np.empty(len(order), dtype=np.int64)
    positions[order] = np.arange(len(order), dtype=np.int64)
    return positions


@dataclasses.dataclass
class _Split:
    """A split's queries (file order) and qrels, restricted to queries present in both files."""

    name: str
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    queries_without_relevant_judgement: int
    qrels_queries_missing_from_queries_file: int

    def relevant_pids(self) -> set[str]:
        return {pid for judged in self.qrels.values() for pid, rel in judged.items() if rel > 0}


def _read_split(dataset: RetrievalDataset, split: str) -> _Split:
    queries = dict(dataset.queries(split))
    qrels = dataset.qrels(split)
    missing = [qid for qid in qrels if qid not in queries]
    if missing:
        logger.warning("%d queries judged in qrels.%s.tsv are not in queries.%s.tsv (e.g. %s): their judgements "
                       "are ignored", len(missing), split, split, missing[:3])
    judged = {qid: qrels[qid] for qid in queries if any(rel > 0 for rel in qrels.get(qid, {}).values())}
    return _Split(name=split, queries=queries, qrels=judged,
                  queries_without_relevant_judgement=len(queries) - len(judged),
                  qrels_queries_missing_from_queries_file=len(missing))


def _check_outputs_free(directories: Iterable[pathlib.Path], *, overwrite: bool) -> None:
    """Refuses, before any expensive pass, to replace existing outputs unless `overwrite`."""
    for directory in directories:
        existing = [name for name in OUTPUT_FILES if (directory / name).exists()]
        if existing and not overwrite:
            raise FileExistsError(f"{directory} already holds {', '.join(existing)}; pass --overwrite to replace "
                                  "that dataset")
        if existing and (directory / "spm.model").exists():
            logger.warning("%s/spm.model was trained on the previous data: retrain it with "
                           "`python -m gr_jax.tools.make_vocab --data_dir %s --overwrite`", directory, directory)


def _split_rows(split: _Split, *, in_subset) -> tuple[list[tuple[str, str]], list[tuple[str, int, str, int]], dict]:
    """A split's kept queries and qrels rows for one subset, plus the counts of what was dropped."""
    query_rows, qrels_rows = [], []
    dropped_queries = dropped_judgements = 0
    for qid, text in split.queries.items():
        judged = split.qrels.get(qid)
        if judged is None:
            continue  # No relevant judgement: counted once per split.
        kept = {pid: rel for pid, rel in judged.items() if in_subset(pid)}
        if not any(rel > 0 for rel in kept.values()):
            dropped_queries += 1
            continue
        dropped_judgements += len(judged) - len(kept)
        query_rows.append((qid, text))
        qrels_rows.extend((qid, 0, pid, rel) for pid, rel in kept.items())
    counts = {
        "queries": len(query_rows),
        "judgements": len(qrels_rows),
        "queries_in_file": len(split.queries),
        "queries_without_relevant_judgement": split.queries_without_relevant_judgement,
        "queries_dropped_relevant_passages_not_in_subset": dropped_queries,
        "judgements_dropped_passage_not_in_subset": dropped_judgements,
    }
    return query_rows, qrels_rows, counts


def build_subsets(
    *,
    msmarco_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    subsets: Sequence[SubsetSpec],
    fill: Fill = "train_relevant",
    seed: int = 0,
    train_split: str = TRAIN,
    dev_split: str = DEV,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Writes every subset to `out_dir/<name>/` and returns the run's summary (also `out_dir/summary.json`).

    Subsets are nested: all are prefixes of one (tier, key) order fixed by `seed`, `fill` and the qrels.
    Raises ValueError when a size exceeds the collection or is too small for the passages its `keep` splits need.
    """
    if not subsets:
        raise ValueError("no subset requested")
    if fill not in FILL_CHOICES:
        raise ValueError(f"fill must be one of {FILL_CHOICES}, got {fill!r}")
    names = [spec.name for spec in subsets]
    if len(set(names)) != len(names):
        raise ValueError(f"subset names repeat: {names}")
    sizes = [spec.size for spec in subsets]
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"subset sizes repeat: {[size_label(s) for s in sizes]}")
    out_dir = pathlib.Path(out_dir)
    targets = {spec.name: out_dir / spec.name for spec in subsets}
    _check_outputs_free(targets.values(), overwrite=overwrite)

    dataset = open_dataset(msmarco_dir)
    if dataset.layout != "msmarco":
        raise ValueError(f"{dataset.data_dir} is in the {dataset.layout} layout; this tool reads the official MS "
                         "MARCO files (collection.tsv, queries.{split}.tsv, qrels.{split}.tsv)")
    train = _read_split(dataset, train_split)
    dev = _read_split(dataset, dev_split)
    dev_relevant = dev.relevant_pids()
    train_relevant = train.relevant_pids()
    judged_pids = {pid for split in (train, dev) for judged in split.qrels.values() for pid in judged}
    train_tier = fill == "train_relevant" or any(TRAIN in spec.keep for spec in subsets)

    # Pass 1: tiers and keys of every passage, and the line of every judged passage.
    collection_path = dataset.collection_path
    stat_before = collection_path.stat()
    tiers, keys = array("b"), array("Q")
    judged_lines: dict[str, int] = {}
    bar = tqdm.tqdm(desc="pass 1/2: selecting passages", unit=" passages", unit_scale=True, disable=not progress)
    for line, (pid, _) in enumerate(read_collection(collection_path)):
        if pid in dev_relevant:
            tiers.append(TIER_KEPT)
        elif train_tier and pid in train_relevant:
            tiers.append(TIER_TRAIN)
        else:
            tiers.append(TIER_OTHER)
        keys.append(passage_key(pid, seed=seed))
        if pid in judged_pids:
            judged_lines[pid] = line
        bar.update()
    bar.close()
    n_passages = len(tiers)
    if not n_passages:
        raise ValueError(f"{collection_path} holds no passage")
    positions = selection_positions(tiers=np.frombuffer(tiers, dtype=np.int8),
                                    keys=np.frombuffer(keys, dtype=np.uint64))
    del keys
    judged_positions = {pid: int(positions[line]) for pid, line in judged_lines.items()}
    missing_from_collection = {out_name: sorted({pid for judged in split.qrels.values() for pid in judged
                                                 if pid not in judged_positions})
                               for split, out_name in ((train, TRAIN), (dev, DEV))}
    for split, out_name in ((train, TRAIN), (dev, DEV)):
        if missing_from_collection[out_name]:
            logger.warning("qrels.%s.tsv names %d passages that are not in %s (e.g. %s)", split.name,
                           len(missing_from_collection[out_name]), collection_path,
                           missing_from_collection[out_name][:3])

    resolved = sorted(((spec, n_passages if spec.size is None else spec.size) for spec in subsets),
                      key=lambda item: item[1])
    relevant_by_split = {TRAIN: train_relevant, DEV: dev_relevant}
    for spec, size in resolved:
        if size > n_passages:
            raise ValueError(f"subset {spec.name}: size {size} exceeds the {n_passages} passages of {collection_path}")
        needed = set().union(*(relevant_by_split[split] for split in spec.keep)) & judged_positions.keys()
        smallest = 1 + max((judged_positions[pid] for pid in needed), default=-1)
        if smallest > size:
            raise ValueError(f"subset {spec.name}: {size} passages cannot hold the {len(needed)} passages relevant "
                             f"to its kept splits ({'+'.join(spec.keep)}); use a size of at least {smallest}"
                             + (" or --keep dev" if TRAIN in spec.keep else ""))

    # Pass 2: stream the collection again, writing each passage to every subset it belongs to.
    out_dir.mkdir(parents=True, exist_ok=True)
    header = _run_header(dataset, seed=seed, fill=fill, n_passages=n_passages)
    summary_subsets = []
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
        built = {spec.name: pathlib.Path(tmp) / spec.name for spec, _ in resolved}
        for directory in built.values():
            directory.mkdir()
        _write_collections(collection_path, positions=positions,
                           outputs=[(built[spec.name] / "collection.tsv", size) for spec, size in resolved],
                           progress=progress)
        stat_after = collection_path.stat()
        if (stat_after.st_size, stat_after.st_mtime_ns) != (stat_before.st_size, stat_before.st_mtime_ns):
            raise RuntimeError(f"{collection_path} changed while the subsets were being written; run again")

        for spec, size in resolved:
            def in_subset(pid: str, _size=size) -> bool:
                position = judged_positions.get(pid)
                return position is not None and position < _size

            subset_summary = {"name": spec.name, "out_dir": str(targets[spec.name]), "passages": size,
                              "keep": "+".join(spec.keep)}
            for split, out_name in ((train, TRAIN), (dev, DEV)):
                query_rows, qrels_rows, counts = _split_rows(split, in_subset=in_subset)
                write_tsv(built[spec.name] / f"queries.{out_name}.tsv", query_rows)
                write_tsv(built[spec.name] / f"qrels.{out_name}.tsv", qrels_rows)
                subset_summary[out_name] = {"input_split": split.name, **counts}
                if out_name == TRAIN:
                    covered = {pid for _, _, pid, rel in qrels_rows if rel > 0}
            subset_summary["passages_with_train_query"] = len(covered)
            subset_summary["train_coverage"] = len(covered) / size
            subset_summary["passages_relevant_to_dev"] = sum(map(in_subset, dev_relevant))
            summary_subsets.append(subset_summary)
            (built[spec.name] / "summary.json").write_text(json.dumps({**header, **subset_summary}, indent=2) + "\n",
                                                           encoding="utf-8")

        for spec, _ in resolved:
            targets[spec.name].mkdir(parents=True, exist_ok=True)
            for name in OUTPUT_FILES:
                os.replace(built[spec.name] / name, targets[spec.name] / name)

    summary = {
        **header,
        "splits": {out_name: {"input_split": split.name, "queries_in_file": len(split.queries),
                              "queries_with_relevant_judgement": len(split.qrels),
                              "qrels_queries_missing_from_queries_file": split.qrels_queries_missing_from_queries_file,
                              "relevant_passages": len(split.relevant_pids()),
                              "judged_passages_missing_from_collection": len(missing_from_collection[out_name])}
                   for split, out_name in ((train, TRAIN), (dev, DEV))},
        "subsets": summary_subsets,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def _write_collections(collection_path: pathlib.Path, *, positions: np.ndarray,
                       outputs: Sequence[tuple[pathlib.Path, int]], progress: bool) -> None:
    """Streams the collection once, writing the passage on line i to every output whose size exceeds
    `positions[i]`. Rows are written verbatim: the reader already refused tabs and line breaks in them."""
    handles = [(open(path, "w", encoding="utf-8", newline="\n"), size) for path, size in outputs]
    try:
        bar = tqdm.tqdm(total=len(positions), desc="pass 2/2: writing subsets", unit=" passages", unit_scale=True,
                        disable=not progress)
        lines = 0
        for pid, text in read_collection(collection_path):
            if lines == len(positions):
                raise RuntimeError(f"{collection_path} grew while the subsets were being written; run again")
            position = positions[lines]
            row = f"{pid}\t{text}\n"
            for handle, size in handles:
                if position < size:
                    handle.write(row)
            lines += 1
            bar.update()
        bar.close()
        if lines != len(positions):
            raise RuntimeError(f"{collection_path} shrank while the subsets were being written; run again")
    finally:
        for handle, _ in handles:
            handle.close()


def _run_header(dataset: RetrievalDataset, *, seed: int, fill: str, n_passages: int) -> dict:
    return {
        "dataset": "MS MARCO passage subsets (Pradeep et al. 2023): dev-relevant passages always kept, then "
                   f"{'training-relevant passages, then ' if fill == 'train_relevant' else ''}seeded random ones",
        "msmarco_dir": str(dataset.data_dir),
        "collection_passages": n_passages,
        "seed": seed,
        "fill": fill,
    }


def format_table(summary: Mapping) -> str:
    """The coverage table of the study's Table 1 for the run's subsets, smallest first."""
    header = ("subset", "passages", "with train query", "train queries", "dev queries", "dropped train",
              "dropped dev")
    rows = [header]
    for subset in summary["subsets"]:
        rows.append((
            subset["name"], f"{subset['passages']:,}",
            f"{subset['passages_with_train_query']:,} ({100 * subset['train_coverage']:.1f}%)",
            f"{subset['train']['queries']:,}", f"{subset['dev']['queries']:,}",
            f"{subset['train']['queries_dropped_relevant_passages_not_in_subset']:,}",
            f"{subset['dev']['queries_dropped_relevant_passages_not_in_subset']:,}",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    splits = summary["splits"]
    lines.append(f"queries without a relevant judgement (dropped from every subset): "
                 f"train {splits[TRAIN]['queries_in_file'] - splits[TRAIN]['queries_with_relevant_judgement']:,}, "
                 f"dev {splits[DEV]['queries_in_file'] - splits[DEV]['queries_with_relevant_judgement']:,}")
    return "\n".join(lines)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.msmarco_subsets",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--msmarco_dir", required=True,
                        help="directory with the official collection.tsv, queries.{split}.tsv, qrels.{split}.tsv")
    parser.add_argument("--out_dir", required=True, help="each subset is written to OUT_DIR/<name>/")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--preset", help=f"comma-separated presets of the study: {', '.join(PRESETS)} "
                                        f"(fill {PRESET_FILL}; nested when several)")
    which.add_argument("--size", help="one subset of this many passages (2000, 100k, 1m or all)")
    which.add_argument("--sizes", help="nested subsets, comma-separated (e.g. 2000,6000,all)")
    parser.add_argument("--keep", choices=tuple(KEEP_CHOICES), default=None,
                        help="splits whose relevant passages every subset must hold (default: dev)")
    parser.add_argument("--fill", choices=FILL_CHOICES, default=None,
                        help="after the kept passages: training-relevant passages first, or uniformly random ones "
                             "(default: train_relevant)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the passage order (default: 0)")
    parser.add_argument("--train_split", default=TRAIN, help="input training split (default: train)")
    parser.add_argument("--dev_split", default=DEV,
                        help="input dev split, written as 'dev' (default: dev; the study used dev.small)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing subsets in --out_dir")
    parser.add_argument("--no_progress", action="store_true", help="no progress bars")
    return parser.parse_args(argv)


def _subsets_from_args(args: argparse.Namespace) -> tuple[list[SubsetSpec], Fill]:
    if args.preset is not None:
        if args.keep is not None or args.fill is not None:
            raise ValueError("presets fix --keep and --fill; leave them out or use --size/--sizes")
        names = [name.strip() for name in args.preset.split(",") if name.strip()]
        unknown = [name for name in names if name not in PRESETS]
        if unknown or not names:
            raise ValueError(f"unknown preset(s) {unknown or names}; choose from {list(PRESETS)}")
        return [PRESETS[name] for name in names], PRESET_FILL
    keep = KEEP_CHOICES[args.keep or "dev"]
    texts = [args.size] if args.size is not None else [t for t in args.sizes.split(",") if t.strip()]
    specs = [SubsetSpec(name=size_label(size), size=size, keep=keep) for size in map(parse_size, texts)]
    return specs, args.fill or "train_relevant"


def main(argv: Sequence[str] | None = None) -> dict:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        subsets, fill = _subsets_from_args(args)
        summary = build_subsets(msmarco_dir=args.msmarco_dir, out_dir=args.out_dir, subsets=subsets, fill=fill,
                                seed=args.seed, train_split=args.train_split, dev_split=args.dev_split,
                                overwrite=args.overwrite, progress=not args.no_progress)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        sys.exit(f"error: {e}")
    print(format_table(summary), flush=True)
    print(f"summary: {pathlib.Path(args.out_dir) / 'summary.json'}", flush=True)
    return summary


if __name__ == "__main__":
    main()
