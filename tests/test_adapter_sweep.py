"""The adapter sweep (GR against DR under model scaling on one decoder-only backbone): its commands are valid gin
for both families, the adapters it reports are the parameters they add, and finished runs are reused."""
import json
import pathlib

import gin
import pytest

from gr_jax import gin_utils
from gr_jax.tools import adapter_sweep

from conftest import FIXTURES

MRR = {("gr", 0): 0.20, ("gr", 128): 0.22, ("dr", 0): 0.40, ("dr", 128): 0.41}


class FakeRunner:
    """Writes the final metrics gr_jax.train would; remembers each command."""

    def __init__(self):
        self.commands = []

    def __call__(self, argv, log_path, timeout):
        self.commands.append(list(argv))
        bindings = dict(a[len("--gin_bindings="):].split(" = ", 1) for a in argv if a.startswith("--gin_bindings="))
        family = "dr" if "--gin_file=dense/decoder_only.gin" in argv else "gr"
        dim = int(bindings["decoder_only_network.DecoderOnlyConfig.adapter_dim"])
        model_dir = pathlib.Path(eval(bindings["MODEL_DIR"]))
        mrr = MRR[family, dim]
        metrics = {"eval/MRR@10": mrr, "eval/Recall@1": mrr / 2, "eval/Recall@10": 2 * mrr}
        if family == "dr":  # a GR run with fewer than 100 beams reports no Recall@100
            metrics["eval/Recall@100"] = 0.9
        (model_dir / "final_metrics.json").write_text(json.dumps(metrics))
        return 0


def test_the_sweep_trains_both_families_at_each_adapter_width_and_reports_the_change(tmp_path):
    args = ["--data_dir", str(FIXTURES / "tasks"), "--out_dir", str(tmp_path / "sweep"), "--size", "p2m",
            "--adapter_dims", "0,128", "--steps", "5"]
    runner = FakeRunner()
    results = adapter_sweep.main([*args[:-3], "128,0", *args[-2:]], runner=runner)
    # Width by width in the order given, both families at each; the results in increasing width.
    order = [("dr" if "--gin_file=dense/decoder_only.gin" in a else "gr",
              next(b for b in a if "adapter_dim" in b).rsplit(" ", 1)[1]) for a in runner.commands]
    assert order == [("gr", "128"), ("dr", "128"), ("gr", "0"), ("dr", "0")]
    assert list(results["runs"]["gr"]) == ["0", "128"]
    # Each command is the family's gin files, the size file and bindings gin accepts.
    for argv in runner.commands:
        files = [a[len("--gin_file="):] for a in argv if a.startswith("--gin_file=")]
        bindings = [a[len("--gin_bindings="):] for a in argv if a.startswith("--gin_bindings=")]
        assert files[-1] == "decoder_only/p2m.gin"
        gin.clear_config()
        try:
            gin_utils.parse_gin(gin_files=files, bindings=bindings)
            assert gin.query_parameter("decoder_only_network.DecoderOnlyConfig.adapter_dim") in (0, 128)
        finally:
            gin.clear_config()
    dr = [a for a in runner.commands if "--gin_file=dense/decoder_only.gin" in a]
    assert len(dr) == 2 and all("--gin_bindings=PROJECTION_DIM = 128" in a for a in dr)
    # 4 layers of width 192, each adapter W_down [192, 128], W_up [128, 192] and a norm scale [192].
    gr = results["runs"]["gr"]
    assert gr["128"]["added_params"] == 4 * (2 * 192 * 128 + 192) and gr["0"]["added_params"] == 0
    assert results["runs"]["dr"]["128"]["added_params"] == gr["128"]["added_params"]
    assert adapter_sweep.relative_change(gr, "MRR@10")["128"] == pytest.approx(0.1)
    table = (tmp_path / "sweep" / "adapter_sweep.md").read_text()
    assert "| 128 | 197,376 | 0.11 | 0.220 | 0.110 | 0.440 | – | +10.0% |" in table
    assert (tmp_path / "sweep" / "adapter_sweep.png").stat().st_size > 0
    assert "| 128 | 197,376 | 0.11 | 0.410 | 0.205 | 0.820 | 0.900 | +2.5% |" in table
    # Finished runs with the same settings are reused; a run with other settings trains afresh.
    again = FakeRunner()
    adapter_sweep.main(args, runner=again)
    assert again.commands == []
    adapter_sweep.main([*args[:-1], "6"], runner=again)
    assert len(again.commands) == 4


def test_bad_arguments_are_refused(tmp_path):
    base = ["--data_dir", str(FIXTURES / "tasks"), "--out_dir", str(tmp_path), "--steps", "3"]
    for extra in (["--size", "tiny"], ["--adapter_dims", "0,-1"], ["--adapter_dims", "8,8"], ["--families", "gr,x"]):
        with pytest.raises(SystemExit):
            adapter_sweep.main([*base, *extra], runner=FakeRunner())
