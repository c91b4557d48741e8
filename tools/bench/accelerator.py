"""The accelerator benchmark kit: one command that measures what a GPU or TPU host must be measured on, as JSON lines.

    python -m gr_jax.tools.bench.accelerator [--size full|tiny|cpu] [--parts train_step decoder_only_step ...]

Parts (each one JSON line, `"benchmark"` naming it; a part that fails prints its error line and the others still
run, and the command then exits 1):

* `train_step`: T5.1.1-Base, bf16 parameters and activations, Adafactor: model FLOP/s over a bf16 matmul probe
  timed alternately in the same process (`ratio`, the MFU against the probe; the goal on an H100/H200 is >= 0.45).
* `decoder_only_step`: the same for a Qwen3-0.6B-shaped decoder-only model (random weights, bf16).
* `atomic_step`: T5.1.1-Base with the atomic head over the study's 8,841,823 docids, on one device.
* `search`: trie-constrained against unconstrained beam search, per query, over 1M random docids of 8 tokens.
* `decoder_only_search`: the same search with the Qwen3-0.6B-shaped model (the query block prefilled once).
* `dense_encode`: documents/s of the T5.1.1-Base document encoder (single vector), and its FLOP/s over the probe.

`--size tiny` runs every part with micro models and small counts (the test suite runs it on CPU); `full` (the
default off CPU) is the accelerator's; `cpu` pairs the scaling grid's p16m T5 and decoder-only models for a CPU
host. Needs neither TensorFlow nor seqio. Figures go to docs/performance.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax import gin_utils
from gr_jax import partitioning
from gr_jax.decoder_only.model import DecoderOnlyModel
from gr_jax.docids.trie import Trie
from gr_jax.heads import AtomicHead
from gr_jax.models import EncoderDecoderModel
from gr_jax.tools.bench import dense as dense_bench
from gr_jax.tools.bench import train_step as train_step_bench
from gr_jax.tools.bench.decode import random_docid_rows

T5_VOCAB = 32128
MSMARCO_PASSAGES = 8_841_823


@dataclasses.dataclass(frozen=True)
class Size:
    """What each part runs at: the accelerator's figures (`full`) or a CPU check of the kit (`tiny`)."""
    t5_gin: str
    vocab: int  # the T5 models' text vocabulary (T5's 32,128; the atomic docids come after it)
    decoder_only_gin: str
    decoder_only_vocab: int
    batch: int
    inputs: int
    targets: int
    atomic_docids: int
    atomic_batch: int
    search_docids: int
    search_batch: int
    beams: int
    encode_batch: int
    encode_length: int
    steps: int
    probe_size: int
    dtype: str


SIZES = {
    "full": Size(t5_gin="models/t5_1_1/base.gin", vocab=T5_VOCAB, decoder_only_gin="decoder_only/qwen3_0_6b.gin",
                 decoder_only_vocab=151936, batch=128, inputs=64, targets=16, atomic_docids=MSMARCO_PASSAGES,
                 atomic_batch=64, search_docids=1_000_000, search_batch=16, beams=40, encode_batch=256,
                 encode_length=128, steps=10, probe_size=8192, dtype="bfloat16"),
    "tiny": Size(t5_gin="models/t5_1_1/p100k.gin", vocab=512, decoder_only_gin="decoder_only/micro.gin",
                 decoder_only_vocab=512, batch=8, inputs=16, targets=4, atomic_docids=1_000, atomic_batch=8,
                 search_docids=1_000, search_batch=2, beams=4, encode_batch=8, encode_length=16, steps=1,
                 probe_size=128, dtype="float32"),
    # The decoder-only and T5 steps of one scaling-grid size side by side on a CPU host (docs/decoder_only.md,
    # experiment 3): `--size cpu --parts train_step decoder_only_step`.
    "cpu": Size(t5_gin="models/t5_1_1/p16m.gin", vocab=2048, decoder_only_gin="decoder_only/p16m.gin",
                decoder_only_vocab=2048, batch=32, inputs=32, targets=8, atomic_docids=10_000, atomic_batch=32,
                search_docids=10_000, search_batch=4, beams=10, encode_batch=32, encode_length=32, steps=7,
                probe_size=1024, dtype="float32"),
}


def _device() -> dict:
    return {"platform": jax.default_backend(), "device": str(jax.devices()[0].device_kind),
            "devices": jax.device_count()}


def _t5_config(size: Size):
    return gin_utils.t5_config([size.t5_gin], vocab_size=size.vocab, dtype=size.dtype, param_dtype=size.dtype,
                               dropout_rate=0.0)


def train_step(size: Size) -> dict:
    return train_step_bench.run(config=_t5_config(size), batch=size.batch, inputs=size.inputs, targets=size.targets,
                                steps=size.steps, optimizer="adafactor", probe_size=size.probe_size,
                                probe_dtype=size.dtype)


def decoder_only_step(size: Size) -> dict:
    result = train_step_bench.run_model(model=DecoderOnlyModel(config=_decoder_only_config(size)),
                                        vocab_size=size.decoder_only_vocab,
                                        dtype=size.dtype, param_dtype=size.dtype, batch=size.batch,
                                        inputs=size.inputs, targets=size.targets, steps=size.steps,
                                        optimizer="adafactor", probe_size=size.probe_size, probe_dtype=size.dtype)
    return {**result, "benchmark": "decoder_only_step", "config": size.decoder_only_gin}


def atomic_step(size: Size) -> dict:
    """The atomic head's train step on one device: the docid columns are most of the parameters."""
    config = _t5_config(size)
    head = AtomicHead(docid_vocab_start=size.vocab, docid_vocab_size=size.atomic_docids)
    model = EncoderDecoderModel(config=config, head=head)
    one = partitioning.make_mesh(data=1, model=1, devices=jax.devices()[:1])
    result = _timed_step(model, mesh=one, size=size, vocab_size=size.vocab, targets=2,
                         target_tokens=lambda rng, n: np.stack(
                             [size.vocab + rng.integers(0, size.atomic_docids, n), np.ones(n, np.int64)], 1))
    return {"benchmark": "atomic_step", "docids": size.atomic_docids, **result}


def _timed_step(model, *, mesh, size: Size, vocab_size: int, targets: int,
                target_tokens: Callable[[np.random.Generator, int], np.ndarray]) -> dict:
    from gr_jax import optimizers
    from gr_jax.trainer import Trainer
    trainer = Trainer(model=model, optimizer=optimizers.make_optimizer(name="adafactor", learning_rate=1e-3),
                      mesh=mesh, input_length=size.inputs, target_length=targets, batch_size=size.atomic_batch)
    rng = np.random.default_rng(0)
    target = target_tokens(rng, size.atomic_batch).astype(np.int32)
    batch = {"encoder_input_tokens": rng.integers(2, vocab_size, (size.atomic_batch, size.inputs), dtype=np.int32),
             "decoder_target_tokens": target, "decoder_input_tokens": np.pad(target[:, :-1], ((0, 0), (1, 0))),
             "decoder_loss_weights": np.ones_like(target)}
    state = trainer.init_state(jax.random.PRNGKey(0))
    key = jax.random.PRNGKey(1)
    start = time.perf_counter()
    state, metrics = trainer.train_step(state, batch, key)
    jax.block_until_ready(metrics["loss"].total)
    first = time.perf_counter() - start
    times = []
    for _ in range(size.steps):
        start = time.perf_counter()
        state, metrics = trainer.train_step(state, batch, key)
        jax.block_until_ready(metrics["loss"].total)
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    return {"params": trainer.param_count(), "batch": size.atomic_batch, "inputs": size.inputs,
            "dtype": size.dtype, "first_step_s": round(first, 3), "steps_per_s": 1.0 / step_s,
            "loss_finite": bool(np.isfinite(float(metrics["loss"].compute()))), **_device()}


def _decoder_only_config(size: Size):
    return gin_utils.decoder_only_config([size.decoder_only_gin], vocab_size=size.decoder_only_vocab,
                                         dtype=size.dtype, param_dtype=size.dtype)


def _search(model: Any, *, size: Size, benchmark: str) -> dict:
    """Per-query time of `model`'s trie-constrained beam search over random docids against the same search without
    the trie, both compiled first; the first constrained call's time (compilation included) too."""
    rows = random_docid_rows(np.random.default_rng(0), num_docids=size.search_docids, vocab_size=size.vocab,
                             length=8)
    trie = Trie.build(rows, vocab_size=model.logits_vocab_size)
    params = partitioning.strip_boxes(jax.jit(functools.partial(model.init, input_length=size.inputs,
                                                                target_length=9))(jax.random.PRNGKey(0))["params"])
    queries = jnp.asarray(np.random.default_rng(1).integers(2, size.vocab, (size.search_batch, size.inputs)),
                          jnp.int32)

    def searcher(constrained: bool):
        return jax.jit(lambda p, q, t: model.predict_batch(p, q, num_beams=size.beams, max_decode_len=9,
                                                           trie=t if constrained else None))

    out: dict[str, Any] = {"benchmark": benchmark, "docids": size.search_docids, "batch": size.search_batch,
                           "beams": size.beams, "dtype": size.dtype}
    for name, constrained in (("constrained", True), ("unconstrained", False)):
        fn = searcher(constrained)
        start = time.perf_counter()
        jax.block_until_ready(fn(params, queries, trie))
        out[f"{name}_first_call_s"] = round(time.perf_counter() - start, 3)
        times = []
        for _ in range(size.steps):
            start = time.perf_counter()
            jax.block_until_ready(fn(params, queries, trie))
            times.append(time.perf_counter() - start)
        out[f"{name}_ms_per_query"] = 1000 * statistics.median(times) / size.search_batch
    out["constrained_over_unconstrained"] = out["constrained_ms_per_query"] / out["unconstrained_ms_per_query"]
    return {**out, **_device()}


def search(size: Size) -> dict:
    """The T5.1.1 model's search (`_search`)."""
    return _search(EncoderDecoderModel(config=_t5_config(size)), size=size, benchmark="search")


def decoder_only_search(size: Size) -> dict:
    """The Qwen3-0.6B-shaped model's search (`_search`): the query block prefilled once, then the docid steps."""
    return {**_search(DecoderOnlyModel(config=_decoder_only_config(size)), size=size,
                      benchmark="decoder_only_search"), "config": size.decoder_only_gin}


def dense_encode(size: Size) -> dict:
    tower = dense_bench.T5EncoderTower(config=_t5_config(size))
    result = dense_bench.run_encode(tower=tower, name="t5", vocab_size=size.vocab, batch=size.encode_batch,
                                    length=size.encode_length, repeats=size.steps, probe_size=size.probe_size,
                                    probe_dtype=size.dtype)
    return {**result, "benchmark": "dense_encode"}


PARTS: dict[str, Callable[[Size], dict]] = {
    "train_step": train_step, "decoder_only_step": decoder_only_step, "atomic_step": atomic_step,
    "search": search, "decoder_only_search": decoder_only_search, "dense_encode": dense_encode}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default=None,
                        help="full (default on accelerators) or tiny (default on CPU)")
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    args = parser.parse_args(argv)
    size = SIZES[args.size or ("tiny" if jax.default_backend() == "cpu" else "full")]
    failed = False
    for name in args.parts:
        start = time.perf_counter()
        try:
            line = PARTS[name](size)
        except Exception as e:  # one part's failure must not cost the others' device time
            failed = True
            traceback.print_exc(file=sys.stderr)
            line = {"benchmark": name, "error": f"{type(e).__name__}: {e}"}
        line["part_seconds"] = round(time.perf_counter() - start, 2)
        print(json.dumps(line), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
