"""valid_split: the chosen training queries move, with their judgements, to `valid`; nothing else changes."""
import json
import shutil

import pytest

from gr_jax.data.readers import open_dataset
from gr_jax.tools import valid_split

from conftest import FIXTURES


def test_chosen_training_queries_move_to_valid_with_their_judgements(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(FIXTURES / "tasks", data)
    original = open_dataset(data)
    summary = valid_split.main(["--data_dir", str(data), "--out_dir", str(tmp_path / "out"), "--queries", "3"])
    out = open_dataset(tmp_path / "out")
    train, valid = dict(out.queries("train")), dict(out.queries("valid"))
    assert len(valid) == 3 and not set(train) & set(valid)
    assert {**train, **valid} == dict(original.queries("train"))  # texts unchanged, none lost
    judged = original.qrels("train")
    assert out.qrels("valid") == {qid: judged[qid] for qid in valid}  # non-relevant judgements move too
    assert out.qrels("train") == {qid: docs for qid, docs in judged.items() if qid not in valid}
    assert set(valid) <= set(judged)  # the fixture's unjudged training query is never a valid query
    assert list(out.collection()) == list(original.collection())
    assert out.qrels("dev") == original.qrels("dev") and (tmp_path / "out" / "collection.tsv").is_symlink()
    assert summary["train_queries"] == len(train) and json.loads(
        (tmp_path / "out" / "valid_split.json").read_text()) == summary
    valid_split.valid_split(data_dir=str(data), out_dir=str(tmp_path / "again"), queries=3)
    assert dict(open_dataset(tmp_path / "again").queries("valid")) == valid  # seeded
    with pytest.raises(ValueError, match="already has a 'valid' split"):
        valid_split.valid_split(data_dir=str(tmp_path / "out"), out_dir=str(tmp_path / "twice"), queries=1)
    with pytest.raises(ValueError, match="is not empty"):
        valid_split.valid_split(data_dir=str(data), out_dir=str(tmp_path / "out"), queries=3)
    with pytest.raises(ValueError, match=r"--queries must be in \[1, "):
        valid_split.valid_split(data_dir=str(data), out_dir=str(tmp_path / "all"), queries=len(judged))
