"""Model wrapper in the t5x manner: a Flax network plus its loss, scoring and prediction.

The trainer and evaluator talk only to this class: `loss_fn` for training, `score_batch` for teacher-forced
log-likelihoods, `predict_batch` for (constrained) beam search. Batches are dicts of int32 arrays with seqio's
EncDecFeatureConverter names: encoder_input_tokens [batch, src_len], decoder_input_tokens / decoder_target_tokens /
decoder_loss_weights [batch, tgt_len].
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

import jax
import jax.numpy as jnp

from gr_jax import decoding
from gr_jax import network
from gr_jax.trie import Trie

Array = jax.Array
Batch = Mapping[str, Array]


def cross_entropy_with_z_loss(logits: Array, targets: Array, *, z_loss: float) -> tuple[Array, Array]:
    """Token-level cross entropy plus t5x's z-loss (keeps log Z near 0, which stabilises bfloat16 training).

    logits: float32[..., vocab], targets: int32[...] -> (total loss [...], z-loss part [...]).
    """
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    z = z_loss * jnp.square(log_z)
    return log_z - target_logit + z, z


@dataclasses.dataclass(frozen=True)
class EncoderDecoderModel:
    """T5 for generative retrieval.

    `z_loss` follows t5x (1e-4). Losses are returned as sums with their weight so that gradient accumulation and
    multi-device reduction can normalise by the true number of target tokens.
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

    def loss_fn(self, params, batch: Batch, dropout_rng: Optional[Array]) -> tuple[Array, dict]:
        """Returns (summed loss, metrics of sums). Dropout is on iff dropout_rng is given."""
        rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
        logits = self.module.apply({"params": params}, batch["encoder_input_tokens"],
                                   batch["decoder_input_tokens"], enable_dropout=dropout_rng is not None,
                                   rngs=rngs)
        return self.loss_from_logits(logits, batch)

    def loss_from_logits(self, logits: Array, batch: Batch) -> tuple[Array, dict]:
        targets = batch["decoder_target_tokens"]
        weights = batch.get("decoder_loss_weights")
        weights = (targets > 0).astype(jnp.float32) if weights is None else weights.astype(jnp.float32)
        token_loss, z = cross_entropy_with_z_loss(logits, targets, z_loss=self.z_loss)
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
        """Teacher-forced log-likelihood of decoder_target_tokens: float32[batch]."""
        logits = self.module.apply({"params": params}, batch["encoder_input_tokens"],
                                   batch["decoder_input_tokens"])
        log_p = jax.nn.log_softmax(logits)
        targets = batch["decoder_target_tokens"]
        token_lp = jnp.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]
        weights = batch.get("decoder_loss_weights")
        weights = (targets > 0) if weights is None else weights > 0
        return jnp.sum(jnp.where(weights, token_lp, 0.0), axis=-1)

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

        With `trie`, only valid docids can be produced and scores are their exact log-likelihoods.
        """
        batch = encoder_input_tokens.shape[0]
        context = self._prefill(params, encoder_input_tokens, max_decode_len)
        cache = network.init_cache(self.config, rows=batch * num_beams, max_decode_len=max_decode_len)
        return decoding.beam_search(step_fn=self._step_fn(params, context), cache=cache, batch_size=batch,
                                    num_beams=num_beams, max_decode_len=max_decode_len, trie=trie,
                                    length_penalty=length_penalty)

    def sample_batch(self, params, encoder_input_tokens: Array, *, rng: Array, max_decode_len: int,
                     top_k: int = 10, temperature: float = 1.0,
                     trie: Optional[Trie] = None) -> decoding.SampleResult:
        """Top-k sampling, one sample per row (repeat rows for several samples per input)."""
        batch = encoder_input_tokens.shape[0]
        context = self._prefill(params, encoder_input_tokens, max_decode_len)
        cache = network.init_cache(self.config, rows=batch, max_decode_len=max_decode_len)
        return decoding.sample(step_fn=self._step_fn(params, context), cache=cache, rng=rng, batch_size=batch,
                               max_decode_len=max_decode_len, top_k=top_k, temperature=temperature, trie=trie)
