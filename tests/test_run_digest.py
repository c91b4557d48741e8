"""gr_jax.tools.run_digest: what a restructuring must leave unchanged, per run dir, by content."""
import hashlib
import json

import numpy as np
import orbax.checkpoint as ocp

from gr_jax.tools import run_digest


def test_digest_hashes_the_latest_state_the_metrics_without_timings_and_the_trec_runs(tmp_path):
    run = tmp_path / "runs" / "a"
    checkpointer = ocp.StandardCheckpointer()
    for step, value in ((2, 1.0), (3, 2.0)):
        checkpointer.save(run / "checkpoints" / str(step) / "state", {"params": {"w": np.full(4, value, np.float32)}})
    checkpointer.wait_until_finished()
    (run / "final_metrics.json").write_text(json.dumps({"eval/MRR@10": 0.5, "train/steps_per_second": 9.0}))
    (run / "run.dev.3.trec").write_text("q Q0 d 1 1.0 t\n")
    (tmp_path / "runs" / "no_run").mkdir()
    digest = run_digest.digest(tmp_path / "runs")
    assert digest["a"] == {
        "step": 3, "arrays": {"params/w": hashlib.sha256(np.full(4, 2.0, np.float32).tobytes()).hexdigest()[:16]},
        "metrics": {"eval/MRR@10": 0.5},
        "trec": {"run.dev.3.trec": hashlib.sha256(b"q Q0 d 1 1.0 t\n").hexdigest()[:16]}}
    assert digest["no_run"] == {"trec": {}}
