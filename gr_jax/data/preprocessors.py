"""seqio preprocessors for generative retrieval: small per-example maps over `tf.data`, seqio style.

A retrieval Task (see `tasks/retrieval.py`) chains seqio's own preprocessors with these:

    source                      {"docid": str, "inputs": str[, "qid": str]}  (D2Q: {"docid", "queries": str[n]})
    select_synthetic_queries    D2Q: up to k of a passage's queries, one example each {"docid", "inputs": str}
    tokenize_inputs             inputs: str -> int32[n]            (seqio tokenize; no EOS yet)
    docid_targets               targets: int32[m]                   (the DocidTable row: docid tokens + EOS)
    trim_inputs_and_append_eos  inputs: int32[<= input_length]      (first input_length - 1 tokens + EOS)
    cache_in_memory             (later epochs start here)
    seqio.CacheDatasetPlaceholder, then seqio repeats
    daq_chunks                  DaQ: num_chunks random windows of a document's tokens + EOS, one example each
    span_corruption             continued pretraining (instead of docid_targets): each window of a document ->
                                inputs with sentinels for masked spans, targets = the spans (T5's objective)
    require_feature_lengths     (a check at pipeline construction, examples unchanged)

Targets are pre-tokenized on purpose: they must be exactly the docid table's rows, the same sequences the
decoding trie is built from, so they never go through the tokenizer or the trimming again.

Random choices (DaQ offsets, sampled D2Q queries) are stateless: Philox keyed by (seed, FarmHash Fingerprint64
of the docid), so an example depends on its document and the seed only: the same in every epoch, on every host,
whatever the order, sharding or caching of the pipeline.
"""
from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import seqio
import tensorflow as tf

from gr_jax.data.d2q import SELECTIONS
from gr_jax.data.span_corruption import span_corruption_counts, span_corruption_window  # noqa: F401

if TYPE_CHECKING:
    from gr_jax.docids import DocidTable


def tokenize_inputs(dataset: tf.data.Dataset, output_features: Mapping[str, seqio.Feature]) -> tf.data.Dataset:
    """seqio's `tokenize` on the string features present (only `inputs`: targets arrive pre-tokenized).

    `copy_pretokenized=False`: the untrimmed passage text would otherwise ride along through the shuffle
    buffer and mislead anyone inspecting examples (the model only sees the trimmed tokens).
    """
    return seqio.preprocessors.tokenize(dataset, output_features=output_features, copy_pretokenized=False)


# One lookup per DocidTable object, shared by every pipeline built from it (the Tasks of a mixture, eval and
# training), instead of one copy of an 8.8M-entry hash table per pipeline.
_LOOKUPS: weakref.WeakKeyDictionary[DocidTable, tuple[tf.lookup.StaticHashTable, tf.Tensor, tf.Tensor]] = (
    weakref.WeakKeyDictionary())


def _docid_lookup(docid_table: DocidTable) -> tuple[tf.lookup.StaticHashTable, tf.Tensor, tf.Tensor]:
    """(docid -> row hash table, tokens int32[N, L], lengths int32[N]) as TensorFlow objects."""
    if docid_table not in _LOOKUPS:
        row_of_docid = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                keys=tf.constant(docid_table.utf8_docids(), dtype=tf.string),
                values=tf.range(len(docid_table.docids), dtype=tf.int64)),
            default_value=-1)
        _LOOKUPS[docid_table] = (row_of_docid, tf.constant(np.asarray(docid_table.tokens, dtype=np.int32)),
                                 tf.constant(docid_table.lengths, dtype=tf.int32))
    return _LOOKUPS[docid_table]


def docid_targets(dataset: tf.data.Dataset, *, docid_table: DocidTable) -> tf.data.Dataset:
    """Adds `targets: int32[m]`, the DocidTable row of each example's `docid: string` (EOS kept, PAD dropped).

    The lookup is a `tf.lookup.StaticHashTable` from docid to row, built once per table (8.8M MS MARCO ids
    take a few hundred MB, like the table itself). An example whose docid is not in the table fails the
    pipeline with the docid in the message: the sources already leave out (and count) qrels naming unknown
    documents, so reaching this is a bug, never something to drop silently.
    """
    row_of_docid, tokens, lengths = _docid_lookup(docid_table)

    @seqio.map_over_dataset
    def add_targets(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        row = row_of_docid.lookup(example["docid"])
        known = tf.debugging.Assert(row >= 0, ["docid not in the docid table:", example["docid"]])
        with tf.control_dependencies([known]):
            row = tf.cast(row, tf.int32)
        return {**example, "targets": tokens[row, :lengths[row]]}

    return add_targets(dataset)


def trim_inputs_and_append_eos(
        dataset: tf.data.Dataset,
        output_features: Mapping[str, seqio.Feature],
        *,
        input_length: int,
) -> tf.data.Dataset:
    """Keeps the first `input_length - 1` input tokens and appends EOS: `inputs: int32[<= input_length]`.

    On documents this *is* the FirstP representation. The length is fixed when the Task is registered
    (seqio's `append_eos_after_trim` with a bound `sequence_length`), not taken from the pipeline's
    requested lengths, so a Task always means the same examples. Features with `add_eos=False` (the
    pre-tokenized targets) are left untouched.
    """
    return seqio.preprocessors.append_eos_after_trim(
        dataset, output_features=output_features, sequence_length={"inputs": input_length})


# tf.strings.to_hash_bucket_fast(x, n) is FarmHash Fingerprint64(x) mod n: stable across TF versions and platforms.
_FINGERPRINT_BUCKETS = 2**63 - 1
def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")


def _docid_seed(docid: tf.Tensor, seed: int) -> tf.Tensor:
    """int64[2] key of the stateless Philox stream of one document: (seed, Fingerprint64(docid))."""
    return tf.stack([tf.constant(seed, tf.int64), tf.strings.to_hash_bucket_fast(docid, _FINGERPRINT_BUCKETS)])


def _repeat_features(example: Mapping[str, tf.Tensor], count: tf.Tensor) -> dict[str, tf.Tensor]:
    """Every feature stacked `count` times along a new first axis (for `unbatch` into `count` examples)."""
    return {key: tf.repeat(value[tf.newaxis], count, axis=0) for key, value in example.items()}


def daq_chunks(
        dataset: tf.data.Dataset,
        output_features: Mapping[str, seqio.Feature],
        *,
        num_chunks: int,
        input_length: int,
        seed: int,
) -> tf.data.Dataset:
    """Document as Query (DaQ): `num_chunks` examples per document, each a window of `input_length - 1`
    consecutive tokens at a random offset, then EOS: `inputs: int32[<= input_length]`; other features copied.

    Offsets are uniform over the windows that fit (`0 .. n - (input_length - 1)` for `n` tokens), drawn
    independently per chunk (two chunks may coincide); a document shorter than a window gives its whole
    text `num_chunks` times, so every document weighs the same and the example count is exactly
    `num_chunks` per document. Stateless (see the module docstring): the chunks of a document depend on
    `(seed, docid)` only, so this runs after the in-memory cache, which then holds each document's tokens
    once instead of `num_chunks` windows.

    Expects tokenized `inputs: int32[n]` without EOS and a scalar `docid: string`.
    """
    if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
        raise ValueError(f"num_chunks must be a positive integer, got {num_chunks!r}")
    if isinstance(input_length, bool) or not isinstance(input_length, int) or input_length < 2:
        raise ValueError(f"input_length must be an integer >= 2, got {input_length!r}")
    _check_seed(seed)
    window = input_length - 1
    eos_id = output_features["inputs"].vocabulary.eos_id

    def chunks(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        tokens = example["inputs"]
        n = tf.size(tokens, out_type=tf.int64)
        # offsets: int64[num_chunks] in [0, max(n - window, 0)].
        offsets = tf.random.stateless_uniform([num_chunks], seed=_docid_seed(example["docid"], seed), minval=0,
                                              maxval=tf.maximum(n - window, 0) + 1, dtype=tf.int64, alg="philox")
        positions = offsets[:, tf.newaxis] + tf.range(tf.minimum(n, window), dtype=tf.int64)[tf.newaxis, :]
        windows = tf.gather(tokens, positions)  # [num_chunks, min(n, window)]
        eos = tf.fill([num_chunks, 1], tf.constant(eos_id, tokens.dtype))
        return {**_repeat_features(example, num_chunks), "inputs": tf.concat([windows, eos], axis=1)}

    return dataset.map(chunks, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


def select_synthetic_queries(
        dataset: tf.data.Dataset,
        *,
        queries_per_passage: int,
        selection: str,
        seed: int,
) -> tf.data.Dataset:
    """D2Q: one example `{"docid", "inputs": query}` per kept synthetic query of each passage.

    Input: `{"docid": string, "queries": string[n]}` per passage. Keeps `min(queries_per_passage, n)`
    queries, in file order: the first ones (`selection="first"`) or a uniformly random subset
    (`"random"`: the queries with the largest stateless uniform keys, seeded by `(seed, docid)`, so the
    subset is the same in every epoch). Passages without queries give no example.
    """
    if isinstance(queries_per_passage, bool) or not isinstance(queries_per_passage, int) or queries_per_passage < 1:
        raise ValueError(f"queries_per_passage must be a positive integer, got {queries_per_passage!r}")
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
    _check_seed(seed)

    def select(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        queries = example["queries"]
        n = tf.size(queries)
        k = tf.minimum(n, queries_per_passage)
        if selection == "first":
            kept = queries[:k]
        else:
            keys = tf.random.stateless_uniform([n], seed=_docid_seed(example["docid"], seed), alg="philox")
            kept = tf.gather(queries, tf.sort(tf.math.top_k(keys, k=k).indices))
        others = {key: value for key, value in example.items() if key != "queries"}
        return {**_repeat_features(others, k), "inputs": kept}

    return dataset.map(select, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


def cache_in_memory(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Keeps the examples in memory after their first full pass, so later epochs skip the steps before.

    Only for deterministic steps (seqio repeats the dataset after this point, before stochastic ones); a
    pass cut short (e.g. `take`) caches nothing and the next one starts over.
    """
    return dataset.cache()


def require_feature_lengths(
        dataset: tf.data.Dataset,
        sequence_length: Mapping[str, int] | None = None,
        *,
        minimum: Mapping[str, int],
        provider_name: str,
) -> tf.data.Dataset:
    """Fails at pipeline construction when the requested feature lengths are below the registered ones.

    seqio trims every feature to the lengths a pipeline asks for. Asking for less than the Task was
    registered with would cut the EOS off inputs and, worse, silently truncate docid targets (which were
    checked to fit `minimum["targets"]`). Larger lengths only add padding and are fine. Examples pass
    through unchanged; `sequence_length=None` (no trimming at all) is fine too.
    """
    if sequence_length is not None:
        too_short = {key: (sequence_length[key], length) for key, length in minimum.items()
                     if sequence_length.get(key) is not None and sequence_length[key] < length}
        if too_short:
            detail = ", ".join(f"{key}: asked {asked} < registered {length}"
                               for key, (asked, length) in sorted(too_short.items()))
            raise ValueError(
                f"{provider_name!r} was registered with feature lengths {dict(minimum)}; a pipeline asking for "
                f"less would truncate them ({detail}). Ask for at least the registered lengths, or register "
                f"the dataset again with the lengths you need.")
    return dataset


# ---------------------------------------------------------------------------------------------------------
# Span corruption (T5's pretraining objective), for continued pretraining on a corpus before indexing it
# ---------------------------------------------------------------------------------------------------------

def _random_partition(total: tf.Tensor, parts: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """int64[parts]: `total` split into `parts` consecutive positive lengths at uniformly random cut points
    (a single zero length when total is 0 and parts 1)."""
    candidates = tf.range(1, tf.maximum(total, 1), dtype=tf.int64)  # the total - 1 possible cuts
    shuffled = tf.gather(candidates, tf.argsort(tf.random.stateless_uniform(tf.shape(candidates), seed=seed,
                                                                            alg="philox")))
    cuts = tf.sort(shuffled[:parts - 1])
    bounds = tf.concat([[tf.constant(0, tf.int64)], cuts, [total]], axis=0)
    return bounds[1:] - bounds[:-1]


def span_corruption(
        dataset: tf.data.Dataset,
        output_features: Mapping[str, seqio.Feature],
        *,
        window: int,
        sentinel_start: int,
        noise_density: float = 0.15,
        mean_noise_span_length: float = 3.0,
        seed: int = 0,
) -> tf.data.Dataset:
    """T5's span corruption over every token of each document: one example per `window`-token piece.

    A document of n tokens is cut into ceil(n / window) consecutive pieces (the last one shorter: no token
    is dropped; an empty document has nothing to corrupt and gives no example). In each piece
    `span_corruption_counts` noise tokens form that many spans, placed by random partitions of the noise and
    non-noise tokens, alternating and starting with non-noise, then rotated by a
    random offset (so a lone span is not always last; a span split by the rotation counts as two); the i-th
    span becomes sentinel `sentinel_start + i` (ids after the SentencePiece pieces, as T5's extra ids):

        piece    a b c d e f g h       (noise: c d, g)
        inputs   a b <0> e f <1> h EOS
        targets  <0> c d <1> g EOS

    Stateless: the spans of piece k depend on (seed, docid, k) only, the same every epoch (see the module
    docstring). Expects tokenized `inputs: int32[n]` without EOS and a scalar `docid: string`; sets
    `inputs` and `targets`, keeps the other features.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    _check_seed(seed)
    eos_id = output_features["inputs"].vocabulary.eos_id

    def pieces(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        tokens = example["inputs"]
        n = tf.size(tokens, out_type=tf.int64)
        count = (n + window - 1) // window
        lengths = tf.minimum(n - tf.range(count, dtype=tf.int64) * window, window)
        return {**_repeat_features(example, count), "inputs": tf.RaggedTensor.from_row_lengths(tokens, lengths),
                "piece": tf.range(count, dtype=tf.int64)}

    # (noise tokens, spans) by piece length 0..window: `span_corruption_counts` itself, looked up in the graph.
    counts = tf.constant([(0, 0)] + [span_corruption_counts(n, noise_density=noise_density,
                                                            mean_noise_span_length=mean_noise_span_length)
                                     for n in range(1, window + 1)], tf.int64)

    def corrupt(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        tokens = example.pop("inputs")
        piece = example.pop("piece")
        length = tf.size(tokens, out_type=tf.int64)
        num_noise, num_spans = counts[length, 0], counts[length, 1]
        key = tf.random.experimental.stateless_fold_in(_docid_seed(example["docid"], seed), piece)
        keys = tf.random.experimental.stateless_split(key, 3)
        noise_lengths = _random_partition(num_noise, num_spans, keys[0])
        kept_lengths = _random_partition(length - num_noise, num_spans, keys[1])
        # segments alternate kept, noise: segment 2i is kept run i, 2i + 1 noise span i.
        segment = tf.repeat(tf.range(2 * num_spans), tf.reshape(tf.stack([kept_lengths, noise_lengths], 1), [-1]))
        offset = tf.random.stateless_uniform([], seed=keys[2], maxval=length, dtype=tf.int64, alg="philox")
        is_noise = tf.roll(segment % 2 == 1, shift=offset, axis=0)
        starts_span = is_noise & ~tf.concat([[False], is_noise[:-1]], axis=0)
        sentinel = tf.cast(sentinel_start + tf.cumsum(tf.cast(starts_span, tf.int64)) - 1, tokens.dtype)
        absent = tf.constant(-1, tokens.dtype)

        def emit(with_sentinel: tf.Tensor, token_kept: tf.Tensor) -> tf.Tensor:
            pairs = tf.stack([tf.where(with_sentinel, sentinel, absent), tf.where(token_kept, tokens, absent)], 1)
            flat = tf.reshape(pairs, [-1])
            return tf.concat([tf.boolean_mask(flat, flat >= 0), [tf.constant(eos_id, tokens.dtype)]], axis=0)

        return {**example, "inputs": emit(starts_span, ~is_noise), "targets": emit(starts_span, is_noise)}

    return (dataset.map(pieces, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
            .map(corrupt, num_parallel_calls=tf.data.AUTOTUNE))
