"""A category for every document of a WordNet dataset, from WordNet's own organisation rather than from any encoder:
GDR's given first cluster level (`python -m gr_jax.tools.gdr_index build --cluster_groups`).

    python -m gr_jax.tools.wordnet_groups --data_dir data/wordnet_nouns_c93 --out groups.lexname.tsv
    python -m gr_jax.tools.wordnet_groups --data_dir data/wordnet_food_c93 --depth 5 --out groups.depth5.tsv
        [--wordnet_dir /usr/share/wordnet]

Without `--depth`: a document's lexicographer file (noun.food, noun.animal, ...: 26 for the nouns). With it: the
synset `--depth` steps below the root on its hypernym path (the first hypernym at each step, as
`gr_jax.tools.wordnet_hypernyms` follows it), the document itself when its path is shorter; the label is that
synset's offset and first lemma (`07555863:food`), so two senses of a word stay apart. Writes `docid \\t label` in the
collection's order and prints one JSON line: documents, labels, the largest group.
"""
from __future__ import annotations

import argparse
import collections
import pathlib
from typing import Optional, Sequence

from gr_jax.data.readers import DataFormatError, read_collection, write_tsv
from gr_jax.entry_point import run_tool
from gr_jax.tools import wordnet
from gr_jax.tools.wordnet_hypernyms import hypernym_path


def document_groups(*, docids: Sequence[str], synsets: dict[str, dict[str, wordnet.Synset]],
                    depth: Optional[int]) -> list[str]:
    """The label of each docid (`Synset.docid`: offset, and `-pos` past the nouns); synsets: pos -> offset ->
    synset, as `wordnet.read_synsets` reads each data file."""
    labels = []
    for docid in docids:
        offset, pos = synset_key(docid)
        if depth is None:
            labels.append(synsets[pos][offset].lexname)
            continue
        path = [offset, *hypernym_path(offset, synsets[pos])][::-1]  # root first
        ancestor = synsets[pos][path[min(depth, len(path) - 1)]]
        labels.append(f"{ancestor.offset}:{ancestor.lemmas[0]}")
    return labels


def synset_key(docid: str) -> tuple[str, str]:
    """(offset, pos) of a `Synset.docid`: a bare offset is a noun's."""
    offset, _, pos = docid.partition("-")
    return offset, pos or "n"


def build(*, data_dir: str, out: str, depth: Optional[int] = None,
          wordnet_dir: str = wordnet.DEFAULT_WORDNET_DIR) -> dict:
    if depth is not None and depth < 0:
        raise ValueError(f"--depth must be >= 0 (0: the root), got {depth}")
    collection = pathlib.Path(data_dir) / "collection.tsv"
    docids = [docid for docid, _ in read_collection(collection)]
    synsets: dict[str, dict[str, wordnet.Synset]] = {}
    for line_number, docid in enumerate(docids, 1):
        offset, pos = synset_key(docid)
        if pos not in wordnet.DATA_FILES:
            raise DataFormatError.at(collection, line_number, f"docid {docid!r} is not a WordNet synset's")
        if pos not in synsets:
            synsets[pos] = wordnet.read_synsets(wordnet_dir, pos=pos)
        if offset not in synsets[pos]:
            raise DataFormatError.at(collection, line_number, f"docid {docid!r}: no such synset in {wordnet_dir}")
    labels = document_groups(docids=docids, synsets=synsets, depth=depth)
    write_tsv(out, zip(docids, labels))
    sizes = collections.Counter(labels)
    label, largest = sizes.most_common(1)[0] if sizes else ("", 0)
    return {"out": out, "documents": len(docids), "labels": len(sizes), "largest": {label: largest}}


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.wordnet_groups",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="a WordNet dataset (gr_jax.tools.wordnet)")
    parser.add_argument("--out", required=True, help="the docid \\t label file to write")
    parser.add_argument("--depth", type=int, default=None,
                        help="label by the hypernym this many steps below the root (default: the lexicographer file)")
    parser.add_argument("--wordnet_dir", default=wordnet.DEFAULT_WORDNET_DIR)
    args = parser.parse_args(argv)
    return run_tool(lambda: build(data_dir=args.data_dir, out=args.out, depth=args.depth,
                                  wordnet_dir=args.wordnet_dir))


if __name__ == "__main__":
    main()
