"""One setting names the evaluation split in every family (the gin macro EVAL_SPLIT, read back from a run's
config.gin by eval and the tools), and a data dir without the requested split says which splits it has and what to
set: a BEIR set with train and test qrels only (no dev), as a new user meets it."""
import json
import pathlib
import shutil

import gin
import pytest

from gr_jax import gin_utils
from gr_jax.data.readers import open_dataset

from conftest import FIXTURES


@pytest.fixture(autouse=True)
def _clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def test_a_missing_split_names_the_splits_there_and_the_one_setting(tmp_path):
    data = tmp_path / "beir"
    shutil.copytree(FIXTURES / "beir", data)  # qrels/train.tsv and qrels/test.tsv
    dataset = open_dataset(data)
    expected = f"{data}/qrels/dev.tsv does not exist; this data dir has splits: test, train; set --gin.EVAL_SPLIT=test"
    for read in (dataset.qrels, dataset.queries, dataset.require_split):
        with pytest.raises(FileNotFoundError) as raised:
            list(read("dev") or ())
        assert str(raised.value) == expected
    # A tool's own flag where it picks the split; the training split has no alternative to name.
    with pytest.raises(FileNotFoundError, match=r"qrels/dev.tsv does not exist; .*; set --split=test$"):
        dataset.require_split("dev", setting="--split")
    (data / "qrels" / "train.tsv").unlink()
    with pytest.raises(FileNotFoundError, match=r"qrels/train.tsv does not exist; this data dir has splits: test$"):
        dataset.qrels("train")
    (data / "qrels" / "valid.tsv").write_text((data / "qrels" / "test.tsv").read_text())
    with pytest.raises(FileNotFoundError, match=r"splits: test, valid; set --gin.EVAL_SPLIT to one of test, valid$"):
        dataset.qrels("dev")
    for split in ("test", "valid"):
        (data / "qrels" / f"{split}.tsv").unlink()
    (data / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tdoc1\t1\n")
    with pytest.raises(FileNotFoundError, match=r"splits: train; it has none to evaluate on besides 'train': add one "
                                                r"\(e.g. qrels/dev.tsv\) or set --gin.EVAL_SPLIT=train$"):
        dataset.qrels("dev")


FAMILIES = {
    "generative": ["experiments/study_cpu.gin"],
    "ranked lists": ["experiments/study_cpu.gin", "ranking/ranked_lists.gin"],
    "n-grams": ["experiments/study_cpu.gin", "ngrams/train.gin"],
    "doc2query": ["experiments/doc2query.gin"],
    "dense MiniLM": ["dense/minilm.gin"],
    "dense T5": ["dense/t5.gin", "models/t5_1_1/tiny.gin"],
    "GDR": ["gdr/train.gin", "models/t5_1_1/tiny.gin"],
    "GDR MiniLM": ["gdr/minilm.gin", "models/t5_1_1/tiny.gin"],
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_evaluates_the_split_eval_split_names(family):
    required = ["MODEL_DIR = '/tmp/unused'", "DATA_DIR = '/tmp/data'", "TRAIN_STEPS = 5"]
    if "GDR" in family:
        required.append("GDR_INDEX = '/tmp/index'")
    for gin_files, bindings, split in ((FAMILIES[family], [], "dev"),
                                       (FAMILIES[family], ["EVAL_SPLIT = 'test'"], "test"),
                                       ([*FAMILIES[family], "runs/eval.gin"], ["EVAL_SPLIT = 'test'"], "test")):
        gin.clear_config()
        gin_utils.parse_gin(gin_files=gin_files, bindings=required + bindings)
        assert gin.query_parameter("%EXPERIMENT").scoped_configurable_fn().dataset.eval_split == split
    from gr_jax import training
    assert "split" not in gin.get_bindings(training.evaluate)  # eval ranks the run's own split, named once


def _beir_train_test(spm_data_dir: pathlib.Path, path: pathlib.Path) -> pathlib.Path:
    """The `tasks` fixture (10 documents, its SentencePiece model) in the BEIR layout, its dev judgements as the test
    split: qrels/train.tsv and qrels/test.tsv, no dev."""
    dataset = open_dataset(spm_data_dir)
    (path / "qrels").mkdir(parents=True)
    shutil.copy(spm_data_dir / "spm.model", path / "spm.model")
    with open(path / "corpus.jsonl", "w") as f:
        for docid, text in dataset.collection():
            f.write(json.dumps({"_id": docid, "title": "", "text": text}) + "\n")
    with open(path / "queries.jsonl", "w") as f:
        for split in ("train", "dev"):
            for qid, text in dataset.queries(split):
                f.write(json.dumps({"_id": qid, "text": text}) + "\n")
    for split, name in (("train", "train"), ("dev", "test")):
        lines = [f"{qid}\t{docid}\t{rel}" for qid, judged in dataset.qrels(split).items()
                 for docid, rel in judged.items()]
        (path / "qrels" / f"{name}.tsv").write_text("\n".join(["query-id\tcorpus-id\tscore", *lines]) + "\n")
    return path


def test_a_beir_set_without_dev_trains_evaluates_and_indexes_with_the_one_setting(spm_data_dir, tmp_path, capsys):
    """The README's dense commands on a train + test BEIR set: each stops with one line naming the splits and
    EVAL_SPLIT; with --gin.EVAL_SPLIT=test at training, eval and dense_index take the split from the run's config."""
    from gr_jax import eval as eval_main
    from gr_jax import train as train_main
    from gr_jax.tools import dense_index
    data = _beir_train_test(spm_data_dir, tmp_path / "beir")
    test_queries = len(open_dataset(data).qrels("test"))
    model_dir = tmp_path / "dr"
    train = ["--gin_file=dense/t5.gin", "--gin_file=models/t5_1_1/tiny.gin", f"--gin.DATA_DIR={data}",
             f"--gin.MODEL_DIR={model_dir}", "--gin.TRAIN_STEPS=0", "--gin.QUERY_LENGTH=8",
             "--gin.DOCUMENT_LENGTH=32", "--gin.PROJECTION_DIM=8", "--gin.network.T5Config.num_encoder_layers=1"]
    with pytest.raises(SystemExit) as stopped:
        train_main.main(train)
    assert str(stopped.value) == (f"error: {data}/qrels/dev.tsv does not exist; this data dir has splits: test, "
                                  f"train; set --gin.EVAL_SPLIT=test")

    gin.clear_config()
    train_main.main([*train, "--gin.EVAL_SPLIT=test"])
    final = json.loads((model_dir / "final_metrics.json").read_text())
    assert final["eval/num_queries"] == test_queries and (model_dir / "run.test.0.trec").is_file()

    gin.clear_config()
    capsys.readouterr()
    eval_main.main([f"--gin_file={model_dir / 'config.gin'}"])
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["num_queries"] == test_queries and metrics["MRR@10"] == pytest.approx(final["eval/MRR@10"])
    assert (model_dir / "eval.test.0.json").is_file()

    gin.clear_config()
    report = dense_index.main(["--model_dir", str(model_dir), "--factory", "IVF2,Flat", "--nprobe", "1"])
    assert report["recall_queries"] == test_queries  # the run's split, from its config.gin
    gin.clear_config()
    report = dense_index.main(["--model_dir", str(model_dir), "--factory", "IVF3,Flat", "--nprobe", "1",
                               "--gin.EVAL_SPLIT=train"])
    assert report["recall_queries"] == len(open_dataset(data).qrels("train"))
