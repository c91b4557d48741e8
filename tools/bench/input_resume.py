"""Resume time of the seqio training input: restoring the saved tf.data iterator state against re-reading batches.

    python -m gr_jax.tools.bench.input_resume [--data_dir data/wordnet_food] [--row firstp_labeled] [--batch 4]
                                               [--far 100000] [--near 100] [--skip 5000] [--repeats 3]

One process, one JSON line. The pipeline (`gr_jax.data.pipeline.train_batches`; by default the demo's task,
WordNet noun.food FirstP + labeled definitions) is driven without a model to batch `--far`, its iterator state
saved at `--near` and at `--far` as every checkpoint saves it (`TrainBatches.save_input_state`). Then, alternating
`--repeats` times, the resume at each: a new pipeline built at that batch, the state restored and the first batch
read (`resume_{near,far}_s`, medians; `resume_far_over_near` is 1 when the resume does not depend on the step).
Re-reading, what a resume cost before (`dataset.skip(k)` in the graph: `old_skip_*`) and what it costs now where a
checkpoint holds no state (`next` on the iterator: `reread_*`), is timed at `--skip` batches and at 0 and
extrapolated linearly to `--far` (`*_far_extrapolated_s`: extrapolated, not measured). Also: each state's bytes
(the shuffle buffer and in-memory caches are in it) and the drive's examples/s.
"""
from __future__ import annotations

import argparse
import json
import logging
import pathlib
import statistics
import tempfile
import time

from gr_jax.data import pipeline  # First: keeps TensorFlow off the accelerators before anything else starts it.

import seqio  # noqa: E402
import tensorflow as tf  # noqa: E402

from gr_jax import tasks  # noqa: E402


def _register(*, data_dir: str, name: str, scheme: str, input_length: int, target_length: int) -> None:
    space = tasks.load_docid_space(data_dir=data_dir, docid_scheme=scheme, input_length=input_length,
                                   target_length=target_length)
    tasks.register_dataset(name=name, data_dir=data_dir, docid_space=space, input_length=input_length,
                           target_length=target_length)


def _state_bytes(directory: pathlib.Path) -> int:
    return sum(path.stat().st_size for path in directory.iterdir())


def _old_skip_first_batch_s(*, mixture: str, batch_size: int, input_length: int, target_length: int, seed: int,
                            start_batch: int) -> float:
    """Seconds to the first batch of the pipeline as `train_batches` built it before the iterator state was saved:
    `dataset.skip(start_batch)` in the graph, read with `as_numpy_iterator`."""
    start = time.perf_counter()
    dataset = seqio.get_dataset(
        mixture, task_feature_lengths={"inputs": input_length, "targets": target_length},
        feature_converter=seqio.EncDecFeatureConverter(pack=False), dataset_split="train", shuffle=True,
        num_epochs=None, seed=seed, verbose=False)
    dataset = dataset.batch(batch_size, drop_remainder=True).skip(start_batch)
    next(pipeline._with_options(dataset).prefetch(tf.data.AUTOTUNE).as_numpy_iterator())
    return time.perf_counter() - start


def run(*, data_dir: str, name: str, row: str, scheme: str, batch_size: int, input_length: int, target_length: int,
        far: int, near: int, skip: int, repeats: int, seed: int = 0) -> dict:
    if not 0 < near < far or skip < 1 or repeats < 1:
        raise SystemExit(f"need 0 < --near ({near}) < --far ({far}), --skip >= 1 and --repeats >= 1")
    _register(data_dir=data_dir, name=name, scheme=scheme, input_length=input_length, target_length=target_length)
    mixture = tasks.mixture_name(name=name, row=row, docid_scheme=scheme)

    def batches(start_batch: int) -> pipeline.TrainBatches:
        return pipeline.train_batches(mixture_or_task_name=mixture, batch_size=batch_size, input_length=input_length,
                                      target_length=target_length, seed=seed, start_batch=start_batch)

    with tempfile.TemporaryDirectory() as tmp:
        states = {k: pathlib.Path(tmp) / str(k) for k in (near, far)}
        driven = batches(0)
        start = time.perf_counter()
        for k in range(far + 1):
            if k in states:
                states[k].mkdir()
                driven.save_input_state(str(states[k]))
                record = json.loads((states[k] / f"{driven.name}.json").read_text())
                if not record["state"]:
                    raise SystemExit(f"no iterator state at batch {k} ({record['reason']}): choose a later --near")
            if k < far:
                next(driven)
        drive_s = time.perf_counter() - start
        del driven

        resume: dict[int, list[float]] = {near: [], far: []}
        for _ in range(repeats):
            for k in (near, far):
                start = time.perf_counter()
                resumed = batches(k)
                if not resumed.restore_input_state(str(states[k])):
                    raise RuntimeError(f"batch {k}: the saved state was not restored")
                next(resumed)
                resume[k].append(time.perf_counter() - start)
                del resumed
        state_bytes = {k: _state_bytes(states[k]) for k in states}

    def reread_first_batch_s(start_batch: int) -> float:
        start = time.perf_counter()
        next(batches(start_batch))
        return time.perf_counter() - start

    old = {k: [] for k in (0, skip)}
    new = {k: [] for k in (0, skip)}
    for _ in range(repeats):
        for k in (0, skip):
            old[k].append(_old_skip_first_batch_s(mixture=mixture, batch_size=batch_size, input_length=input_length,
                                                  target_length=target_length, seed=seed, start_batch=k))
            new[k].append(reread_first_batch_s(k))

    def extrapolated(times: dict[int, list[float]]) -> tuple[float, float]:
        at0, atk = statistics.median(times[0]), statistics.median(times[skip])
        per_batch = (atk - at0) / skip
        return atk, at0 + per_batch * far

    old_skip_s, old_far_s = extrapolated(old)
    reread_s, reread_far_s = extrapolated(new)
    resume_near_s, resume_far_s = statistics.median(resume[near]), statistics.median(resume[far])
    return {
        "benchmark": "input_resume", "mixture": mixture, "batch": batch_size, "inputs": input_length,
        "targets": target_length, "near": near, "far": far, "repeats": repeats,
        "resume_near_s": resume_near_s, "resume_far_s": resume_far_s,
        "resume_far_over_near": resume_far_s / resume_near_s,
        "resume_near_all_s": resume[near], "resume_far_all_s": resume[far],
        "state_bytes_near": state_bytes[near], "state_bytes_far": state_bytes[far],
        "drive_s": drive_s, "drive_examples_per_s": far * batch_size / drive_s,
        "skip": skip, "old_skip_s": old_skip_s, "old_skip_0_s": statistics.median(old[0]),
        "old_skip_far_extrapolated_s": old_far_s, "reread_s": reread_s, "reread_0_s": statistics.median(new[0]),
        "reread_far_extrapolated_s": reread_far_s,
        "old_skip_far_extrapolated_over_resume_far": old_far_s / resume_far_s,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", default="data/wordnet_food")
    parser.add_argument("--name", default="wordnet_food", help="the dataset's registered name")
    parser.add_argument("--row", default="firstp_labeled", help="the study row (mixture) to read")
    parser.add_argument("--scheme", default="naive", help="docid scheme")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--inputs", type=int, default=32)
    parser.add_argument("--targets", type=int, default=12)
    parser.add_argument("--far", type=int, default=100_000)
    parser.add_argument("--near", type=int, default=100)
    parser.add_argument("--skip", type=int, default=5000, help="batches re-read to time today's skip")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(run(data_dir=args.data_dir, name=args.name, row=args.row, scheme=args.scheme,
                         batch_size=args.batch, input_length=args.inputs, target_length=args.targets, far=args.far,
                         near=args.near, skip=args.skip, repeats=args.repeats)), flush=True)


if __name__ == "__main__":
    main()
