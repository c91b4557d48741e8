"""Input-pipeline throughput next to the train step's, measured in one process: can the data keep up?

    python -m gr_jax.tools.bench.input_pipeline --mixture msmarco_mini.firstp_daq_d2q_labeled.naive [--data_dir DIR]

`--mixture` is any registered name `{dataset}.{row or representation}.{scheme}` (`{dataset}.3b.naive` too); the
dataset is registered from `--data_dir` (default `data/{dataset}`) with the given docid scheme. Prints one JSON
line: the seqio pipeline's training examples/s (`gr_jax.data.pipeline.train_batches`, after warm-up batches
that fill the shuffle buffers and the in-memory cache) and the T5.1.1-tiny train step's examples/s at the same
batch and lengths (`gr_jax.tools.bench.train_step.run`), their ratio, and whether it reaches the target (5x: the
pipeline must never be what training waits for, even with the host busy feeding several devices).

A mixture with D2Q needs `{data_dir}/d2q.tsv` (or `--d2q_path`). Without one, `--fake_d2q_per_passage N`
writes N made-up queries per passage (random 3 to 8 word spans of the passage) to a temporary file for the
measurement only; the JSON line says so.
"""
from __future__ import annotations

import argparse
import json
import logging
import pathlib
import random
import tempfile
import time

from gr_jax.data import pipeline  # First: keeps TensorFlow off the accelerators before anything else starts it.

import gin  # noqa: E402
import seqio  # noqa: E402

from gr_jax import tasks  # noqa: E402
from gr_jax import gin_utils, network  # noqa: E402
from gr_jax.data import d2q  # noqa: E402
from gr_jax.data.readers import open_dataset, write_tsv  # noqa: E402
from gr_jax.tools.bench import train_step  # noqa: E402

TINY_GIN = "models/t5_1_1/tiny.gin"
TARGET_RATIO = 5.0


def write_fake_d2q(*, data_dir: str | pathlib.Path, path: pathlib.Path, per_passage: int, seed: int = 0) -> int:
    """Writes `per_passage` random 3-8 word spans of each passage, per-passage layout; returns the passage count."""
    rng = random.Random(seed)

    def lines():
        for _, text in open_dataset(data_dir).collection():
            words = text.split() or ["empty"]
            spans = []
            for _ in range(per_passage):
                length = rng.randint(3, 8)
                start = rng.randrange(max(len(words) - length, 0) + 1)
                spans.append(" ".join(words[start:start + length]))
            yield spans

    return write_tsv(path, lines())


def pipeline_throughput(*, mixture: str, batch_size: int, input_length: int, target_length: int, warmup_batches: int,
                        batches: int, seed: int = 0) -> dict[str, float]:
    """Training examples/s of `train_batches` after `warmup_batches` (which fill shuffle buffers and caches)."""
    start = time.perf_counter()
    iterator = pipeline.train_batches(mixture_or_task_name=mixture, batch_size=batch_size, input_length=input_length,
                                      target_length=target_length, seed=seed)
    next(iterator)
    first_batch_s = time.perf_counter() - start
    for _ in range(warmup_batches):
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    elapsed = time.perf_counter() - start
    return {"pipeline_examples_per_s": batches * batch_size / elapsed, "pipeline_first_batch_s": first_batch_s,
            "pipeline_timed_batches": batches}


def run(*, mixture: str, data_dir: str | None, d2q_path: str | None, fake_d2q_per_passage: int | None,
        batch_size: int, input_length: int, target_length: int, warmup_batches: int, batches: int,
        train_steps: int) -> dict:
    parts = mixture.split(".")
    if len(parts) != 3:
        raise SystemExit(f"--mixture {mixture!r}: expected `dataset.row.scheme`, e.g. msmarco_mini.3b.naive")
    dataset, _, scheme = parts
    data_dir = data_dir or f"data/{dataset}"
    d2q_note = None
    with tempfile.TemporaryDirectory() as tmp:
        if d2q_path is None and not d2q.default_path(data_dir).is_file() and fake_d2q_per_passage:
            d2q_path = str(pathlib.Path(tmp) / "fake_d2q.tsv")
            passages = write_fake_d2q(data_dir=data_dir, path=pathlib.Path(d2q_path), per_passage=fake_d2q_per_passage)
            d2q_note = f"fake: {fake_d2q_per_passage} random word spans for each of {passages} passages"
        space = tasks.load_docid_space(data_dir=data_dir, docid_scheme=scheme, input_length=input_length,
                                       target_length=target_length)
        tasks.register_dataset(name=dataset, data_dir=data_dir, docid_space=space, input_length=input_length,
                               target_length=target_length, d2q_path=d2q_path,
                               d2q_queries_per_passage=fake_d2q_per_passage or 10)
        if mixture not in set(seqio.MixtureRegistry.names()) | set(seqio.TaskRegistry.names()):
            raise SystemExit(f"{mixture!r} was not registered (see the warnings above; a D2Q row needs "
                             f"{d2q.default_path(data_dir)}, --d2q_path or --fake_d2q_per_passage)")
        data = pipeline_throughput(mixture=mixture, batch_size=batch_size, input_length=input_length,
                                   target_length=target_length, warmup_batches=warmup_batches, batches=batches)
    gin_utils.parse_gin(gin_files=[TINY_GIN], bindings=[])
    config = gin.get_configurable(network.T5Config)(dtype="float32", dropout_rate=0.1).with_vocab_size(
        space.model_vocab_size)
    step = train_step.run(config=config, batch=batch_size, inputs=input_length, targets=target_length,
                          steps=train_steps, optimizer="adafactor", probe_size=512)
    train_examples_per_s = step["steps_per_s"] * batch_size
    ratio = data["pipeline_examples_per_s"] / train_examples_per_s
    return {
        "benchmark": "input_pipeline", "mixture": mixture,
        "d2q": d2q_note or d2q_path or (str(d2q.default_path(data_dir)) if d2q.default_path(data_dir).is_file()
                                        else None),
        "batch": batch_size, "inputs": input_length, "targets": target_length, **data,
        "train_model": "t5_1_1 tiny", "train_params": step["params"], "train_platform": step["platform"],
        "train_devices": step["devices"], "train_examples_per_s": train_examples_per_s,
        "ratio": ratio, "target_ratio": TARGET_RATIO, "ok": ratio >= TARGET_RATIO,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mixture", required=True, help="`dataset.row.scheme`, e.g. msmarco_mini.3b.naive")
    parser.add_argument("--data_dir", default=None, help="the dataset's directory (default: data/{dataset})")
    parser.add_argument("--d2q_path", default=None, help="synthetic queries (default: DATA_DIR/d2q.tsv)")
    parser.add_argument("--fake_d2q_per_passage", type=int, default=None,
                        help="without a D2Q file: made-up queries per passage, in a temporary file")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument("--targets", type=int, default=16)
    parser.add_argument("--warmup_batches", type=int, default=50)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--train_steps", type=int, default=10)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(run(mixture=args.mixture, data_dir=args.data_dir, d2q_path=args.d2q_path,
                         fake_d2q_per_passage=args.fake_d2q_per_passage, batch_size=args.batch,
                         input_length=args.inputs, target_length=args.targets, warmup_batches=args.warmup_batches,
                         batches=args.batches, train_steps=args.train_steps)), flush=True)


if __name__ == "__main__":
    main()
