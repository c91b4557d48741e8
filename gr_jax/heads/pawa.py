"""NCI's prefix-aware weight-adaptive (PAWA) decoder (Wang et al. 2022) over 2D semantic docids.

A second, randomly initialised decoder stack (`pawa/...`) reads the docid prefix and the query encoding and
generates, at every position t, a matrix M_t [embed, embed]; the position's projection is W_t = M_t W [embed, vocab]
with W the shared `logits_dense`, restricted to the docid tokens and EOS (other columns masked). As NCI's
`adaptor_decode` (modeling_t5.py). The docid tokens [docid_vocab_start, docid_vocab_start + docid_vocab_size) are
the 2D semantic tokens, inside `vocab_size` (the PAWA stack embeds the prefix).

gin: `HEAD = @pawa.PawaHead()` (gin_configs/decoders/pawa.gin). Its settings: `pawa.PawaHead.num_layers`, the PAWA
stack's depth (default None: half the decoder's layers, which reproduces the study's PAWA sizes: 761M for Base,
2.1B for Large), and `docid_vocab_start` / `docid_vocab_size`, which the model builder fills from the docid space
when unset.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

import jax
import jax.numpy as jnp
from flax import linen as nn

from gr_jax.heads.base import OverDocidTokens, masked_logits
from gr_jax.heads.standard import StandardHead, StandardLayer
from gr_jax.network import (EMBED, MLP, DecoderLayer, Dropout, RelativePositionBias, RMSNorm, T5Config,
                            fan_in_init, layer_stack, logical_param, stack_cross_kv, stack_step,
                            teacher_forced_stack)
from gr_jax.vocabulary import EOS_ID

Array = jax.Array


class PawaLayer(StandardLayer):
    """`logits_dense` (shared with the standard head, so a pretrained lm_head fills it) mixed per position by the
    PAWA stack's generated matrices, restricted to EOS and the docid tokens; `head` is a `PawaHead`."""

    if TYPE_CHECKING:  # the head that built the layer (`OutputHead.layer`), a PawaHead; no field of its own
        head: PawaHead

    def setup(self):
        cfg, head = self.config, self.head
        head.docid_tokens()  # raises unless the docid token range is known
        super().setup()
        if cfg.vocab_size is None:
            raise ValueError("T5Config.vocab_size is unset: the PAWA decoder embeds the docid tokens")
        if head.docid_vocab_end > min(cfg.vocab_size, head.logits_vocab_size(cfg)):
            raise ValueError(f"the docid tokens [{head.docid_vocab_start}, {head.docid_vocab_end}) do not fit the "
                             f"vocabulary ({cfg.vocab_size} input, {head.logits_vocab_size(cfg)} output tokens): the "
                             "PAWA decoder embeds and predicts them")
        self.pawa = PawaDecoder(cfg, num_layers=head.depth(cfg))

    def mixed_logits(self, states: Array, pawa_states: Array) -> Array:
        """(h_t M_t) W over EOS and the docid tokens, other columns NEG_INF: states, pawa_states [..., embed]."""
        cfg, head = self.config, self.head
        x = self.pawa.mix(states, pawa_states)
        logits = jnp.einsum("...d,dv->...v", x, self.logits_dense.astype(cfg.dtype))
        column = jnp.arange(head.logits_vocab_size(cfg))
        start, size = head.docid_tokens()
        return masked_logits(logits, (column == EOS_ID) | ((column >= start) & (column < start + size)))

    def __call__(self, states, *, embedded, encoded, cross_mask, deterministic):
        pawa_states = self.pawa(embedded, encoded, cross_mask=cross_mask, deterministic=deterministic)
        return self.mixed_logits(states, pawa_states)

    def prefill(self, encoded, *, max_decode_len):
        return self.pawa.prefill(encoded, max_decode_len=max_decode_len)

    def step(self, states, *, embedded, position, cache, context, cross_mask):
        cross_kv, bias = context
        pawa_states, cache = self.pawa.step(embedded, position=position, cache=cache, cross_kv=cross_kv,
                                            cross_mask=cross_mask, bias=bias)
        return self.mixed_logits(states, pawa_states)[:, 0], cache

    def projections(self, embedded: Array, encoded: Array, *, cross_mask: Array) -> Array:
        """The per-position output projections W_t = M_t W restricted to EOS and the docid tokens,
        float32[batch, tgt_len, embed, 1 + docid_vocab_size] (column 0: EOS). For inspection and tests only: the
        head never materialises them (it computes (h_t M_t) W)."""
        start, size = self.head.docid_tokens()
        u = self.pawa(embedded, encoded, cross_mask=cross_mask, deterministic=True)
        columns = jnp.concatenate([jnp.array([EOS_ID]), start + jnp.arange(size)])
        shared = jnp.take(self.logits_dense, columns, axis=1).astype(jnp.float32)
        return jnp.einsum("btde,ev->btdv", self.pawa.generated_matrices(u).astype(jnp.float32), shared)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PawaHead(OverDocidTokens, StandardHead):
    """NCI's PAWA decoder. Settings: `num_layers`, the PAWA stack's depth (None: half the decoder's), and the docid
    token range (`OverDocidTokens`; None: from the docid space)."""

    num_layers: Optional[int] = None

    layer_class = PawaLayer

    def __post_init__(self) -> None:
        if self.num_layers is not None and self.num_layers < 1:
            raise ValueError(f"PawaHead.num_layers must be >= 1, got {self.num_layers}")
        super().__post_init__()

    def depth(self, config: T5Config) -> int:
        """Layers of the PAWA stack: `num_layers`, or half the decoder's."""
        return self.num_layers or max(1, config.num_decoder_layers // 2)

    def num_cached_layers(self, config):
        return self.depth(config)

    def layer_stacks(self, config):
        return {"pawa/layers": self.depth(config)}

    def fresh_param_patterns(self, config):
        """NCI also initialises its PAWA decoder randomly."""
        return (*super().fresh_param_patterns(config), r"pawa/.*")


class PawaDecoder(nn.Module):
    """NCI's prefix-aware weight-adaptive (PAWA) stack: per position t, a projection generator M_t [embed, embed].

    Its own T5.1.1 decoder layers (causal self-attention over the docid prefix, cross-attention to the query
    encoding), relative-position table and final norm read the same decoder input tokens as the main decoder; a
    linear map `weight_generator` [embed, embed * embed] turns each output u_t into M_t, and the position's logits are
    (h_t M_t) W: h_t the main decoder's state, W the shared projection. M_t depends on the prefix, so the same
    token gets different output weights at different depths of the docid tree. The generator is initialised so
    that h_t M_t keeps h_t's scale (var 1 / (embed * embed), u_t being RMS-normalised). The restriction to the docid
    vocabulary is a mask on (h_t M_t) W: computing W's other columns costs 2 embed |V| per position, a few percent
    of generating M_t (2 embed^3).
    """
    config: T5Config
    num_layers: int

    def setup(self):
        cfg = self.config
        self.relpos = RelativePositionBias(cfg, bidirectional=False)
        # `layers_{i}/...` each, or scanned (cfg.scan_layers) one `layers/...` with a leading 'layers' axis.
        self.layers = layer_stack(DecoderLayer, config=cfg, num_layers=self.num_layers, deterministic_argnum=6)
        self.norm = RMSNorm(cfg)
        # [embed, embed * embed] is an up-projection like an MLP's first layer (NCI: Linear(d, d^2)), and its wide
        # axis is split over 'model' as an MLP's is: 453M parameters at Base, 1.07B at Large.
        self.weight_generator = logical_param(self, "weight_generator", fan_in_init(1, scale=1.0 / cfg.emb_dim),
                                       (cfg.emb_dim, cfg.emb_dim * cfg.emb_dim), (EMBED, MLP), cfg.param_dtype)
        self.dropout = Dropout(cfg.dropout_rate, broadcast_dims=cfg.dropout_broadcast_dims)

    def __call__(self, embedded: Array, encoded: Array, *, cross_mask: Array, deterministic: bool) -> Array:
        """Teacher-forced. embedded: [batch, tgt_len, embed] (decoder input embeddings) -> u, same shape."""
        return teacher_forced_stack(embedded, encoded, layers=self.layers, num_layers=self.num_layers,
                                    relpos=self.relpos, norm=self.norm, dropout=self.dropout, cross_mask=cross_mask,
                                    deterministic=deterministic)

    def prefill(self, encoded: Array, *, max_decode_len: int) -> tuple[tuple, Array]:
        """Per-query constants: cross-attention (keys, values) per layer (`stack_cross_kv`) and the bias
        [heads, max_len, max_len]."""
        cross_kv = stack_cross_kv(self.layers, encoded, num_layers=self.num_layers)
        return cross_kv, self.relpos(max_decode_len, max_decode_len)

    def step(self, embedded: Array, *, position: Array, cache: tuple, cross_kv: tuple, cross_mask: Array,
             bias: Array) -> tuple[Array, tuple]:
        """One position for batch*beams rows. embedded: [rows, 1, embed] -> (u [rows, 1, embed], new cache)."""
        bias_row = jax.lax.dynamic_index_in_dim(bias, position, axis=1, keepdims=False)
        x, new_cache = stack_step(self.layers, embedded, num_layers=self.num_layers, position=position, cache=cache,
                                  cross_kv=cross_kv, cross_mask=cross_mask, bias_row=bias_row)
        return self.norm(x), new_cache

    def generated_matrices(self, u: Array) -> Array:
        """u: [..., embed] -> M: [..., embed, embed], one per position (and per beam)."""
        d = self.config.emb_dim
        flat = jnp.einsum("...p,pf->...f", u, self.weight_generator.astype(self.config.dtype))
        return flat.reshape(flat.shape[:-1] + (d, d))

    def mix(self, h: Array, u: Array) -> Array:
        """h_t M_t: h, u: [..., embed] -> [..., embed]. Costs 2 embed^3 FLOPs per position (generating M_t)."""
        return jnp.einsum("...d,...de->...e", h, self.generated_matrices(u))
