"""What an output head is, and the registry of heads by name (`T5Config.decoder_head`).

A head is everything that depends on the output layer, in one module:
  * as a Flax module, the output layer's parameters and how decoder states become logits, teacher-forced
    (`__call__`) and one step at a time (`prefill`, `step`). The `Transformer` shares its scope with its head,
    so the head's parameters keep top-level names (`logits_dense`, `atomic_logits_dense`, `pawa/...`);
  * as class methods, what the rest of the code base asks before any module exists: the config's checks and
    sizes, which logits column each target token is scored at, how a batch of queries is decoded into ranked
    docids (generic beam search unless the head ranks directly), and which parameters no pretrained T5 has.

A new head is one new module of `gr_jax.heads` with an `OutputHead` subclass decorated with `register_head`, and
a gin binding of `network.T5Config.decoder_head`.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar, Optional, TypeVar

import jax
import jax.numpy as jnp
from flax import linen as nn

from gr_jax import decoding
from gr_jax.network import BATCH, LENGTH, NEG_INF, VOCAB, T5Config
from gr_jax.vocabulary import EOS_ID

if TYPE_CHECKING:
    from gr_jax.docids.trie import Trie
    from gr_jax.models import EncoderDecoderModel

Array = jax.Array


class OutputHead(nn.Module):
    """The output layer of a `gr_jax.network.Transformer` (see the module docstring)."""

    config: T5Config

    name_in_registry: ClassVar[str]
    #: Regular expressions (full match) over '/'-joined parameter paths that a pretrained T5 has no tensor for.
    fresh_param_patterns: ClassVar[tuple[str, ...]] = ()
    #: Whether `predict_batch` ranks the whole corpus in one decoder pass instead of decoding step by step.
    ranks_in_one_pass: ClassVar[bool] = False

    # --- Configuration ------------------------------------------------------------------------------------------

    @classmethod
    def check_config(cls, config: T5Config) -> None:
        """Raises on settings this head cannot use (called when a T5Config is made)."""

    @classmethod
    def logits_vocab_size(cls, config: T5Config) -> int:
        """Size of the decoded token space: decode_step's logits, the trie's vocabulary."""
        size = config.output_vocab_size or config.vocab_size
        if size is None:
            raise ValueError("T5Config.vocab_size is unset: bind it in gin or let the model builder fill it from the "
                             "docid space (config.with_vocab_size(...)).")
        return size

    @classmethod
    def with_docid_range(cls, config: T5Config, docid_token_range: Optional[tuple[int, int]]) -> T5Config:
        """The config with what this head needs from the run's docid tokens [start, stop) filled in."""
        del docid_token_range
        return config

    @classmethod
    def num_cached_layers(cls, config: T5Config) -> int:
        """Decoder layers of the head's own whose self-attention cache incremental decoding keeps."""
        del config
        return 0

    @classmethod
    def layer_stacks(cls, config: T5Config) -> dict[str, int]:
        """The head's own layer stacks (`network.layer_stack`): parameter path -> depth, so that
        `gr_jax.layer_layout` converts them between the unscanned and scanned layouts as the trunk's."""
        del config
        return {}

    @classmethod
    def embedded_vocab_size(cls, config: T5Config, *, model_vocab_size: int) -> int:
        """How many token ids the input embedding must cover when the run's tokens are [0, model_vocab_size): all of
        them by default (docid tokens are decoder inputs). The model builder sizes `T5Config.vocab_size` from it."""
        del config
        return model_vocab_size

    @classmethod
    def shares_input_vocabulary(cls, config: T5Config) -> bool:
        """Whether `logits_dense` indexes the embedding's tokens, so a pretrained lm_head's rows fill it."""
        return cls.logits_vocab_size(config) == config.vocab_size

    # --- Training and scoring -----------------------------------------------------------------------------------

    @classmethod
    def target_columns(cls, config: T5Config, targets: Array, weights: Array) -> tuple[Array, Array]:
        """The logits column of each target token, int32[batch, length], and bool `invalid` (a weighted target the
        head cannot score; its loss and score become NaN, which stops training loudly: a jitted step cannot raise)."""
        del config, weights
        return targets, jnp.zeros(targets.shape, bool)

    # --- Retrieval ----------------------------------------------------------------------------------------------

    @classmethod
    def predict_batch(cls, model: EncoderDecoderModel, params: Any, encoder_input_tokens: Array, *, num_beams: int,
                      max_decode_len: int, trie: Optional[Trie], length_penalty: float) -> decoding.BeamSearchResult:
        """The `num_beams` best sequences per query, best first: beam search over `decode_step`."""
        return model.beam_search(params, encoder_input_tokens, num_beams=num_beams, max_decode_len=max_decode_len,
                                 trie=trie, length_penalty=length_penalty)

    # --- The Flax module ----------------------------------------------------------------------------------------

    def teacher_forced_inputs(self, decoder_input_tokens: Array) -> Array:
        """The decoder input positions this head is trained and scored on (all of them by default)."""
        return decoder_input_tokens

    def __call__(self, states: Array, *, embedded: Array, encoded: Array, cross_mask: Array,
                 deterministic: bool) -> Array:
        """Teacher-forced logits. states: the main decoder's normalised states [batch, length, embed]; embedded: the
        decoder input embeddings, same shape; encoded: [batch, src_len, embed]; cross_mask: bool[batch, 1, 1, src]."""
        raise NotImplementedError

    def prefill(self, encoded: Array, *, max_decode_len: int) -> Any:
        """Per-query constants of the head's own stack for incremental decoding (a pytree; () for none)."""
        del encoded, max_decode_len
        return ()

    def step_inputs(self, tokens: Array, *, position: Array) -> Array:
        """The previous tokens, int32[rows], as the decoder embeds them at `position`."""
        del position
        return tokens

    def step(self, states: Array, *, embedded: Array, position: Array, cache: tuple, context: Any,
             cross_mask: Array) -> tuple[Array, tuple]:
        """One decoding position: states [rows, 1, embed] -> (float32 logits [rows, logits_vocab_size], the head's
        updated cache)."""
        raise NotImplementedError


def masked_logits(logits: Array, allowed: Array) -> Array:
    """NEG_INF outside `allowed` (bool[width]); float32 logits with the (batch, length, vocab) constraint."""
    logits = jnp.where(allowed, logits.astype(jnp.float32), NEG_INF)
    return nn.with_logical_constraint(logits, (BATCH, LENGTH, VOCAB)[-logits.ndim:])


class OverDocidTokens:
    """Mixin of heads whose output layer covers the docid tokens [docid_vocab_start, docid_vocab_start +
    docid_vocab_size) (atomic, PAWA): the range's checks, and its filling from the docid space."""

    name_in_registry: ClassVar[str]

    @classmethod
    def check_config(cls, config: T5Config) -> None:
        """Both or neither of the range's fields set, ids above EOS, at least one, inside `output_vocab_size`."""
        if (config.docid_vocab_start is None) != (config.docid_vocab_size is None):
            raise ValueError(f"decoder_head={cls.name_in_registry!r}: set both docid_vocab_start and docid_vocab_size, "
                             "or neither (the model builder fills them from the docid space)")
        if config.docid_vocab_start is not None:
            if config.docid_vocab_start <= EOS_ID or config.docid_vocab_size < 1:
                raise ValueError(f"docid tokens must be ids above EOS={EOS_ID} (docid_vocab_start="
                                 f"{config.docid_vocab_start}) and at least one "
                                 f"(docid_vocab_size={config.docid_vocab_size})")
            end = config.docid_vocab_start + config.docid_vocab_size
            if config.output_vocab_size is not None and config.output_vocab_size < end:
                raise ValueError(f"output_vocab_size={config.output_vocab_size} does not cover the docid tokens "
                                 f"[{config.docid_vocab_start}, {end})")

    @classmethod
    def require_docid_range(cls, config: T5Config) -> None:
        """Raises unless the docid token range the head's output layer covers is known."""
        if config.docid_vocab_start is None:
            raise ValueError(f"decoder_head={cls.name_in_registry!r} needs docid_vocab_start and docid_vocab_size, the "
                             "id range of the docid tokens its output layer covers: bind them in gin, or let the model "
                             "builder fill them from the docid space (gr_jax.experiment.build_model)")

    @classmethod
    def with_docid_range(cls, config: T5Config, docid_token_range: Optional[tuple[int, int]]) -> T5Config:
        """`config` with the docid range of the docid space, or checked against it when gin fixed one."""
        if docid_token_range is None:
            return config
        start, stop = docid_token_range
        if config.docid_vocab_start is None:
            return dataclasses.replace(config, docid_vocab_start=start, docid_vocab_size=stop - start)
        if not config.docid_vocab_start <= start < stop <= config.docid_vocab_start + config.docid_vocab_size:
            end = config.docid_vocab_start + config.docid_vocab_size
            raise ValueError(f"the docid tokens [{start}, {stop}) are outside the {cls.name_in_registry} head's "
                             f"range [{config.docid_vocab_start}, {end}) set in gin (DOCID_VOCAB_START, "
                             "DOCID_VOCAB_SIZE); leave those unset to fill them from the docid space")
        return config


HEADS: dict[str, type[OutputHead]] = {}

HeadType = TypeVar("HeadType", bound=type[OutputHead])


def register_head(name: str):
    """Class decorator: registers an `OutputHead` subclass under `name` (`T5Config.decoder_head`)."""
    def register(cls: HeadType) -> HeadType:
        if name in HEADS and HEADS[name] is not cls:
            raise ValueError(f"output head {name!r} is already registered by {HEADS[name].__module__}")
        cls.name_in_registry = name
        HEADS[name] = cls
        return cls
    return register


def get_head(name: str) -> type[OutputHead]:
    if name not in HEADS:
        raise ValueError(f"decoder_head must be one of {tuple(HEADS)}, got {name!r}")
    return HEADS[name]
