"""Our constrained beam search against STATIC (youtube/static-constraint-decoding), in one process.

python -m gr_jax.tools.bench.static_decode --static_dir /tmp/static_src [--num-docids 1000000 --vocab-size 2048
    --docid-length 8 --batch 2 --beams 70 --sparse-fanout 30 --rounds 7 --calls 5 --logit-scale 3
    --stand-in bigram --table-rows 64]

STATIC's code is not copied here: `--static_dir` is a checkout of its repository (`git clone
https://github.com/youtube/static-constraint-decoding`), put on `sys.path`, and its own index builder
(`static_decoding.csr_utils.build_static_index`, dense specialisation of the first 2 levels as its benchmark) and
decoder (`static_decoding.decoding_jax.sparse_transition_jax`, its benchmark's arguments: `tokens_per_beam` =
`--sparse-fanout`, start token 0) run as they are. Only its stand-in model is replaced.

The setting is STATIC's benchmark's (Appendix Table 4 of its paper): N random docids of L tokens over a V-token
vocabulary, batch 2, 70 beams, 30 candidates per beam. STATIC's generator draws `np.random.randint(0, V, (N, L))`;
here the docids are `decode.random_docid_rows` (the same uniform draw over tokens 2..V-1, since 0 and 1 are our
PAD and EOS, with duplicates redrawn), then EOS for our trie; STATIC gets the same L content tokens, sorted as its
builder requires.

The stand-in model is a fixed table of random logits, N(0, 1) * `--logit-scale`, so that only decoding is timed
(STATIC's own benchmark draws fresh uniform logits with the RNG at every step, which would time the RNG). Two
layouts (`StandIn`): `bigram` (default), float32[batch, L + 1, R, V], a row's logits at position p being
table[query, p, previous token % R] (`--table-rows` R, 64: a small table, so that the model's cost is a cheap
gather): logits that depend on the prefix make every docid's score one number, the same for both searches. And
`per-position`, float32[L + 1, batch * beams, V], row r's logits at position p being table[p, r] (the stand-in of
`decode --part constraint`: the model is a slice). Both searches take the full-vocabulary log-softmax at every
step (the model returns logits) and call the same model (STATIC's first call has one row per query, ours all
rows, of which the search reads beam 0's). The docids each returns are compared with an untruncated beam search
in numpy (`reference_beam_search`, which also counts the second-level beams STATIC's per-beam cut would drop).

Objectives. STATIC scores a docid by the log-probs of its L tokens: it has no end-of-docid token. Ours scores
the model's log-likelihood of the docid and its EOS, unless `score_forced_eos=False`, where an EOS that the trie
forces (the prefix is a docid no other docid extends) costs nothing: with docids of one length that is STATIC's
objective, and our search then spends no model step on EOS (L steps, as STATIC). `ours` below is that search,
compared with STATIC for time and docids; `ours_eos` is our default objective (L + 1 model steps), timed too and
compared with the reference search of its own objective.

Timing: each search is compiled, then `--rounds` rounds each time every search `--calls` times, interleaved
call by call; a round's ratio is the ratio of its medians. One JSON line: the per-round ratios, their median,
the median times, per-step ratios (search time / model steps), and the docid agreement.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import pathlib
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax import entry_point
from gr_jax.decoding import beam_search
from gr_jax.docids.trie import Trie
from gr_jax.tools.bench.decode import random_docid_rows
from gr_jax.vocabulary import EOS_ID, PAD_ID


def import_static(static_dir: str):
    """(build_static_index, sparse_transition_jax, the checkout's commit) from a STATIC checkout."""
    path = pathlib.Path(static_dir).resolve()
    if not (path / "static_decoding" / "decoding_jax.py").exists():
        raise FileNotFoundError(f"{path} is not a checkout of youtube/static-constraint-decoding "
                                "(no static_decoding/decoding_jax.py)")
    sys.path.insert(0, str(path))
    from static_decoding.csr_utils import build_static_index  # noqa: PLC0415
    from static_decoding.decoding_jax import sparse_transition_jax  # noqa: PLC0415
    try:
        commit = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        commit = None
    return build_static_index, sparse_transition_jax, commit


class StandIn:
    """The stand-in model: a fixed table of random logits, N(0, 1) * scale, given to both searches as an argument
    (not a constant baked into the compiled search).

    `bigram`: float32[batch, L + 1, R, V]; a row's logits at position p are table[query, p, previous token % R], a
    function of the query and the prefix, so every docid has one score and both searches rank the same thing.
    `per-position`: float32[L + 1, batch * beams, V]; row r's logits at position p are table[p, r] whatever its
    prefix, the `decode --part constraint` stand-in (slicing is all the model does; a docid's score depends on
    the beam slot that decodes it, and both searches keep their beams best first, so slots match while the
    searches agree). STATIC's first call has one row per query: it gets each query's beam-0 row.
    """

    def __init__(self, kind: str, *, batch: int, beams: int, length: int, vocab: int, rows: int, scale: float,
                 seed: int):
        self.kind, self.batch, self.beams = kind, batch, beams
        shape = (batch, length + 1, rows, vocab) if kind == "bigram" else (length + 1, batch * beams, vocab)
        self.table = jax.block_until_ready(jax.random.normal(jax.random.PRNGKey(seed), shape) * scale)

    def logits(self, table: jax.Array, previous: jax.Array, position: jax.Array) -> jax.Array:
        """float32[rows, V] for `rows` = batch * b batch-major rows, b = 1 or beams (previous: int32[rows])."""
        rows = previous.shape[0]
        if self.kind == "bigram":
            return table[jnp.arange(rows) // (rows // self.batch), position, previous % table.shape[2]]
        sliced = table[position]
        if rows == self.batch * self.beams:
            return sliced
        return sliced.reshape(self.batch, self.beams, -1)[:, :rows // self.batch].reshape(rows, -1)

    def reference_log_probs(self, log_probs: np.ndarray, query: int, position: int, previous: np.ndarray,
                            parent_ranks: np.ndarray, tokens: np.ndarray | int) -> np.ndarray:
        """float32[n]: log p(token) for n prefixes (previous token, rank of the beam holding the prefix), from the
        table's log-softmax `log_probs`."""
        if self.kind == "bigram":
            return log_probs[query, position, previous % log_probs.shape[2], tokens]
        return log_probs[position, query * self.beams + parent_ranks, tokens]


class StaticModel:
    """STATIC's model interface, `model(input_ids [rows, 1], key) -> (logits [rows, 1, V], key)`, over the stand-in.
    The `key` STATIC threads through its loop carries (table, position) instead of a PRNG key."""

    def __init__(self, stand_in: StandIn):
        self.stand_in = stand_in

    def __call__(self, input_ids: jax.Array, key: tuple[jax.Array, jax.Array]):
        table, position = key
        return self.stand_in.logits(table, input_ids[:, 0], position)[:, None, :], (table, position + 1)


def prefix_ids(docids: np.ndarray) -> np.ndarray:
    """int64[N, L + 1]: column d numbers the distinct d-token prefixes (0 for the empty one), built level by
    level from (previous id, token) pairs: a plain reference, independent of the trie code."""
    ids = np.zeros((docids.shape[0], docids.shape[1] + 1), np.int64)
    for d in range(docids.shape[1]):
        _, ids[:, d + 1] = np.unique(ids[:, d] * (int(docids.max()) + 1) + docids[:, d], return_inverse=True)
    return ids


def reference_beam_search(stand_in: StandIn, log_probs: np.ndarray, docids: np.ndarray, ids: np.ndarray, *,
                          with_eos: bool, cut: int) -> tuple[np.ndarray, list[int]]:
    """(int[batch, beams] docid rows best first, per query the number of level-2 beams beyond `cut`): the
    untruncated beam search, in float64 numpy.

    Each level keeps the `beams` best prefixes among *all* children of the kept ones; after the last token the
    kept docids are ranked by their score, plus log p(EOS | docid) if `with_eos` (every docid has L tokens, so EOS
    is the only continuation and every kept beam finishes there). The second number counts the beams kept at the
    second level that are not among their parent's `cut` best children: STATIC's dense step keeps only those
    (`tokens_per_beam`), so where it is 0 STATIC's search is the untruncated one."""
    batch, beams, length = stand_in.batch, stand_in.beams, docids.shape[1]
    found, beyond_cut = np.zeros((batch, beams), np.int64), []
    for query in range(batch):
        kept, kept_scores, kept_ranks = np.array([0]), np.array([0.0]), np.array([0])  # sorted by prefix id
        for d in range(length):
            rows = np.flatnonzero(np.isin(ids[:, d], kept))
            children, first = np.unique(ids[rows, d + 1], return_index=True)
            rows = rows[first]  # one row per child prefix
            parent = np.searchsorted(kept, ids[rows, d])
            previous = docids[rows, d - 1] if d else np.full(len(rows), PAD_ID)
            scores = kept_scores[parent] + stand_in.reference_log_probs(log_probs, query, d, previous,
                                                                         kept_ranks[parent], docids[rows, d])
            best = np.argsort(-scores, kind="stable")[:beams]
            if d == 1:  # each kept child's rank among its siblings
                sibling_rank = np.array([np.sum((parent == parent[i]) & (scores > scores[i])) for i in best])
                beyond_cut.append(int(np.sum(sibling_rank >= cut)))
            order = np.argsort(children[best])
            kept, kept_scores, kept_rows = children[best][order], scores[best][order], rows[best][order]
            kept_ranks = order  # the slot (rank) of each kept prefix: both searches keep their beams best first
        if with_eos:
            kept_scores = kept_scores + stand_in.reference_log_probs(log_probs, query, length, docids[kept_rows, -1],
                                                                     kept_ranks, EOS_ID)
        found[query] = kept_rows[np.argsort(-kept_scores, kind="stable")]
    return found, beyond_cut


def bigram_scores(log_probs: np.ndarray, docids: np.ndarray, *, with_eos: bool) -> np.ndarray:
    """float64[batch, N]: each query's log-likelihood of every docid under the bigram stand-in's log-probs."""
    batch, rows, length = log_probs.shape[0], log_probs.shape[2], docids.shape[1]
    previous = np.concatenate([np.full((len(docids), 1), PAD_ID, docids.dtype), docids[:, :-1]], axis=1)
    scores = np.zeros((batch, len(docids)))
    for query in range(batch):
        for position in range(length):
            scores[query] += log_probs[query, position, previous[:, position] % rows, docids[:, position]]
        if with_eos:
            scores[query] += log_probs[query, length, docids[:, -1] % rows, EOS_ID]
    return scores


def top_k_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """int[batch, k]: the rows of the k best scores per query, best first."""
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1, kind="stable")
    return np.take_along_axis(top, order, axis=1)


def agreement(found: np.ndarray, reference: np.ndarray) -> dict:
    """found, reference: int[batch, k] docid rows (-1: not a docid), best first."""
    k = found.shape[1]
    return {
        "valid_fraction": float((found >= 0).mean()),
        "overlap_per_query": [len(set(f.tolist()) & set(r.tolist())) / k for f, r in zip(found, reference)],
        "same_ranked_lists": int(sum(np.array_equal(f, r) for f, r in zip(found, reference))),
    }


def warm_up_compiler() -> None:
    """Compiles and runs a small program of the searches' kinds of operation (a while loop, a switch, top-k, gathers),
    so that JAX's and XLA's one-time set-up is not charged to whichever search's first call comes first."""
    def program(x: jax.Array) -> jax.Array:
        def body(carry):
            i, y = carry
            values, picked = jax.lax.top_k(y, 4)
            y = jax.lax.switch(i % 2, [lambda: y + values.sum(),
                                       lambda: y + jnp.take_along_axis(y, picked, axis=1).sum()])
            return i + 1, y
        return jax.lax.while_loop(lambda carry: carry[0] < 3, body, (jnp.int32(0), x))[1]

    jax.block_until_ready(jax.jit(program)(jnp.ones((2, 16))))


def run(args: argparse.Namespace) -> dict:
    build_static_index, sparse_transition_jax, commit = import_static(args.static_dir)
    batch, beams, vocab, length = args.batch, args.beams, args.vocab_size, args.docid_length
    rows = random_docid_rows(np.random.default_rng(args.seed), num_docids=args.num_docids, vocab_size=vocab,
                             length=length)
    content = rows[:, :length]
    jax.block_until_ready(jnp.zeros(1))  # start the backend outside the timings

    start = time.perf_counter()
    trie = jax.block_until_ready(Trie.build(rows, vocab_size=vocab, sparse_fanout=args.sparse_fanout))
    trie_build_s = time.perf_counter() - start
    start = time.perf_counter()
    order = np.lexsort([content[:, i] for i in range(length - 1, -1, -1)])
    packed_csr, indptr, branches, start_mask, dense_mask, dense_states = build_static_index(
        content[order], vocab, dense_lookup_layers=2)
    static_index = tuple(map(jnp.asarray, (packed_csr, indptr, start_mask, dense_mask, dense_states)))
    jax.block_until_ready(static_index)
    static_build_s = time.perf_counter() - start

    stand_in = StandIn(args.stand_in, batch=batch, beams=beams, length=length, vocab=vocab,
                       rows=args.table_rows or vocab, scale=args.logit_scale, seed=args.seed)
    table = stand_in.table

    def step_fn_of(table: jax.Array):
        return lambda tokens, position, cache: (stand_in.logits(table, tokens, position), cache)

    def ours_search(table, trie, *, score_forced_eos: bool):
        return beam_search(step_fn=step_fn_of(table), cache={}, batch_size=batch, num_beams=beams,
                           max_decode_len=length + 1, trie=trie, score_forced_eos=score_forced_eos)

    static_call = functools.partial(
        sparse_transition_jax, StaticModel(stand_in), batch_size=batch, beam_size=beams,
        tokens_per_beam=args.sparse_fanout, start_token=0, max_sample_len=length, vocab_size=vocab,
        max_branch_factors=branches, packed_csr=static_index[0], csr_indptr=static_index[1],
        start_mask=static_index[2], dense_mask=static_index[3], dense_states=static_index[4], d_dense=2)
    position_zero = jnp.int32(0)
    searches = {
        "ours": functools.partial(jax.jit(functools.partial(ours_search, score_forced_eos=False)), table, trie),
        "static": lambda: static_call((table, position_zero)),
        "ours_eos": functools.partial(jax.jit(functools.partial(ours_search, score_forced_eos=True)), table, trie),
    }
    model_steps = {"ours": length, "static": length, "ours_eos": length + 1}
    if args.baseline_decoding:  # another version of gr_jax/decoding.py (e.g. from git show), default objective
        spec = importlib.util.spec_from_file_location("baseline_decoding", args.baseline_decoding)
        baseline = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(baseline)

        def baseline_search(table, trie):
            return baseline.beam_search(step_fn=step_fn_of(table), cache={}, batch_size=batch, num_beams=beams,
                                        max_decode_len=length + 1, trie=trie)

        searches["baseline_eos"] = functools.partial(jax.jit(baseline_search), table, trie)
        model_steps["baseline_eos"] = length + 1
    warm_up_compiler()
    first_call_s, outputs = {}, {}
    for name, search in searches.items():
        start = time.perf_counter()
        outputs[name] = jax.block_until_ready(search())
        first_call_s[name] = round(time.perf_counter() - start, 2)

    rounds: list[dict[str, float]] = []
    for _ in range(args.rounds):
        times: dict[str, list[float]] = {name: [] for name in searches}
        for _ in range(args.calls):
            for name, search in searches.items():
                start = time.perf_counter()
                jax.block_until_ready(search())
                times[name].append(time.perf_counter() - start)
        rounds.append({name: statistics.median(values) for name, values in times.items()})
    ratios = {name: [r[name] / r["static"] for r in rounds] for name in searches if name != "static"}

    # Docids: each search against the untruncated numpy beam search of its objective.
    def docid_rows(sequences: np.ndarray) -> np.ndarray:
        """int[batch, beams]: the docid row of each decoded sequence, -1 if it is none. Ours end with EOS; STATIC's
        (L tokens, no end token) are given one to be looked up in the same trie."""
        flat = sequences.reshape(batch * beams, -1)
        if flat.shape[1] == length:
            flat = np.concatenate([flat, np.full((len(flat), 1), EOS_ID, flat.dtype)], axis=1)
        return np.asarray(trie.leaf_indices(jnp.asarray(flat, jnp.int32))).reshape(batch, beams)

    found = {name: docid_rows(np.asarray(out if name == "static" else out.sequences)) for name, out in outputs.items()}
    log_probs = np.asarray(jax.nn.log_softmax(table, axis=-1))
    ids = prefix_ids(content)
    reference, beyond_cut = {}, {}
    for with_eos in (False, True):  # the second level, where the cut is counted, is the same for both
        reference[with_eos], beyond_cut[with_eos] = reference_beam_search(
            stand_in, log_probs, content, ids, with_eos=with_eos, cut=args.sparse_fanout)
    line = {
        "bench": "static_decode",
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
        "static_commit": commit,
        "stand_in": args.stand_in,
        "num_docids": args.num_docids,
        "vocab_size": vocab,
        "docid_length": length,
        "batch": batch,
        "beams": beams,
        "sparse_fanout": args.sparse_fanout,
        "logit_scale": args.logit_scale,
        "table_shape": list(table.shape),
        "trie_build_s": round(trie_build_s, 2),
        "trie_bytes": trie.nbytes,
        "static_build_s": round(static_build_s, 2),
        "static_bytes": sum(int(x.nbytes) for x in static_index),
        "static_max_branch_factors": [int(b) for b in branches],
        "trie_level_fanouts": list(trie.level_fanouts),
        "first_call_s": first_call_s,
        "model_steps": model_steps,
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "round_medians_ms": [{name: round(1e3 * t, 3) for name, t in r.items()} for r in rounds],
        # Per search: time / STATIC's time, per round and their median; per step: the same over model steps.
        "ratios_over_static": {name: {
            "per_round": [round(r, 3) for r in values],
            "median": round(statistics.median(values), 3),
            "per_step": round(statistics.median(values) * model_steps["static"] / model_steps[name], 3),
        } for name, values in ratios.items()},
        "ours_vs_static": agreement(found["ours"], found["static"]),
        "ours_vs_reference": agreement(found["ours"], reference[False]),
        "static_vs_reference": agreement(found["static"], reference[False]),
        "ours_eos_vs_reference_with_eos": agreement(found["ours_eos"], reference[True]),
        **({"baseline_eos_vs_reference_with_eos": agreement(found["baseline_eos"], reference[True]),
            "baseline_decoding": args.baseline_decoding} if args.baseline_decoding else {}),
        "reference_level2_beams_beyond_static_cut": beyond_cut[False],
    }
    if args.stand_in == "bigram":  # what beam search itself misses: the exact top-k of all N docids
        exact = bigram_scores(log_probs, content, with_eos=False)
        line["global_top_k_overlap"] = {name: agreement(found[name], top_k_rows(exact, beams))["overlap_per_query"]
                                        for name in ("ours", "static")}
    return line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--static_dir", "--static-dir", required=True,
                        help="a checkout of github.com/youtube/static-constraint-decoding")
    parser.add_argument("--num-docids", type=int, default=1_000_000)
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--docid-length", type=int, default=8, help="tokens per docid (ours add EOS)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--beams", type=int, default=70)
    parser.add_argument("--sparse-fanout", type=int, default=30,
                        help="STATIC's tokens_per_beam and our trie's K")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5, help="timed calls of each search per round")
    parser.add_argument("--logit-scale", type=float, default=3.0, help="the table's logits are N(0, 1) * this")
    parser.add_argument("--stand-in", choices=("bigram", "per-position"), default="bigram",
                        help="the fixed logits table's layout (see StandIn)")
    parser.add_argument("--table-rows", type=int, default=64,
                        help="bigram: R, the logits follow the previous token modulo R (0: R = V)")
    parser.add_argument("--baseline-decoding", default=None,
                        help="a decoding.py of another version (git show REV:gr_jax/decoding.py > FILE), timed too")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    entry_point.run(lambda: print(json.dumps(run(args)), flush=True))


if __name__ == "__main__":
    main()
