"""What an output head is: its settings and answers (`OutputHead`) and its Flax layer (`HeadLayer`).

A head is everything that depends on the output layer, in one module of `gr_jax.heads`:
  * an `OutputHead`, a frozen dataclass: the head as configured (its own settings are its fields: PAWA's depth, the
    docid token range of the atomic and PAWA heads), chosen and set in gin as a configurable of its own
    (`HEAD = @pawa.PawaHead()`, `pawa.PawaHead.num_layers = 4`; gin_configs/decoders/*.gin) and passed where the
    model is built (`gr_jax.experiment.build_model(head=...)`, `EncoderDecoderModel(head=...)`,
    `network.Transformer(head=...)`). Its methods answer what the rest of the code base asks before any parameter
    exists: the network it needs and the sizes it implies, which logits column each target token is scored at, how
    a batch of queries is decoded into ranked docids (generic beam search unless the head ranks directly), and which
    of its parameters a pretrained T5 fills (`lm_head_parameter`) or lacks (`fresh_param_patterns`);
  * a `HeadLayer`, the Flax module it builds (`OutputHead.layer_class`): the output layer's parameters and how
    decoder states become logits, teacher-forced (`__call__`) and one step at a time (`prefill`, `step`). The
    `Transformer` shares its scope with the layer, so the head's parameters keep top-level names (`logits_dense`,
    `atomic_logits_dense`, `pawa/...`).

A new head is one new module (anywhere, `gr_jax/heads/` or a user's own) with an `OutputHead` subclass, its
`HeadLayer` and a gin binding of `HEAD`; no other module is edited (`tests/test_custom_head.py` adds one).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import jax
import jax.numpy as jnp
from flax import linen as nn

from gr_jax import decoding
from gr_jax.network import BATCH, LENGTH, NEG_INF, VOCAB, T5Config
from gr_jax.vocabulary import EOS_ID

if TYPE_CHECKING:
    from gr_jax.docids.trie import Trie

Array = jax.Array


class HeadLayer(nn.Module):
    """The output layer of a `gr_jax.network.Transformer`, built by its `head` (see the module docstring)."""

    config: T5Config
    head: OutputHead

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutputHead:
    """A head as configured: its settings (a subclass's fields) and what the code base asks of it (see the module
    docstring). Frozen and hashable, so a network holding it compiles once per head."""

    #: The Flax module `layer` builds.
    layer_class: ClassVar[type[HeadLayer]]
    #: Whether `predict_batch` ranks the whole corpus in one decoder pass instead of decoding step by step.
    ranks_in_one_pass: ClassVar[bool] = False

    def __post_init__(self) -> None:
        """Checks the head's own settings (subclasses extend it and call it)."""

    # --- Configuration ------------------------------------------------------------------------------------------

    def check(self, config: T5Config) -> None:
        """Raises on a network this head cannot sit on (called when a model or layer is made)."""
        del config

    def layer(self, config: T5Config) -> HeadLayer:
        """The head's Flax module for the network `config` (`network.Transformer` builds it in its `setup`)."""
        self.check(config)
        return self.layer_class(config=config, head=self)

    def logits_vocab_size(self, config: T5Config) -> int:
        """Size of the decoded token space: decode_step's logits, the trie's vocabulary."""
        size = config.output_vocab_size or config.vocab_size
        if size is None:
            raise ValueError("T5Config.vocab_size is unset: bind it in gin or let the model builder fill it from the "
                             "docid space (config.with_vocab_size(...)).")
        return size

    def with_docid_range(self, docid_token_range: Optional[tuple[int, int]]) -> OutputHead:
        """This head with what it needs from the run's docid tokens [start, stop) filled in."""
        del docid_token_range
        return self

    def num_cached_layers(self, config: T5Config) -> int:
        """Decoder layers of the head's own whose self-attention cache incremental decoding keeps."""
        del config
        return 0

    def layer_stacks(self, config: T5Config) -> dict[str, int]:
        """The head's own layer stacks (`network.layer_stack`): parameter path -> depth, so that
        `gr_jax.layer_layout` converts them between the unscanned and scanned layouts as the trunk's."""
        del config
        return {}

    def embedded_vocab_size(self, config: T5Config, *, model_vocab_size: int) -> int:
        """How many token ids the input embedding must cover when the run's tokens are [0, model_vocab_size): all of
        them by default (docid tokens are decoder inputs). The model builder sizes `T5Config.vocab_size` from it."""
        del config
        return model_vocab_size

    # --- Starting from other parameters -------------------------------------------------------------------------

    def lm_head_parameter(self, config: T5Config) -> Optional[str]:
        """The parameter that a pretrained T5's output layer (`lm_head`, its columns the input vocabulary's tokens)
        fills, or None when the head has no such layer (`gr_jax.pretrained`)."""
        del config
        return None

    def pretrained_params(self, *, abstract: Mapping[str, Any]) -> dict[str, Any]:
        """Top-level parameters of the head that start as given rather than initialised (`Trainer.init_state(
        given=...)`), placed on `abstract`'s (the abstract state's parameters) shardings: none by default."""
        del abstract
        return {}

    def frozen_param_pattern(self) -> Optional[str]:
        """A regex of the head's parameters no optimizer update may reach (None: it trains them all)."""
        return None

    def fresh_param_patterns(self, config: T5Config) -> tuple[str, ...]:
        """Regular expressions (full match) over '/'-joined paths of the head's parameters that neither a pretrained
        T5 nor a run of another head holds: they start from this run's initialisation (`gr_jax.pretrained`,
        `gr_jax.warm_start`)."""
        del config
        return ()

    # --- Training and scoring -----------------------------------------------------------------------------------

    def target_columns(self, config: T5Config, targets: Array, weights: Array) -> tuple[Array, Array]:
        """The logits column of each target token, int32[batch, length], and bool `invalid` (a weighted target the
        head cannot score; its loss and score become NaN, which stops training loudly: a jitted step cannot raise)."""
        del config, weights
        return targets, jnp.zeros(targets.shape, bool)

    # --- Retrieval ----------------------------------------------------------------------------------------------

    def predict_batch(self, model: Any, params: Any, encoder_input_tokens: Array, *, num_beams: int,
                      max_decode_len: int, trie: Optional[Trie], length_penalty: float) -> decoding.BeamSearchResult:
        """The `num_beams` best sequences per query, best first, of `model` (a `gr_jax.models.EncoderDecoderModel`
        with this head): beam search over `decode_step`."""
        return model.beam_search(params, encoder_input_tokens, num_beams=num_beams, max_decode_len=max_decode_len,
                                 trie=trie, length_penalty=length_penalty)


def masked_logits(logits: Array, allowed: Array) -> Array:
    """NEG_INF outside `allowed` (bool[width]); float32 logits with the (batch, length, vocab) constraint."""
    logits = jnp.where(allowed, logits.astype(jnp.float32), NEG_INF)
    return nn.with_logical_constraint(logits, (BATCH, LENGTH, VOCAB)[-logits.ndim:])


@dataclasses.dataclass(frozen=True, kw_only=True)
class OverDocidTokens(OutputHead):
    """Base of heads whose output layer covers the docid tokens [docid_vocab_start, docid_vocab_start +
    docid_vocab_size) (atomic, PAWA): the range's settings, their checks, and their filling from the docid space
    (None: filled by the model builder, `gr_jax.experiment.build_model`)."""

    docid_vocab_start: Optional[int] = None
    docid_vocab_size: Optional[int] = None

    def __post_init__(self) -> None:
        """Both or neither of the range's fields set, ids above EOS, at least one."""
        super().__post_init__()
        name = type(self).__name__
        if (self.docid_vocab_start is None) != (self.docid_vocab_size is None):
            raise ValueError(f"{name}: set both docid_vocab_start and docid_vocab_size, or neither (the model "
                             "builder fills them from the docid space)")
        if (self.docid_vocab_start is not None and self.docid_vocab_size is not None
                and (self.docid_vocab_start <= EOS_ID or self.docid_vocab_size < 1)):
            raise ValueError(f"{name}: docid tokens must be ids above EOS={EOS_ID} (docid_vocab_start="
                             f"{self.docid_vocab_start}) and at least one (docid_vocab_size={self.docid_vocab_size})")

    @property
    def docid_vocab_end(self) -> int:
        """One past the last docid token."""
        start, size = self.docid_tokens()
        return start + size

    def check(self, config: T5Config) -> None:
        """The range inside `output_vocab_size` where that is set."""
        super().check(config)
        if self.docid_vocab_start is not None and config.output_vocab_size is not None:
            if config.output_vocab_size < self.docid_vocab_end:
                raise ValueError(f"output_vocab_size={config.output_vocab_size} does not cover the docid tokens "
                                 f"[{self.docid_vocab_start}, {self.docid_vocab_end}) of the {type(self).__name__}")

    def docid_tokens(self) -> tuple[int, int]:
        """(docid_vocab_start, docid_vocab_size), the docid tokens the head's output layer covers; raises unless they
        are known."""
        if self.docid_vocab_start is None or self.docid_vocab_size is None:
            raise ValueError(f"{type(self).__name__} needs docid_vocab_start and docid_vocab_size, the id range of the "
                             "docid tokens its output layer covers: bind them in gin, or let the model builder fill "
                             "them from the docid space (gr_jax.experiment.build_model)")
        return self.docid_vocab_start, self.docid_vocab_size

    def with_docid_range(self, docid_token_range: Optional[tuple[int, int]]) -> OverDocidTokens:
        """This head with the docid range of the docid space, or checked against it when gin fixed one."""
        if docid_token_range is None:
            return self
        start, stop = docid_token_range
        if self.docid_vocab_start is None:
            return dataclasses.replace(self, docid_vocab_start=start, docid_vocab_size=stop - start)
        if not self.docid_vocab_start <= start < stop <= self.docid_vocab_end:
            raise ValueError(f"the docid tokens [{start}, {stop}) are outside the output head's range "
                             f"[{self.docid_vocab_start}, {self.docid_vocab_end}) set in gin ({type(self).__name__}'s "
                             "docid_vocab_start, docid_vocab_size: DOCID_VOCAB_START, DOCID_VOCAB_SIZE); leave those "
                             "unset to fill them from the docid space")
        return self
