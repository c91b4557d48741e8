"""A digest of every run under a folder, to show that a restructuring changed nothing a run computes.

    python -m gr_jax.tools.run_digest --runs_dir /tmp/before > before.json   (then the same for after; diff them)

Per run (a subfolder with `checkpoints/`): the sha256 of every array of its latest saved state (parameters and
optimizer state), its `final_metrics.json` without timings (`*second*` keys), and the sha256 of each TREC run.
`tools/restructure/runs.sh` trains and evaluates a micro run of every head and family to fill such a folder.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
from collections.abc import Sequence

from gr_jax.entry_point import run_tool
from gr_jax.run_dir import RunDir


def digest(runs_dir: str | pathlib.Path) -> dict[str, dict]:
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    from gr_jax import checkpoints
    from gr_jax.partitioning import path_str
    out = {}
    for path in sorted(p for p in pathlib.Path(runs_dir).iterdir() if p.is_dir()):
        run, entry = RunDir.of(path), {}
        steps = sorted(int(p.name) for p in run.checkpoints.iterdir() if p.name.isdigit()) if run.is_run() else []
        if steps:
            state = ocp.StandardCheckpointer().restore(run.checkpoints / str(steps[-1]) / checkpoints.STATE_ITEM)
            entry["step"] = steps[-1]
            entry["arrays"] = {path_str(key): hashlib.sha256(np.asarray(leaf).tobytes()).hexdigest()[:16]
                               for key, leaf in jax.tree_util.tree_leaves_with_path(state)}
        if run.final_metrics.is_file():
            entry["metrics"] = {k: v for k, v in json.loads(run.final_metrics.read_text()).items() if "second" not in k}
        entry["trec"] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in sorted(path.glob("*.trec"))}
        out[path.name] = entry
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs_dir", required=True, help="a folder of run dirs (tools/restructure/runs.sh's RUNS)")
    args = parser.parse_args(argv)
    return run_tool(lambda: digest(args.runs_dir), indent=1)


if __name__ == "__main__":
    main()
