"""A decoder-only network as a generative retriever: the query as the prompt, the docid tokens after it.

Why: the follow-up papers run DSI-style retrieval on decoder-only LMs. The examples are the generative family's own
(the seqio tasks' `encoder_input_tokens`, `decoder_input_tokens`, `decoder_target_tokens`): one sequence is the
query's block (the prompt template's prefix, the query [input_length] right-padded, its suffix) followed by the
decoder's inputs [target_length] (the start token PAD, then the docid's tokens), its pads masked from attention
and skipped by the rotary positions, so every docid token sits right after the prompt's last token. The loss reads
the logits at the decoder positions only (`losses.Outputs`, so the generative losses apply unchanged: token
cross-entropy, SToICaL's item weights and soft trie targets).

Decoding prefills each query's block once, then runs `gr_jax.decoding`'s (trie-constrained) beam search over
`decode_step`, the slots after the block holding the docid tokens: the same sequence training saw.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Optional, cast

import jax
import jax.numpy as jnp

from gr_jax import decoding
from gr_jax import lora
from gr_jax import losses
from gr_jax.data.features import SOFT_TARGET_MASS, SOFT_TARGET_TOKENS
from gr_jax.decoder_only.network import DecoderOnlyConfig, DecoderOnlyTransformer, KVCache, left_padded_positions
from gr_jax.decoder_only.pretrained import load_params
from gr_jax.docids.trie import Trie
from gr_jax.models import sequence_log_likelihood
from gr_jax.network import Array
from gr_jax.vocabulary import PAD_ID

Batch = Mapping[str, Array]


@dataclasses.dataclass(frozen=True)
class DecoderOnlyModel:
    """config: the network's (vocab_size set: the text's pieces and the docid tokens); loss: as the generative
    family's (`gr_jax.losses`)."""
    config: DecoderOnlyConfig
    loss: losses.Loss = losses.TokenCrossEntropy()
    # The prompt template's token ids around each query block (`experiment.PromptTemplate`): the block is
    # [prompt_prefix, query (right-padded), prompt_suffix], its pads masked and skipped by the rotary positions.
    prompt_prefix: tuple[int, ...] = ()
    prompt_suffix: tuple[int, ...] = ()
    # Where a Hugging Face checkpoint's token rows start among the model's (`params_from_checkpoint`): the run's
    # vocabulary's shift of the checkpoint tokenizer's ids (`gr_jax.data.hf_tokenizer`).
    token_offset: int = 0

    # What a generative run asks of its model beyond training and decoding: no pretrained tower.
    encoder_tower = None

    @property
    def frozen_parameters(self) -> Optional[str]:
        """With LoRA, everything but the adapters (no update and no optimizer state reach them); else nothing."""
        return self.config.lora.frozen_pattern() if self.config.lora is not None else None

    @property
    def module(self) -> DecoderOnlyTransformer:
        return DecoderOnlyTransformer(self.config)

    def _decoding(self, params: Any) -> tuple[DecoderOnlyTransformer, Any]:
        """The network decoding runs and its parameters: with LoRA, the base network with the adapters merged into
        its kernels (`lora.merge`), so no decoding step computes the low-rank products."""
        if self.config.lora is None:
            return self.module, params
        return (DecoderOnlyTransformer(dataclasses.replace(self.config, lora=None)),
                lora.merge(params, lora=self.config.lora))

    @property
    def logits_vocab_size(self) -> int:
        """Size of the decoded token space: decode_step's logits, the trie's vocabulary."""
        return self.config.vocab

    def pretrained_params(self, *, abstract: Any) -> None:
        del abstract
        return None

    def params_from_checkpoint(self, *, checkpoint_dir: str, fresh: Any, shardings: Any) -> Any:
        """The network's parameters from a Hugging Face Llama / Mistral / Qwen checkpoint
        (`gr_jax.decoder_only.pretrained`), its token rows from row `token_offset` on; `fresh` (the initialised
        parameters) gives the rest: the rows before and after them (PAD and EOS, the docid tokens) and the
        adapters."""
        return load_params(checkpoint_dir=checkpoint_dir, config=self.config, shardings=shardings, fresh=fresh,
                           token_offset=self.token_offset)

    def init(self, rng: Array, *, input_length: int, target_length: int) -> Mapping[str, Any]:
        """Boxed variables for queries of `input_length` tokens and `target_length` docid positions."""
        tokens = jnp.ones((1, input_length + target_length), jnp.int32)
        return self.module.init({"params": rng, "dropout": rng}, tokens)

    def prompt_block(self, encoder_input_tokens: Array) -> Array:
        """The queries int32[batch, L] in the prompt template: int32[batch, len(prefix) + L + len(suffix)]."""
        def constant(ids: tuple[int, ...]) -> Array:
            return jnp.broadcast_to(jnp.asarray(ids, jnp.int32), (encoder_input_tokens.shape[0], len(ids)))
        if not self.prompt_prefix and not self.prompt_suffix:
            return encoder_input_tokens
        return jnp.concatenate([constant(self.prompt_prefix), encoder_input_tokens, constant(self.prompt_suffix)], 1)

    # --- Training -------------------------------------------------------------------------------------------

    def outputs(self, params: Any, batch: Batch, dropout_rng: Optional[Array]) -> losses.Outputs:
        """One teacher-forced pass over [query block, decoder inputs]: the logits of the decoder positions."""
        inputs, targets = self.prompt_block(batch["encoder_input_tokens"]), batch["decoder_target_tokens"]
        tokens = jnp.concatenate([inputs, batch["decoder_input_tokens"]], axis=1)
        valid = jnp.concatenate([inputs != PAD_ID, targets != PAD_ID], axis=1)
        rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
        logits = cast(Array, self.module.apply({"params": params}, tokens, positions=left_padded_positions(valid),
                                               valid=valid, enable_dropout=dropout_rng is not None, rngs=rngs))
        weights = batch.get("decoder_loss_weights")
        weights = (targets > 0 if weights is None else weights).astype(jnp.float32)
        soft_columns = soft_mass = None
        if SOFT_TARGET_TOKENS in batch:
            soft_columns = batch[SOFT_TARGET_TOKENS]
            soft_mass = batch[SOFT_TARGET_MASS].astype(jnp.float32)
        return losses.Outputs(logits=logits[:, inputs.shape[1]:], states=None, columns=targets, weights=weights,
                              invalid=jnp.zeros(targets.shape, bool), soft_columns=soft_columns, soft_mass=soft_mass)

    def loss_fn(self, params: Any, batch: Batch, dropout_rng: Optional[Array]) -> tuple[Array, Mapping[str, Any]]:
        """(summed loss, metrics) of `loss` over `loss.num_passes` passes (one without dropout)."""
        return losses.loss_over_passes(self.loss, lambda key: self.outputs(params, batch, key), dropout_rng)

    # --- Decoding -------------------------------------------------------------------------------------------

    def _prefilled(self, module: DecoderOnlyTransformer, params: Any, encoder_input_tokens: Array, *,
                   rows_per_query: int, max_decode_len: int) -> tuple[KVCache, Array]:
        """The query blocks [batch, L] run once through `module` (`_decoding`'s), each repeated for its
        `rows_per_query` rows: (the cache with `max_decode_len` free slots after the block, each row's number of
        query tokens int32[rows])."""
        encoder_input_tokens = self.prompt_block(encoder_input_tokens)
        valid = encoder_input_tokens != PAD_ID
        _, cache = module.apply({"params": params}, encoder_input_tokens, positions=left_padded_positions(valid),
                                valid=valid, max_len=encoder_input_tokens.shape[1] + max_decode_len,
                                method=DecoderOnlyTransformer.prefill)
        cache = jax.tree.map(lambda leaf: jnp.repeat(leaf, rows_per_query, axis=0), cache)
        return cache, jnp.repeat(jnp.sum(valid, axis=1, dtype=jnp.int32), rows_per_query)

    def _block_length(self, encoder_input_tokens: Array) -> int:
        return len(self.prompt_prefix) + encoder_input_tokens.shape[1] + len(self.prompt_suffix)

    def _step_fn(self, module: DecoderOnlyTransformer, params: Any, *, block: int,
                 query_tokens: Array) -> decoding.StepFn:
        """`decoding`'s step through `module`: decoder position p is cache slot block + p, rotary position
        query_tokens + p."""
        def step_fn(tokens, position, cache):
            return module.apply({"params": params}, tokens, positions=query_tokens + position,
                                index=block + position, cache=cache, method=DecoderOnlyTransformer.decode_step)
        return step_fn

    def predict_batch(self, params: Any, encoder_input_tokens: Array, *, num_beams: int, max_decode_len: int,
                      trie: Optional[Trie] = None, length_penalty: float = 0.0) -> decoding.BeamSearchResult:
        """The `num_beams` best docid sequences per query [batch, beams, max_decode_len] and their scores, best first
        (`gr_jax.decoding.beam_search`; with `trie`, valid docids only, scored by their exact log-likelihoods)."""
        batch = encoder_input_tokens.shape[0]
        module, params = self._decoding(params)  # merged once for the whole search
        cache, query_tokens = self._prefilled(module, params, encoder_input_tokens, rows_per_query=num_beams,
                                              max_decode_len=max_decode_len)
        step_fn = self._step_fn(module, params, block=self._block_length(encoder_input_tokens),
                                query_tokens=query_tokens)
        return decoding.beam_search(step_fn=step_fn, cache=cache, batch_size=batch, num_beams=num_beams,
                                    max_decode_len=max_decode_len, trie=trie, length_penalty=length_penalty)

    def score_docids(self, params: Any, encoder_input_tokens: Array, sequences: Array, *,
                     trie: Trie) -> decoding.SequenceScores:
        """Log-likelihoods of one docid sequence int32[batch, length] per query, decoded step by step as the search
        decodes it (`decoding.score_sequences`)."""
        module, params = self._decoding(params)
        cache, query_tokens = self._prefilled(module, params, encoder_input_tokens, rows_per_query=1,
                                              max_decode_len=sequences.shape[1])
        step_fn = self._step_fn(module, params, block=self._block_length(encoder_input_tokens),
                                query_tokens=query_tokens)
        return decoding.score_sequences(step_fn=step_fn, cache=cache, sequences=sequences, trie=trie)

    def score_batch(self, params: Any, batch: Batch) -> Array:
        """Teacher-forced log-likelihood of decoder_target_tokens: float32[batch]."""
        return sequence_log_likelihood(self.outputs(params, batch, None))

    def score_candidates(self, params: Any, encoder_input_tokens: Array,
                         candidate_targets: Array) -> tuple[Array, Array]:
        """Teacher-forced scores of C candidate docids per query (CGL, the ranking metrics: `gr_jax.candidates`):
        encoder_input_tokens int32[B, L], candidate_targets int32[B, C, T] (EOS-terminated, 0-padded) ->
        (log-likelihood float32[B, C], scored positions float32[B, C]). Each query block is prefilled once and its
        cache shared by its C candidates, whose T docid tokens then run as cached steps: a candidate costs T
        one-token steps, not a pass over the query and the docid."""
        batch, candidates, length = candidate_targets.shape
        targets = candidate_targets.reshape(batch * candidates, length)
        inputs = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))
        module, params = self._decoding(params)
        cache, query_tokens = self._prefilled(module, params, encoder_input_tokens, rows_per_query=candidates,
                                              max_decode_len=length)
        step_fn = self._step_fn(module, params, block=self._block_length(encoder_input_tokens),
                                query_tokens=query_tokens)

        def step(carry, position):
            cache, total = carry
            logits, cache = step_fn(inputs[:, position], position, cache)
            token = targets[:, position]
            log_p = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
            token_log_p = jnp.take_along_axis(log_p, token[:, None], axis=1)[:, 0]
            return (cache, total + jnp.where(token > 0, token_log_p, 0.0)), None

        (_, total), _ = jax.lax.scan(step, (cache, jnp.zeros(targets.shape[0], jnp.float32)), jnp.arange(length))
        scored = jnp.sum(targets > 0, axis=-1).astype(jnp.float32)
        return total.reshape(batch, candidates), scored.reshape(batch, candidates)
