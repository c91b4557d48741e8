"""The scaling grid: fraction dirs, one run_study per size, CGL per cell, the fits of planted laws, correlations
and the beam sweep, with stand-ins for the subprocesses."""
import json
import pathlib
import re

import pytest

from gr_jax.tools import scaling_study

from conftest import FIXTURES

PARAMS = {"p100k": 100_000, "p800k": 800_000, "p2m": 2_000_000, "tiny": 6_000_000}
MODEL_LAW = (3e3, 0.5, 0.001)  # CGL(P) = (gamma / P)^alpha + lambda at the full data
BEAM_LAW = (10.0, 0.4, 0.2)    # MR(C) = (mu / C)^sigma + lambda


def _bindings(argv):
    return dict(arg[len("--gin_bindings="):].split(" = ", 1) for arg in argv if arg.startswith("--gin_bindings="))


class FakeRunner:
    """Writes what gr_jax.train / gr_jax.cgl / gr_jax.eval would; CGL follows planted laws in P and D."""

    def __init__(self):
        self.calls = []
        self.gin_files = []  # per training process
        self.steps = {}  # (module, size, fraction) -> the step it trained to or measured at

    def __call__(self, argv, log_path, timeout):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        module = argv[argv.index("-m") + 1]
        bindings = _bindings(argv)
        if module == "gr_jax.train":
            model_dir = pathlib.Path(eval(bindings["MODEL_DIR"]))
            size = next(a for a in argv if re.search(r"(models/t5_1_1|decoder_only)/p?\d*[a-z0-9]+\.gin$", a)
                        and not a.endswith("experiment.gin")).rsplit("/", 1)[1][:-4]
            self.gin_files.append([a[len("--gin_file="):] for a in argv if a.startswith("--gin_file=")])
            fraction = int(eval(bindings["DATASET_NAME"]).rsplit("_q", 1)[1]) / 100
            self.calls.append(("train", size, fraction))
            self.steps["train", size, fraction] = int(bindings["TRAIN_STEPS"])
            model_dir.mkdir(parents=True, exist_ok=True)
            (model_dir / "cell.json").unlink(missing_ok=True)
            (model_dir / "fake.json").write_text(json.dumps({"size": size, "fraction": fraction}))
            cgl = self.cgl(size, fraction)
            (model_dir / "final_metrics.json").write_text(json.dumps({
                "eval/MRR@10": 0.8 - 2 * cgl, "eval/Recall@1": 0.1, "eval/Recall@10": 1 - 2 * cgl}))
            return 0
        model_dir = pathlib.Path(next(a for a in argv if a.startswith("--gin_file="))[len("--gin_file="):]).parent
        cell = json.loads((model_dir / "fake.json").read_text())
        if module == "gr_jax.cgl":
            self.calls.append(("cgl", cell["size"], cell["fraction"]))
            self.steps["cgl", cell["size"], cell["fraction"]] = int(bindings["CGL_STEP"])
            negatives = int(bindings["CGL_NEGATIVES"])
            result = {"cgl": self.cgl(cell["size"], cell["fraction"]), "chance": 1 / negatives,
                      "settings": {"num_negatives": negatives}}
            log_path.write_text(json.dumps(result) + "\n")
            (model_dir / f"cgl.dev.{bindings['CGL_STEP']}.json").write_text(json.dumps(result))
            return 0
        assert module == "gr_jax.eval"
        beams = int(bindings["training.EvalConfig.num_beams"])
        self.calls.append(("eval", cell["size"], cell["fraction"], beams))
        self.steps["eval", cell["size"], cell["fraction"]] = int(bindings["training.evaluate.step"])
        miss = (BEAM_LAW[0] / flops(model_dir, beams)) ** BEAM_LAW[1] + BEAM_LAW[2]
        recall = {5: 1 - miss, 20: 1 - miss / 2, 100: 1 - miss / 4}  # gr_jax.eval: only the k the beams fill
        log_path.write_text(json.dumps({"MRR@10": 1 - miss, **{f"Recall@{k}": r for k, r in recall.items()
                                                               if k <= beams}}) + "\n")
        return 0

    @staticmethod
    def cgl(size, fraction):
        gamma, alpha, floor = MODEL_LAW
        return (gamma / PARAMS[size]) ** alpha + floor + 0.002 * (1 / fraction - 1)


def flops(cell_dir, beams):
    return 1e6 * beams


def test_the_grid_trains_measures_and_fits_the_planted_laws(tmp_path):
    out_dir = tmp_path / "scaling"
    args = ["--data_dir", str(FIXTURES / "tasks"), "--out_dir", str(out_dir), "--sizes", "p100k,p800k,p2m,tiny",
            "--fractions", "0.5,1.0", "--steps", "3", "--beams", "5,10,20,40,80", "--cgl_negatives", "16"]
    runner = FakeRunner()
    results = scaling_study.main(args, runner=runner, preflight=lambda **_: {"firstp_labeled"}, flops=flops,
                                 params=PARAMS.__getitem__)
    trained = [c for c in runner.calls if c[0] == "train"]
    assert sorted(trained) == sorted(("train", s, f) for s in PARAMS for f in (0.5, 1.0))
    assert all(c["status"] == "ok" and c["cgl"] is not None for c in results["cells"])
    # Each fraction dir has its share of the training queries; D is their judged pairs.
    pairs = {c["fraction"]: c["pairs"] for c in results["cells"]}
    assert pairs[0.5] < pairs[1.0]
    model = results["fits"]["model_size"]
    assert model["points"] == 4 and model["r2"] == pytest.approx(1.0, abs=1e-6)
    assert model["parameters"]["alpha"] == pytest.approx(MODEL_LAW[1], rel=1e-3)
    assert results["fits"]["data_size"] is None  # two fractions: fewer points than its three parameters
    assert results["monotonic"]["falls_with_params"] and results["monotonic"]["falls_with_pairs"]
    assert results["correlations"]["Recall@10"]["spearman"] == pytest.approx(-1.0)
    # The beam sweep ran on the best cell (the largest model at all the data) and recovers Eq. 12 for MR@5.
    assert results["inference"]["cell"]["size"] == "tiny" and results["inference"]["cell"]["fraction"] == 1.0
    mr5 = results["inference"]["fits"]["MR@5"]
    assert mr5["parameters"]["sigma"] == pytest.approx(BEAM_LAW[1], rel=1e-3) and mr5["r2"] > 0.999999
    # MR@k only where the beams fill k: MR@20 from 20, 40 and 80 beams; no beam size fills MR@100.
    assert [sorted(p) for p in results["inference"]["points"]][:3] == [
        ["MR@5", "MRR@10", "beams", "flops"], ["MR@5", "MRR@10", "beams", "flops"],
        ["MR@20", "MR@5", "MRR@10", "beams", "flops"]]
    assert results["inference"]["fits"]["MR@20"]["points"] == 3 and results["inference"]["fits"]["MR@100"] is None
    assert json.loads((out_dir / "scaling.json").read_text())["settings"]["cgl_negatives"] == 16
    table = (out_dir / "scaling.md").read_text()
    assert "| tiny | 6,000,000 | 1 |" in table and "model_size: L(P) = (gamma/P)^alpha + lambda" in table
    assert re.search(r"^\| 5 \| 5e\+06 \| 0\.\d{3} \| – \| – \| 0\.\d{3} \|$", table, re.MULTILINE)
    assert re.search(r"^\| 80 \| 8e\+07 \| 0\.\d{3} \| 0\.\d{3} \| – \| 0\.\d{3} \|$", table, re.MULTILINE)

    # Analysing only the finished cells of a larger grid trains nothing; the data law takes the size measured at
    # the most fractions.
    calls = FakeRunner()
    partial = scaling_study.main([*args[:-6], "--fractions", "0.25,0.5,1.0", "--steps", "3", "--beams", "1,2,4",
                                  "--cgl_negatives", "16", "--analyse_only"], runner=calls,
                                 preflight=lambda **_: {"firstp_labeled"}, flops=flops, params=PARAMS.__getitem__)
    assert not [c for c in calls.calls if c[0] == "train"]
    assert sorted((c["size"], c["fraction"]) for c in partial["cells"]) == sorted(
        (s, f) for s in PARAMS for f in (0.5, 1.0))

    # Rerun: every cell, CGL and beam size is reused.
    again = FakeRunner()
    scaling_study.main(args, runner=again, preflight=lambda **_: {"firstp_labeled"}, flops=flops,
                       params=PARAMS.__getitem__)
    assert again.calls == []


def test_steps_grow_with_the_data_fraction(tmp_path):
    """--steps_with_data: each cell trains round(fraction x steps) steps, and its CGL and beam sweep read that step."""
    args = ["--data_dir", str(FIXTURES / "tasks"), "--out_dir", str(tmp_path / "scaling"), "--sizes", "p100k,tiny",
            "--fractions", "0.25,0.5,1.0", "--steps", "40", "--steps_with_data", "--beams", "1,2",
            "--cgl_negatives", "16"]
    runner = FakeRunner()
    results = scaling_study.main(args, runner=runner, preflight=lambda **_: {"firstp_labeled"}, flops=flops,
                                 params=PARAMS.__getitem__)
    expected = {0.25: 10, 0.5: 20, 1.0: 40}
    assert {k: v for k, v in runner.steps.items() if k[0] in ("train", "cgl")} == {
        (module, size, f): expected[f] for module in ("train", "cgl") for size in ("p100k", "tiny") for f in expected}
    assert runner.steps["eval", "tiny", 1.0] == 40
    assert {(c["fraction"], c["steps"]) for c in results["cells"]} == set(expected.items())
    assert "round(fraction x 40) steps" in (tmp_path / "scaling" / "scaling.md").read_text()
    again = FakeRunner()
    scaling_study.main([*args, "--analyse_only"], runner=again, preflight=lambda **_: {"firstp_labeled"},
                       flops=flops, params=PARAMS.__getitem__)
    assert not [c for c in again.calls if c[0] == "train"]


def test_bad_arguments_are_refused(tmp_path):
    base = ["--data_dir", str(FIXTURES / "tasks"), "--out_dir", str(tmp_path), "--steps", "3"]
    for extra in (["--sizes", "no_such_size"], ["--sizes", "tiny", "--fractions", "0,1"],
                  ["--sizes", "tiny", "--row", "9z"], ["--sizes", "tiny", "--beams", "0"],
                  ["--sizes", "tiny", "--family", "decoder_only", "--beams", ""]):  # no decoder_only/tiny.gin
        with pytest.raises(SystemExit):
            scaling_study.main([*base, *extra], runner=FakeRunner())


def test_the_decoder_only_family_trains_its_matched_sizes_and_counts_their_own_parameters(tmp_path):
    """--family decoder_only: each cell is the decoder-only network at the T5 size's matched file after the study's
    gin, and P is that network's non-embedding count (docs/decoder_only.md, experiment 1); the inference sweep,
    whose FLOPs are counted with the T5 model, is refused unless --beams is empty."""
    args = ["--data_dir", str(FIXTURES / "tasks"), "--out_dir", str(tmp_path / "grid"), "--sizes", "p100k,p2m",
            "--fractions", "1.0", "--steps", "3", "--cgl_negatives", "16", "--family", "decoder_only"]
    with pytest.raises(SystemExit):
        scaling_study.main(args, runner=FakeRunner(), preflight=lambda **_: {"firstp_labeled"})
    runner = FakeRunner()
    results = scaling_study.main([*args, "--beams", ""], runner=runner, preflight=lambda **_: {"firstp_labeled"})
    assert [files[:3] for files in runner.gin_files] == [
        ["experiments/study_cpu.gin", "decoder_only/experiment.gin", f"decoder_only/{size}.gin"]
        for size in ("p100k", "p2m")]
    # p2m: T5's 1,769,472 kernel parameters (tests/test_gin_configs.py) + 2 RMSNorms in each of 4 layers and the
    # final one, 192 wide; p100k has its own count, not T5's 98,880.
    params = {c["size"]: c["params"] for c in results["cells"]}
    assert params["p2m"] == 1_769_472 + (4 * 2 + 1) * 192 and params["p100k"] != 98_880
    assert "inference" not in results
    assert (tmp_path / "grid" / "scaling.md").read_text().startswith("# Scaling study: decoder-only, row 2a")
