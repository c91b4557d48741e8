"""The study runner: cells as isolated commands, resumability, failure isolation, results.json and the table."""
import json
import pathlib
import shutil
import sys

import pytest

from gr_jax.vocabulary import train_sentencepiece
from gr_jax.tools import run_study

from conftest import FIXTURES

FIXTURE_DATA = FIXTURES / "tasks"
# Metrics the fake trainer reports per (row, scheme): MRR@10, Recall@1, Recall@10.
FAKE_METRICS = {("labeled_only", "naive"): (0.5, 0.25, 0.75), ("firstp_labeled", "naive"): (0.625, 0.5, 1.0),
                ("daq_labeled", "naive"): (0.125, 0.0, 0.5), ("labeled_only", "atomic"): (0.25, 0.25, 0.25),
                ("firstp_labeled", "atomic"): (0.375, 0.25, 0.5), ("daq_labeled", "atomic"): (0.0, 0.0, 0.0)}
BM25 = {"MRR@10": 0.4, "Recall@1": 0.3, "Recall@10": 0.9, "num_queries": 4}
BM25_D2Q = {"MRR@10": 0.45, "Recall@1": 0.35, "Recall@10": 0.95, "num_queries": 4}
DENSE = {"minilm_zero_shot": {"MRR@10": 0.55, "Recall@1": 0.5, "Recall@10": 1.0, "num_queries": 4},
         "minilm_finetuned": {"MRR@10": 0.6, "Recall@1": 0.5, "Recall@10": 1.0, "num_queries": 4},
         "t5_dual_encoder": {"MRR@10": 0.2, "Recall@1": 0.0, "Recall@10": 0.5, "num_queries": 4}}
GDR = {"gdr_minilm": {"MRR@10": 0.7, "Recall@1": 0.5, "Recall@10": 1.0, "num_queries": 4},
       "gdr_t5": {"MRR@10": 0.3, "Recall@1": 0.25, "Recall@10": 0.75, "num_queries": 4}}


def _bindings(argv):
    """The cell's `--gin_bindings=KEY = VALUE` arguments as a dict of Python values."""
    out = {}
    for arg in argv:
        if arg.startswith("--gin_bindings="):
            key, value = arg[len("--gin_bindings="):].split(" = ", 1)
            out[key] = eval(value)  # noqa: S307 - our own repr()s
    return out


class FakeRunner:
    """Stands in for the subprocesses: writes what `gr_jax.train` / `gr_jax.tools.bm25` would, or fails like them."""

    def __init__(self, *, failing=()):
        self.failing = set(failing)
        self.calls = []

    def __call__(self, argv, log_path, timeout):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        module = argv[argv.index("-m") + 1]
        if module == "gr_jax.tools.bm25":
            self.calls.append(("bm25_d2q" if "--d2q_file" in argv else "bm25",))
            metrics = BM25_D2Q if "--d2q_file" in argv else BM25
            log_path.write_text("some warning on stderr\n" + json.dumps({"system": "bm25", "split": "dev",
                                                                          **metrics}) + "\n")
            return 0
        if module in ("gr_jax.tools.dense_index", "gr_jax.tools.gdr_index"):  # a GDR system's preparation
            self.calls.append((module.rsplit(".", 1)[1],))
            if module in self.failing:
                log_path.write_text("Traceback (most recent call last):\nValueError: no vectors here\n")
                return 1
            return 0
        assert module == "gr_jax.train"
        bindings = _bindings(argv)
        if any(arg.startswith("--gin_file=gdr/") for arg in argv):  # a GDR system
            name = pathlib.Path(bindings["MODEL_DIR"]).name
            self.calls.append((name, bindings["TRAIN_STEPS"]))
            pathlib.Path(bindings["MODEL_DIR"]).mkdir(parents=True, exist_ok=True)
            (pathlib.Path(bindings["MODEL_DIR"]) / "final_metrics.json").write_text(json.dumps(
                {"train/loss": 0.5, **{f"eval/{k}": v for k, v in GDR[name].items()}}))
            return 0
        if any(arg.startswith("--gin_file=dense/") for arg in argv):  # a dual-encoder baseline
            name = pathlib.Path(bindings["MODEL_DIR"]).name
            self.calls.append((name, bindings["TRAIN_STEPS"]))
            if name in self.failing:
                log_path.write_text("Traceback (most recent call last):\nValueError: no MiniLM here\n")
                return 1
            pathlib.Path(bindings["MODEL_DIR"]).mkdir(parents=True, exist_ok=True)
            (pathlib.Path(bindings["MODEL_DIR"]) / "final_metrics.json").write_text(json.dumps(
                {"train/loss": 0.5, **{f"eval/{k}": v for k, v in DENSE[name].items()}}))
            return 0
        cell = (bindings["MIXTURE_ROW"], bindings["DOCID_SCHEME"])
        self.calls.append((*cell, bindings["TRAIN_STEPS"]))
        if cell in self.failing:
            log_path.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                                "FloatingPointError: non-finite training metrics at step 3\n"
                                "  In call to configurable 'train' (<function train>)\n")
            return 1
        model_dir = pathlib.Path(bindings["MODEL_DIR"])
        (model_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        (model_dir / "checkpoints" / str(bindings["TRAIN_STEPS"])).mkdir(exist_ok=True)
        mrr, r1, r10 = FAKE_METRICS[cell]
        (model_dir / "final_metrics.json").write_text(json.dumps({
            "train/loss": 1.5, "eval/MRR@10": mrr, "eval/Recall@1": r1, "eval/Recall@10": r10,
            "eval/num_queries": 4}))
        return 0


def _fake_preflight(*, data_dir, scheme):
    del data_dir
    if scheme == "semantic":
        raise FileNotFoundError("no prebuilt docids.semantic.tsv: run python -m gr_jax.tools.semantic_ids")
    return {"labeled_only", "firstp_labeled", "daq_labeled"}  # as without a d2q.tsv: no D2Q rows


@pytest.fixture
def data_dir(tmp_path) -> pathlib.Path:
    path = tmp_path / "fixture_corpus"
    shutil.copytree(FIXTURE_DATA, path)
    (path / "d2q.tsv").write_text("".join("synthetic query\n" for _ in (path / "collection.tsv").open()))
    return path


def _study_args(data_dir, out_dir, *, rows="1a,2a,2b,6b", schemes="naive", steps=3):
    return ["--data_dir", str(data_dir), "--rows", rows, "--schemes", schemes, "--size", "tiny",
            "--steps", str(steps), "--out_dir", str(out_dir), "--gin.BATCH_SIZE=8"]


def test_cells_baselines_results_and_table(data_dir, tmp_path):
    out_dir = tmp_path / "study"
    runner = FakeRunner(failing={("daq_labeled", "naive")})
    results = run_study.main(_study_args(data_dir, out_dir, schemes="naive,semantic"), runner=runner,
                             preflight=_fake_preflight)

    # 6b is not registered and no semantic cell can register: none of them is run; 2b fails in its own process.
    assert sorted(runner.calls) == sorted([("bm25",), ("bm25_d2q",), ("labeled_only", "naive", 3),
                                           ("firstp_labeled", "naive", 3), ("daq_labeled", "naive", 3)])
    cells = {(c["row"], c["scheme"]): c for c in results["cells"]}
    assert len(cells) == 8
    assert cells["1a", "naive"]["status"] == "ok"
    assert cells["1a", "naive"]["metrics"] == {"MRR@10": 0.5, "Recall@1": 0.25, "Recall@10": 0.75,
                                               "num_queries": 4}
    assert cells["2b", "naive"]["status"] == "failed"
    assert cells["2b", "naive"]["reason"].startswith("FloatingPointError: non-finite training metrics at step 3")
    assert "'d2q_only' is not registered" in cells["6b", "naive"]["reason"]
    assert all("no prebuilt docids.semantic.tsv" in cells[row, "semantic"]["reason"] for row in ("1a", "2a"))
    assert json.loads((out_dir / "results.json").read_text()) == results
    dataset = results["datasets"]["fixture_corpus"]
    assert (dataset["documents"], dataset["queries"]) == (10, 4)  # collection lines; dev qrels queries
    assert dataset["baselines"]["bm25"]["metrics"] == BM25
    assert dataset["baselines"]["bm25_d2q"]["metrics"] == BM25_D2Q

    # Each cell is one gr_jax.train process with the study gin, the size gin and the cell's bindings.
    command = run_study.Study(datasets=[run_study.Dataset("fixture_corpus", data_dir)],
                              rows=[], schemes=["naive"], size="small", steps=5, out_dir=out_dir).train_command(
        run_study.Cell(run_study.Dataset("fixture_corpus", data_dir),
                       run_study.parse_row("2a+unconstrained+pawa+consistency"), "naive"))
    assert command[:3] == [sys.executable, "-m", "gr_jax.train"]
    assert [a for a in command if a.startswith("--gin_file")] == [
        "--gin_file=experiments/study_cpu.gin", "--gin_file=models/t5_1_1/small.gin",
        "--gin_file=decoders/pawa.gin", "--gin_file=losses/consistency.gin"]
    bindings = _bindings(command)
    assert (bindings["MIXTURE_ROW"], bindings["DOCID_SCHEME"], bindings["TRAIN_STEPS"]) == (
        "firstp_labeled", "naive", 5)
    assert bindings["training.EvalConfig.constrained"] is False
    # The consistency variant is NCI's loss at its weight 0.15 (the loss gin, configured in one place).
    assert "CONSISTENCY_WEIGHT = 0.15" in (run_study.REPO_ROOT / "gin_configs/losses/consistency.gin").read_text()
    # The atomic scheme brings its output head.
    atomic = run_study.Study(datasets=[run_study.Dataset("fixture_corpus", data_dir)], rows=[], schemes=["atomic"],
                             size="tiny", steps=5, out_dir=out_dir).train_command(
        run_study.Cell(run_study.Dataset("fixture_corpus", data_dir), run_study.parse_row("2a"), "atomic"))
    assert [a for a in atomic if a.startswith("--gin_file")][2:] == ["--gin_file=decoders/atomic.gin"]
    assert _bindings(atomic)["DOCID_SCHEME"] == "atomic"

    table = (out_dir / "results.md").read_text().splitlines()
    header = table.index("| Method | naive MRR@10 | naive R@1 | naive R@10 | semantic MRR@10 | semantic R@1 | "
                         "semantic R@10 |")
    assert table[header + 2:header + 8] == [
        "| BM25 | 0.400 | 0.300 | 0.900 | 0.400 | 0.300 | 0.900 |",
        "| BM25 w/ doc2query-T5 | 0.450 | 0.350 | 0.950 | 0.450 | 0.350 | 0.950 |",
        "| (1a) Labeled Queries (No Indexing) | 0.500 | 0.250 | 0.750 | failed | failed | failed |",
        "| (2a) FirstP + Labeled Queries (DSI) | 0.625 | 0.500 | 1.000 | failed | failed | failed |",
        "| (2b) DaQ + Labeled Queries | failed | failed | failed | failed | failed | failed |",
        "| (6b) D2Q only (No Labeled Queries) | failed | failed | failed | failed | failed | failed |",
    ]
    assert any(line.startswith("- (2b) DaQ + Labeled Queries, naive: FloatingPointError") for line in table)


def test_rerun_skips_finished_cells_and_retries_failed_ones(data_dir, tmp_path):
    out_dir = tmp_path / "study"
    first = FakeRunner(failing={("daq_labeled", "naive")})
    run_study.main(_study_args(data_dir, out_dir, rows="1a,2b"), runner=first, preflight=_fake_preflight)

    second = FakeRunner()
    results = run_study.main(_study_args(data_dir, out_dir, rows="1a,2b"), runner=second, preflight=_fake_preflight)
    assert second.calls == [("daq_labeled", "naive", 3)]  # baselines and 1a are done
    cells = {c["row"]: c for c in results["cells"]}
    assert cells["1a"]["cached"] and cells["1a"]["metrics"]["MRR@10"] == 0.5
    assert cells["2b"]["status"] == "ok" and cells["2b"]["metrics"]["MRR@10"] == 0.125

    # More steps: every cell trains on (from its checkpoint, in the real trainer).
    third = FakeRunner()
    run_study.main(_study_args(data_dir, out_dir, rows="1a,2b", steps=6), runner=third, preflight=_fake_preflight)
    assert sorted(third.calls) == [("daq_labeled", "naive", 6), ("labeled_only", "naive", 6)]

    # Another model size in the same out_dir would restore checkpoints of the wrong shapes: refused per cell.
    fourth = FakeRunner()
    args = _study_args(data_dir, out_dir, rows="1a", steps=6)
    args[args.index("tiny")] = "small"
    results = run_study.main(args, runner=fourth, preflight=_fake_preflight)
    assert fourth.calls == [] and "holds a run with other settings" in results["cells"][0]["reason"]

    # All done: nothing runs, and the data dir is not even registered again.
    asked = []
    results = run_study.main(_study_args(data_dir, out_dir, rows="1a,2b", steps=6), runner=fourth,
                             preflight=lambda **kwargs: asked.append(kwargs) or _fake_preflight(**kwargs))
    assert fourth.calls == [] and asked == [] and all(c["cached"] for c in results["cells"])


def test_new_d2q_file_reruns_the_d2q_baseline(data_dir, tmp_path):
    out_dir = tmp_path / "study"
    (data_dir / "d2q.tsv").unlink()
    results = run_study.main(_study_args(data_dir, out_dir, rows="1a"), runner=FakeRunner(), preflight=_fake_preflight)
    assert results["datasets"]["fixture_corpus"]["baselines"]["bm25_d2q"]["status"] == "skipped"
    (data_dir / "d2q.tsv").write_text("".join("q\n" for _ in range(10)))
    runner = FakeRunner()
    results = run_study.main(_study_args(data_dir, out_dir, rows="1a"), runner=runner, preflight=_fake_preflight)
    assert runner.calls == [("bm25_d2q",)]
    assert results["datasets"]["fixture_corpus"]["baselines"]["bm25_d2q"]["metrics"] == BM25_D2Q


def test_bad_rows_are_rejected_before_anything_runs(data_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown study row '9z'"):
        run_study.main(_study_args(data_dir, tmp_path, rows="1a,9z"), runner=FakeRunner(), preflight=_fake_preflight)
    with pytest.raises(ValueError, match="unknown variant"):
        run_study.main(_study_args(data_dir, tmp_path, rows="2a+magic"), runner=FakeRunner(),
                       preflight=_fake_preflight)


def test_failure_reason_reads_the_exception_line(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("I0000 info\nTraceback (most recent call last):\n  File \"a.py\"\n"
                   "ValueError: Mixture 'x.d2q_only.naive' not registered\n  In call to configurable 'train'\n")
    assert run_study.failure_reason(log, 1).startswith("ValueError: Mixture 'x.d2q_only.naive' not registered")
    log.write_text("Killed\n")
    assert run_study.failure_reason(log, 137) == f"exit status 137; last log line: Killed (log {log})"


@pytest.fixture
def vocab_data_dir(data_dir) -> pathlib.Path:
    texts = [line.split("\t", 1)[1] for name in ("collection.tsv", "queries.train.tsv")
             for line in (data_dir / name).read_text().splitlines()]
    train_sentencepiece(texts=texts * 3, model_path=data_dir / "spm.model", vocab_size=320)
    return data_dir


def test_preflight_lists_the_rows_tasks_registers(vocab_data_dir):
    from gr_jax import tasks
    with_d2q = run_study.registered_rows(data_dir=vocab_data_dir, scheme="naive")
    assert with_d2q == set(tasks.MIXTURE_ROWS)  # the fixture has training queries and a d2q.tsv
    (vocab_data_dir / "d2q.tsv").unlink()
    without = run_study.registered_rows(data_dir=vocab_data_dir, scheme="naive")
    assert without == {row for row, representations in tasks.MIXTURE_ROWS.items() if "d2q" not in representations}
    with pytest.raises(ValueError, match="unknown docid scheme"):
        run_study.registered_rows(data_dir=vocab_data_dir, scheme="no_such_scheme")


def test_one_real_cell_trains_and_evaluates(vocab_data_dir, tmp_path):
    """A real `python -m gr_jax.train` subprocess: a micro model, 2 steps, then the constrained evaluation."""
    out_dir = tmp_path / "study"
    micro = ["--gin.network.T5Config.emb_dim=32", "--gin.network.T5Config.num_heads=2",
             "--gin.network.T5Config.num_encoder_layers=1", "--gin.network.T5Config.num_decoder_layers=1",
             "--gin.network.T5Config.head_dim=8", "--gin.network.T5Config.mlp_dim=64", "--gin.INPUT_LENGTH=16",
             "--gin.TARGET_LENGTH=12", "--gin.training.EvalConfig.num_beams=10",
             "--gin.training.EvalConfig.batch_size=8"]
    results = run_study.main([*_study_args(vocab_data_dir, out_dir, rows="2a", steps=2), "--no_baselines", *micro])
    cell = results["cells"][0]
    assert cell["status"] == "ok", cell.get("reason")
    assert cell["metrics"]["num_queries"] == 4 and cell["metrics"]["invalid_docid_rate"] == 0.0
    assert 0.0 <= cell["metrics"]["MRR@10"] <= cell["metrics"]["Recall@10"] <= 1.0
    assert (pathlib.Path(cell["model_dir"]) / "run.dev.2.trec").is_file()


def test_plots_are_written_when_matplotlib_is_installed(data_dir, tmp_path):
    pytest.importorskip("matplotlib")
    other = tmp_path / "bigger_corpus"
    shutil.copytree(data_dir, other)
    out_dir = tmp_path / "study"
    results = run_study.main([*_study_args(data_dir, out_dir, rows="1a,2a"), "--data_dir", str(other)],
                             runner=FakeRunner(), preflight=_fake_preflight)
    assert sorted(pathlib.Path(p).name for p in results["plots"]) == [
        "bigger_corpus.metric_by_row.png", "fixture_corpus.metric_by_row.png", "metric_by_corpus_size.png"]
    assert all(pathlib.Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in results["plots"])


def test_study_rows_train_the_mixtures_tasks_registers_under_their_table_ids():
    from gr_jax import tasks
    assert {row.id: row.mixture_row for row in run_study.STUDY_ROWS.values()} == tasks.ROW_IDS


def test_dense_baselines_run_as_training_runs_of_the_dense_gins_and_are_cached(data_dir, tmp_path):
    out_dir = tmp_path / "study"
    args = [*_study_args(data_dir, out_dir, rows="1a"), "--dense_baselines", "all", "--dense_steps", "7",
            "--split", "dev"]
    runner = FakeRunner(failing={"t5_dual_encoder"})
    results = run_study.main(args, runner=runner, preflight=_fake_preflight)
    # Zero-shot MiniLM trains 0 steps; the others --dense_steps; the generative cell still runs after a failure.
    assert sorted(runner.calls) == sorted([("bm25",), ("bm25_d2q",), ("minilm_finetuned", 7), ("minilm_zero_shot", 0),
                                           ("t5_dual_encoder", 7), ("labeled_only", "naive", 3)])
    baselines = results["datasets"]["fixture_corpus"]["baselines"]
    assert baselines["minilm_zero_shot"]["metrics"] == DENSE["minilm_zero_shot"]
    assert baselines["t5_dual_encoder"]["status"] == "failed"
    assert baselines["t5_dual_encoder"]["reason"].startswith("ValueError: no MiniLM here")
    assert results["cells"][0]["status"] == "ok"
    table = (out_dir / "results.md").read_text()
    assert table.startswith("# Study: T5.1.1-tiny, 3 steps, split dev; dense baselines that train: 7 steps\n")
    assert "| MiniLM zero-shot (dual encoder) | 0.550 | 0.500 | 1.000 |" in table
    assert "| MiniLM fine-tuned (dual encoder) | 0.600 | 0.500 | 1.000 |" in table
    assert "| T5.1.1-tiny dual encoder (scratch) | failed | failed | failed |" in table

    # The exact commands: the dense gins (the size gin for the T5 tower), their own bindings, the split; not the
    # study's --gin.BATCH_SIZE=8, which is the generative cells'.
    study = run_study.Study(datasets=[run_study.Dataset("fixture_corpus", data_dir)], rows=[], schemes=["naive"],
                            size="small", steps=5, out_dir=tmp_path / "commands", bindings=["BATCH_SIZE = 8"],
                            dense_baselines=list(run_study.DENSE_BASELINES), dense_steps=9, split="valid")
    dataset = run_study.Dataset("fixture_corpus", data_dir)
    model_dirs = tmp_path.resolve() / "commands/fixture_corpus/baselines"
    expected = {"minilm_zero_shot": (["dense/minilm.gin"], 0), "minilm_finetuned": (["dense/minilm.gin"], 9),
                "t5_dual_encoder": (["dense/t5.gin", "models/t5_1_1/small.gin"], 9)}
    for name, (gin_files, steps) in expected.items():
        settings, argv = study.dense_command(dataset, run_study.DENSE_BASELINES[name])
        assert argv == [sys.executable, "-m", "gr_jax.train", *(f"--gin_file={f}" for f in gin_files),
                        f"--gin_bindings=DATA_DIR = {str(data_dir)!r}",
                        "--gin_bindings=DATASET_NAME = 'fixture_corpus'",
                        f"--gin_bindings=MODEL_DIR = {str(model_dirs / name)!r}",
                        f"--gin_bindings=TRAIN_STEPS = {steps}",
                        "--gin_bindings=EVAL_SPLIT = 'valid'"]
        assert settings == {"split": "valid", "steps": steps, "gin_files": gin_files, "bindings": []}
        assert all((run_study.gin_utils.GIN_CONFIGS_DIR / f).is_file() for f in gin_files)

    # A rerun reuses what succeeded and retries the failure; other steps rerun the ones that train.
    again = FakeRunner()
    run_study.main(args, runner=again, preflight=_fake_preflight)
    assert again.calls == [("t5_dual_encoder", 7)]
    more = FakeRunner()
    run_study.main([*_study_args(data_dir, out_dir, rows="1a"), "--dense_baselines", "all", "--dense_steps", "8"],
                   runner=more, preflight=_fake_preflight)
    assert sorted(more.calls) == [("minilm_finetuned", 8), ("t5_dual_encoder", 8)]


def test_a_dense_baseline_with_other_settings_starts_afresh_and_one_stopped_part_way_resumes(data_dir, tmp_path):
    out_dir = tmp_path / "study"
    args = [*_study_args(data_dir, out_dir, rows="1a"), "--no_baselines"]
    dataset = run_study.Dataset("fixture_corpus", data_dir.resolve())
    model_dir = out_dir / "fixture_corpus/baselines/minilm_finetuned"

    def study(steps, runner):
        return run_study.Study(datasets=[dataset], rows=[], schemes=["naive"], size="tiny", steps=3, out_dir=out_dir,
                               dense_baselines=["minilm_finetuned"], dense_steps=steps, runner=runner)

    # A run killed part-way (its checkpoint and a stale final_metrics.json stay): the same settings resume it, and
    # only the new run's metrics count.
    killed = FakeRunner(failing={"minilm_finetuned"})
    study(5, killed).run_baselines(dataset)
    (model_dir / "checkpoints/3").mkdir(parents=True)
    (model_dir / "final_metrics.json").write_text(json.dumps({"eval/MRR@10": 0.99}))
    again = FakeRunner(failing={"minilm_finetuned"})
    result = study(5, again).run_baselines(dataset)["minilm_finetuned"]
    assert (result["status"], again.calls) == ("failed", [("minilm_finetuned", 5)])
    assert (model_dir / "checkpoints/3").is_dir() and not (model_dir / "final_metrics.json").exists()
    # Fewer steps: the checkpoint is not restored (it would be evaluated as the shorter run).
    fewer = FakeRunner()
    result = study(2, fewer).run_baselines(dataset)["minilm_finetuned"]
    assert (result["status"], result["metrics"]["MRR@10"], fewer.calls) == ("ok", 0.6, [("minilm_finetuned", 2)])
    assert not (model_dir / "checkpoints").exists()
    # --no_baselines skips the dense ones too.
    skipping = FakeRunner()
    results = run_study.main([*args, "--dense_baselines", "all"], runner=skipping, preflight=_fake_preflight)
    assert skipping.calls == [("labeled_only", "naive", 3)] and "baselines" not in results["datasets"]["fixture_corpus"]


def test_gdr_systems_chain_vectors_clusters_and_training_after_their_dense_baseline(data_dir, tmp_path):
    out_dir = tmp_path / "study"
    args = [*_study_args(data_dir, out_dir, rows="1a"), "--gdr", "all", "--gdr_steps", "11", "--dense_steps", "7",
            "--gdr_branching", "4,3"]
    runner = FakeRunner()
    results = run_study.main(args, runner=runner, preflight=_fake_preflight)
    # The fine-tuned MiniLM (their document encoder) runs although --dense_baselines does not name it; each GDR
    # system encodes its vectors, clusters them, then trains --gdr_steps.
    assert runner.calls == [("bm25",), ("bm25_d2q",), ("minilm_finetuned", 7),
                            ("dense_index",), ("gdr_index",), ("gdr_minilm", 11),
                            ("dense_index",), ("gdr_index",), ("gdr_t5", 11), ("labeled_only", "naive", 3)]
    baselines = results["datasets"]["fixture_corpus"]["baselines"]
    assert baselines["gdr_minilm"]["metrics"] == GDR["gdr_minilm"]
    table = (out_dir / "results.md").read_text()
    assert table.startswith("# Study: T5.1.1-tiny, 3 steps, split dev; dense baselines that train: 7 steps; "
                            "GDR systems: 11 steps, 4x3 clusters\n")
    assert "| GDR-style (MiniLM tower, T5.1.1-tiny cluster decoder) | 0.700 | 0.500 | 1.000 |" in table

    # The exact commands: the dense run's last state encodes the documents, which are clustered, then trained on.
    study = run_study.Study(datasets=[run_study.Dataset("fixture_corpus", data_dir)], rows=[], schemes=["naive"],
                            size="small", steps=5, out_dir=tmp_path / "commands", bindings=["BATCH_SIZE = 8"],
                            gdr_systems=["gdr_minilm"], dense_steps=9, split="valid", gdr_branching=(4, 3))
    baselines_dir = tmp_path.resolve() / "commands/fixture_corpus/baselines"
    settings, prepare, argv = study.gdr_commands(run_study.Dataset("fixture_corpus", data_dir),
                                                 run_study.GDR_SYSTEMS["gdr_minilm"])
    encoder = baselines_dir / "minilm_finetuned"
    assert prepare == [
        ("vectors", [sys.executable, "-m", "gr_jax.tools.dense_index", "--model_dir", str(encoder), "--step", "9"]),
        ("clusters", [sys.executable, "-m", "gr_jax.tools.gdr_index", "build", "--index_dir",
                      str(encoder / "index/9"), "--branching", "4,3", "--out_dir",
                      str(baselines_dir / "gdr_minilm.clusters")])]
    assert argv == [sys.executable, "-m", "gr_jax.train", "--gin_file=gdr/minilm.gin",
                    "--gin_file=models/t5_1_1/small.gin", f"--gin_bindings=DATA_DIR = {str(data_dir)!r}",
                    "--gin_bindings=DATASET_NAME = 'fixture_corpus'",
                    f"--gin_bindings=MODEL_DIR = {str(baselines_dir / 'gdr_minilm')!r}",
                    "--gin_bindings=TRAIN_STEPS = 5",
                    f"--gin_bindings=GDR_INDEX = {str(baselines_dir / 'gdr_minilm.clusters')!r}",
                    "--gin_bindings=EVAL_SPLIT = 'valid'"]
    assert settings["document_encoder"] == {"name": "minilm_finetuned", "split": "valid", "steps": 9,
                                            "gin_files": ["dense/minilm.gin"], "bindings": []}

    # Cached on rerun; a failing preparation fails the system with its reason; another encoder setting reruns it.
    again = FakeRunner()
    run_study.main(args, runner=again, preflight=_fake_preflight)
    assert again.calls == []
    failing = FakeRunner(failing={"gr_jax.tools.gdr_index"})
    results = run_study.main([*args[:-4], "--gdr", "gdr_minilm", "--dense_steps", "8"], runner=failing,
                             preflight=_fake_preflight)
    gdr = results["datasets"]["fixture_corpus"]["baselines"]["gdr_minilm"]
    assert failing.calls == [("minilm_finetuned", 8), ("dense_index",), ("gdr_index",)]
    assert gdr["status"] == "failed" and gdr["reason"].startswith("clusters: ValueError: no vectors here")
    with pytest.raises(SystemExit):
        run_study.main([*args, "--gdr", "gdr_nope"], runner=FakeRunner(), preflight=_fake_preflight)
