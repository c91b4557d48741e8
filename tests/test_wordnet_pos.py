"""gr_jax.tools.wordnet beyond nouns: data.verb (frames, verb hypernyms), data.adj (satellites), docids per pos."""
import pathlib
import shutil

import pytest

from gr_jax.data import readers
from gr_jax.data.readers import DataFormatError
from gr_jax.tools import wordnet

SYSTEM_WORDNET = pathlib.Path("/usr/share/wordnet")
HEADER = "  1 A hand-written test fixture in the wndb(5WN) format (not WordNet's text).  \n"
# lex_filenum 38 is verb.motion, 29 verb.body; 00 adj.all, 44 adj.ppl. Offset 00001740 is also a fixture noun
# (entity, noun.Tops): offsets are unique only within one data file.
DATA_VERB = HEADER + "".join(line + "  \n" for line in (
    '00001740 38 v 01 travel 0 001 ~ 00002222 v 0000 02 + 01 00 + 02 00 | change location; move; '
    '"we travelled across the country"',
    '00002222 38 v 02 walk 0 go_on_foot 0 002 @ 00001740 v 0000 + 00004444 n 0201 03 + 01 00 + 02 01 + 22 02 | '
    'use one\'s feet to advance; "she walks to work"; "walk the dog"',
    '00003333 29 v 01 breathe 0 000 01 + 02 00 | draw air into the lungs',
    '00005555 38 v 01 march 0 001 @ 00002222 v 0000 01 + 01 00 | walk with regular steps, as soldiers do',
))
DATA_ADJ = HEADER + "".join(line + "  \n" for line in (
    '00001740 00 a 01 dry 0 002 ! 00002222 a 0101 & 00003333 s 0000 | free from liquid; "dry clothes"',
    '00002222 00 a 01 wet 0 001 ! 00001740 a 0101 | covered with water',
    '00003333 00 s 02 arid 0 desiccated(a) 0 001 & 00001740 a 0000 | lacking moisture; "arid land"',
    '00004444 44 a 01 broken 0 000 | damaged',
))


@pytest.fixture
def dict_dir(tmp_path, wordnet_dir) -> pathlib.Path:
    """The noun fixture plus a hand-written data.verb and data.adj."""
    path = tmp_path / "dict"
    path.mkdir()
    shutil.copy(wordnet_dir / "data.noun", path / "data.noun")
    (path / "data.verb").write_text(DATA_VERB, encoding="utf-8")
    (path / "data.adj").write_text(DATA_ADJ, encoding="utf-8")
    return path


def test_verbs_parse_past_their_frames_with_verb_hypernyms(dict_dir):
    verbs = wordnet.read_synsets(dict_dir, pos="v")
    assert list(verbs) == ["00001740", "00002222", "00003333", "00005555"]
    assert verbs["00002222"] == wordnet.Synset(
        offset="00002222", lexname="verb.motion", lemmas=("walk", "go on foot"), hypernyms=("00001740",),
        instance_hypernyms=(), definition="use one's feet to advance", examples=("she walks to work", "walk the dog"),
        pos="v")
    assert verbs["00002222"].docid == "00002222-v"
    assert verbs["00003333"].lexname == "verb.body" and verbs["00003333"].hypernyms == ()
    assert wordnet.document_text(verbs["00005555"], verbs) == "march; a kind of walk, go on foot"


def test_adjective_satellites_are_adjectives_without_hypernyms(dict_dir):
    adjectives = wordnet.read_synsets(dict_dir, pos="a")
    arid = adjectives["00003333"]  # ss_type s; `&` (similar to) is not a hypernym; the (a) marker is dropped.
    assert arid == wordnet.Synset(offset="00003333", lexname="adj.all", lemmas=("arid", "desiccated"), hypernyms=(),
                                  instance_hypernyms=(), definition="lacking moisture", examples=("arid land",),
                                  pos="a")
    assert arid.docid == "00003333-a"
    assert adjectives["00004444"].lexname == "adj.ppl"
    assert wordnet.document_text(arid, adjectives) == "arid, desiccated; arid land"


def test_build_verb_motion(tmp_path, dict_dir):
    summary = wordnet.main(["--out_dir", str(tmp_path / "out"), "--lexfiles", "verb.motion", "--wordnet_dir",
                            str(dict_dir), "--dev_fraction", "0"])
    dataset = readers.open_dataset(tmp_path / "out")
    assert list(dataset.collection()) == [  # breathe is verb.body.
        ("00001740-v", "travel; we travelled across the country"),
        ("00002222-v", "walk, go on foot; a kind of travel; she walks to work; walk the dog"),
        ("00005555-v", "march; a kind of walk, go on foot"),
    ]
    assert dict(dataset.queries("train")) == {"00001740-v": "change location; move",
                                              "00002222-v": "use one's feet to advance",
                                              "00005555-v": "walk with regular steps, as soldiers do"}
    assert dataset.qrels("train") == {qid: {qid: 1} for qid in ("00001740-v", "00002222-v", "00005555-v")}
    assert (summary["lexfiles"], summary["documents"], summary["train_queries"]) == (["verb.motion"], 3, 3)


def test_docids_stay_unique_when_parts_of_speech_are_mixed(tmp_path, dict_dir):
    nouns_only = wordnet.build_reverse_dictionary(wordnet_dir=dict_dir, lexfiles="noun.Tops", out_dir=tmp_path / "n")
    summary = wordnet.build_reverse_dictionary(wordnet_dir=dict_dir, lexfiles=["adj.all,verb.motion", "noun.Tops"],
                                               out_dir=tmp_path / "mixed")
    collection = list(readers.open_dataset(tmp_path / "mixed").collection())
    docids = [docid for docid, _ in collection]
    # Nouns first (their docids unchanged), then verbs, then adjectives; 00001740 is in all three files.
    assert docids == ["00001740", "00020827", "00021265", "00001740-v", "00002222-v", "00005555-v",
                      "00001740-a", "00002222-a", "00003333-a"]
    assert dict(collection)["00001740"] == "entity" and dict(collection)["00001740-a"] == "dry; dry clothes"
    assert summary["documents"] == 9 and summary["train_queries"] + summary["dev_queries"] == 9
    noun_rows = (tmp_path / "n" / "collection.tsv").read_text().splitlines()
    assert (tmp_path / "mixed" / "collection.tsv").read_text().splitlines()[:3] == noun_rows
    assert nouns_only["documents"] == 3
    dataset = readers.open_dataset(tmp_path / "mixed")
    for split in ("train", "dev"):
        assert dataset.check_qrels(split) == 0
        assert all(qrels == {qid: 1} for qid, qrels in dataset.qrels(split).items())


@pytest.mark.parametrize(
    "name, line, message",
    [
        ("data.verb", "00009999 38 v 01 run 0 000 | go fast", "expected 0 pointer fields and then f_cnt"),
        ("data.verb", "00009999 38 v 01 run 0 000 02 + 01 00 | go fast",
         "f_cnt is 2: expected 6 frame fields, found 3"),
        ("data.verb", "00009999 38 v 01 run 0 000 01 + 01 02 | go fast", r"frame '\+ 01 02' names word 2 of 1"),
        ("data.verb", "00009999 38 v 01 run 0 000 01 - 01 00 | go fast", r"malformed frame '- 01 00'"),
        ("data.verb", "00009999 38 v 01 run 0 001 @ 00001740 n 0000 01 + 01 00 | go fast",
         "verb hypernym pointer to a synset of pos 'n'"),
        ("data.verb", "00009999 38 v 01 run 0 001 @ 00009998 v 0000 01 + 01 00 | go fast",
         "hypernym pointer to 00009998, which is not in data.verb"),
        ("data.verb", "00009999 38 s 01 run 0 000 01 + 01 00 | go fast", r"ss_type 's': data.verb holds verb synsets"),
        ("data.verb", "00009999 13 v 01 run 0 000 01 + 01 00 | go fast", "lex_filenum 13 is noun.food, not a"),
        ("data.adj", "00009999 00 s 01 damp 0 000 01 + 01 00 | a bit wet", "p_cnt is 0: expected 0 pointer fields, "
                                                                         "found 4"),
        ("data.adj", "00009999 38 a 01 damp 0 000 | a bit wet", "lex_filenum 38 is verb.motion, not a lexicog"),
        ("data.adj", "00009999 00 v 01 damp 0 000 | a bit wet", r"ss_type 'v': data.adj holds adjective synsets"),
    ],
)
def test_malformed_verb_and_adjective_lines_name_the_file_and_line(dict_dir, name, line, message):
    path = dict_dir / name
    text = path.read_text(encoding="utf-8")
    path.write_text(text + line + "  \n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=rf"^{path}:{text.count(chr(10)) + 1}: .*{message}"):
        wordnet.read_synsets(dict_dir, pos="v" if name == "data.verb" else "a")


def test_only_the_requested_parts_of_speech_are_read(tmp_path, wordnet_dir):
    # The noun fixture has no data.verb: nouns build, verbs say what is missing.
    wordnet.build_reverse_dictionary(wordnet_dir=wordnet_dir, lexfiles="noun.food", out_dir=tmp_path / "food")
    with pytest.raises(FileNotFoundError, match=r"has no data.verb \(found: .*'data.noun'.*wordnet-base"):
        wordnet.build_reverse_dictionary(wordnet_dir=wordnet_dir, lexfiles="verb.motion", out_dir=tmp_path / "v")


def _brute_force_lex_counts(path: pathlib.Path) -> dict[str, list[str]]:
    """Offsets by the second column (lex_filenum) of every non-header line of a wndb data file."""
    offsets: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("  "):
            offset, lex_filenum = line.split()[:2]
            offsets.setdefault(lex_filenum, []).append(offset)
    return offsets


@pytest.mark.skipif(not (SYSTEM_WORDNET / "data.verb").is_file(), reason="wordnet-base is not installed")
def test_real_wordnet_verb_motion_and_adj_all(tmp_path):
    assert (wordnet.LEXNAMES[38], wordnet.LEXNAMES[0]) == ("verb.motion", "adj.all")
    motion = _brute_force_lex_counts(SYSTEM_WORDNET / "data.verb")["38"]
    adj_all = _brute_force_lex_counts(SYSTEM_WORDNET / "data.adj")["00"]  # Heads and satellites.
    assert len(motion) == 1408 and len(adj_all) == 14435  # `grep -v '^  ' data.verb | awk '$2 == "38"' | wc -l`
    summary = wordnet.build_reverse_dictionary(wordnet_dir=SYSTEM_WORDNET, lexfiles=["verb.motion", "adj.all"],
                                               out_dir=tmp_path)
    docids = [docid for docid, _ in readers.open_dataset(tmp_path).collection()]
    assert docids == [f"{o}-v" for o in motion] + [f"{o}-a" for o in adj_all]
    assert summary["documents"] == len(motion) + len(adj_all)
    assert summary["train_queries"] + summary["dev_queries"] == summary["documents"]
    collection = dict(readers.open_dataset(tmp_path).collection())
    # walk (01904948) has the hypernym travel, go (01835514); another walk (01906841) one outside verb.motion.
    assert collection["01904948-v"].startswith("walk; a kind of travel, go; Walk, don't run!")
    assert collection["01906841-v"].startswith("walk; a kind of compel, oblige; ")  # verb.social
