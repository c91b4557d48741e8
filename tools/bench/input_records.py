"""The preprocessed input path at a host's share of the study's batch: examples/s read, resume far against near, the
input state's bytes, memory, and the headroom over what a TPU v4 host's chips consume.

    python -m gr_jax.tools.bench.input_records --directory DIR [--batch 512] [--hosts 32] [--seconds 20]
        [--near 100] [--far 100000] [--repeats 3] [--model_gin models/t5_1_1/xxl.gin]

One process, one JSON line; needs neither TensorFlow nor seqio. This process is host 0 of `--hosts`, reading its rows
of global batches of `--batch` from DIR (made by `python -m gr_jax.tools.preprocess`) as training does
(`records.RecordBatches`, prefetched on one thread):
* `examples_per_second`: its rows read and made into features for `--seconds` (after the first batch);
* `resume_{near,far}_s`: a fresh reader's first batch at batch `--near` and at `--far`, alternated `--repeats` times
  (medians); `resume_far_over_near` is 1 when resuming does not depend on the step;
* `input_state_bytes`: the checkpoint's input item at batch `--far` as training writes it (the position, the
  stream's seed, batch and processes, the input fingerprint): all a resume reads;
* `peak_rss_mb` (after the reads) and `start_rss_mb` (after the imports and opening the files);
* `host_need_examples_per_second`: what one TPU v4 host (4 chips at 275 bf16 TFLOP/s each) consumes at 100% of peak
  with `--model_gin`'s T5.1.1 and the directory's lengths: 6 x the matmul parameters x the tokens, plus attention
  (`train_flops_per_example`): an upper bound, whatever the pod's size, since a host feeds its own chips.
  `headroom` = examples_per_second / that need (goal >= 3).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from typing import Any

from gr_jax.data import records

V4_CHIP_BF16_FLOPS = 275e12
V4_CHIPS_PER_HOST = 4


def train_flops_per_example(*, emb_dim: int, num_heads: int, head_dim: int, mlp_dim: int, num_encoder_layers: int,
                            num_decoder_layers: int, vocab_size: int, input_length: int, target_length: int) -> float:
    """Training FLOPs (forward + backward: 6 per parameter and token) of one T5.1.1 example: the encoder's matmuls on
    the inputs, the decoder's (self and cross attention, gated MLP) and the output logits on the targets, and the
    attention scores and their weighted sums."""
    attention = 4 * emb_dim * num_heads * head_dim
    mlp = 3 * emb_dim * mlp_dim  # gated GELU: two input kernels and one output kernel
    encoder = num_encoder_layers * (attention + mlp) * input_length
    decoder = (num_decoder_layers * (2 * attention + mlp) + emb_dim * vocab_size) * target_length
    width = num_heads * head_dim
    scores = 2 * width * (num_encoder_layers * input_length ** 2 + num_decoder_layers * (
        target_length ** 2 + target_length * input_length))
    return 6.0 * (encoder + decoder) + 3.0 * scores


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(*, directory: str, batch: int, hosts: int, seconds: float, near: int, far: int, repeats: int,
        model: dict[str, int], seed: int = 0) -> dict[str, Any]:
    if batch % hosts:
        raise SystemExit(f"--batch {batch} must be a multiple of --hosts {hosts}")
    if not 0 < near < far:
        raise SystemExit(f"0 < --near < --far needed, got {near} and {far}")
    manifest = records.Manifest.read(directory)
    description = manifest.description
    lengths = {"input_length": int(description["input_length"]), "target_length": int(description["target_length"])}

    def reader() -> records.RecordBatches:
        return records.RecordBatches(manifest=manifest, batch_size=batch, seed=seed, **lengths)

    start_rss = _rss_mb()
    resume: dict[int, list[float]] = {near: [], far: []}
    for _ in range(repeats):
        for start in (near, far):
            began = time.perf_counter()
            stream = reader().batches(start_batch=start, shard_index=0, num_shards=hosts)
            next(stream)
            resume[start].append(time.perf_counter() - began)
            stream.close()
    stream = reader().batches(start_batch=far, shard_index=0, num_shards=hosts)
    next(stream)
    rows = read = 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        rows += len(next(stream)["encoder_input_tokens"])
        read += 1
    elapsed = time.perf_counter() - began
    stream.close()
    state = {"batches_consumed": far, "seed": seed, "batch_size": batch, "num_processes": hosts,
             "inputs": description["input_fingerprint"]}  # what training's checkpoint input item holds
    flops = train_flops_per_example(**model, **lengths)
    need = V4_CHIPS_PER_HOST * V4_CHIP_BF16_FLOPS / flops
    rate = rows / elapsed
    near_s, far_s = statistics.median(resume[near]), statistics.median(resume[far])
    return {"benchmark": "input_records", "directory": directory, "examples": manifest.num_examples,
            "tasks": {task.task: task.num_examples for task in manifest.tasks}, "batch": batch, "hosts": hosts,
            "host_rows": batch // hosts, "batches_read": read, "examples_per_second": round(rate, 1),
            "resume_near_s": round(near_s, 4), "resume_far_s": round(far_s, 4),
            "resume_far_over_near": round(far_s / near_s, 3), "near": near, "far": far,
            "input_state_bytes": len(json.dumps(state)), "start_rss_mb": round(start_rss, 1),
            "peak_rss_mb": round(_rss_mb(), 1), "train_flops_per_example": flops,
            "host_need_examples_per_second": round(need, 1), "headroom": round(rate / need, 2)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--directory", required=True, help="preprocessed examples (python -m gr_jax.tools.preprocess)")
    parser.add_argument("--batch", type=int, default=512, help="global batch (the study's: 512)")
    parser.add_argument("--hosts", type=int, default=32, help="hosts sharing it (128 v4 chips, 4 a host: 32)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--near", type=int, default=100)
    parser.add_argument("--far", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model_gin", default="models/t5_1_1/xxl.gin", help="the T5.1.1 size the host feeds")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from gr_jax import gin_utils
    config = gin_utils.t5_config([args.model_gin])
    model = {name: int(getattr(config, name)) for name in ("emb_dim", "num_heads", "head_dim", "mlp_dim",
                                                           "num_encoder_layers", "num_decoder_layers")}
    model["vocab_size"] = int(config.vocab_size or 32128)
    print(json.dumps(run(directory=args.directory, batch=args.batch, hosts=args.hosts, seconds=args.seconds,
                         near=args.near, far=args.far, repeats=args.repeats, model=model)), flush=True)


if __name__ == "__main__":
    main()
