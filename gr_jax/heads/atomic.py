"""DSI's atomic docids: one output column per document; retrieval is one decoder step and a top-k over the corpus.

gin: `HEAD = @atomic.AtomicHead()` (gin_configs/decoders/atomic.gin); `atomic.AtomicHead.docid_vocab_start` and
`docid_vocab_size` fix the docid tokens' range, which the model builder fills from the docid space when unset.

`atomic_logits_dense` [embed, docids] has one column per document, split over the 'model' mesh axis (its columns
are padded to a multiple of 128, masked, so the axis divides them). Docid i is the token `docid_vocab_start + i`
(table row `[docid_vocab_start + i, EOS]`, `gr_jax.docids.schemes.atomic`), column i of the head. Only the start
position is decoded and learnt (after a docid, EOS has probability 1 by construction), so loss, accuracy and
scores are per docid: log p(docid | query) under a softmax over the whole corpus. Retrieval ranks all docid
columns shard-wise (`top_k_columns`): no device ever holds the logits of all 8.8M MS MARCO docids.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from gr_jax import decoding
from gr_jax.heads.base import HeadLayer, OverDocidTokens, masked_logits
from gr_jax.network import EMBED, NEG_INF, VOCAB, Transformer, fan_in_init, logical_param
from gr_jax.partitioning import DATA_AXIS, MODEL_AXIS
from gr_jax.vocabulary import EOS_ID, PAD_ID

Array = jax.Array

# The head's columns are padded to a multiple of this (masked), so the 'model' mesh axis divides them.
COLUMNS_MULTIPLE = 128


class AtomicLayer(HeadLayer):
    """`atomic_logits_dense` [embed, columns]: one column per docid (see the module docstring); `head` is an
    `AtomicHead`."""

    if TYPE_CHECKING:  # the head that built the layer (`OutputHead.layer`), an AtomicHead; no field of its own
        head: AtomicHead

    def setup(self):
        cfg = self.config
        self.atomic_logits_dense = logical_param(self, "atomic_logits_dense", fan_in_init(1),
                                                 (cfg.emb_dim, self.head.columns()), (EMBED, VOCAB), cfg.param_dtype)

    def teacher_forced_inputs(self, decoder_input_tokens):
        return decoder_input_tokens[:, :1]  # the docid is one token: only the start position is decoded

    def docid_logits(self, states: Array) -> Array:
        """states [..., embed] -> float32 logits over the docid columns [..., columns] (padding columns NEG_INF)."""
        head = self.head
        _, size = head.docid_tokens()
        logits = jnp.einsum("...d,dv->...v", states, self.atomic_logits_dense.astype(self.config.dtype))
        return masked_logits(logits, jnp.arange(head.columns()) < size)

    def __call__(self, states, *, embedded, encoded, cross_mask, deterministic):
        """Logits [batch, 1, columns]: column i for token docid_vocab_start + i."""
        del embedded, encoded, cross_mask, deterministic
        return self.docid_logits(states)

    def step_inputs(self, tokens, *, position):
        # After position 0 the input is a docid token, which need not be in the input vocabulary.
        return jnp.where(position == 0, tokens, PAD_ID)

    def step(self, states, *, embedded, position, cache, context, cross_mask):
        """Position 0 gives the docid logits placed at their token ids (every other id NEG_INF); later positions
        allow only EOS (log-prob 0), so generic beam search and sampling produce `[docid token, EOS]`. This
        materialises all docid logits of each row: retrieval uses `AtomicHead.rank` instead."""
        del embedded, cache, context, cross_mask
        head = self.head
        start, size = head.docid_tokens()
        vocab = head.logits_vocab_size(self.config)
        logits = self.docid_logits(states)[:, 0]
        rows = logits.shape[0]
        logits = jnp.concatenate([jnp.full((rows, start), NEG_INF, jnp.float32),
                                  logits[:, :size],
                                  jnp.full((rows, vocab - head.docid_vocab_end), NEG_INF, jnp.float32)], axis=1)
        eos_only = jnp.where(jnp.arange(vocab) == EOS_ID, 0.0, NEG_INF).astype(jnp.float32)
        return jnp.where(position == 0, logits, eos_only[None, :]), ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class AtomicHead(OverDocidTokens):
    """DSI's atomic docids. Settings: the docid token range (`OverDocidTokens`; None: from the docid space)."""

    layer_class: ClassVar[type[HeadLayer]] = AtomicLayer
    ranks_in_one_pass = True

    def columns(self) -> int:
        """Columns of the head: docid_vocab_size padded to a multiple of 128 (padding columns are masked)."""
        _, size = self.docid_tokens()
        return -(-size // COLUMNS_MULTIPLE) * COLUMNS_MULTIPLE

    def logits_vocab_size(self, config):
        """The decoded token space ends with the docid tokens (decoded sequences are `[docid token, EOS]`)."""
        if config.output_vocab_size is None:
            return self.docid_vocab_end
        return config.output_vocab_size

    def embedded_vocab_size(self, config, *, model_vocab_size):
        """Only the ids below the docid tokens: a docid token is never an input (`teacher_forced_inputs` keeps the
        start position, `step_inputs` feeds PAD after it), so T5-Base with 8.8M atomic docids embeds T5's 32,128
        ids (Table 4's 7.0B parameters), not a second 8.8M-row matrix."""
        del config, model_vocab_size
        start, _ = self.docid_tokens()
        return start

    def fresh_param_patterns(self, config):
        """The docid columns replace the output layer: nothing pretrained to copy."""
        return (*super().fresh_param_patterns(config), r"atomic_logits_dense")

    def target_columns(self, config, targets, weights):
        """Column = token - docid_vocab_start, at the first position only (the logits cover that one position); a
        weighted target that is no docid token is invalid, unweighted ones (padding rows) are scored at column 0."""
        del config
        start, size = self.docid_tokens()
        columns = targets - start
        outside = (columns < 0) | (columns >= size)
        return jnp.where(outside, 0, columns), outside & (weights > 0)

    def predict_batch(self, model, params, encoder_input_tokens, *, num_beams, max_decode_len, trie, length_penalty):
        """Exact: the `num_beams` best docids of the whole corpus (`rank`); no trie is needed, since the outputs
        are exactly the docids, and one given is ignored."""
        del trie
        return self.rank(model, params, encoder_input_tokens, num_results=num_beams, max_decode_len=max_decode_len,
                         length_penalty=length_penalty)

    def ranking_operands(self, params: Any, states: Array) -> tuple[Array, Array]:
        """(queries [..., q], kernel [q, columns]) of the docid logits queries . kernel (`rank`'s shard-wise top-k):
        the decoder's start states and the head's columns."""
        return states, params["atomic_logits_dense"]

    def rank(self, model: Any, params: Any, encoder_input_tokens: Array, *, num_results: int, max_decode_len: int = 2,
             length_penalty: float = 0.0) -> decoding.BeamSearchResult:
        """The `num_results` most likely docids of the whole corpus for each query, best first.

        One encoder pass and one decoder step give the query state; `top_k_columns` ranks all docid columns
        shard-wise. Results have beam search's format, so the DocidTable lookup applies unchanged: sequences
        int32[batch, num_results, max_decode_len] = `[docid token, EOS, PAD...]`, scores float32[batch,
        num_results] = log p(docid | query) (divided by the brevity penalty of length 2 if `length_penalty` != 0);
        slots beyond the number of docids have score -inf and PAD tokens.
        """
        if not isinstance(num_results, int) or num_results < 1:
            raise ValueError(f"num_results must be a positive int, got {num_results!r}")
        if max_decode_len < 2:
            raise ValueError(f"max_decode_len={max_decode_len}: an atomic docid needs 2 tokens (docid, EOS)")
        start, size = self.docid_tokens()
        states = model.module.apply({"params": params}, encoder_input_tokens, method=Transformer.start_states)
        queries, kernel = self.ranking_operands(params, states)
        scores, columns = top_k_columns(queries, kernel, k=num_results, first_column=0, end_column=size)
        tokens = columns + start
        found = scores > NEG_INF / 2  # masked columns only surface when num_results > number of docids
        scores = jnp.where(found, scores, -jnp.inf)
        if length_penalty:
            scores = scores / decoding.brevity_penalty(alpha=length_penalty, length=2.0)
        missing = num_results - scores.shape[1]
        if missing > 0:
            scores = jnp.pad(scores, ((0, 0), (0, missing)), constant_values=-jnp.inf)
            tokens = jnp.pad(tokens, ((0, 0), (0, missing)), constant_values=PAD_ID)
            found = jnp.pad(found, ((0, 0), (0, missing)), constant_values=False)
        batch = encoder_input_tokens.shape[0]
        sequences = jnp.full((batch, num_results, max_decode_len), PAD_ID, jnp.int32)
        sequences = sequences.at[:, :, 0].set(jnp.where(found, tokens, PAD_ID))
        sequences = sequences.at[:, :, 1].set(jnp.where(found, EOS_ID, PAD_ID))
        return decoding.BeamSearchResult(sequences=sequences, scores=scores)


def _top_k_local(states: Array, kernel: Array, *, k: int, first_column: int, end_column: int,
                 column_offset: Array | int) -> tuple[Array, Array, Array]:
    """Top-k of states @ kernel over the columns [first_column, end_column) of this block of columns.

    states: [batch, embed]; kernel: [embed, block] holding global columns column_offset .. + block.
    Returns (values float32[batch, min(k, block)], global columns int32[same], logsumexp float32[batch]).
    """
    logits = jnp.einsum("bd,dv->bv", states, kernel.astype(states.dtype)).astype(jnp.float32)
    columns = column_offset + jnp.arange(kernel.shape[1], dtype=jnp.int32)
    logits = jnp.where((columns >= first_column) & (columns < end_column), logits, NEG_INF)
    values, picked = jax.lax.top_k(logits, min(k, kernel.shape[1]))
    return values, (picked + column_offset).astype(jnp.int32), jax.nn.logsumexp(logits, axis=-1)


def top_k_columns(states: Array, kernel: Array, *, k: int, first_column: int, end_column: int
                  ) -> tuple[Array, Array]:
    """The k best columns of the log-softmax of states @ kernel restricted to [first_column, end_column).

    states: [batch, embed]; kernel: [embed, columns], split over the 'model' mesh axis when a mesh with that axis is
    in context (`partitioning.partitioning_context`). Returns (log-probs float32[batch, k'], columns int32[batch, k'])
    best first, k' = min(k, columns). Shard-wise: each 'model' shard computes only its own block of logits, its
    local top-k and log-normaliser; the shards' candidates (k per shard) and normalisers are gathered and merged.
    No device ever holds the logits of all columns, so an atomic head over 8.8M docids ranks the whole corpus in
    one pass with memory per device ~ batch * columns / model_shards.
    """
    mesh = jax.sharding.get_abstract_mesh()
    shards = 1 if mesh.empty or MODEL_AXIS not in mesh.axis_names else mesh.shape[MODEL_AXIS]
    width = kernel.shape[1]
    k = min(k, width)
    if shards == 1:
        values, columns, log_z = _top_k_local(states, kernel, k=k, first_column=first_column,
                                              end_column=end_column, column_offset=0)
        return values - log_z[:, None], columns
    if width % shards:
        raise ValueError(f"the kernel's {width} columns do not split over the {shards} '{MODEL_AXIS}' shards")
    data = mesh.shape[DATA_AXIS] if DATA_AXIS in mesh.axis_names else 1
    batch_axis = DATA_AXIS if data > 1 and states.shape[0] % data == 0 else None

    def per_shard(states_block, kernel_block):
        offset = jax.lax.axis_index(MODEL_AXIS) * kernel_block.shape[1]
        values, columns, log_z = _top_k_local(states_block, kernel_block, k=k, first_column=first_column,
                                              end_column=end_column, column_offset=offset)
        values = jax.lax.all_gather(values, MODEL_AXIS, axis=1, tiled=True)  # [batch, shards * k_local]
        columns = jax.lax.all_gather(columns, MODEL_AXIS, axis=1, tiled=True)
        log_z = jax.nn.logsumexp(jax.lax.all_gather(log_z[:, None], MODEL_AXIS, axis=1, tiled=True), axis=-1)
        best, picked = jax.lax.top_k(values, k)
        return best - log_z[:, None], jnp.take_along_axis(columns, picked, axis=1)

    return jax.shard_map(per_shard, in_specs=(PartitionSpec(batch_axis, None), PartitionSpec(None, MODEL_AXIS)),
                         out_specs=(PartitionSpec(batch_axis, None), PartitionSpec(batch_axis, None)),
                         check_vma=False)(states, kernel)
