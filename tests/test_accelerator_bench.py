"""tools/bench/accelerator: the kit a GPU or TPU host runs in one call, checked at its tiny size on CPU, in a process
where TensorFlow and seqio cannot be imported (the accelerator image has neither)."""
import json
import os
import subprocess
import sys

from gr_jax import gin_utils
from gr_jax.tools.bench import accelerator

BLOCKED = ("import sys; sys.modules['tensorflow'] = None; sys.modules['seqio'] = None; "
           "from gr_jax.tools.bench import accelerator; sys.exit(accelerator.main(['--size', 'tiny']))")


def test_every_part_reports_its_line_without_tensorflow_or_seqio():
    done = subprocess.run([sys.executable, "-c", BLOCKED], capture_output=True, text=True, env=dict(os.environ),
                          timeout=None)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = {line["benchmark"]: line for line in map(json.loads, done.stdout.splitlines())}
    assert list(lines) == list(accelerator.PARTS)
    size = accelerator.SIZES["tiny"]
    for name in ("train_step", "decoder_only_step"):
        assert lines[name]["ratio"] > 0 and lines[name]["step_flops"] > 0, lines[name]
        assert lines[name]["probe_dtype"] == size.dtype
    micro = gin_utils.decoder_only_config([size.decoder_only_gin], vocab_size=size.decoder_only_vocab)
    assert lines["decoder_only_step"]["params"] == micro.non_embedding_params() + 512 * micro.emb_dim  # tied
    t5 = gin_utils.t5_config([size.t5_gin], vocab_size=size.vocab)
    # The atomic head adds one [embed, columns] matrix over the docids (padded to a multiple of 128) to T5's
    # network, whose own output layer it replaces.
    columns = -(-size.atomic_docids // 128) * 128
    assert lines["atomic_step"]["params"] - lines["train_step"]["params"] == t5.emb_dim * (columns - size.vocab)
    assert lines["atomic_step"]["loss_finite"] and lines["atomic_step"]["docids"] == size.atomic_docids
    for name in ("search", "decoder_only_search"):
        assert lines[name]["constrained_ms_per_query"] > 0 and lines[name]["unconstrained_ms_per_query"] > 0
    assert lines["dense_encode"]["documents_per_s"] > 0
    assert all("error" not in line for line in lines.values())
