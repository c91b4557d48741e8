"""Tests of gr_jax.tools.wordnet_groups: a WordNet dataset's documents labelled by lexicographer file or by the
hypernym at a depth, checked by hand against the fixture's hypernym pointers."""
import pytest

from gr_jax.data.readers import DataFormatError
from gr_jax.tools import wordnet, wordnet_groups


def labels(path):
    return dict(line.split("\t") for line in path.read_text().splitlines())


def test_documents_are_labelled_by_lexicographer_file_or_by_the_hypernym_at_a_depth(tmp_path, wordnet_dir):
    wordnet.build_reverse_dictionary(wordnet_dir=wordnet_dir, lexfiles="all", out_dir=tmp_path / "all")
    report = wordnet_groups.build(data_dir=str(tmp_path / "all"), out=str(tmp_path / "lex.tsv"),
                                  wordnet_dir=str(wordnet_dir))
    by_file = labels(tmp_path / "lex.tsv")
    assert report["documents"] == len(by_file) == 14 and report["labels"] == 6
    assert by_file["07850329"] == "noun.food" and by_file["08672738"] == "noun.location"
    assert by_file["15046900"] == "noun.substance" and by_file["00001740"] == "noun.Tops"
    wordnet.build_reverse_dictionary(wordnet_dir=wordnet_dir, lexfiles="noun.food", out_dir=tmp_path / "food")
    wordnet_groups.build(data_dir=str(tmp_path / "food"), out=str(tmp_path / "d2.tsv"), depth=2,
                         wordnet_dir=str(wordnet_dir))
    # entity > matter > {solid (food, bomber and midnight snack through food), food/nutrient (dairy product,
    # cheese and cheddar: cheese's first hypernym is dairy product)}.
    assert labels(tmp_path / "d2.tsv") == {
        "07555863": "15046900:solid", "07697825": "15046900:solid", "07899999": "15046900:solid",
        "07843775": "00021265:food", "07850329": "00021265:food", "07852919": "00021265:food"}
    wordnet_groups.build(data_dir=str(tmp_path / "food"), out=str(tmp_path / "d9.tsv"), depth=9,
                         wordnet_dir=str(wordnet_dir))
    assert labels(tmp_path / "d9.tsv")["07852919"] == "07852919:cheddar"  # a path shorter than 9: itself


def test_a_docid_that_is_no_synset_is_refused_naming_the_line(tmp_path, wordnet_dir):
    (tmp_path / "collection.tsv").write_text("07850329\tcheese\n99999999\tnothing\n")
    with pytest.raises(DataFormatError, match=r"collection\.tsv:2: docid '99999999': no such synset"):
        wordnet_groups.build(data_dir=str(tmp_path), out=str(tmp_path / "g.tsv"), wordnet_dir=str(wordnet_dir))
    assert not (tmp_path / "g.tsv").exists()
