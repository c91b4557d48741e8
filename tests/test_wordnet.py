"""Tests of gr_jax.tools.wordnet: wndb parsing, document/query text, the stable split, the MS MARCO layout output."""
import hashlib
import json
import pathlib
import shutil

import pytest

from gr_jax.data import readers
from gr_jax.data.readers import DataFormatError
from gr_jax.tools import wordnet

SYSTEM_WORDNET = pathlib.Path("/usr/share/wordnet")
FOOD = ("07555863", "07697825", "07843775", "07850329", "07852919", "07899999")  # Fixture noun.food synsets.



def _dataset_rows(out_dir: pathlib.Path) -> dict:
    dataset = readers.open_dataset(out_dir)
    return {
        "collection": dict(dataset.collection()),
        "train": dict(dataset.queries("train")),
        "dev": dict(dataset.queries("dev")),
        "valid": dict(dataset.queries("valid")),
        "qrels_train": dataset.qrels("train"),
        "qrels_dev": dataset.qrels("dev"),
    }


# ---------------------------------------------------------------------------------------------------- parsing


def test_parses_every_fixture_synset_after_the_license_header(wordnet_dir):
    synsets = wordnet.read_noun_synsets(wordnet_dir)
    assert len(synsets) == 14
    assert list(synsets)[:2] == ["00001740", "00020827"]
    bomber = synsets["07697825"]  # w_cnt "0f" is hexadecimal: 15 lemmas.
    assert len(bomber.lemmas) == 15
    assert bomber.lemmas[-3:] == ("torpedo", "wedge", "zep")
    assert synsets["07852919"] == wordnet.Synset(
        offset="07852919", lexname="noun.food",
        lemmas=("cheddar", "cheddar cheese", "Armerican cheddar", "American cheese"),
        hypernyms=("07850329",), instance_hypernyms=(),
        definition="hard smooth-textured cheese; originally made in Cheddar in southwestern England", examples=())
    assert synsets["07850329"].hypernyms == ("07843775", "07555863")
    assert synsets["08878885"].instance_hypernyms == ("08672738",)
    assert synsets["00021265"].hypernyms == ("00020827",)  # `+ ... a` and `%p` pointers are not hypernyms.
    assert {s.lexname for s in synsets.values()} == {
        "noun.Tops", "noun.act", "noun.attribute", "noun.food", "noun.location", "noun.substance"}


@pytest.mark.parametrize(
    "gloss, definition, examples",
    [
        ("a solid food prepared from the pressed curd of milk  ",
         "a solid food prepared from the pressed curd of milk", ()),
        ('any solid substance (as opposed to liquid) that is used as a source of nourishment; "food and drink"',
         "any solid substance (as opposed to liquid) that is used as a source of nourishment", ("food and drink",)),
        ('a whole (a thing or person) of the same kind; "lard was also used, though its congener, butter, was more '
         'frequently employed"; "the American shopkeeper differs"',
         "a whole (a thing or person) of the same kind",
         ("lard was also used, though its congener, butter, was more frequently employed",
          "the American shopkeeper differs")),
        # A quoted phrase inside the definition stays there.
        ('significant progress (especially in the phrase "make strides"); "they made big strides in productivity"',
         'significant progress (especially in the phrase "make strides")', ("they made big strides in productivity",)),
        ('a demand especially in the phrase "the call of duty"', 'a demand especially in the phrase "the call of duty"',
         ()),
        # Examples after ':' or ',' ; attributions and ';' inside quotes are kept.
        ('a complete extent or range: "a face that expressed a gamut of emotions"', "a complete extent or range",
         ("a face that expressed a gamut of emotions",)),
        ('that which causes harm; "the evil that men do lives after them; the good is oft interred"- Shakespeare',
         "that which causes harm", ("the evil that men do lives after them; the good is oft interred- Shakespeare",)),
        ('degree of separation; "just one remove from madness" or "it imitates at many removes a tragedy";',
         "degree of separation", ("just one remove from madness or it imitates at many removes a tragedy",)),
        # An unclosed quote keeps its text; a gloss that is only an example has an empty definition.
        ('an announcement; "an obituary notice"; "a notice of sale', "an announcement",
         ("an obituary notice", "a notice of sale")),
        ('"raiding the fridge for a midnight snack"', "", ("raiding the fridge for a midnight snack",)),
    ],
)
def test_split_gloss(gloss, definition, examples):
    assert wordnet.split_gloss(gloss) == (definition, examples)


def test_document_text_has_lemmas_hypernyms_and_examples_but_not_the_definition(wordnet_dir):
    synsets = wordnet.read_noun_synsets(wordnet_dir)
    text = {offset: wordnet.document_text(synset, synsets) for offset, synset in synsets.items()}
    assert text["07555863"] == "food, solid food; a kind of solid; food and drink"
    assert text["07850329"] == "cheese; a kind of dairy product; a kind of food, solid food"
    assert text["07852919"] == "cheddar, cheddar cheese, Armerican cheddar, American cheese; a kind of cheese"
    assert text["08878885"] == "Cheddar; an instance of village, hamlet"
    assert text["05050115"] == ("presentness, nowness; a kind of entity; a study of the pastness of the present "
                                "and...of the presentness of the past- R.E.Spiller")
    assert text["00001740"] == "entity"
    for offset, synset in synsets.items():
        assert not synset.definition or synset.definition not in text[offset]


def test_lexnames_file_overrides_the_builtin_table(tmp_path, wordnet_dir):
    shutil.copy(wordnet_dir / "data.noun", tmp_path / "data.noun")
    names = list(wordnet.LEXNAMES)
    assert len(names) == 45 and names[13] == "noun.food" and names[44] == "adj.ppl"
    names[13] = "noun.snacks"  # NLTK's lexnames format: `NN\tname\tpos`.
    (tmp_path / "lexnames").write_text("".join(f"{i:02d}\t{name}\t1\n" for i, name in enumerate(names)))
    assert wordnet.read_lexnames(tmp_path)[13] == "noun.snacks"
    assert wordnet.read_noun_synsets(tmp_path)["07850329"].lexname == "noun.snacks"


@pytest.mark.parametrize(
    "line, message",
    [
        ("07999998 13 n 01 cheese 0 002 @ 07843775 n 0000 | curd", r"p_cnt is 2: expected 8 pointer fields, found 4"),
        ("07999998 13 n 0g cheese 0 000 | curd", "w_cnt '0g' is not a hexadecimal number"),
        ("07999998 13 n 01 cheese x 000 | curd", "lex_id 'x' is not one hexadecimal digit"),
        ("07999998 13 n 01 cheese 0 001 @ 0784377 n 0000 | curd", "malformed pointer '@ 0784377 n 0000'"),
        ("07999998 13 n 02 cheese 0 000 | curd", "p_cnt '000' is not a decimal number|fewer words"),
        ("7850329 13 n 01 cheese 0 000 | curd", "synset_offset '7850329' is not 8 digits"),
        ("07999998 45 n 01 cheese 0 000 | curd", "lex_filenum '45' is not one of 0..44"),
        ("07999998 13 v 01 cheese 0 000 | curd", "ss_type 'v'"),
        ("07999998 13 n 01 cheese 0 000 curd", r"expected `... \| gloss`"),
        ("07999998 13 n 01 cheese 0 001 @ 99999999 n 0000 | curd", "hypernym pointer to 99999999"),
        ("00001740 13 n 01 cheese 0 000 | curd", "duplicate synset_offset 00001740"),
    ],
)
def test_malformed_data_noun_lines_name_the_file_and_line(tmp_path, wordnet_dir, line, message):
    text = (wordnet_dir / "data.noun").read_text(encoding="utf-8")
    (tmp_path / "data.noun").write_text(text + line + "  \n", encoding="utf-8")
    line_number = text.count("\n") + 1
    with pytest.raises(DataFormatError, match=rf"^{tmp_path / 'data.noun'}:{line_number}: .*({message})"):
        wordnet.read_noun_synsets(tmp_path)


def test_missing_wordnet_says_how_to_install_it(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match=r"does not exist\. .*apt-get install -y wordnet-base.*--wordnet_dir"):
        wordnet.read_noun_synsets(tmp_path / "nowhere")
    (tmp_path / "index.noun").write_text("")
    with pytest.raises(FileNotFoundError, match=r"has no data.noun \(found: \['index.noun'\]\).*wordnet-base"):
        wordnet.read_noun_synsets(tmp_path)
    with pytest.raises(SystemExit, match="^error: .*apt-get install -y wordnet-base"):
        wordnet.main(["--out_dir", str(tmp_path / "out"), "--lexfiles", "noun.food", "--wordnet_dir",
                      str(tmp_path / "nowhere")])


# ------------------------------------------------------------------------------------------------------ split


def test_stable_fraction_is_md5_of_seed_purpose_offset():
    digest = hashlib.md5(b"0:dev:07555863").hexdigest()
    assert wordnet.stable_fraction("07555863", purpose="dev", seed=0) == int(digest[:16], 16) / 2**64


def test_split_fractions_are_close_to_the_requested_ones_and_coverage_sets_are_nested():
    offsets = [f"{i * 37 + 1740:08d}" for i in range(20_000)]
    dev = {o for o in offsets if wordnet.stable_fraction(o, purpose="dev", seed=0) < 0.2}
    assert abs(len(dev) / len(offsets) - 0.2) < 0.01  # 3.5 standard deviations.
    pool = [o for o in offsets if o not in dev]
    covered = {c: {o for o in pool if wordnet.stable_fraction(o, purpose="coverage", seed=0) < c}
               for c in (0.93, 0.52, 0.06)}
    for c, chosen in covered.items():
        assert abs(len(chosen) / len(pool) - c) < 0.01
    assert covered[0.06] < covered[0.52] < covered[0.93]
    other_seed = {o for o in offsets if wordnet.stable_fraction(o, purpose="dev", seed=1) < 0.2}
    assert 0.1 < len(dev & other_seed) / len(dev) < 0.3  # Independent draws overlap by ~dev_fraction.


# --------------------------------------------------------------------------------------------------- building


def test_build_noun_food_writes_the_msmarco_layout(tmp_path, wordnet_dir):
    summary = wordnet.build_reverse_dictionary(wordnet_dir=wordnet_dir, lexfiles=["noun.food"], out_dir=tmp_path,
                                               coverage=1.0, dev_fraction=0.5, seed=0)
    rows = _dataset_rows(tmp_path)
    assert list(rows["collection"]) == list(FOOD)
    assert rows["collection"]["07850329"] == "cheese; a kind of dairy product; a kind of food, solid food"
    # Hand-computed md5 fractions (seed 0): dev 07843775 (0.28) only; the other food synsets are >= 0.58.
    assert rows["dev"] == {"07843775": "milk and butter and cheese"}
    assert rows["train"] == {
        "07555863": "any solid substance (as opposed to liquid) that is used as a source of nourishment",
        "07697825": ("a large sandwich made of a long crusty roll split lengthwise and filled with meats and cheese "
                     "(and tomato and onion and lettuce and condiments); different names are used in different "
                     "sections of the United States"),
        "07850329": "a solid food prepared from the pressed curd of milk",
        "07852919": "hard smooth-textured cheese; originally made in Cheddar in southwestern England",
    }  # 07899999 has an empty definition: a document without a query.
    assert rows["qrels_train"] == {qid: {qid: 1} for qid in rows["train"]}
    assert rows["qrels_dev"] == {"07843775": {"07843775": 1}}
    assert rows["valid"] == {}  # coverage 1.0: every non-dev definition is a training query
    assert (tmp_path / "qrels.dev.tsv").read_text() == "07843775\t0\t07843775\t1\n"
    assert summary == json.loads((tmp_path / "summary.json").read_text())
    assert {k: summary[k] for k in ("documents", "train_queries", "dev_queries", "documents_without_query",
                                    "empty_definition", "empty_document_text", "coverage_achieved")} == {
        "documents": 6, "train_queries": 4, "dev_queries": 1, "documents_without_query": 1,
        "empty_definition": 1, "empty_document_text": 0, "coverage_achieved": 1.0}
    assert summary["lexfiles"] == ["noun.food"]
    assert readers.open_dataset(tmp_path).check_qrels("train") == 0


def test_coverage_selects_training_queries_by_the_second_hash(tmp_path, wordnet_dir):
    summary = wordnet.build_reverse_dictionary(wordnet_dir=wordnet_dir, lexfiles="noun.food", out_dir=tmp_path,
                                               coverage=0.4, dev_fraction=0.5, seed=0)
    # Coverage fractions of the 4 non-dev food synsets with a definition: 0.42, 0.36, 0.17, 0.64.
    assert set(_dataset_rows(tmp_path)["train"]) == {"07697825", "07850329"}
    assert summary["coverage_achieved"] == 0.5
    assert summary["documents_without_query"] == 3
    # The uncovered ones with a definition are the validation split (07899999 has none).
    assert set(_dataset_rows(tmp_path)["valid"]) == {"07555863", "07852919"} and summary["valid_queries"] == 2
    assert readers.open_dataset(tmp_path).check_qrels("valid") == 0
    wordnet.build_reverse_dictionary(wordnet_dir=wordnet_dir, lexfiles="noun.food", out_dir=tmp_path / "none",
                                     coverage=0.0, dev_fraction=0.5, seed=0)
    assert _dataset_rows(tmp_path / "none")["train"] == {}


def test_all_nouns_split_is_pinned_and_deterministic(tmp_path, wordnet_dir):
    first = wordnet.build_reverse_dictionary(wordnet_dir=wordnet_dir, lexfiles="all", out_dir=tmp_path / "a")
    wordnet.build_reverse_dictionary(wordnet_dir=wordnet_dir, lexfiles=["all"], out_dir=tmp_path / "b")
    rows = _dataset_rows(tmp_path / "a")
    assert len(rows["collection"]) == first["documents"] == 14
    assert set(rows["dev"]) == {"00001740", "08672738"}  # The md5 rule must never change: splits are published.
    assert len(rows["train"]) == 11 and not set(rows["train"]) & set(rows["dev"])
    for name in wordnet.OUTPUT_FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    wordnet.build_reverse_dictionary(wordnet_dir=wordnet_dir, lexfiles="all", out_dir=tmp_path / "c", seed=1)
    assert set(_dataset_rows(tmp_path / "c")["dev"]) == {"07852919"}  # Fraction 0.067 under seed 1.


def test_several_lexfiles_and_unknown_ones(tmp_path, wordnet_dir):
    summary = wordnet.build_reverse_dictionary(wordnet_dir=wordnet_dir, lexfiles=["noun.location,noun.substance"],
                                               out_dir=tmp_path)
    assert list(_dataset_rows(tmp_path)["collection"]) == ["08672738", "08878885", "15046900"]
    assert summary["lexfiles"] == ["noun.location", "noun.substance"]
    with pytest.raises(ValueError, match=r"unknown lexicographer files \['noun.fud', 'verb.bdy'\]"):
        wordnet.build_reverse_dictionary(wordnet_dir=wordnet_dir, lexfiles=["noun.fud", "verb.bdy"],
                                         out_dir=tmp_path / "x")
    with pytest.raises(ValueError, match=r"coverage must be in \[0, 1\]"):
        wordnet.build_reverse_dictionary(wordnet_dir=wordnet_dir, lexfiles="all", out_dir=tmp_path, coverage=1.5)


def test_rebuilding_refuses_to_replace_a_different_dataset(tmp_path, wordnet_dir):
    build = dict(wordnet_dir=wordnet_dir, lexfiles="noun.food", out_dir=tmp_path)
    wordnet.build_reverse_dictionary(**build)
    wordnet.build_reverse_dictionary(**build)  # Identical output: nothing to refuse.
    before = (tmp_path / "queries.train.tsv").read_bytes()
    with pytest.raises(FileExistsError, match=r"different dataset \(queries.train.tsv, .*summary.json differ\)"):
        wordnet.build_reverse_dictionary(**build, coverage=0.5)
    assert (tmp_path / "queries.train.tsv").read_bytes() == before
    wordnet.build_reverse_dictionary(**build, coverage=0.5, overwrite=True)
    assert json.loads((tmp_path / "summary.json").read_text())["coverage"] == 0.5
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(wordnet.OUTPUT_FILES)  # No temporary leftovers.


def test_main_prints_the_summary(tmp_path, wordnet_dir, capsys):
    summary = wordnet.main(["--out_dir", str(tmp_path), "--lexfiles", "noun.food", "--wordnet_dir", str(wordnet_dir),
                            "--coverage", "0.4", "--dev_fraction", "0.5"])
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"out_dir": str(tmp_path), **summary}
    assert (summary["documents"], summary["train_queries"], summary["dev_queries"]) == (6, 2, 1)


# ------------------------------------------------------------------------------------------ the real WordNet 3.0


@pytest.mark.skipif(not (SYSTEM_WORDNET / "data.noun").is_file(), reason="wordnet-base is not installed")
def test_real_wordnet_noun_food(tmp_path):
    synsets = wordnet.read_noun_synsets(SYSTEM_WORDNET)
    index_offsets = set()  # index.noun lists every noun synset: an independent count of data.noun.
    for line in (SYSTEM_WORDNET / "index.noun").read_text(encoding="utf-8").splitlines():
        if not line.startswith("  "):
            index_offsets.update(token for token in line.split() if len(token) == 8 and token.isdigit())
    assert len(synsets) == 82_115 and set(synsets) == index_offsets

    summaries = {}
    for coverage in (1.0, 0.52):
        out_dir = tmp_path / str(coverage)
        summaries[coverage] = wordnet.build_reverse_dictionary(
            wordnet_dir=SYSTEM_WORDNET, lexfiles="noun.food", out_dir=out_dir, coverage=coverage)
        assert abs(summaries[coverage]["coverage_achieved"] - coverage) < 0.03
    full = summaries[1.0]
    assert full["documents"] == 2573
    assert full["train_queries"] + full["dev_queries"] == 2573 and full["empty_definition"] == 0
    assert abs(full["dev_fraction_achieved"] - 0.2) < 0.02
    datasets = {c: readers.open_dataset(tmp_path / str(c)) for c in summaries}
    assert datasets[1.0].check_qrels("dev") == 0
    train = {c: {qid for qid, _ in d.queries("train")} for c, d in datasets.items()}
    assert train[0.52] < train[1.0]
    assert len({frozenset(qid for qid, _ in d.queries("dev")) for d in datasets.values()}) == 1
    collection = dict(datasets[1.0].collection())
    assert collection["07850329"] == ("cheese; a kind of dairy product; a kind of food, solid food")
