"""Builds the WordNet 3.0 reverse-dictionary retrieval dataset (the embedded default corpus).

Reverse dictionary: given a definition ("a dairy product made by curdling milk"), retrieve the concept. Each
synset of the chosen lexicographer files is one document; the document text is its lemma names, its hypernyms
("a kind of X, Y"; nouns and verbs have them, adjectives and adverbs do not) and its usage examples; the query
is its definition, which is *not* part of the document text. A noun's docid is its 8-digit synset offset (e.g.
"07555863", a natural naive docid); offsets are unique only within one data file, so a verb's, adjective's or
adverb's docid is its offset and the letter of its data file, as in the Open Multilingual Wordnet
("01904948-v", "00003553-a" for an adjective or satellite, "00001740-r"). Synsets are split by a stable hash
of the docid into dev queries (`dev_fraction`) and the rest, of which a `coverage` fraction get a training
query, mirroring the corpus regimes of the study (coverage 0.93 / 0.52 / 0.06). The sets are nested: with one
seed, the training synsets at coverage 0.52 are a subset of those at 0.93. The definitions of the remaining
synsets (not dev, not covered) are the `valid` split: queries of documents that, like the dev ones, have no
training query, disjoint from dev, for choosing a step or hyperparameters without touching dev.

The output directory has the official MS MARCO layout (collection.tsv, queries.{train,dev,valid}.tsv,
qrels.{train,dev,valid}.tsv) read by `gr_jax.data.readers.open_dataset`, plus summary.json.

    python -m gr_jax.tools.wordnet --out_dir data/wordnet_food --lexfiles noun.food [--wordnet_dir /usr/share/wordnet]
        [--coverage 1.0] [--dev_fraction 0.2] [--seed 0]
    python -m gr_jax.tools.wordnet --out_dir data/wordnet_motion --lexfiles verb.motion   # or adj.all, adv.all

The WordNet dict files come from Debian's `wordnet-base` (/usr/share/wordnet) or any WordNet 3.0 dict dir,
such as NLTK's nltk_data/corpora/wordnet. data.noun, data.verb, data.adj and data.adv are parsed here directly
(wndb(5WN) format); only the data files of the requested lexicographer files' parts of speech are read.
"""
from __future__ import annotations

import argparse
import dataclasses
import filecmp
import hashlib
import json
import logging
import os
import pathlib
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence

from gr_jax.entry_point import run_tool
from gr_jax.data.readers import DataFormatError, read_lines, write_tsv

DEFAULT_WORDNET_DIR = "/usr/share/wordnet"
ALL_NOUNS = "all"

# The 45 lexicographer files of WordNet 3.0 (lexnames(5WN)), indexed by lex_filenum. Debian's wordnet-base
# ships no `lexnames` file; when a dict dir has one (NLTK's copy does) it is read instead.
LEXNAMES: tuple[str, ...] = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact",
    "noun.attribute", "noun.body", "noun.cognition", "noun.communication", "noun.event", "noun.feeling",
    "noun.food", "noun.group", "noun.location", "noun.motive", "noun.object", "noun.person",
    "noun.phenomenon", "noun.plant", "noun.possession", "noun.process", "noun.quantity", "noun.relation",
    "noun.shape", "noun.state", "noun.substance", "noun.time", "verb.body", "verb.change", "verb.cognition",
    "verb.communication", "verb.competition", "verb.consumption", "verb.contact", "verb.creation",
    "verb.emotion", "verb.motion", "verb.perception", "verb.possession", "verb.social", "verb.stative",
    "verb.weather", "adj.ppl",
)

# A lexname's prefix -> the letter of its data file (the pos of its pointers); in the files' order.
POS_OF_PREFIX: dict[str, str] = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}
DATA_FILES: dict[str, str] = {"n": "data.noun", "v": "data.verb", "a": "data.adj", "r": "data.adv"}
# The ss_types each data file holds: adjective satellites (s) live in data.adj.
SS_TYPES: dict[str, tuple[str, ...]] = {"n": ("n",), "v": ("v",), "a": ("a", "s"), "r": ("r",)}
_SS_TYPE_NAMES = {"n": "noun synsets (n)", "v": "verb synsets (v)", "a": "adjective synsets (a, s)",
                  "r": "adverb synsets (r)"}

SPLITS = ("train", "dev", "valid")
OUTPUT_FILES = ("collection.tsv", *(f"{kind}.{split}.tsv" for kind in ("queries", "qrels") for split in SPLITS),
                "summary.json")

_OFFSET = re.compile(r"\d{8}")
_POINTERS = re.compile(r"(?:\S+ \d{8} [nvasr] [0-9a-f]{4}(?: |$))*")  # `symbol offset pos source/target`, repeated.
_QUOTE = re.compile('"')
_LEX_ID = re.compile(r"[0-9a-f]")
_ADJECTIVE_MARKER = re.compile(r"\((?:a|p|ip)\)$")
_FRAME_NUMBER = re.compile(r"\d{2}")
_FRAME_WORD = re.compile(r"[0-9a-f]{2}")
_EXAMPLE_SEPARATORS = ";:,"

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Synset:
    """One synset of a data file; `hypernyms` / `instance_hypernyms` hold synset offsets in the same file.

    pos: the letter of its data file (n, v, a, r): an adjective satellite (ss_type s) has pos "a".
    """

    offset: str
    lexname: str
    lemmas: tuple[str, ...]
    hypernyms: tuple[str, ...]
    instance_hypernyms: tuple[str, ...]
    definition: str
    examples: tuple[str, ...]
    pos: str = "n"

    @property
    def docid(self) -> str:
        """The offset for a noun (the docids of every noun dataset so far); `offset-pos` otherwise."""
        return self.offset if self.pos == "n" else f"{self.offset}-{self.pos}"


def _missing_wordnet(message: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"{message}. Install the WordNet 3.0 dict files with `apt-get install -y wordnet-base` (they land in "
        f"{DEFAULT_WORDNET_DIR}) or pass --wordnet_dir pointing at a WordNet dict dir such as NLTK's "
        "nltk_data/corpora/wordnet")


def _data_lines(path: pathlib.Path) -> Iterator[tuple[int, str]]:
    """Yields (line number, line) of a wndb file, skipping the license header (lines starting with two spaces)."""
    for line_number, line in read_lines(path):
        if not line.startswith("  "):
            yield line_number, line


def read_lexnames(wordnet_dir: str | os.PathLike) -> tuple[str, ...]:
    """Lexicographer file names by lex_filenum: the dir's `lexnames` file (`NN name pos`) or the standard table."""
    path = pathlib.Path(wordnet_dir) / "lexnames"
    if not path.is_file():
        return LEXNAMES
    names: dict[int, str] = {}
    for line_number, line in _data_lines(path):
        columns = line.split()
        if len(columns) < 2 or not columns[0].isdigit():
            raise DataFormatError.at(path, line_number, "expected `lex_filenum lexname [pos]`")
        names[int(columns[0])] = columns[1]
    if sorted(names) != list(range(len(names))):
        raise DataFormatError.at(path, 1, f"lex_filenums must run 0..{len(names) - 1} without gaps")
    return tuple(names[i] for i in range(len(names)))


def split_gloss(gloss: str) -> tuple[str, tuple[str, ...]]:
    """Splits a gloss into (definition, usage examples).

    Examples are the quoted sentences after the definition: they start at the first opening `"` that begins
    the gloss or follows `;`, `:` or `,` (quotes inside the definition, as in `the phrase "make strides"`,
    follow a word and stay in it). The example part is cut at `;` outside quotes; each piece loses its `"`
    marks but keeps everything else, e.g. the attribution in `"..."- Shakespeare`. Nothing is dropped.
    """
    gloss = gloss.strip()
    quote_positions = [match.start() for match in _QUOTE.finditer(gloss)]
    start = len(gloss)
    for i in quote_positions[::2]:  # Opening quotes: an even number of quotes precedes them.
        before = gloss[:i].rstrip()
        if not before or before[-1] in _EXAMPLE_SEPARATORS:
            start = i
            break
    definition = gloss[:start].strip().rstrip(_EXAMPLE_SEPARATORS + " ")
    examples = []
    piece, in_quote = [], False
    for c in gloss[start:] + ";":
        if c == '"':
            in_quote = not in_quote
        elif c == ";" and not in_quote:
            example = "".join(piece).strip()
            if example:
                examples.append(example)
            piece = []
        else:
            piece.append(c)
    if in_quote and "".join(piece).strip():  # An unclosed quote swallowed the separators: keep the text.
        examples.append("".join(piece).strip().rstrip(";").strip())
    return definition, tuple(examples)


def _lemma_text(word: str) -> str:
    return _ADJECTIVE_MARKER.sub("", word).replace("_", " ")


def parse_data_line(line: str, *, path: str | os.PathLike, line_number: int,
                    lexnames: Sequence[str], pos: str = "n") -> Synset:
    """Parses one line of the data file of `pos` (n, v, a, r):
    `offset lex_filenum ss_type w_cnt (word lex_id)* p_cnt (ptr)* [frames] | gloss`.

    w_cnt and lex_id are hexadecimal, p_cnt decimal; a pointer is `symbol offset pos source/target`. Only
    data.verb has frames: `f_cnt (+ f_num w_num)*`, f_cnt and f_num decimal, w_num hexadecimal (00: all words).
    Hypernyms (`@`, `@i`) must point into the same file.
    """
    def fail(message: str) -> DataFormatError:
        return DataFormatError.at(path, line_number, message)

    fields, bar, gloss = line.partition(" | ")
    if not bar:
        fields, bar, gloss = line.partition("|")
    if not bar:
        raise fail("expected `... | gloss`")
    tokens = fields.split()
    if len(tokens) < 6:
        raise fail("expected `synset_offset lex_filenum ss_type w_cnt word lex_id ... p_cnt`")
    offset, lex_filenum, ss_type, w_cnt = tokens[:4]
    if not _OFFSET.fullmatch(offset):
        raise fail(f"synset_offset {offset!r} is not 8 digits")
    if not lex_filenum.isdigit() or int(lex_filenum) >= len(lexnames):
        raise fail(f"lex_filenum {lex_filenum!r} is not one of 0..{len(lexnames) - 1}")
    if ss_type not in SS_TYPES[pos]:
        raise fail(f"ss_type {ss_type!r}: {DATA_FILES[pos]} holds {_SS_TYPE_NAMES[pos]} only")
    lexname = lexnames[int(lex_filenum)]
    if POS_OF_PREFIX.get(lexname.partition(".")[0]) != pos:
        raise fail(f"lex_filenum {lex_filenum} is {lexname}, not a lexicographer file of {DATA_FILES[pos]}")
    try:
        word_count = int(w_cnt, 16)
    except ValueError:
        raise fail(f"w_cnt {w_cnt!r} is not a hexadecimal number") from None
    if word_count < 1:
        raise fail("a synset needs at least one word")
    position = 4 + 2 * word_count
    if len(tokens) < position + 1:
        raise fail(f"w_cnt is {word_count} but the line has fewer words")
    lemmas = tuple(_lemma_text(word) for word in tokens[4:position:2])
    bad_lex_ids = [lex_id for lex_id in tokens[5:position:2] if not _LEX_ID.fullmatch(lex_id)]
    if bad_lex_ids:
        raise fail(f"lex_id {bad_lex_ids[0]!r} is not one hexadecimal digit")
    p_cnt = tokens[position]
    if not p_cnt.isdigit():
        raise fail(f"p_cnt {p_cnt!r} is not a decimal number (check w_cnt, which is hexadecimal)")
    pointer_count = int(p_cnt)
    pointers = tokens[position + 1:position + 1 + 4 * pointer_count]
    frames = tokens[position + 1 + 4 * pointer_count:]
    if pos == "v":
        if len(pointers) != 4 * pointer_count or not frames:
            raise fail(f"p_cnt is {pointer_count}: expected {4 * pointer_count} pointer fields and then f_cnt, "
                       f"found {len(tokens) - position - 1} fields")
        _check_frames(frames, word_count=word_count, fail=fail)
    elif frames or len(pointers) != 4 * pointer_count:
        found = len(tokens) - position - 1
        raise fail(f"p_cnt is {pointer_count}: expected {4 * pointer_count} pointer fields, found {found}")
    if not _POINTERS.fullmatch(" ".join(pointers)):
        bad = next(pointers[i:i + 4] for i in range(0, len(pointers), 4)
                   if not _POINTERS.fullmatch(" ".join(pointers[i:i + 4])))
        raise fail(f"malformed pointer {' '.join(bad)!r}: expected `symbol offset pos source/target`")
    hypernyms, instance_hypernyms = [], []
    for symbol, target, target_pos in zip(pointers[0::4], pointers[1::4], pointers[2::4]):
        if symbol in ("@", "@i"):
            if target_pos != pos:
                raise fail(f"{_POS_NAMES[pos]} hypernym pointer to a synset of pos {target_pos!r}")
            (hypernyms if symbol == "@" else instance_hypernyms).append(target)
    definition, examples = split_gloss(gloss)
    return Synset(offset=offset, lexname=lexname, lemmas=lemmas, hypernyms=tuple(hypernyms),
                  instance_hypernyms=tuple(instance_hypernyms), definition=definition, examples=examples, pos=pos)


_POS_NAMES = {"n": "noun", "v": "verb", "a": "adjective", "r": "adverb"}


def _check_frames(frames: Sequence[str], *, word_count: int, fail) -> None:
    """Checks a verb's `f_cnt (+ f_num w_num)*` (they are not part of the dataset, but a miscount is an error)."""
    f_cnt = frames[0]
    if not f_cnt.isdigit():
        raise fail(f"f_cnt {f_cnt!r} is not a decimal number (check p_cnt and the pointers before it)")
    frame_count = int(f_cnt)
    if len(frames) - 1 != 3 * frame_count:
        raise fail(f"f_cnt is {frame_count}: expected {3 * frame_count} frame fields, found {len(frames) - 1}")
    for i in range(1, len(frames), 3):
        plus, f_num, w_num = frames[i:i + 3]
        if plus != "+" or not _FRAME_NUMBER.fullmatch(f_num) or not _FRAME_WORD.fullmatch(w_num):
            raise fail(f"malformed frame {' '.join(frames[i:i + 3])!r}: expected `+ f_num w_num`")
        if int(w_num, 16) > word_count:
            raise fail(f"frame {' '.join(frames[i:i + 3])!r} names word {int(w_num, 16)} of {word_count}")


def read_noun_synsets(wordnet_dir: str | os.PathLike) -> dict[str, Synset]:
    """All synsets of `wordnet_dir/data.noun`, by offset, in file order; checks every hypernym exists."""
    return read_synsets(wordnet_dir, pos="n")


def read_synsets(wordnet_dir: str | os.PathLike, *, pos: str) -> dict[str, Synset]:
    """All synsets of the data file of `pos` (n: data.noun, v: data.verb, a: data.adj, r: data.adv), by
    offset, in file order; checks every hypernym exists in that file."""
    if pos not in DATA_FILES:
        raise ValueError(f"pos {pos!r} is not one of {list(DATA_FILES)}")
    wordnet_dir = pathlib.Path(wordnet_dir)
    if not wordnet_dir.is_dir():
        raise _missing_wordnet(f"WordNet dict dir {wordnet_dir} does not exist")
    path = wordnet_dir / DATA_FILES[pos]
    if not path.is_file():
        found = sorted(p.name for p in wordnet_dir.iterdir())
        raise _missing_wordnet(f"{wordnet_dir} has no {DATA_FILES[pos]} (found: {found or 'nothing'})")
    lexnames = read_lexnames(wordnet_dir)
    synsets: dict[str, Synset] = {}
    line_numbers: dict[str, int] = {}
    for line_number, line in _data_lines(path):
        synset = parse_data_line(line, path=path, line_number=line_number, lexnames=lexnames, pos=pos)
        if synset.offset in synsets:
            raise DataFormatError.at(path, line_number, f"duplicate synset_offset {synset.offset}")
        synsets[synset.offset] = synset
        line_numbers[synset.offset] = line_number
    for synset in synsets.values():
        for target in synset.hypernyms + synset.instance_hypernyms:
            if target not in synsets:
                raise DataFormatError.at(path, line_numbers[synset.offset],
                                         f"hypernym pointer to {target}, which is not in {DATA_FILES[pos]}")
    return synsets


def document_text(synset: Synset, synsets: Mapping[str, Synset]) -> str:
    """`lemma, lemma; a kind of X, Y; an instance of Z; example; example` (no definition: that is the query).

    Hypernyms contribute their first two lemma names; instance hypernyms (`@i`, e.g. a city -> "an instance
    of city") are phrased as such, since "a kind of" would be false for them. `synsets`: those of the synset's
    own data file (a verb's hypernyms are verbs; adjectives and adverbs have none).
    """
    parts = [", ".join(synset.lemmas)]
    parts += ["a kind of " + ", ".join(synsets[h].lemmas[:2]) for h in synset.hypernyms]
    parts += ["an instance of " + ", ".join(synsets[h].lemmas[:2]) for h in synset.instance_hypernyms]
    parts += synset.examples
    return "; ".join(part for part in parts if part)


def stable_fraction(offset: str, *, purpose: str, seed: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, purpose, offset): MD5, so it is the same on every machine
    and Python run (unlike `hash()`), and independent between purposes ("dev" and "coverage")."""
    digest = hashlib.md5(f"{seed}:{purpose}:{offset}".encode("ascii")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _resolve_lexfiles(lexfiles: str | Sequence[str], lexnames: Sequence[str]) -> tuple[str, ...]:
    names = [lexfiles] if isinstance(lexfiles, str) else list(lexfiles)
    names = [name.strip() for entry in names for name in entry.split(",") if name.strip()]
    nouns = tuple(name for name in lexnames if name.startswith("noun."))
    known = tuple(name for name in lexnames if name.partition(".")[0] in POS_OF_PREFIX)
    if names == [ALL_NOUNS]:
        return nouns
    if not names:
        raise ValueError(f"no lexicographer files given; choose {ALL_NOUNS!r} (every noun) or some of {list(known)}")
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"unknown lexicographer files {unknown}; choose {ALL_NOUNS!r} (every noun) or some of "
                         f"{list(known)}")
    return tuple(dict.fromkeys(names))


def _install_outputs(built: pathlib.Path, out_dir: pathlib.Path, *, overwrite: bool) -> None:
    """Moves the built files into `out_dir`; refuses to change existing different files unless `overwrite`."""
    changed = [name for name in OUTPUT_FILES
               if (out_dir / name).exists() and not filecmp.cmp(built / name, out_dir / name, shallow=False)]
    if changed and not overwrite:
        raise FileExistsError(f"{out_dir} already holds a different dataset ({', '.join(changed)} differ); "
                              "pass --overwrite to replace it")
    if changed and (out_dir / "spm.model").exists():
        logger.warning("%s/spm.model was trained on the previous data: retrain it with "
                       "`python -m gr_jax.tools.make_vocab --data_dir %s --overwrite`", out_dir, out_dir)
    for name in OUTPUT_FILES:
        os.replace(built / name, out_dir / name)


def build_reverse_dictionary(
    *,
    wordnet_dir: str | os.PathLike = DEFAULT_WORDNET_DIR,
    lexfiles: str | Sequence[str],
    out_dir: str | os.PathLike,
    coverage: float = 1.0,
    dev_fraction: float = 0.2,
    seed: int = 0,
    overwrite: bool = False,
) -> dict:
    """Writes the reverse-dictionary dataset for the synsets of `lexfiles` (noun.food, verb.motion, adj.all,
    adv.all, ...; "all" = every noun) and returns its summary (also written to summary.json).

    Documents come in the order of the data files (nouns, verbs, adjectives, adverbs), each in file order.

    Every selected synset is a document. A synset whose stable hash falls under `dev_fraction` has its
    definition as a dev query; of the others, those under `coverage` (a second hash) get a training query
    and the rest a validation query.
    A synset with an empty definition stays a document without a query; it is counted in the summary.
    """
    if not 0.0 <= coverage <= 1.0:
        raise ValueError(f"coverage must be in [0, 1], got {coverage}")
    if not 0.0 <= dev_fraction <= 1.0:
        raise ValueError(f"dev_fraction must be in [0, 1], got {dev_fraction}")
    wordnet_dir_path = pathlib.Path(wordnet_dir)
    if not wordnet_dir_path.is_dir():
        raise _missing_wordnet(f"WordNet dict dir {wordnet_dir_path} does not exist")
    selected_lexfiles = _resolve_lexfiles(lexfiles, read_lexnames(wordnet_dir))
    wanted = set(selected_lexfiles)
    wanted_pos = {POS_OF_PREFIX[name.partition(".")[0]] for name in selected_lexfiles}
    # (synset, the synsets of its data file: its hypernyms' names), nouns first.
    selected: list[tuple[Synset, Mapping[str, Synset]]] = []
    for pos in DATA_FILES:
        if pos in wanted_pos:
            synsets = read_synsets(wordnet_dir, pos=pos)
            selected += [(synset, synsets) for synset in synsets.values() if synset.lexname in wanted]

    documents, train_queries, dev_queries, valid_queries = [], [], [], []
    dev_synsets = train_pool = empty_definition = empty_document = 0
    for synset, synsets in selected:
        text = document_text(synset, synsets)
        empty_document += not text
        docid = synset.docid  # Nouns: the offset, hashed as before (published splits stay put).
        documents.append((docid, text))
        is_dev = stable_fraction(docid, purpose="dev", seed=seed) < dev_fraction
        dev_synsets += is_dev
        if not synset.definition:
            empty_definition += 1
            continue
        query = (docid, synset.definition)
        if is_dev:
            dev_queries.append(query)
        else:
            train_pool += 1
            if stable_fraction(docid, purpose="coverage", seed=seed) < coverage:
                train_queries.append(query)
            else:
                valid_queries.append(query)

    summary = {
        "dataset": "WordNet 3.0 reverse dictionary (query: definition; document: lemmas, hypernyms, examples)",
        "wordnet_dir": str(wordnet_dir),
        "lexfiles": list(selected_lexfiles),
        "documents": len(documents),
        "train_queries": len(train_queries),
        "dev_queries": len(dev_queries),
        "documents_without_query": len(documents) - len(train_queries) - len(dev_queries),  # valid ones included
        "valid_queries": len(valid_queries),
        "empty_definition": empty_definition,
        "empty_document_text": empty_document,
        "dev_fraction": dev_fraction,
        "dev_fraction_achieved": dev_synsets / len(documents) if documents else 0.0,
        "coverage": coverage,
        "coverage_achieved": len(train_queries) / train_pool if train_pool else 0.0,
        "seed": seed,
    }
    if empty_definition or empty_document:
        logger.warning("%d synsets have an empty definition (documents without a query) and %d an empty "
                       "document text", empty_definition, empty_document)

    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
        built = pathlib.Path(tmp)
        write_tsv(built / "collection.tsv", documents)
        for split, queries in zip(SPLITS, (train_queries, dev_queries, valid_queries)):
            write_tsv(built / f"queries.{split}.tsv", queries)
            write_tsv(built / f"qrels.{split}.tsv", ((qid, 0, qid, 1) for qid, _ in queries))
        (built / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        _install_outputs(built, out_dir, overwrite=overwrite)
    return summary


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.wordnet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out_dir", required=True, help="dataset directory to write (MS MARCO layout)")
    parser.add_argument("--lexfiles", nargs="+", required=True,
                        help="lexicographer files (noun.food verb.motion adj.all adv.all, or comma-separated) "
                             f"or {ALL_NOUNS!r} (every noun)")
    parser.add_argument("--wordnet_dir", default=DEFAULT_WORDNET_DIR,
                        help=f"WordNet 3.0 dict dir holding data.noun, data.verb, ... (default: {DEFAULT_WORDNET_DIR})")
    parser.add_argument("--coverage", type=float, default=1.0,
                        help="fraction of non-dev synsets whose definition is a training query (default: 1.0)")
    parser.add_argument("--dev_fraction", type=float, default=0.2,
                        help="fraction of synsets whose definition is a dev query (default: 0.2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the stable split hash (default: 0)")
    parser.add_argument("--overwrite", action="store_true", help="replace a different dataset in --out_dir")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    args = _parse_args(argv)
    return run_tool(lambda: build_reverse_dictionary(wordnet_dir=args.wordnet_dir, lexfiles=args.lexfiles,
                                                     out_dir=args.out_dir, coverage=args.coverage,
                                                     dev_fraction=args.dev_fraction, seed=args.seed,
                                                     overwrite=args.overwrite),
                    report=lambda summary: {"out_dir": str(args.out_dir), **summary}, indent=2)


if __name__ == "__main__":
    main()
