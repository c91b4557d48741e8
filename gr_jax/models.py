"""Model wrapper in the t5x manner: a Flax network plus its loss, scoring and prediction.

The trainer and retrievers talk only to this class: `loss_fn` for training, `score_batch` for teacher-forced
log-likelihoods, `predict_batch` for ranked docid sequences (beam search, or the head's own ranking). Batches are
dicts of int32 arrays with seqio's EncDecFeatureConverter names: encoder_input_tokens [batch, src_len],
decoder_input_tokens / decoder_target_tokens / decoder_loss_weights [batch, tgt_len]; a ranked-list batch
(`gr_jax.ranking.data`) adds soft targets, decoder_soft_target_tokens int32 / decoder_soft_target_mass float32
[batch, tgt_len, K], and its decoder_loss_weights carry each example's item weight.

What depends on the output layer (which logits column scores a target token, how a batch is ranked) is the head's
(`head`, a `gr_jax.heads.OutputHead`); what the training objective is, the loss's (`gr_jax.losses`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, cast

import jax
import jax.numpy as jnp

from gr_jax import decoding
from gr_jax import losses
from gr_jax import network
from gr_jax import pretrained
from gr_jax.data.features import SOFT_TARGET_MASS, SOFT_TARGET_TOKENS
from gr_jax.dense.towers import Tower
from gr_jax.docids.trie import Trie
from gr_jax.heads import OutputHead, StandardHead
from gr_jax.tower_encoder import TowerEncoderTransformer

Array = jax.Array
Batch = Mapping[str, Array]

@dataclasses.dataclass(frozen=True)
class EncoderDecoderModel:
    """T5 for generative retrieval: `config` fixes the network, `head` its output head (T5.1.1's projection over the
    vocabulary by default), `loss` the training objective. encoder_tower: a pretrained tower (all-MiniLM-L6-v2)
    as the encoder instead of T5's, bridged to the decoder (`gr_jax.tower_encoder`); its inputs are then the tower's
    tokens. train_encoder_tower=False: no gradient through it."""
    config: network.T5Config
    loss: losses.Loss = losses.TokenCrossEntropy()
    head: OutputHead = StandardHead()
    encoder_tower: Optional[Tower] = None
    train_encoder_tower: bool = True

    def __post_init__(self):
        self.head.check(self.config)

    @property
    def frozen_parameters(self) -> Optional[str]:
        """A regex of the parameters no optimizer update may reach: the tower's when it is not trained, the
        head's own frozen ones (`OutputHead.frozen_param_pattern`), and with LoRA all but the adapters."""
        patterns = [*(["tower/.*"] if self.encoder_tower is not None and not self.train_encoder_tower else []),
                    *filter(None, [self.head.frozen_param_pattern()]),
                    *([self.config.lora.frozen_pattern()] if self.config.lora is not None else [])]
        return "|".join(f"(?:{pattern})" for pattern in patterns) or None

    def pretrained_params(self, *, abstract: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters that start as loaded rather than initialised (`Trainer.init_state(given=...)`), by
        top-level name, placed on `abstract` (the abstract state's parameters)'s shardings: the encoder tower's
        pretrained weights (none for a tower without stored weights) and the head's (`OutputHead.
        pretrained_params`)."""
        given = dict(self.head.pretrained_params(abstract=abstract))
        if self.encoder_tower is not None:
            loaded = self.encoder_tower.load_params(abstract=abstract["tower"])
            if loaded is not None:
                given["tower"] = loaded
        return given

    def params_from_checkpoint(self, *, checkpoint_dir: str, fresh: Any, shardings: Any) -> Any:
        """The network's parameters from a Hugging Face T5.1.1 checkpoint (`gr_jax.pretrained`), on `shardings`;
        `fresh` (the initialised parameters) gives what it does not hold: the head's fresh parameters and the
        vocabulary rows beyond the checkpoint's."""
        return pretrained.load_pretrained_params(checkpoint_dir=checkpoint_dir, config=self.config, head=self.head,
                                                 fresh_params=fresh, shardings=shardings)

    @property
    def module(self) -> TowerEncoderTransformer:
        return TowerEncoderTransformer(self.config, head=self.head, encoder_tower=self.encoder_tower,
                                       train_tower=self.train_encoder_tower)

    @property
    def logits_vocab_size(self) -> int:
        """Size of the decoded token space: decode_step's logits, the trie's vocabulary."""
        return self.head.logits_vocab_size(self.config)

    def init_cache(self, *, rows: int, max_decode_len: int) -> tuple:
        """The zeroed decoding cache of `rows` rows (`network.init_cache`)."""
        return network.init_cache(self.config, head=self.head, rows=rows, max_decode_len=max_decode_len)

    # --- Initialisation -------------------------------------------------------------------------------------

    def init(self, rng: Array, *, input_length: int, target_length: int, batch_size: int = 1) -> Mapping[str, Any]:
        """Boxed (logically partitioned) variables; use under jax.eval_shape for shapes and shardings."""
        enc = jnp.ones((batch_size, input_length), jnp.int32)
        dec = jnp.ones((batch_size, target_length), jnp.int32)
        return self.module.init({"params": rng, "dropout": rng}, enc, dec, enable_dropout=False)

    # --- Training -------------------------------------------------------------------------------------------

    def outputs(self, params, batch: Batch, dropout_rng: Optional[Array]) -> losses.Outputs:
        """One teacher-forced pass (dropout on iff `dropout_rng` is given) as the loss sees it."""
        rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
        # Without `mutable`, flax's apply returns the output alone (it types it as maybe (output, state)): so here.
        logits, states = cast(tuple[Array, Array], self.module.apply(
            {"params": params}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
            enable_dropout=dropout_rng is not None, return_states=True, rngs=rngs))
        return self.teacher_forced_outputs(logits, states, batch)

    def teacher_forced_outputs(self, logits: Array, states: Optional[Array], batch: Batch) -> losses.Outputs:
        """What a loss sees of a teacher-forced pass's logits [B, length, columns] and states over `batch`: each
        target's column, weight and validity, and the batch's soft targets where it has them."""
        length = logits.shape[1]
        columns, weights, invalid = self._columns_and_weights(batch, length=length)
        soft_columns = soft_mass = None
        if SOFT_TARGET_TOKENS in batch:
            soft_mass = batch[SOFT_TARGET_MASS][:, :length].astype(jnp.float32)
            soft_columns, soft_invalid = self.head.target_columns(
                self.config, batch[SOFT_TARGET_TOKENS][:, :length], soft_mass)
            invalid = invalid | (jnp.any(soft_invalid, axis=-1) & (weights > 0))
        return losses.Outputs(logits=logits, states=states, columns=columns, weights=weights, invalid=invalid,
                              soft_columns=soft_columns, soft_mass=soft_mass)

    def loss_fn(self, params, batch: Batch, dropout_rng: Optional[Array]) -> tuple[Array, dict]:
        """Returns (summed loss, its metrics: `gr_jax.metrics`): `loss.num_passes` passes with independent dropout
        keys, or one pass without dropout when `dropout_rng` is None."""
        return losses.loss_over_passes(self.loss, lambda key: self.outputs(params, batch, key), dropout_rng)

    def _columns_and_weights(self, batch: Batch, *, length: int) -> tuple[Array, Array, Array]:
        """The logits' columns to score [batch, length] (int32), float32 loss weights and bool `invalid`
        (the head's `target_columns`): `length` is the head's number of teacher-forced positions."""
        targets = batch["decoder_target_tokens"][:, :length]
        weights = batch.get("decoder_loss_weights")
        weights = ((targets > 0) if weights is None else weights[:, :length]).astype(jnp.float32)
        columns, invalid = self.head.target_columns(self.config, targets, weights)
        return columns, weights, invalid

    # --- Scoring and prediction -----------------------------------------------------------------------------

    def score_batch(self, params, batch: Batch) -> Array:
        """Teacher-forced log-likelihood of decoder_target_tokens: float32[batch] (atomic: log p(docid))."""
        return sequence_log_likelihood(self.outputs(params, batch, None))

    def score_candidates(self, params, encoder_input_tokens: Array, candidate_targets: Array) -> tuple[Array, Array]:
        """Teacher-forced scores of C candidate target sequences per query, each query encoded once.

        encoder_input_tokens int32[B, L]; candidate_targets int32[B, C, T] (EOS-terminated, 0-padded) ->
        (log-likelihood float32[B, C] as `score_batch`, the number of scored positions float32[B, C]: the head's
        target positions, 1 for the atomic head)."""
        batch, candidates, length = candidate_targets.shape
        encoded = cast(Array, self.module.apply({"params": params}, encoder_input_tokens,
                                                method=network.Transformer.encode))
        targets = candidate_targets.reshape(batch * candidates, length)
        flat = {"encoder_input_tokens": jnp.repeat(encoder_input_tokens, candidates, axis=0),
                "decoder_target_tokens": targets,
                "decoder_input_tokens": jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))}
        logits = cast(Array, self.module.apply({"params": params}, jnp.repeat(encoded, candidates, axis=0),
                                               flat["encoder_input_tokens"], flat["decoder_input_tokens"],
                                               method=network.Transformer.decode))
        columns, weights, invalid = self._columns_and_weights(flat, length=logits.shape[1])
        outputs = losses.Outputs(logits=logits, states=None, columns=columns, weights=weights, invalid=invalid)
        return (sequence_log_likelihood(outputs).reshape(batch, candidates),
                jnp.sum(weights > 0, axis=-1).astype(jnp.float32).reshape(batch, candidates))

    def _step_fn(self, params, context: network.DecodeContext):
        def step_fn(tokens, position, cache):
            return self.module.apply({"params": params}, tokens, position=position, cache=cache,
                                     context=context, method=network.Transformer.decode_step)
        return step_fn

    def _prefill(self, params, encoder_input_tokens: Array, max_decode_len: int) -> network.DecodeContext:
        return cast(network.DecodeContext, self.module.apply({"params": params}, encoder_input_tokens,
                                                             max_decode_len=max_decode_len,
                                                             method=network.Transformer.prefill))

    def predict_batch(self, params, encoder_input_tokens: Array, *, num_beams: int, max_decode_len: int,
                      trie: Optional[Trie] = None, length_penalty: float = 0.0) -> decoding.BeamSearchResult:
        """The `num_beams` best docid sequences per query: sequences int32[batch, beams, max_decode_len], scores
        float32[batch, beams], best first. Beam search unless the head ranks directly (atomic: the exact top
        docids of the whole corpus). With `trie`, only valid docids can be produced and scores are their exact
        log-likelihoods."""
        return self.head.predict_batch(self, params, encoder_input_tokens, num_beams=num_beams,
                                       max_decode_len=max_decode_len, trie=trie, length_penalty=length_penalty)

    def beam_search(self, params, encoder_input_tokens: Array, *, num_beams: int, max_decode_len: int,
                    trie: Optional[Trie] = None, length_penalty: float = 0.0) -> decoding.BeamSearchResult:
        """Beam search over `decode_step` (see `predict_batch`)."""
        return self.beam_search_from(params, self._prefill(params, encoder_input_tokens, max_decode_len),
                                     num_beams=num_beams, max_decode_len=max_decode_len, trie=trie,
                                     length_penalty=length_penalty)

    def beam_search_from(self, params, context: network.DecodeContext, *, num_beams: int, max_decode_len: int,
                         trie: Optional[Trie] = None, length_penalty: float = 0.0) -> decoding.BeamSearchResult:
        """`beam_search` from a computed prefill (`network.Transformer.prefill`)."""
        batch = context.cross_mask.shape[0]
        cache = self.init_cache(rows=batch * num_beams, max_decode_len=max_decode_len)
        return decoding.beam_search(step_fn=self._step_fn(params, context), cache=cache, batch_size=batch,
                                    num_beams=num_beams, max_decode_len=max_decode_len, trie=trie,
                                    length_penalty=length_penalty)

    def score_docids(self, params, encoder_input_tokens: Array, sequences: Array, *,
                     trie: Trie) -> decoding.SequenceScores:
        """Log-likelihoods of one docid sequence int32[batch, length] per query, decoded step by step as the search
        decodes it, also renormalised over the trie's allowed tokens at every step (`decoding.score_sequences`)."""
        batch, length = sequences.shape
        context = self._prefill(params, encoder_input_tokens, length)
        cache = self.init_cache(rows=batch, max_decode_len=length)
        return decoding.score_sequences(step_fn=self._step_fn(params, context), cache=cache, sequences=sequences,
                                        trie=trie)

    def sample_batch(self, params, encoder_input_tokens: Array, *, rng: Array, max_decode_len: int,
                     top_k: int = 10, temperature: float = 1.0,
                     trie: Optional[Trie] = None) -> decoding.SampleResult:
        """Top-k sampling, one sample per row (repeat rows for several samples per input)."""
        batch = encoder_input_tokens.shape[0]
        context = self._prefill(params, encoder_input_tokens, max_decode_len)
        cache = self.init_cache(rows=batch, max_decode_len=max_decode_len)
        return decoding.sample(step_fn=self._step_fn(params, context), cache=cache, rng=rng, batch_size=batch,
                               max_decode_len=max_decode_len, top_k=top_k, temperature=temperature, trie=trie)


def sequence_log_likelihood(outputs: losses.Outputs) -> Array:
    """Sum over the weighted positions of log p(target column): float32[batch]; NaN where a target is invalid
    for the head."""
    log_p = jax.nn.log_softmax(outputs.logits)
    token_lp = jnp.where(outputs.invalid, jnp.nan,
                         jnp.take_along_axis(log_p, outputs.columns[..., None], axis=-1)[..., 0])
    return jnp.sum(jnp.where(outputs.weights > 0, token_lp, 0.0), axis=-1)
