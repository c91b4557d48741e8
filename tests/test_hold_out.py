"""hold_out: the held-out documents leave the collection and the training judgements, and the split's queries are
divided by whether their relevant documents were held out."""
import json
import shutil

from gr_jax.data.readers import open_dataset, read_collection
from gr_jax.tools import hold_out

from conftest import FIXTURES


def test_held_out_documents_leave_the_collection_and_training_and_split_the_dev_queries(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(FIXTURES / "tasks", data)
    summary = hold_out.main(["--data_dir", str(data), "--out_dir", str(tmp_path / "out"), "--fraction", "0.3"])
    out = open_dataset(tmp_path / "out")
    kept = [docid for docid, _ in out.collection()]
    new = dict(read_collection(tmp_path / "out" / hold_out.NEW_DOCUMENTS))
    original = dict(open_dataset(data).collection())
    assert len(new) == 3 and len(kept) == 7 and set(kept) | set(new) == set(original) and not set(kept) & set(new)
    assert all(new[docid] == original[docid] for docid in new)
    train = out.qrels("train")
    assert not any(docid in new for judged in train.values() for docid in judged)
    assert summary["train_judgements_dropped"] == sum(
        docid in new for judged in open_dataset(data).qrels("train").values() for docid in judged)
    assert out.qrels("dev") == open_dataset(data).qrels("dev")  # other splits unchanged
    # By hand from the fixture's dev judgements: each query's relevant documents, all new / all kept / both.
    relevant = {qid: {d for d, rel in judged.items() if rel > 0} for qid, judged in out.qrels("dev").items()}
    expect_new = {q for q, docs in relevant.items() if docs <= set(new)}
    expect_seen = {q for q, docs in relevant.items() if not docs & set(new)}
    assert expect_new and expect_seen  # this seed holds out a dev-relevant document (4420) and keeps others
    assert set(out.qrels("dev_new")) == expect_new and set(out.qrels("dev_seen")) == expect_seen
    assert {q for q, _ in out.queries("dev_new")} == expect_new
    assert summary["dev_mixed_queries"] == len(relevant) - len(expect_new) - len(expect_seen)
    assert json.loads((tmp_path / "out" / "hold_out.json").read_text()) == summary
    again = hold_out.hold_out(data_dir=str(data), out_dir=str(tmp_path / "again"), fraction=0.3)
    assert again["held_out"] == 3 and (tmp_path / "again" / "new_documents.tsv").read_text() == (
        tmp_path / "out" / "new_documents.tsv").read_text()  # seeded
