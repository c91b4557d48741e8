"""gr_jax.run_dir: the paths of a run's files, each named in one place."""
import json
import pathlib

from gr_jax.run_dir import RunDir


def test_the_layout_of_a_run():
    run = RunDir.of("/runs/a")
    assert run.path == pathlib.Path("/runs/a")
    assert run.config == pathlib.Path("/runs/a/config.gin")
    assert run.checkpoints == pathlib.Path("/runs/a/checkpoints") and run.best == pathlib.Path("/runs/a/best")
    assert run.index(12) == pathlib.Path("/runs/a/index/12")
    assert run.trec_run("dev", 7) == pathlib.Path("/runs/a/run.dev.7.trec")
    assert run.eval_metrics("dev", 7) == pathlib.Path("/runs/a/eval.dev.7.json")
    assert run.examples_record(process=1, count=2) == pathlib.Path("/runs/a/train_examples-1-of-2.jsonl")


def test_trec_runs_are_listed_in_step_order_and_only_those_of_the_split(tmp_path):
    for name in ("run.dev.10.trec", "run.dev.9.trec", "run.dev.x.trec", "run.test.3.trec", "run.dev.2.json"):
        (tmp_path / name).write_text("")
    run = RunDir.of(tmp_path)
    assert run.trec_runs("dev") == {9: tmp_path / "run.dev.9.trec", 10: tmp_path / "run.dev.10.trec"}
    assert list(run.trec_runs("dev")) == [9, 10] and run.trec_runs("train") == {}
    assert not run.is_run()
    run.checkpoints.mkdir()
    assert run.is_run()


def test_final_metrics_are_written_whole_and_never_replaced_by_less(tmp_path):
    """A rerun of a finished run trains no step: its report (evaluation only) updates the earlier one and keeps the
    training metrics it does not measure again."""
    run = RunDir.of(tmp_path)
    assert run.write_final_metrics({"train/loss": 1.5, "eval/MRR@10": 0.25}) == {"train/loss": 1.5,
                                                                                  "eval/MRR@10": 0.25}
    assert run.write_final_metrics({"eval/MRR@10": 0.5}) == {"train/loss": 1.5, "eval/MRR@10": 0.5}
    assert json.loads(run.final_metrics.read_text()) == {"train/loss": 1.5, "eval/MRR@10": 0.5}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_metrics.json"]  # no temporary file left


def test_only_the_primary_process_writes_the_runs_own_files(tmp_path):
    other = RunDir.of(tmp_path, process=1)
    other.write_config("x = 1\n")
    assert other.write_final_metrics({"eval/MRR@10": 0.5}) == {"eval/MRR@10": 0.5}
    assert list(tmp_path.iterdir()) == []
    primary = RunDir.of(tmp_path)
    primary.write_config("x = 1\n")
    primary.write_final_metrics({"eval/MRR@10": 0.5})
    assert primary.config.read_text() == "x = 1\n"
    assert json.loads(primary.final_metrics.read_text()) == {"eval/MRR@10": 0.5}


def test_a_run_records_its_start_and_a_chain_of_runs_leads_to_the_hugging_face_checkpoint_behind_it(tmp_path):
    import pytest
    from gr_jax.run_dir import hugging_face_checkpoint, start_fingerprint
    hf = tmp_path / "Qwen3-0.6B"
    hf.mkdir()
    first, second, scratch = (RunDir.of(tmp_path / name) for name in ("lora", "continued", "scratch"))
    for run in (first, second, scratch):
        run.checkpoints.mkdir(parents=True)
    first.write_start(seed=3, init_checkpoint=hf, frozen="(?!.*_lora_[ab]$).*")
    second.write_start(seed=0, init_checkpoint=first.path, frozen=None)
    scratch.write_start(seed=5, init_checkpoint=None, frozen=None)
    assert first.read_start() == {"seed": 3, "init_checkpoint": str(hf.resolve()), "frozen": "(?!.*_lora_[ab]$).*",
                                  "fingerprint": start_fingerprint(hf)}
    assert scratch.read_start()["fingerprint"] is None
    assert hugging_face_checkpoint(hf) == hf  # a checkpoint dir stands for itself
    assert hugging_face_checkpoint(second.path) == hugging_face_checkpoint(first.path) == hf.resolve()
    with pytest.raises(ValueError, match="started from seed 5, not from a Hugging Face checkpoint"):
        hugging_face_checkpoint(scratch.path)
    (tmp_path / "old").mkdir()
    RunDir.of(tmp_path / "old").checkpoints.mkdir()  # a run from before runs recorded their start
    with pytest.raises(FileNotFoundError, match="start.json is missing"):
        hugging_face_checkpoint(tmp_path / "old")
    # Another process than the primary one writes nothing.
    RunDir.of(tmp_path / "other", process=1).write_start(seed=1, init_checkpoint=None, frozen=None)
    assert not (tmp_path / "other" / "start.json").exists()


def test_a_run_whose_checkpoints_leave_out_its_base_refuses_another_base(tmp_path):
    """check_start: the same checkpoint files elsewhere are the same base; another config.json, other weights or,
    from a seed, another seed are refused, naming start.json; runs that save every parameter are not checked."""
    import pytest
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text('{"model_type": "qwen3"}')
    (base / "model.safetensors").write_bytes(b"0" * 64)
    run = RunDir.of(tmp_path / "lora")
    run.path.mkdir()
    run.write_start(seed=0, init_checkpoint=base, frozen="(?!.*_lora_[ab]$).*")
    run.check_start(seed=0, init_checkpoint=tmp_path / "elsewhere")  # no checkpoint yet: nothing to protect
    (run.checkpoints / "3").mkdir(parents=True)
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in ("config.json", "model.safetensors"):
        (moved / name).write_bytes((base / name).read_bytes())
    run.check_start(seed=1, init_checkpoint=moved)
    (moved / "model.safetensors").write_bytes(b"0" * 65)
    with pytest.raises(ValueError, match=r"start.json: the checkpoints of .* trained on .*base.*this run's base"):
        run.check_start(seed=0, init_checkpoint=moved)
    (moved / "model.safetensors").write_bytes(b"0" * 64)
    (moved / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="Point init_checkpoint back"):
        run.check_start(seed=0, init_checkpoint=moved)
    scratch = RunDir.of(tmp_path / "scratch")
    (scratch.checkpoints / "1").mkdir(parents=True)
    scratch.write_start(seed=4, init_checkpoint=None, frozen="(?!.*_lora_[ab]$).*")
    scratch.check_start(seed=4, init_checkpoint=None)
    with pytest.raises(ValueError, match="trained on seed 4; this run's base is seed 5"):
        scratch.check_start(seed=5, init_checkpoint=None)
    scratch.write_start(seed=4, init_checkpoint=None, frozen=None)
    scratch.check_start(seed=5, init_checkpoint=base)
