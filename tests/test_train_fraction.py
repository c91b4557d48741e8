"""Training-query fractions: nested seeded subsets with their judgements; everything else linked."""
import json

import pytest

from gr_jax.data.readers import open_dataset
from gr_jax.tools import train_fraction

from conftest import FIXTURES


def test_fractions_are_nested_subsets_with_their_judgements_and_the_rest_linked(tmp_path):
    source = FIXTURES / "tasks"
    out = [tmp_path / "f40", tmp_path / "f80", tmp_path / "f100"]
    summary = train_fraction.main(["--data_dir", str(source), "--fractions", "0.4,0.8,1.0", "--seed", "3",
                                   *(f"--out_dir={o}" for o in out)])
    original = open_dataset(source)
    all_queries = dict(original.queries("train"))
    qrels = original.qrels("train")
    kept = []
    for directory, fraction in zip(out, (0.4, 0.8, 1.0)):
        data = open_dataset(directory)
        queries = dict(data.queries("train"))
        assert len(queries) == round(fraction * len(all_queries))
        assert all(all_queries[qid] == text for qid, text in queries.items())
        assert data.qrels("train") == {qid: qrels[qid] for qid in queries if qid in qrels}
        assert list(data.queries("dev")) == list(original.queries("dev")) and data.qrels("dev") == original.qrels("dev")
        assert list(data.collection()) == list(original.collection())
        assert (directory / "collection.tsv").is_symlink()
        kept.append(set(queries))
    assert kept[0] <= kept[1] <= kept[2] == set(all_queries)
    assert [f["train_queries"] for f in summary["fractions"]] == [len(k) for k in kept]
    assert json.loads((out[0] / "train_fraction.json").read_text())["seed"] == 3
    # Another seed draws another subset; bad fractions are refused.
    other = train_fraction.main(["--data_dir", str(source), "--fractions", "0.4", "--seed", "4",
                                 f"--out_dir={tmp_path / 'g40'}"])
    assert other["fractions"][0]["train_queries"] == len(kept[0])
    assert set(dict(open_dataset(tmp_path / "g40").queries("train"))) != kept[0]
    with pytest.raises(SystemExit):
        train_fraction.main(["--data_dir", str(source), "--fractions", "1.5", f"--out_dir={tmp_path / 'bad'}"])
