"""WordNet hypernym ranking: synset names from index.noun, hypernym paths, graded qrels, negatives, in-context."""
import json

import pytest

from gr_jax.data.readers import DataFormatError, open_dataset
from gr_jax.tools import wordnet, wordnet_hypernyms



def test_synset_names_follow_the_sense_order_of_index_noun(wordnet_dir):
    synsets = wordnet.read_noun_synsets(wordnet_dir)
    names = wordnet_hypernyms.read_sense_names(wordnet_dir, synsets)
    # NLTK's names of these WordNet 3.0 synsets.
    assert (names["07852919"], names["08878885"], names["07555863"], names["00020827"], names["08672738"]) == (
        "cheddar.n.02", "cheddar.n.01", "food.n.02", "matter.n.03", "village.n.02")
    # cheese.n.01 has two hypernyms: the path follows the first; Cheddar the village has an instance hypernym only.
    assert [names[o] for o in wordnet_hypernyms.hypernym_path("07852919", synsets)] == [
        "cheese.n.01", "dairy_product.n.01", "food.n.01", "matter.n.03", "entity.n.01"]
    assert [names[o] for o in wordnet_hypernyms.hypernym_path("08878885", synsets)] == ["village.n.02",
                                                                                         "entity.n.01"]


def test_the_dataset_of_a_subtree(wordnet_dir, tmp_path):
    summary = wordnet_hypernyms.main(["--wordnet_dir", str(wordnet_dir), "--out_dir", str(tmp_path / "d"),
                                      "--root", "food.n.02", "--dev_fraction", "0.5", "--seed", "1"])
    data = open_dataset(tmp_path / "d")
    # food.n.02's subtree (cheese through its second hypernym) and everything on the paths above it.
    assert {docid for docid, _ in data.collection()} == {
        "food.n.02", "bomber.n.03", "midnight_snack.n.01", "cheese.n.01", "cheddar.n.02", "solid.n.01",
        "matter.n.03", "entity.n.01", "dairy_product.n.01", "food.n.01"}
    queries = {**dict(data.queries("train")), **dict(data.queries("dev"))}
    assert sorted(queries.values()) == ["bomber.n.03", "cheddar.n.02", "cheese.n.01", "food.n.02",
                                        "midnight_snack.n.01"]
    assert set(dict(data.queries("train"))).isdisjoint(dict(data.queries("dev")))
    assert summary["train_queries"] + summary["dev_queries"] == 5
    qrels = {**data.qrels("train"), **data.qrels("dev")}
    assert qrels["07852919"] == {"cheese.n.01": 5, "dairy_product.n.01": 4, "food.n.01": 3, "matter.n.03": 2,
                                 "entity.n.01": 1}
    negatives = {}
    for split in ("train", "dev"):
        for line in (tmp_path / "d" / f"negatives.{split}.tsv").read_text().splitlines():
            qid, negative = line.split("\t")
            negatives[qid] = negative
    assert set(negatives) == set(queries)
    assert all(negative not in qrels[qid] and negative != queries[qid] for qid, negative in negatives.items())
    assert json.loads((tmp_path / "d" / "summary.json").read_text())["path_length"]["max"] == 5

    # In context: the name, then its path's docids shuffled.
    wordnet_hypernyms.main(["--wordnet_dir", str(wordnet_dir), "--out_dir", str(tmp_path / "c"), "--root",
                            "food.n.02", "--dev_fraction", "0.5", "--seed", "1", "--in_context"])
    context = open_dataset(tmp_path / "c")
    texts = {**dict(context.queries("train")), **dict(context.queries("dev"))}
    name, *candidates = texts["07852919"].split()
    assert name == "cheddar.n.02" and sorted(candidates) == sorted(qrels["07852919"])


def test_bad_roots_and_missing_index_are_refused(wordnet_dir, tmp_path):
    with pytest.raises(ValueError, match="no noun synset name"):
        wordnet_hypernyms.build(wordnet_dir=str(wordnet_dir), out_dir=str(tmp_path / "x"), root="nope.n.01")
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "data.noun").write_text((wordnet_dir / "data.noun").read_text())
    with pytest.raises(FileNotFoundError, match="index.noun"):
        wordnet_hypernyms.build(wordnet_dir=str(tmp_path / "w"), out_dir=str(tmp_path / "x"), root="entity.n.01")
    (tmp_path / "w" / "index.noun").write_text("cheese n 2 1 @ 1 1 07850329\n")
    with pytest.raises(DataFormatError, match="synset_cnt is 2 but 1 offsets"):
        wordnet_hypernyms.build(wordnet_dir=str(tmp_path / "w"), out_dir=str(tmp_path / "x"), root="entity.n.01")
