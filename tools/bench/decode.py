"""Decoding benchmark: the docid constraint's cost with a model and alone, and the trie build at MS MARCO scale.

python -m gr_jax.tools.bench.decode --part model [--models tiny small --schemes pids semantic
                                           --num-docids 10000 100000 1000000 8841823 --batch 16 64 --beams 10 40]
python -m gr_jax.tools.bench.decode --part constraint [--num-docids 1000000 --vocab-size 2048 --docid-length 8
                                                --batch 2 --beams 70 --sparse-fanout 30 --repeats 10
                                                --model-output logits log_probs]
python -m gr_jax.tools.bench.decode --part build [--num-docids 8841823 --vocab path/to/spm.model]

`model` (part 1): random-init T5.1.1 models (dimensions from gin_configs/models/t5_1_1/{tiny,small}.gin, a
32,128-token output layer as T5's) decode random 32-token queries, jitted, once with `trie=None` and once
with the docid trie, timed alternately in one process; the JSON line per (model, docid set, batch, beams)
gives the medians per call and per query and their ratio (constrained / unconstrained; target <= 1.10 at
every corpus size), with the trie's build seconds and bytes. Both decode exactly `max_decode_len` = the
docid table's longest sequence (EOS included) steps: `predict_batch`'s computation with beam search's early
stop off, since a random model's unconstrained search would otherwise stop after ~2 steps (its best output
is the lone EOS) while the constrained one runs to the docids' depth. `predict_batch` as is, early stop
included, is timed too (`predict_batch_*`; --no-predict-batch skips it). Docid sets: `pids`, MS MARCO-style
naive docids (pids 0..N-1 as strings through a SentencePiece vocabulary: --vocab, else
data/wordnet_food/spm.model, else one trained here on synthetic text), and `semantic`, semantic-id-shaped
docids (a random cluster tree with k=10 children per split and leaves of at most c=100 documents, written
as digit tokens and a 2-digit leaf position, as `gr_jax.docids.schemes.semantic.semantic_docid_table` writes them).

`constraint` (part 2): random logits stand in for the model (a step_fn returning fixed random logits per
position), so only the search and its constraint are timed. One jitted beam search uses our array trie
(`gr_jax.docids.trie`); the other is the research-code pattern inside the same jitted beam search: at every step
a `jax.pure_callback` runs HF's `PrefixConstrainedLogitsProcessor` on the host, which calls GENRE's
`prefix_allowed_tokens_fn` (`trie.get(sent.tolist())` on a nested-dict trie) once per beam and turns the
returned token lists into a [rows, vocab] mask added to the log-probs. Both are compiled first and timed
alternately; medians are reported with their ratio (host callback / ours; target >= 50x) and the trie's
build seconds and bytes. One JSON line per (`--beams`, `--model-output`) setting; `unconstrained_search_s`
times our search without any constraint. `--model-output logits` (the model returns logits: both searches
take the full-vocabulary log-softmax at every step, one pass over [rows, vocab] that any search pays) or
`log_probs` (the model returns log-probs, as a step_fn with the log-softmax fused into it: the timing is the
search and its constraint only).

`build`: the trie of 8.8M MS MARCO-style naive docids (pids 0..8841822 as digit strings, tokenised by
the SentencePiece model given with --vocab, else one token per digit). Target: < 2 minutes, a few
hundred MB. One JSON line.
"""
from __future__ import annotations

import argparse
import functools
import json
import pathlib
import resource
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm
from flax.core import meta

from gr_jax import gin_utils
from gr_jax import network
from gr_jax.decoding import beam_search
from gr_jax.docids import DocidTable
from gr_jax.docids.schemes.naive import naive_docid_table
from gr_jax.models import EncoderDecoderModel
from gr_jax.docids.trie import Trie
from gr_jax.vocabulary import EOS_ID, PAD_ID, train_sentencepiece

MSMARCO_PASSAGES = 8_841_823
REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_VOCAB = REPO / "data" / "wordnet_food" / "spm.model"
MODEL_GINS = {name: f"models/t5_1_1/{name}.gin" for name in ("tiny", "small", "base", "large")}


def _time_once(fn, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def _max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _device_fields() -> dict:
    return {"backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind)}


# ---------------------------------------------------------------------------------------------------------
# Part 1: with the model
# ---------------------------------------------------------------------------------------------------------

def synthetic_texts(rng: np.random.Generator, *, count: int) -> list[str]:
    """Lines of random lowercase words and numbers, enough for a small SentencePiece vocabulary."""
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, rng.integers(2, 9))) for _ in range(3000)]
    lines = []
    for _ in range(count):
        tokens = [words[i] for i in rng.integers(0, len(words), 12)] + [str(rng.integers(0, 10**7))]
        lines.append(" ".join(tokens))
    return lines


def load_vocabulary(path: str | None) -> tuple[spm.SentencePieceProcessor, str]:
    """(processor, its path): `path`, else data/wordnet_food/spm.model, else one trained on synthetic text."""
    if path is None and DEFAULT_VOCAB.exists():
        path = str(DEFAULT_VOCAB)
    if path is None:
        path = str(pathlib.Path(tempfile.mkdtemp(prefix="decode_bench_")) / "spm.model")
        train_sentencepiece(texts=synthetic_texts(np.random.default_rng(0), count=20_000), model_path=path,
                            vocab_size=1000)
    return spm.SentencePieceProcessor(model_file=path), path


def digit_tokens(processor: spm.SentencePieceProcessor) -> np.ndarray:
    """int64[10]: the ids of the pieces "0".."9" (the vocabulary must split digits, as ours do)."""
    ids = np.array([processor.piece_to_id(d) for d in "0123456789"])
    if any(processor.is_unknown(int(i)) for i in ids) or np.isin(ids, (PAD_ID, EOS_ID)).any():
        raise ValueError("the SentencePiece vocabulary has no piece for every digit 0..9")
    return ids


def pid_docid_table(processor: spm.SentencePieceProcessor, *, num_docids: int) -> DocidTable:
    """MS MARCO-style naive docids: pids 0..N-1 as strings, tokenised by the vocabulary."""
    return naive_docid_table(docids=[str(pid) for pid in range(num_docids)], encode=processor.encode, batched=True)


def semantic_id_table(rng: np.random.Generator, *, num_docids: int, digits: np.ndarray, k: int = 10,
                      c: int = 100, concentration: float = 1.0) -> DocidTable:
    """Semantic-id-shaped docids without embeddings or k-means: the same tree shape and token layout.

    A node with more than c documents is split into k children with Dirichlet(concentration) proportions
    (unbalanced, as k-means clusters are; empty children vanish), recursively; a document's id is its
    path of cluster digits, then its 2-digit position in its leaf, then EOS (k=10: one digit per level).
    """
    if k != 10 or c != 100:
        raise ValueError("the token layout here is one digit per level and two for the leaf position: k=10, c=100")
    depth_paths: list[np.ndarray] = []  # per level d: int[leaves at depth d, d] cluster digits
    depth_sizes: list[np.ndarray] = []
    paths, sizes = np.zeros((1, 0), np.int64), np.array([num_docids])
    while sizes.size:
        leaf = sizes <= c
        depth_paths.append(paths[leaf])
        depth_sizes.append(sizes[leaf])
        parents, parent_sizes = paths[~leaf], sizes[~leaf]
        child_sizes = rng.multinomial(parent_sizes, rng.dirichlet(np.full(k, concentration), size=len(parents)))
        paths = np.concatenate([np.repeat(parents, k, axis=0), np.tile(np.arange(k), len(parents))[:, None]], axis=1)
        sizes = child_sizes.ravel()
        paths, sizes = paths[sizes > 0], sizes[sizes > 0]
    max_depth = len(depth_paths) - 1
    tokens = np.full((num_docids, max_depth + 3), PAD_ID, np.int32)
    row = 0
    for depth, (leaf_paths, leaf_sizes) in enumerate(zip(depth_paths, depth_sizes)):
        count = int(leaf_sizes.sum())
        rows = slice(row, row + count)
        starts = np.cumsum(leaf_sizes) - leaf_sizes
        position = np.arange(count) - np.repeat(starts, leaf_sizes)
        tokens[rows, :depth] = digits[np.repeat(leaf_paths, leaf_sizes, axis=0)]
        tokens[rows, depth] = digits[position // 10]
        tokens[rows, depth + 1] = digits[position % 10]
        tokens[rows, depth + 2] = EOS_ID
        row += count
    return DocidTable(docids=tuple(map(str, range(num_docids))), tokens=tokens)


def model_config(name: str, *, vocab_size: int, dtype: str) -> network.T5Config:
    """The T5Config of a size gin (dimensions only), as the training entry points build it."""
    return gin_utils.t5_config([MODEL_GINS[name]], vocab_size=vocab_size, dtype=dtype, dropout_rate=0.0)


class ModelDecoder:
    """A random-init model and its jitted searches, compiled once per (beams, max_decode_len, early stop):
    the unconstrained ones are shared by docid sets of the same length."""

    def __init__(self, *, name: str, vocab_size: int, dtype: str, query_length: int, seed: int):
        self.name = name
        self.model = EncoderDecoderModel(config=model_config(name, vocab_size=vocab_size, dtype=dtype))
        init = jax.jit(lambda rng: meta.unbox(self.model.init(rng, input_length=query_length, target_length=8)))
        self.params = jax.block_until_ready(init(jax.random.PRNGKey(seed))["params"])  # not into later timings
        self.num_params = int(sum(x.size for x in jax.tree.leaves(self.params)))
        self._searches: dict[tuple[int, int, bool], Callable] = {}

    def search(self, *, num_beams: int, max_decode_len: int, stop_early: bool) -> Callable:
        """(params, tokens, trie or None) -> BeamSearchResult, jitted.

        stop_early=True: `EncoderDecoderModel.predict_batch` itself. False: the same computation (prefill,
        then `decoding.beam_search` over `Transformer.decode_step`) for exactly `max_decode_len` steps.
        """
        key = (num_beams, max_decode_len, stop_early)
        if key not in self._searches:
            if stop_early:
                fn = functools.partial(self.model.predict_batch, num_beams=num_beams, max_decode_len=max_decode_len)
                self._searches[key] = jax.jit(lambda params, tokens, trie: fn(params, tokens, trie=trie))
            else:
                self._searches[key] = jax.jit(functools.partial(
                    self._full_length_search, num_beams=num_beams, max_decode_len=max_decode_len))
        return self._searches[key]

    def _full_length_search(self, params, tokens: jax.Array, trie: Trie | None, *, num_beams: int,
                            max_decode_len: int):
        module, variables = self.model.module, {"params": params}
        context = module.apply(variables, tokens, max_decode_len=max_decode_len, method=network.Transformer.prefill)
        batch = tokens.shape[0]
        cache = self.model.init_cache(rows=batch * num_beams, max_decode_len=max_decode_len)

        def step_fn(previous, position, cache):
            return module.apply(variables, previous, position=position, cache=cache, context=context,
                                method=network.Transformer.decode_step)

        return beam_search(step_fn=step_fn, cache=cache, batch_size=batch, num_beams=num_beams,
                           max_decode_len=max_decode_len, trie=trie, stop_early=False)


def _time_pair(search: Callable, params, queries: jax.Array, trie: Trie, *, repeats: int) -> dict:
    """Compiles and runs `search` without and with the trie, then times them alternately: medians (s)."""
    first = {"unconstrained": _time_once(search, params, queries, None),
             "constrained": _time_once(search, params, queries, trie)}
    times: dict[str, list[float]] = {"unconstrained": [], "constrained": []}
    for _ in range(repeats):
        times["unconstrained"].append(_time_once(search, params, queries, None))
        times["constrained"].append(_time_once(search, params, queries, trie))
    return {"first_call_s": first, **{mode: statistics.median(values) for mode, values in times.items()}}


def run_model_setting(*, decoder: ModelDecoder, table: DocidTable, trie: Trie, scheme: str, docid_set_s: float,
                      trie_build_s: float, batch: int, beams: int, query_length: int, query_vocab: int,
                      repeats: int, seed: int, predict_batch: bool) -> dict:
    length = table.max_length
    rng = np.random.default_rng(seed)
    queries = rng.integers(3, query_vocab, (batch, query_length), dtype=np.int32)
    queries[:, -1] = EOS_ID
    queries = jnp.asarray(queries)
    params = decoder.params

    full = decoder.search(num_beams=beams, max_decode_len=length, stop_early=False)
    timed = _time_pair(full, params, queries, trie, repeats=repeats)

    def outputs(result) -> tuple[float, float]:
        """(mean length of the best output, fraction of finished outputs that are docids)."""
        sequences = np.asarray(result.sequences)
        found = np.isfinite(np.asarray(result.scores))
        rows = np.asarray(trie.leaf_indices(jnp.asarray(sequences.reshape(-1, length)))).reshape(found.shape)
        return float((sequences[:, 0] != PAD_ID).sum(axis=1).mean()), float((rows[found] >= 0).mean())

    unconstrained_length, unconstrained_valid = outputs(full(params, queries, None))
    constrained_length, constrained_valid = outputs(full(params, queries, trie))
    line = {
        "part": "model",
        **_device_fields(),
        "model": decoder.name,
        "params": decoder.num_params,
        "dtype": decoder.model.config.dtype,
        "model_vocab_size": decoder.model.config.vocab_size,
        "scheme": scheme,
        "num_docids": len(table),
        "max_decode_len": length,
        "docid_set_s": round(docid_set_s, 2),
        "docid_table_bytes": int(table.tokens.nbytes),
        "trie_build_s": round(trie_build_s, 3),
        "trie_bytes": trie.nbytes,
        "trie_states": trie.num_states,
        "trie_max_fanout": trie.max_fanout,
        "batch": batch,
        "beams": beams,
        "query_length": query_length,
        "unconstrained_first_call_s": round(timed["first_call_s"]["unconstrained"], 2),
        "constrained_first_call_s": round(timed["first_call_s"]["constrained"], 2),
        "unconstrained_s": timed["unconstrained"],
        "constrained_s": timed["constrained"],
        "unconstrained_ms_per_query": 1e3 * timed["unconstrained"] / batch,
        "constrained_ms_per_query": 1e3 * timed["constrained"] / batch,
        "ratio_constrained_over_unconstrained": round(timed["constrained"] / timed["unconstrained"], 3),
        "unconstrained_best_output_length": unconstrained_length,
        "constrained_best_output_length": constrained_length,
        "unconstrained_valid_fraction": unconstrained_valid,
        "constrained_valid_fraction": constrained_valid,
        "repeats": repeats,
    }
    if predict_batch:  # as used, with the early stop: a random model's unconstrained search stops after ~2 steps
        early = _time_pair(decoder.search(num_beams=beams, max_decode_len=length, stop_early=True), params,
                           queries, trie, repeats=repeats)
        line.update({
            "predict_batch_unconstrained_s": early["unconstrained"],
            "predict_batch_constrained_s": early["constrained"],
            "predict_batch_unconstrained_best_output_length":
                outputs(decoder.search(num_beams=beams, max_decode_len=length, stop_early=True)(
                    params, queries, None))[0],
        })
    return line


def run_model_part(args: argparse.Namespace) -> None:
    processor, vocab_path = load_vocabulary(args.vocab)
    dtype = args.dtype or ("float32" if jax.default_backend() == "cpu" else "bfloat16")
    jax.block_until_ready(Trie.build(np.array([[3, EOS_ID]]), vocab_size=args.model_vocab_size))  # warm-up
    for name in args.models:
        decoder = ModelDecoder(name=name, vocab_size=args.model_vocab_size, dtype=dtype,
                               query_length=args.query_length, seed=args.seed)
        for scheme in args.schemes:
            for num_docids in args.num_docids or [10_000, 100_000, 1_000_000, MSMARCO_PASSAGES]:
                start = time.perf_counter()
                if scheme == "pids":
                    table = pid_docid_table(processor, num_docids=num_docids)
                else:
                    table = semantic_id_table(np.random.default_rng(args.seed), num_docids=num_docids,
                                              digits=digit_tokens(processor))
                docid_set_s = time.perf_counter() - start
                start = time.perf_counter()
                trie = jax.block_until_ready(Trie.build(table.tokens, vocab_size=args.model_vocab_size,
                                                        sparse_fanout=args.sparse_fanout))
                trie_build_s = time.perf_counter() - start
                for batch in args.batch or [16, 64]:
                    for beams in args.beams or [10, 40]:
                        line = run_model_setting(
                            decoder=decoder, table=table, trie=trie, scheme=scheme, docid_set_s=docid_set_s,
                            trie_build_s=trie_build_s, batch=batch, beams=beams, query_length=args.query_length,
                            query_vocab=processor.get_piece_size(), repeats=args.repeats or 5, seed=args.seed,
                            predict_batch=args.predict_batch)
                        print(json.dumps({**line, "vocab": pathlib.Path(vocab_path).name}), flush=True)
                del table, trie


# ---------------------------------------------------------------------------------------------------------
# Part 2: the constraint alone, against the host-callback pattern of research code
# ---------------------------------------------------------------------------------------------------------

def random_docid_rows(rng: np.random.Generator, *, num_docids: int, vocab_size: int, length: int) -> np.ndarray:
    """int32[num_docids, length + 1]: distinct random docids of `length` content tokens, then EOS."""
    content = np.unique(rng.integers(2, vocab_size, (num_docids, length), dtype=np.int32), axis=0)
    while len(content) < num_docids:  # collisions are rare; top up
        extra = rng.integers(2, vocab_size, (num_docids - len(content), length), dtype=np.int32)
        content = np.unique(np.concatenate([content, extra]), axis=0)
    content = content[rng.permutation(num_docids)]
    return np.concatenate([content, np.full((num_docids, 1), EOS_ID, np.int32)], axis=1)


class GenreTrie:
    """GENRE's `genre.trie.Trie`: nested dicts token -> subtree, queried by `get(prefix) -> allowed next ids`.

    Sequences start with the decoder start token, as GENRE builds them, since HF passes the decoder inputs
    (start token first) to `prefix_allowed_tokens_fn`. `get` is GENRE's `_get_from_trie` (recursive, slicing
    the prefix); the build is iterative (the same dicts, faster to make; its time is not in the ratio).
    """

    def __init__(self, sequences: list[list[int]]):
        self.trie_dict: dict = {}
        for sequence in sequences:
            node = self.trie_dict
            for token in sequence:
                node = node.setdefault(token, {})

    def get(self, prefix_sequence: list[int]) -> list[int]:
        return GenreTrie._get_from_trie(prefix_sequence, self.trie_dict)

    @staticmethod
    def _get_from_trie(prefix_sequence: list[int], trie_dict: dict) -> list[int]:
        if len(prefix_sequence) == 0:
            return list(trie_dict.keys())
        if prefix_sequence[0] in trie_dict:
            return GenreTrie._get_from_trie(prefix_sequence[1:], trie_dict[prefix_sequence[0]])
        return []


def prefix_constrained_mask(prefix_allowed_tokens_fn: Callable[[int, np.ndarray], list[int]], num_beams: int,
                            input_ids: np.ndarray, scores_shape: tuple[int, int]) -> np.ndarray:
    """HF's `PrefixConstrainedLogitsProcessor.__call__`: float32[rows, vocab], 0 where allowed.

    One `prefix_allowed_tokens_fn(batch_id, sent)` call per beam, its list scattered into the row. (HF since
    4.39 raises on an empty list; here such a row stays all -inf: that beam dies, as in older versions.)
    """
    mask = np.full(scores_shape, -np.inf, np.float32)
    for batch_id, beam_sent in enumerate(input_ids.reshape(-1, num_beams, input_ids.shape[-1])):
        for beam_id, sent in enumerate(beam_sent):
            mask[batch_id * num_beams + beam_id, prefix_allowed_tokens_fn(batch_id, sent)] = 0
    return mask


def host_callback_step_fn(*, logits_table: jax.Array, trie: GenreTrie, num_beams: int,
                          log_softmax: bool = True) -> Callable:
    """A step_fn applying the host-side constraint at every step: the research-code pattern inside `jax.jit`.

    The beams' decoder inputs so far ride in the beam-search cache as `input_ids` int32[rows, max_decode_len]
    (column p: the input at position p, i.e. the start token PAD, then the decoded tokens), which beam search
    reorders with the beams as HF reorders its `input_ids`. One `jax.pure_callback` per step sends them to
    the host, runs HF's processor with GENRE's function and returns the mask, added to the log-probs (after
    the log-softmax, as in HF: run beam search with `step_fn_returns_log_probs=True`, so that the scores are
    the model's log-likelihoods as ours are, and both searches rank the same docids). With
    `log_softmax=False` the table already holds log-probs and the mask is added to them as they are.
    """
    rows, vocab_size = logits_table.shape[1:]

    def allowed_tokens(batch_id: int, sent: np.ndarray) -> list[int]:  # GENRE's prefix_allowed_tokens_fn
        return trie.get(sent.tolist())

    def host_mask(input_ids: jax.Array, position: jax.Array) -> np.ndarray:
        # JAX hands the callback jax.Arrays, whose per-row iteration and indexing dispatch one host op
        # each; HF's processor iterates CPU torch tensors, which is cheap: convert once, as a port would.
        input_ids = np.asarray(input_ids)
        return prefix_constrained_mask(allowed_tokens, num_beams, input_ids[:, :int(position) + 1],
                                       (rows, vocab_size))

    def step_fn(tokens: jax.Array, position: jax.Array, cache: dict) -> tuple[jax.Array, dict]:
        input_ids = cache["input_ids"].at[:, position].set(tokens)  # at position 0, tokens is the start token
        mask = jax.pure_callback(host_mask, jax.ShapeDtypeStruct((rows, vocab_size), jnp.float32), input_ids,
                                 position)
        log_probs = jax.nn.log_softmax(logits_table[position]) if log_softmax else logits_table[position]
        return log_probs + mask, {"input_ids": input_ids}

    return step_fn


MODEL_OUTPUTS = ("logits", "log_probs")


def run_constraint(*, num_docids: int, vocab_size: int, docid_length: int, batch: int, beams: int,
                   sparse_fanout: int, repeats: int, rows: np.ndarray, trie: Trie, build_s: float,
                   host_trie: GenreTrie, host_build_s: float, seed: int, model_output: str = "logits") -> dict:
    """Times both searches on a random [max_decode_len, rows, vocab] table that the 'model' returns per step:
    logits (`model_output="logits"`, each search takes the log-softmax) or log-probs ("log_probs")."""
    if model_output not in MODEL_OUTPUTS:
        raise ValueError(f"model_output must be one of {MODEL_OUTPUTS}, got {model_output!r}")
    rows_n = batch * beams
    max_decode_len = docid_length + 1
    logits_table = jax.random.normal(jax.random.PRNGKey(seed), (max_decode_len, rows_n, vocab_size), jnp.float32) * 3
    returns_log_probs = model_output == "log_probs"
    if returns_log_probs:
        logits_table = jax.nn.log_softmax(logits_table)

    def random_logits(tokens, position, cache):
        return logits_table[position], cache

    ours = jax.jit(functools.partial(beam_search, step_fn=random_logits, batch_size=batch, num_beams=beams,
                                     max_decode_len=max_decode_len, step_fn_returns_log_probs=returns_log_probs))
    host = jax.jit(functools.partial(
        beam_search, step_fn=host_callback_step_fn(logits_table=logits_table, trie=host_trie, num_beams=beams,
                                                   log_softmax=not returns_log_probs),
        batch_size=batch, num_beams=beams, max_decode_len=max_decode_len, step_fn_returns_log_probs=True))
    host_cache = {"input_ids": jnp.zeros((rows_n, max_decode_len), jnp.int32)}

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
    host_found = np.isfinite(np.asarray(host_result.scores)).reshape(-1)  # beams that never took a masked token
    host_leaves = np.asarray(trie.leaf_indices(host_result.sequences.reshape(rows_n, max_decode_len)))
    # Both searches score docids by the model's log-probs: they should return the same docids, in the same order.
    same_docids = float((leaves == host_leaves).mean())
    score_gap = float(np.max(np.abs(np.asarray(ours_result.scores) - np.asarray(host_result.scores))))
    return {
        "part": "constraint",
        **_device_fields(),
        "model_output": model_output,
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
        "host_callback_ms_per_step_per_beam": 1e3 * host_s / (max_decode_len * rows_n),
        "unconstrained_search_s": statistics.median(unconstrained_times),
        "ratio_host_callback_over_ours": round(host_s / ours_s, 2),
        "ours_valid_docid_fraction": float((leaves >= 0).mean()),
        "host_callback_valid_docid_fraction": float((host_leaves[host_found] >= 0).mean()),
        "same_docids_ours_host": same_docids,
        "max_score_difference_ours_host": score_gap,
        "repeats": repeats,
    }


def run_constraint_part(args: argparse.Namespace) -> None:
    num_docids = (args.num_docids or [1_000_000])[0]
    rows = random_docid_rows(np.random.default_rng(args.seed), num_docids=num_docids, vocab_size=args.vocab_size,
                             length=args.docid_length)
    jax.block_until_ready(jnp.zeros(1))  # start the backend outside the timing
    start = time.perf_counter()
    trie = jax.block_until_ready(Trie.build(rows, vocab_size=args.vocab_size, sparse_fanout=args.sparse_fanout))
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    host_trie = GenreTrie([[PAD_ID, *row] for row in rows.tolist()])
    host_build_s = time.perf_counter() - start
    for beams in args.beams or [70]:
        for model_output in args.model_output:
            print(json.dumps(run_constraint(
                num_docids=num_docids, vocab_size=args.vocab_size, docid_length=args.docid_length,
                batch=(args.batch or [2])[0], beams=beams, sparse_fanout=args.sparse_fanout,
                repeats=args.repeats or 10, rows=rows, trie=trie, build_s=build_s, host_trie=host_trie,
                host_build_s=host_build_s, seed=args.seed, model_output=model_output)), flush=True)


# ---------------------------------------------------------------------------------------------------------
# The trie build at MS MARCO scale
# ---------------------------------------------------------------------------------------------------------

def digit_encoder(text: str) -> list[int]:
    """One token per digit, '0' -> 3 .. '9' -> 12 (the ids after PAD, EOS, UNK)."""
    return list(text.encode("ascii").translate(_DIGIT_TOKENS))


_DIGIT_TOKENS = bytes.maketrans(b"0123456789", bytes(range(3, 13)))


def run_build(*, num_docids: int, vocab: str | None, sparse_fanout: int) -> dict:
    docids = [str(pid) for pid in range(num_docids)]
    start = time.perf_counter()
    if vocab:
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
    parser.add_argument("--part", choices=("model", "constraint", "build"), required=True)
    parser.add_argument("--num-docids", type=int, nargs="+", default=None,
                        help="default: 10k 100k 1M 8.8M (model), 1M (constraint), 8,841,823 (build)")
    parser.add_argument("--batch", type=int, nargs="+", default=None, help="default: 16 64 (model), 2 (constraint)")
    parser.add_argument("--beams", type=int, nargs="+", default=None, help="default: 10 40 (model), 70 (constraint)")
    parser.add_argument("--sparse-fanout", type=int, default=None,
                        help="the trie's K: children expanded per beam (default 32 for model, 30 for constraint)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per setting (default 5 / 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", default=None, help="a SentencePiece model (model: default "
                        "data/wordnet_food/spm.model or one trained here; build: default one token per digit)")
    model = parser.add_argument_group("model part")
    model.add_argument("--models", nargs="+", choices=sorted(MODEL_GINS), default=["tiny", "small"])
    model.add_argument("--schemes", nargs="+", choices=("pids", "semantic"), default=["pids", "semantic"])
    model.add_argument("--model-vocab-size", type=int, default=32128, help="the model's vocabulary (T5's 32,128)")
    model.add_argument("--query-length", type=int, default=32)
    model.add_argument("--dtype", default=None, help="activations: default float32 on CPU, bfloat16 elsewhere")
    model.add_argument("--predict-batch", action=argparse.BooleanOptionalAction, default=True,
                       help="also time predict_batch as is (with its early stop)")
    constraint = parser.add_argument_group("constraint part")
    constraint.add_argument("--vocab-size", type=int, default=2048, help="vocabulary of the random docids")
    constraint.add_argument("--docid-length", type=int, default=8, help="tokens per docid before EOS")
    constraint.add_argument("--model-output", nargs="+", choices=MODEL_OUTPUTS, default=list(MODEL_OUTPUTS),
                            help="what the stand-in model returns per step: logits (the searches take the "
                            "log-softmax) or log-probs")
    args = parser.parse_args(argv)

    if args.part == "model":
        args.sparse_fanout = args.sparse_fanout or 32
        run_model_part(args)
    elif args.part == "constraint":
        args.sparse_fanout = args.sparse_fanout or 30
        run_constraint_part(args)
    else:
        print(json.dumps(run_build(num_docids=(args.num_docids or [MSMARCO_PASSAGES])[0], vocab=args.vocab,
                                   sparse_fanout=args.sparse_fanout or 32)), flush=True)


if __name__ == "__main__":
    main()
