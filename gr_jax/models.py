"""Model wrapper in the t5x manner: a Flax network plus its loss, scoring and prediction.

The trainer and evaluator talk only to this class: `loss_fn` for training, `score_batch` for teacher-forced
log-likelihoods, `predict_batch` for (constrained) beam search. Batches are dicts of int32 arrays with seqio's
EncDecFeatureConverter names: encoder_input_tokens [batch, src_len], decoder_input_tokens / decoder_target_tokens /
decoder_loss_weights [batch, tgt_len].

Atomic docids (`T5Config.decoder_head='atomic'`): a target row is `[docid_vocab_start + i, EOS, PAD...]` and only
its first token is learnt and scored (after a docid, EOS has probability 1 by construction), so loss, accuracy and
`score_batch` are per docid: log p(docid | query) under a softmax over the whole corpus. `predict_batch` is then
`rank_atomic`: one decoder step and a top-k over all docid logits, computed shard-wise over the 'model' mesh axis.

NCI's consistency regulariser (`T5Config.consistency_weight` > 0, see `gr_jax.losses`) runs two dropout passes per
training batch; the loss is their mean cross entropy plus the weighted regulariser.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

import jax
import jax.numpy as jnp

from jax.sharding import PartitionSpec

from gr_jax import decoding
from gr_jax import losses
from gr_jax import network
from gr_jax.losses import cross_entropy_with_z_loss
from gr_jax.partitioning import DATA_AXIS, MODEL_AXIS
from gr_jax.trie import Trie
from gr_jax.vocabulary import EOS_ID, PAD_ID

Array = jax.Array
Batch = Mapping[str, Array]

__all__ = ["EncoderDecoderModel", "cross_entropy_with_z_loss", "top_k_columns"]


def _top_k_local(states: Array, kernel: Array, *, k: int, first_column: int, end_column: int,
                 column_offset: Array | int) -> tuple[Array, Array, Array]:
    """Top-k of states @ kernel over the columns [first_column, end_column) of this block of columns.

    states: [batch, embed]; kernel: [embed, block] holding global columns column_offset .. + block.
    Returns (values float32[batch, min(k, block)], global columns int32[same], logsumexp float32[batch]).
    """
    logits = jnp.einsum("bd,dv->bv", states, kernel.astype(states.dtype)).astype(jnp.float32)
    columns = column_offset + jnp.arange(kernel.shape[1], dtype=jnp.int32)
    logits = jnp.where((columns >= first_column) & (columns < end_column), logits, network.NEG_INF)
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


@dataclasses.dataclass(frozen=True)
class EncoderDecoderModel:
    """T5 for generative retrieval.

    `z_loss` follows t5x (1e-4). Losses are returned as sums with their weight so that gradient accumulation and
    multi-device reduction can normalise by the true number of target tokens.

    `T5Config.consistency_weight` > 0 adds NCI's consistency regulariser (`T5Config.consistency_loss`:
    'symmetric_kl' or 'contrastive', see `gr_jax.losses`) between two dropout passes of each training batch.
    """
    config: network.T5Config
    z_loss: float = 1e-4

    @property
    def module(self) -> network.Transformer:
        return network.Transformer(self.config)

    # --- Initialisation -------------------------------------------------------------------------------------

    def init(self, rng: Array, *, input_length: int, target_length: int, batch_size: int = 1) -> dict:
        """Boxed (logically partitioned) variables; use under jax.eval_shape for shapes and shardings."""
        enc = jnp.ones((batch_size, input_length), jnp.int32)
        dec = jnp.ones((batch_size, target_length), jnp.int32)
        return self.module.init({"params": rng, "dropout": rng}, enc, dec, enable_dropout=False)

    # --- Training -------------------------------------------------------------------------------------------

    def _forward(self, params, batch: Batch, dropout_rng: Optional[Array], *, return_states: bool = False):
        rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
        return self.module.apply({"params": params}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
                                 enable_dropout=dropout_rng is not None, return_states=return_states, rngs=rngs)

    def loss_fn(self, params, batch: Batch, dropout_rng: Optional[Array]) -> tuple[Array, dict]:
        """Returns (summed loss, metrics of sums). Dropout is on iff dropout_rng is given.

        With `config.consistency_weight` > 0 and dropout on, the batch runs twice with independent dropout masks:
        the loss is the two passes' mean cross entropy (+ z-loss) plus consistency_weight * the regulariser summed
        over the weighted target positions; metrics add `consistency_loss` (the unweighted sum) and keep pass 1's
        accuracy.
        """
        cfg = self.config
        if dropout_rng is None or cfg.consistency_weight == 0.0:
            return self.loss_from_logits(self._forward(params, batch, dropout_rng), batch)
        rng_a, rng_b = jax.random.split(dropout_rng)
        logits_a, states_a = self._forward(params, batch, rng_a, return_states=True)
        logits_b, states_b = self._forward(params, batch, rng_b, return_states=True)
        loss_a, metrics = self.loss_from_logits(logits_a, batch)
        loss_b, metrics_b = self.loss_from_logits(logits_b, batch)
        _, weights, _ = self._targets_and_weights(batch, length=logits_a.shape[1])
        if cfg.consistency_loss == "symmetric_kl":
            per_position = losses.symmetric_kl(logits_a, logits_b)
        else:
            per_position = losses.contrastive_consistency(states_a, states_b, weights > 0,
                                                          temperature=cfg.consistency_temperature)
        consistency = jnp.sum(jnp.where(weights > 0, per_position * weights, 0.0))
        total = 0.5 * (loss_a + loss_b) + cfg.consistency_weight * consistency
        metrics = dict(metrics, loss=total, z_loss=0.5 * (metrics["z_loss"] + metrics_b["z_loss"]),
                       consistency_loss=consistency)
        return total, metrics

    def _targets_and_weights(self, batch: Batch, *, length: int) -> tuple[Array, Array, Array]:
        """The logits' columns to score [batch, length] (int32), float32 loss weights and bool `invalid`.

        All target positions are scored at their token ids, except for the atomic head, whose logits cover the
        docid columns of the first position only: column = token - docid_vocab_start. A weighted atomic target
        that is no docid token is `invalid` (its loss and score become NaN, which stops training loudly:
        a jitted step cannot raise); unweighted ones (padding rows) are scored at column 0 and weigh nothing.
        """
        cfg = self.config
        targets = batch["decoder_target_tokens"][:, :length]
        weights = batch.get("decoder_loss_weights")
        weights = ((targets > 0) if weights is None else weights[:, :length]).astype(jnp.float32)
        invalid = jnp.zeros(targets.shape, bool)
        if cfg.decoder_head == "atomic":
            targets = targets - cfg.docid_vocab_start
            outside = (targets < 0) | (targets >= cfg.docid_vocab_size)
            invalid = outside & (weights > 0)
            targets = jnp.where(outside, 0, targets)
        return targets, weights, invalid

    def loss_from_logits(self, logits: Array, batch: Batch) -> tuple[Array, dict]:
        targets, weights, invalid = self._targets_and_weights(batch, length=logits.shape[1])
        token_loss, z = cross_entropy_with_z_loss(logits, targets, z_loss=self.z_loss)
        token_loss = jnp.where(invalid, jnp.nan, token_loss)
        correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
        # A sequence is right when all its weighted tokens are: exact-match accuracy of the docid.
        seq_correct = jnp.all((correct > 0) | (weights == 0), axis=-1).astype(jnp.float32)
        has_target = (jnp.sum(weights, axis=-1) > 0).astype(jnp.float32)
        metrics = {
            "loss": jnp.sum(token_loss * weights),
            "z_loss": jnp.sum(z * weights),
            "weight": jnp.sum(weights),
            "correct_tokens": jnp.sum(correct * weights),
            "correct_sequences": jnp.sum(seq_correct * has_target),
            "num_sequences": jnp.sum(has_target),
        }
        return metrics["loss"], metrics

    # --- Scoring and prediction -----------------------------------------------------------------------------

    def score_batch(self, params, batch: Batch) -> Array:
        """Teacher-forced log-likelihood of decoder_target_tokens: float32[batch] (atomic: log p(docid))."""
        logits = self._forward(params, batch, None)
        log_p = jax.nn.log_softmax(logits)
        targets, weights, invalid = self._targets_and_weights(batch, length=logits.shape[1])
        token_lp = jnp.where(invalid, jnp.nan, jnp.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0])
        return jnp.sum(jnp.where(weights > 0, token_lp, 0.0), axis=-1)

    def _step_fn(self, params, context: network.DecodeContext):
        def step_fn(tokens, position, cache):
            return self.module.apply({"params": params}, tokens, position=position, cache=cache,
                                     context=context, method=network.Transformer.decode_step)
        return step_fn

    def _prefill(self, params, encoder_input_tokens: Array, max_decode_len: int) -> network.DecodeContext:
        return self.module.apply({"params": params}, encoder_input_tokens, max_decode_len=max_decode_len,
                                 method=network.Transformer.prefill)

    def predict_batch(self, params, encoder_input_tokens: Array, *, num_beams: int, max_decode_len: int,
                      trie: Optional[Trie] = None, length_penalty: float = 0.0) -> decoding.BeamSearchResult:
        """Beam search: sequences int32[batch, beams, max_decode_len], scores float32[batch, beams], best first.

        With `trie`, only valid docids can be produced and scores are their exact log-likelihoods. The atomic head
        ranks instead (`rank_atomic`, exact: the `num_beams` best docids of the whole corpus); it needs no trie,
        since its outputs are exactly the docids, and ignores one if given.
        """
        if self.config.decoder_head == "atomic":
            return self.rank_atomic(params, encoder_input_tokens, num_results=num_beams,
                                    max_decode_len=max_decode_len, length_penalty=length_penalty)
        batch = encoder_input_tokens.shape[0]
        context = self._prefill(params, encoder_input_tokens, max_decode_len)
        cache = network.init_cache(self.config, rows=batch * num_beams, max_decode_len=max_decode_len)
        return decoding.beam_search(step_fn=self._step_fn(params, context), cache=cache, batch_size=batch,
                                    num_beams=num_beams, max_decode_len=max_decode_len, trie=trie,
                                    length_penalty=length_penalty)

    def rank_atomic(self, params, encoder_input_tokens: Array, *, num_results: int, max_decode_len: int = 2,
                    length_penalty: float = 0.0) -> decoding.BeamSearchResult:
        """Atomic head: the `num_results` most likely docids of the whole corpus for each query, best first.

        One encoder pass and one decoder step give the query state; `top_k_columns` ranks all docid columns
        shard-wise. Results have `predict_batch`'s format so the evaluator's DocidTable lookup applies unchanged:
        sequences int32[batch, num_results, max_decode_len] = `[docid token, EOS, PAD...]` (the table row
        `[docid_vocab_start + i, EOS]` of docid i), scores float32[batch, num_results] = log p(docid | query)
        (divided by the brevity penalty of length 2 if `length_penalty` != 0); slots beyond the number of docids
        have score -inf and PAD tokens.
        """
        cfg = self.config
        if cfg.decoder_head != "atomic":
            raise ValueError(f"rank_atomic needs decoder_head='atomic', not {cfg.decoder_head!r}")
        if not isinstance(num_results, int) or num_results < 1:
            raise ValueError(f"num_results must be a positive int, got {num_results!r}")
        if max_decode_len < 2:
            raise ValueError(f"max_decode_len={max_decode_len}: an atomic docid needs 2 tokens (docid, EOS)")
        states = self.module.apply({"params": params}, encoder_input_tokens,
                                   method=network.Transformer.atomic_query_states)
        scores, columns = top_k_columns(states, params["atomic_logits_dense"], k=num_results, first_column=0,
                                        end_column=cfg.docid_vocab_size)
        tokens = columns + cfg.docid_vocab_start
        found = scores > network.NEG_INF / 2  # masked columns only surface when num_results > number of docids
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

    def sample_batch(self, params, encoder_input_tokens: Array, *, rng: Array, max_decode_len: int,
                     top_k: int = 10, temperature: float = 1.0,
                     trie: Optional[Trie] = None) -> decoding.SampleResult:
        """Top-k sampling, one sample per row (repeat rows for several samples per input)."""
        batch = encoder_input_tokens.shape[0]
        context = self._prefill(params, encoder_input_tokens, max_decode_len)
        cache = network.init_cache(self.config, rows=batch, max_decode_len=max_decode_len)
        return decoding.sample(step_fn=self._step_fn(params, context), cache=cache, rng=rng, batch_size=batch,
                               max_decode_len=max_decode_len, top_k=top_k, temperature=temperature, trie=trie)
