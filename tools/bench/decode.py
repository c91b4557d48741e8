"""Decoding benchmark, part 2: the cost of the docid constraint, and the trie build at MS MARCO scale.

python -m tools.bench.decode --part constraint [--num-docids 1000000 --vocab-size 2048 --docid-length 8
                                                --batch 2 --beams 70 --sparse-fanout 30 --repeats 10]
python -m tools.bench.decode --part build [--num-docids 8841823 --vocab path/to/spm.model]

`constraint`: random logits stand in for the model (a step_fn returning fixed random logits per
position), so only the search and its constraint are timed. One jitted beam search uses our array trie
(`gr_jax.trie`); the other is the research-code pattern: the same beam search, unconstrained, with a
step_fn that asks the host for the allowed-token mask at every step (`jax.pure_callback` walking a
nested-dict trie per beam, as GENRE's `Trie.get` behind HF's `prefix_allowed_tokens_fn`). Both are
compiled first and timed alternately in one process; medians are reported with their ratio
(host callback / ours; target >= 50x) and the trie's build seconds and bytes. One JSON line per
`--beams` value; `unconstrained_search_s` times the same search without any constraint.

`build`: the trie of 8.8M MS MARCO-style naive docids (pids 0..8841822 as digit strings, tokenised by
the SentencePiece model given with --vocab, else one token per digit). Target: < 2 minutes, a few
hundred MB. One JSON line.
"""
from __future__ import annotations

import argparse
import functools
import json
import resource
import statistics
import time
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.decoding import beam_search
from gr_jax.docids import naive_docid_table
from gr_jax.trie import Trie
from gr_jax.vocabulary import EOS_ID

MSMARCO_PASSAGES = 8_841_823


def random_docid_rows(rng: np.random.Generator, *, num_docids: int, vocab_size: int, length: int) -> np.ndarray:
    """int32[num_docids, length + 1]: distinct random docids of `length` content tokens, then EOS."""
    content = np.unique(rng.integers(2, vocab_size, (num_docids, length), dtype=np.int32), axis=0)
    while len(content) < num_docids:  # collisions are rare; top up
        extra = rng.integers(2, vocab_size, (num_docids - len(content), length), dtype=np.int32)
        content = np.unique(np.concatenate([content, extra]), axis=0)
    content = content[rng.permutation(num_docids)]
    return np.concatenate([content, np.full((num_docids, 1), EOS_ID, np.int32)], axis=1)


def dict_trie(rows: np.ndarray) -> dict:
    """The research-code trie: nested dicts token -> subtree (GENRE's `Trie`)."""
    root: dict = {}
    for row in rows.tolist():
        node = root
        for token in row:
            node = node.setdefault(token, {})
            if token == EOS_ID:
                break
    return root


def host_allowed_mask(root: dict, vocab_size: int, prefixes: np.ndarray, position: np.ndarray) -> np.ndarray:
    """bool[rows, vocab]: per beam, walk the decoded prefix from the root and allow the node's children."""
    mask = np.zeros((prefixes.shape[0], vocab_size), bool)
    for i, prefix in enumerate(prefixes[:, :int(position)].tolist()):
        node = root
        for token in prefix:
            node = node.get(token)
            if node is None:
                break
        if node:
            mask[i, list(node)] = True
    return mask


def _time_once(fn, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def _max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_constraint(*, num_docids: int, vocab_size: int, docid_length: int, batch: int, beams: int,
                   sparse_fanout: int, repeats: int, rows: np.ndarray, trie: Trie, build_s: float,
                   host_trie: dict, host_build_s: float, seed: int) -> dict:
    rows_n = batch * beams
    max_decode_len = docid_length + 1
    logits_table = jax.random.normal(jax.random.PRNGKey(seed), (max_decode_len, rows_n, vocab_size), jnp.float32) * 3

    def random_logits(tokens, position, cache):
        return logits_table[position], cache

    ours = jax.jit(functools.partial(beam_search, step_fn=random_logits, batch_size=batch, num_beams=beams,
                                     max_decode_len=max_decode_len))

    def host_constrained(tokens, position, cache):
        prefix = cache["prefix"].at[:, jnp.maximum(position - 1, 0)].set(
            jnp.where(position > 0, tokens, cache["prefix"][:, 0]))
        mask = jax.pure_callback(functools.partial(host_allowed_mask, host_trie, vocab_size),
                                 jax.ShapeDtypeStruct((rows_n, vocab_size), jnp.bool_), prefix, position)
        return jnp.where(mask, logits_table[position], -1e9), {"prefix": prefix}

    host = jax.jit(functools.partial(beam_search, step_fn=host_constrained, batch_size=batch, num_beams=beams,
                                     max_decode_len=max_decode_len))
    host_cache = {"prefix": jnp.zeros((rows_n, max_decode_len), jnp.int32)}

    start = time.perf_counter()
    ours_result = jax.block_until_ready(ours(cache={}, trie=trie))
    ours_first_call_s = time.perf_counter() - start
    host_result = jax.block_until_ready(host(cache=host_cache))
    jax.block_until_ready(ours(cache={}, trie=None))  # the same search without any constraint, for reference

    ours_times, host_times, unconstrained_times = [], [], []
    for _ in range(repeats):
        ours_times.append(_time_once(lambda: ours(cache={}, trie=trie)))
        host_times.append(_time_once(lambda: host(cache=host_cache)))
        unconstrained_times.append(_time_once(lambda: ours(cache={}, trie=None)))
    ours_s, host_s = statistics.median(ours_times), statistics.median(host_times)

    leaves = np.asarray(trie.leaf_indices(ours_result.sequences.reshape(rows_n, max_decode_len)))
    host_found = np.asarray(host_result.scores).reshape(-1) > -1e8  # beams that never took a masked token
    host_leaves = np.asarray(trie.leaf_indices(host_result.sequences.reshape(rows_n, max_decode_len)))
    return {
        "part": "constraint",
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
        "num_docids": num_docids,
        "vocab_size": vocab_size,
        "docid_length": docid_length,
        "batch": batch,
        "beams": beams,
        "sparse_fanout": sparse_fanout,
        "trie_max_fanout": trie.max_fanout,
        "trie_states": trie.num_states,
        "trie_build_s": round(build_s, 3),
        "trie_bytes": trie.nbytes,
        "docid_table_bytes": int(rows.nbytes),
        "dict_trie_build_s": round(host_build_s, 3),
        "ours_first_call_s": round(ours_first_call_s, 3),
        "ours_search_s": ours_s,
        "host_callback_search_s": host_s,
        "unconstrained_search_s": statistics.median(unconstrained_times),
        "ratio_host_callback_over_ours": round(host_s / ours_s, 2),
        "ours_valid_docid_fraction": float((leaves >= 0).mean()),
        "host_callback_valid_docid_fraction": float((host_leaves[host_found] >= 0).mean()),
        "repeats": repeats,
    }


def digit_encoder(text: str) -> list[int]:
    """One token per digit, '0' -> 3 .. '9' -> 12 (the ids after PAD, EOS, UNK)."""
    return list(text.encode("ascii").translate(_DIGIT_TOKENS))


_DIGIT_TOKENS = bytes.maketrans(b"0123456789", bytes(range(3, 13)))


def run_build(*, num_docids: int, vocab: str | None, sparse_fanout: int) -> dict:
    docids = [str(pid) for pid in range(num_docids)]
    start = time.perf_counter()
    if vocab:
        import sentencepiece as spm  # noqa: PLC0415 (only this mode needs it)

        processor = spm.SentencePieceProcessor(model_file=vocab)
        table = naive_docid_table(docids=docids, encode=processor.encode, batched=True)
        vocab_size = processor.get_piece_size()
    else:
        table = naive_docid_table(docids=docids, encode=digit_encoder)
        vocab_size = 13
    tokenize_s = time.perf_counter() - start
    jax.block_until_ready(jnp.zeros(1))  # start the backend outside the timing
    tracemalloc.start()  # numpy's host allocations during the build; the trie's device arrays are trie_bytes
    start = time.perf_counter()
    trie = Trie.build(table.tokens, vocab_size=vocab_size, sparse_fanout=sparse_fanout)
    jax.block_until_ready(trie)
    build_s = time.perf_counter() - start
    build_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {
        "part": "build",
        "num_docids": num_docids,
        "encoder": vocab or "digits",
        "vocab_size": vocab_size,
        "max_length": table.max_length,
        "tokenize_s": round(tokenize_s, 2),
        "docid_table_bytes": int(table.tokens.nbytes),
        "trie_build_s": round(build_s, 2),
        "trie_bytes": trie.nbytes,
        "trie_states": trie.num_states,
        "trie_max_fanout": trie.max_fanout,
        "trie_build_peak_host_bytes": build_peak,
        "process_peak_rss_bytes": _max_rss_bytes(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("constraint", "build"), required=True)
    parser.add_argument("--num-docids", type=int, default=None,
                        help="default: 1,000,000 (constraint) or 8,841,823 (build)")
    parser.add_argument("--vocab-size", type=int, default=2048, help="constraint: vocabulary of the random docids")
    parser.add_argument("--docid-length", type=int, default=8, help="constraint: tokens per docid before EOS")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--beams", type=int, nargs="+", default=[70])
    parser.add_argument("--sparse-fanout", type=int, default=30, help="the trie's K: children expanded per beam")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", default=None, help="build: a SentencePiece model (default: one token per digit)")
    args = parser.parse_args(argv)

    if args.part == "build":
        print(json.dumps(run_build(num_docids=args.num_docids or MSMARCO_PASSAGES, vocab=args.vocab,
                                   sparse_fanout=args.sparse_fanout)), flush=True)
        return
    num_docids = args.num_docids or 1_000_000
    rows = random_docid_rows(np.random.default_rng(args.seed), num_docids=num_docids, vocab_size=args.vocab_size,
                             length=args.docid_length)
    jax.block_until_ready(jnp.zeros(1))  # start the backend outside the timing
    start = time.perf_counter()
    trie = jax.block_until_ready(Trie.build(rows, vocab_size=args.vocab_size, sparse_fanout=args.sparse_fanout))
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    host_trie = dict_trie(rows)
    host_build_s = time.perf_counter() - start
    for beams in args.beams:
        print(json.dumps(run_constraint(
            num_docids=num_docids, vocab_size=args.vocab_size, docid_length=args.docid_length, batch=args.batch,
            beams=beams, sparse_fanout=args.sparse_fanout, repeats=args.repeats, rows=rows, trie=trie,
            build_s=build_s, host_trie=host_trie, host_build_s=host_build_s, seed=args.seed)), flush=True)


if __name__ == "__main__":
    main()
