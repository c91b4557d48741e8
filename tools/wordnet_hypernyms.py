"""WordNet hypernym ranking (SToICaL's WordNet task, Rozonoyer et al. Sec. 5): rank a synset's hypernyms.

    python -m gr_jax.tools.wordnet_hypernyms --out_dir data/hypernyms_mammal --root mammal.n.01
        [--wordnet_dir /usr/share/wordnet] [--dev_fraction 0.1] [--seed 0] [--in_context]

Query: a noun synset of depth >= 1 in the subtree of `--root` (entity.n.01: every noun), as its name
(`deer.n.01`). Its ranked documents: its hypernym path, most specific first, up to the top (deer -> ruminant >
even-toed ungulate > ... > entity), following the first hypernym listed at each step (instance hypernyms when a
synset has no other; WordNet's few multi-parent synsets get one path). Docids are synset names, as NLTK writes
them (`ruminant.n.01`: the first lemma, lower-cased, and its sense number from index.noun), which the naive
docid scheme tokenises with the vocabulary. Every synset of the subtree or on a path is a document (text: its
lemmas and definition).

The MS MARCO layout: `collection.tsv`; `queries.{train,dev}.tsv` (a stable seeded hash of the synset offset puts
`--dev_fraction` in dev); graded `qrels.{split}.tsv`, grade n_q - r + 1 for rank r (what turns any graded qrels
into a ranked list); `negatives.{split}.tsv` (qid, one synset off the query's path, seeded: the evaluation
negative of CVR); `summary.json`. `--in_context` writes the paper's form instead of the parametric one: the query
text is the name followed by its path's docids, shuffled (seeded per query). Then train a vocabulary with
`python -m gr_jax.tools.make_vocab`.
"""
from __future__ import annotations

import argparse
import json
import pathlib
from collections.abc import Mapping
from typing import Optional, Sequence

import numpy as np

from gr_jax.data.readers import DataFormatError, write_tsv
from gr_jax.entry_point import run_tool
from gr_jax.ranking.evaluation import NEGATIVES
from gr_jax.tools import wordnet



def read_sense_names(wordnet_dir: str | pathlib.Path, synsets: Mapping[str, wordnet.Synset]) -> dict[str, str]:
    """offset -> `lemma.n.NN` for every synset, NN its position in its first lemma's index.noun entry."""
    path = pathlib.Path(wordnet_dir) / "index.noun"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: synset names need WordNet's index.noun (wordnet-base)")
    senses: dict[str, list[str]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("  ") or not line.strip():
            continue  # the license header
        fields = line.split()
        try:
            count, pointers = int(fields[2]), int(fields[3])
            offsets = fields[4 + pointers + 2:]
        except (IndexError, ValueError):
            raise DataFormatError.at(path, number, "expected `lemma pos synset_cnt p_cnt ptr... sense_cnt "
                                                   "tagsense_cnt offset...`") from None
        if len(offsets) != count:
            raise DataFormatError.at(path, number, f"synset_cnt is {count} but {len(offsets)} offsets follow")
        senses[fields[0]] = offsets
    names = {}
    for offset, synset in synsets.items():
        lemma = synset.lemmas[0].replace(" ", "_").lower()
        try:
            names[offset] = f"{lemma}.n.{senses[lemma].index(offset) + 1:02d}"
        except (KeyError, ValueError):
            raise DataFormatError(f"{path}: no sense of {lemma!r} is synset {offset}") from None
    return names


def hypernym_path(offset: str, synsets: Mapping[str, wordnet.Synset]) -> list[str]:
    """The synsets above `offset`, most specific first, following the first hypernym at each step."""
    path, seen = [], {offset}
    current = synsets[offset]
    while current.hypernyms or current.instance_hypernyms:
        parent = (current.hypernyms or current.instance_hypernyms)[0]
        if parent in seen:
            raise DataFormatError(f"hypernym cycle through synset {parent}")
        seen.add(parent)
        path.append(parent)
        current = synsets[parent]
    return path


def build(*, wordnet_dir: str, out_dir: str, root: str, dev_fraction: float = 0.1, seed: int = 0,
          in_context: bool = False) -> dict:
    if not 0.0 < dev_fraction < 1.0:
        raise ValueError(f"--dev_fraction must be in (0, 1), got {dev_fraction}")
    synsets = wordnet.read_noun_synsets(wordnet_dir)
    names = read_sense_names(wordnet_dir, synsets)
    by_name = {name: offset for offset, name in names.items()}
    if root not in by_name:
        raise ValueError(f"--root {root!r} is no noun synset name (e.g. mammal.n.01)")
    children: dict[str, list[str]] = {}
    for offset, synset in synsets.items():
        for parent in synset.hypernyms + synset.instance_hypernyms:
            children.setdefault(parent, []).append(offset)
    subtree, stack = [], [by_name[root]]
    seen = set(stack)
    while stack:
        offset = stack.pop()
        subtree.append(offset)
        for child in children.get(offset, ()):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    queries = sorted(o for o in subtree if synsets[o].hypernyms or synsets[o].instance_hypernyms)
    paths = {o: hypernym_path(o, synsets) for o in queries}
    documents = sorted(set(subtree) | {p for path in paths.values() for p in path})
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_tsv(out / "collection.tsv", ((names[o], f"{', '.join(synsets[o].lemmas)}; {synsets[o].definition}")
                                       for o in documents))
    doc_names = np.array([names[o] for o in documents])
    counts = {}
    for split in ("train", "dev"):
        chosen = [o for o in queries if (wordnet.stable_fraction(o, purpose="dev", seed=seed) < dev_fraction)
                  == (split == "dev")]
        texts, qrels, negatives = [], [], []
        for offset in chosen:
            rng = np.random.default_rng([seed, int(offset)])
            path = [names[p] for p in paths[offset]]
            text = names[offset]
            if in_context:
                text += " " + " ".join(path[i] for i in rng.permutation(len(path)))
            texts.append((offset, text))
            qrels += [(offset, "0", name, str(len(path) - rank)) for rank, name in enumerate(path)]
            excluded = set(path) | {names[offset]}
            while True:  # one uniform off-path document (paths are short against any subtree worth ranking)
                negative = str(doc_names[rng.integers(len(doc_names))])
                if negative not in excluded:
                    break
            negatives.append((offset, negative))
        write_tsv(out / f"queries.{split}.tsv", texts)
        write_tsv(out / f"qrels.{split}.tsv", qrels)
        write_tsv(out / NEGATIVES.format(split=split), negatives)
        counts[split] = len(chosen)
    lengths = [len(p) for p in paths.values()]
    summary = {"dataset": "WordNet 3.0 hypernym ranking (query: a synset name; documents: its hypernym path)",
               "wordnet_dir": str(wordnet_dir), "root": root, "documents": len(documents),
               "train_queries": counts["train"], "dev_queries": counts["dev"], "in_context": in_context,
               "path_length": {"min": min(lengths), "mean": float(np.mean(lengths)), "max": max(lengths)},
               "dev_fraction": dev_fraction, "seed": seed}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.wordnet_hypernyms",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--root", default="entity.n.01", help="the subtree whose synsets are the queries")
    parser.add_argument("--wordnet_dir", default=wordnet.DEFAULT_WORDNET_DIR)
    parser.add_argument("--dev_fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--in_context", action="store_true", help="the query lists its shuffled candidates")
    args = parser.parse_args(argv)
    return run_tool(lambda: build(wordnet_dir=args.wordnet_dir, out_dir=args.out_dir, root=args.root,
                                  dev_fraction=args.dev_fraction, seed=args.seed, in_context=args.in_context))


if __name__ == "__main__":
    main()
