"""tools/distill: pseudo-queries labeled with a teacher's top documents, added to a data dir's training queries."""
import json

import pytest

from gr_jax import search
from gr_jax.data.readers import open_dataset
from gr_jax.retrievers import Ranking
from gr_jax.tools import distill as tool

DOCUMENTS = {"d1": "apple fruit", "d2": "pear fruit", "d3": "beef meat", "d4": "salmon fish"}


class WordOverlap:
    """A stand-in teacher: documents by the number of words they share with the query, then by docid."""

    def rank(self, queries, *, k):
        ids, scores = [], []
        for query in queries:
            words = set(query.split())
            ranked = sorted(((-len(words & set(text.split())), docid) for docid, text in DOCUMENTS.items()
                             if words & set(text.split())))[:k]
            ids.append([docid for _, docid in ranked])
            scores.append([float(-overlap) for overlap, _ in ranked])
        return Ranking(ids=ids, scores=scores)


@pytest.fixture
def data(tmp_path, monkeypatch):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "collection.tsv").write_text("".join(f"{d}\t{t}\n" for d, t in DOCUMENTS.items()))
    (data_dir / "queries.train.tsv").write_text("1\ta red apple\n")
    (data_dir / "qrels.train.tsv").write_text("1\t0\td1\t1\n")
    (data_dir / "queries.dev.tsv").write_text("2\tsmoked salmon\n")
    (data_dir / "qrels.dev.tsv").write_text("2\t0\td4\t1\n")
    (data_dir / "spm.model").write_bytes(b"a vocabulary")
    pseudo = tmp_path / "pseudo.tsv"
    pseudo.write_text("p1\tpear tree fruit\np2\tgrilled beef\np3\tSmoked salmon\np4\tnothing in common\n")
    asked = {}

    def restore(model_dir, *, settings, step=None, **kwargs):
        asked.update(model_dir=model_dir, depth=settings.depth, step=step)
        return None, WordOverlap()

    monkeypatch.setattr(search, "restore_retriever", restore)
    return data_dir, pseudo, asked


def test_pseudo_queries_are_judged_to_the_teachers_top_documents(data, tmp_path, capsys):
    data_dir, pseudo, asked = data
    out = tmp_path / "distilled"
    report = tool.main(["--data_dir", str(data_dir), "--teacher_dir", "runs/teacher", "--pseudo_queries",
                        str(pseudo), "--labels", "2", "--teacher_step", "7", "--out_dir", str(out)])
    assert json.loads(capsys.readouterr().out) == report == json.loads((out / "distill.json").read_text())
    assert asked == {"model_dir": "runs/teacher", "depth": 2, "step": 7}
    distilled = open_dataset(out)
    # p3 is a dev query (case aside): left out; p4 shares no word with any document: the teacher ranks nothing.
    assert list(distilled.queries("train", setting=None)) == [
        ("1", "a red apple"), ("pseudo-p1", "pear tree fruit"), ("pseudo-p2", "grilled beef")]
    assert distilled.qrels("train", setting=None) == {
        "1": {"d1": 1}, "pseudo-p1": {"d2": 2, "d1": 1}, "pseudo-p2": {"d3": 2}}
    assert report["left_out_as_eval_queries"] == 1 and report["pseudo_queries_unranked"] == 1
    assert report["documents_labeled"] == 3 and report["documents_labeled_without_a_train_query"] == 2
    for name in ("collection.tsv", "queries.dev.tsv", "qrels.dev.tsv", "spm.model"):
        assert (out / name).is_symlink() and (out / name).resolve() == (data_dir / name).resolve()
    assert dict(distilled.queries("dev")) == {"2": "smoked salmon"}


def test_doc2query_outputs_are_pseudo_queries_named_by_their_document(data, tmp_path):
    data_dir, pseudo, _ = data
    d2q = tmp_path / "d2q.tsv"   # docTTTTTquery's layout: one line per document in collection order
    d2q.write_text("green pear\tsmoked salmon\n\nsalmon fish\n\n")
    out = tmp_path / "distilled"
    report = tool.distill(data_dir=str(data_dir), teacher_dir="t", pseudo_queries=[], d2q_files=[str(d2q)],
                          out_dir=str(out))
    # d1's second query is a dev query (left out); d2 and d4 have none; d3's ranks d4 (the one shared word wins).
    assert list(open_dataset(out).queries("train", setting=None)) == [
        ("1", "a red apple"), ("pseudo-d1.q0", "green pear"), ("pseudo-d3.q0", "salmon fish")]
    assert open_dataset(out).qrels("train", setting=None) == {"1": {"d1": 1}, "pseudo-d1.q0": {"d2": 1},
                                                               "pseudo-d3.q0": {"d4": 1}}
    assert report["d2q_files"] == [str(d2q)] and report["left_out_as_eval_queries"] == 1
    with pytest.raises(ValueError, match="no pseudo-queries to label"):
        tool.distill(data_dir=str(data_dir), teacher_dir="t", pseudo_queries=[], out_dir=str(tmp_path / "none"))


def test_bad_inputs_are_refused(data, tmp_path):
    data_dir, pseudo, _ = data
    with pytest.raises(ValueError, match="must differ from --data_dir"):
        tool.distill(data_dir=str(data_dir), teacher_dir="t", pseudo_queries=[str(pseudo)], out_dir=str(data_dir))
    with pytest.raises(ValueError, match="query id 'p1' occurs twice among the pseudo-queries"):
        tool.distill(data_dir=str(data_dir), teacher_dir="t", pseudo_queries=[str(pseudo), str(pseudo)],
                     out_dir=str(tmp_path / "o"))
    other = tmp_path / "other"
    other.mkdir()
    for name in ("queries.train.tsv", "qrels.train.tsv", "queries.dev.tsv", "qrels.dev.tsv"):
        (other / name).write_text((data_dir / name).read_text())
    (other / "collection.tsv").write_text("d1\tapple fruit\n")
    with pytest.raises(ValueError, match="ranks 'd2', not a document of .*other: it retrieves from another"):
        tool.distill(data_dir=str(other), teacher_dir="t", pseudo_queries=[str(pseudo)], out_dir=str(tmp_path / "p"))
