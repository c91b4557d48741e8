"""A decoder-only Transformer covering the Llama-2/3, Mistral, Qwen2 and Qwen3 architectures from one config.

Why: three of the follow-up papers run generative retrieval on decoder-only language models (Qwen3-0.6B, LLaMA-2
7B-70B, Mistral-7B), and users start from those checkpoints (`gr_jax.decoder_only.pretrained` loads them). The
four architectures differ only in options of one block: pre-norm RMSNorm, rotary position embeddings (theta, and
Llama 3's frequency scaling), grouped-query attention, a SwiGLU MLP, Qwen2's query/key/value biases, Qwen3's
per-head RMSNorm of queries and keys, and a tied or separate output embedding.

Parameters carry logical axis names (`gr_jax.partitioning`): the query/output kernels shard their 'heads', the
key/value kernels their 'kv_heads', the MLP its 'mlp', embeddings their 'vocab'; `scan_layers` and `remat` are the
T5 network's (`gr_jax.network.layer_stack`). Tokens are [batch, length]; `positions` [batch, length] are each
token's rotary position (a left-padded prompt starts at 0 after its pads) and `valid` [batch, length] marks the
tokens keys may attend to.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from gr_jax import lora
from gr_jax.lora import LoraConfig
from gr_jax.network import (
    BATCH, EMBED, HEADS, KV, LENGTH, MLP, NEG_INF, VOCAB, Array, Layers, Mlp, RMSNorm, scan_stack, fan_in_init,
    layer_stack, logical_param, run_layers, write_cache)

KV_HEADS = "kv_heads"  # the key/value heads of grouped-query attention (fewer than the query heads)


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's rotary frequency scaling (transformers' 'llama3' rope type): wavelengths longer than the
    original context divided by `factor`, shorter than original / high_freq_factor kept, smoothly between."""
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class DecoderOnlyConfig:
    """Dimensions and options of a decoder-only network (gin binds it; a Hugging Face config.json is read into
    one by `gr_jax.decoder_only.pretrained.config_from_checkpoint`).

    qkv_bias: biases on the query, key and value projections (Qwen2); qk_norm: RMSNorm of each head's query and
    key before the rotation (Qwen3); tie_embeddings: the output layer is the input embedding (Qwen3-0.6B,
    Qwen2-0.5B); lora: adapters beside the attention and MLP kernels (`gr_jax.lora`). `mlp_activations` and the
    dropout fields are the T5 MLP's (`gr_jax.network.Mlp`): SwiGLU is
    ('silu', 'linear'), and the papers fine-tune these models without dropout. `vocab_size` None: the run's
    vocabulary and docid tokens fill it (`with_vocab_size`), as T5Config's.
    """
    emb_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    vocab_size: Optional[int] = None
    rope_theta: float = 10000.0
    rope_scaling: Optional[Llama3RopeScaling] = None
    norm_epsilon: float = 1e-6
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    mlp_activations: tuple[str, ...] = ("silu", "linear")
    dropout_rate: float = 0.0
    dropout_broadcast_dims: tuple[int, ...] = (-2,)
    dtype: str = "float32"
    param_dtype: str = "float32"
    scan_layers: bool = False
    remat: bool = False
    # Low-rank adapters on the attention and MLP kernels (`gr_jax.lora`); the model then trains only them.
    lora: Optional[LoraConfig] = None
    # A bottleneck adapter of this width after every layer (`LayerAdapter`; 0: none): gr_vs_dense_limitations.txt's
    # model-scaling experiment adds parameters to a pretrained backbone this way, trained with it.
    adapter_dim: int = 0

    def __post_init__(self):
        for name in ("vocab_size", "emb_dim", "num_layers", "num_heads", "num_kv_heads", "head_dim", "mlp_dim"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"DecoderOnlyConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.adapter_dim < 0:
            raise ValueError(f"DecoderOnlyConfig.adapter_dim must be >= 0, got {self.adapter_dim}")
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        object.__setattr__(self, "dropout_broadcast_dims", tuple(self.dropout_broadcast_dims))

    def with_vocab_size(self, vocab_size: int, *, multiple_of: int = 128) -> DecoderOnlyConfig:
        """A copy whose vocab_size covers `vocab_size`, padded so the vocab axis shards evenly."""
        return dataclasses.replace(self, vocab_size=-(-vocab_size // multiple_of) * multiple_of)

    @property
    def vocab(self) -> int:
        """vocab_size, which a network needs set."""
        if self.vocab_size is None:
            raise ValueError("DecoderOnlyConfig.vocab_size is unset: a run sets it from its vocabulary "
                             "(with_vocab_size)")
        return self.vocab_size

    def non_embedding_params(self) -> int:
        """Parameters outside the token embedding and output layer (the scaling laws' N)."""
        d, k = self.emb_dim, self.head_dim
        attention = d * k * (2 * self.num_heads + 2 * self.num_kv_heads)
        attention += k * (self.num_heads + 2 * self.num_kv_heads) if self.qkv_bias else 0
        attention += 2 * k if self.qk_norm else 0
        mlp = d * self.mlp_dim * (len(self.mlp_activations) + 1)
        adapter = 2 * d * self.adapter_dim + d if self.adapter_dim else 0
        return self.num_layers * (attention + mlp + 2 * d + adapter) + d


def rope_inverse_frequencies(config: DecoderOnlyConfig) -> np.ndarray:
    """float32[head_dim // 2]: the rotation speed of each pair of features (transformers' `inv_freq`)."""
    k = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, k, 2, dtype=np.int64).astype(np.float32) / k))
    inv_freq = inv_freq.astype(np.float32)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context / scaling.low_freq_factor
    high_freq_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x: Array, positions: Array, inv_freq: np.ndarray) -> Array:
    """x [batch, length, heads, head_dim] rotated by positions [batch, length]: the first and second halves of
    the features are the pairs (transformers' `rotate_half` convention)."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [b, l, k/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


@flax.struct.dataclass
class KVCache:
    """Decoding state, every leaf leading with the rows (as `gr_jax.decoding` reorders beams): keys/values per layer
    [rows, max_len, kv_heads, head_dim] (a scanned stack: one pair [rows, layers, max_len, kv_heads, head_dim]) and
    which slots hold a token keys may attend to, bool[rows, max_len]."""
    keys: tuple
    values: tuple
    valid: Array


class Attention(nn.Module):
    """Grouped-query self-attention with rotary positions, scaled by head_dim**-0.5."""
    config: DecoderOnlyConfig

    def setup(self):
        cfg = self.config
        d, h, g, k = cfg.emb_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.query = logical_param(self, "query", fan_in_init(1), (d, h, k), (EMBED, HEADS, KV), cfg.param_dtype)
        self.key = logical_param(self, "key", fan_in_init(1), (d, g, k), (EMBED, KV_HEADS, KV), cfg.param_dtype)
        self.value = logical_param(self, "value", fan_in_init(1), (d, g, k), (EMBED, KV_HEADS, KV), cfg.param_dtype)
        self.out = logical_param(self, "out", fan_in_init(2), (h, k, d), (HEADS, KV, EMBED), cfg.param_dtype)
        self.adapters = {
            name: lora.adapter(self, name, lora=cfg.lora, shape=shape, axes=axes, in_axes=in_axes,
                               dtype=cfg.param_dtype)
            for name, shape, axes, in_axes in (("query", (d, h, k), (EMBED, HEADS, KV), 1),
                                               ("key", (d, g, k), (EMBED, KV_HEADS, KV), 1),
                                               ("value", (d, g, k), (EMBED, KV_HEADS, KV), 1),
                                               ("out", (h, k, d), (HEADS, KV, EMBED), 2))}
        if cfg.qkv_bias:
            zeros = nn.initializers.zeros
            self.query_bias = logical_param(self, "query_bias", zeros, (h, k), (HEADS, KV), cfg.param_dtype)
            self.key_bias = logical_param(self, "key_bias", zeros, (g, k), (KV_HEADS, KV), cfg.param_dtype)
            self.value_bias = logical_param(self, "value_bias", zeros, (g, k), (KV_HEADS, KV), cfg.param_dtype)
        if cfg.qk_norm:
            self.query_norm = RMSNorm(cfg, epsilon=cfg.norm_epsilon, axis=KV)
            self.key_norm = RMSNorm(cfg, epsilon=cfg.norm_epsilon, axis=KV)

    def _project(self, x: Array, name: str, bias: Optional[Array], axes: tuple[str, ...]) -> Array:
        cfg, dtype = self.config, self.config.dtype
        y = jnp.einsum("bld,dhk->blhk", x.astype(dtype), getattr(self, name).astype(dtype))
        y = lora.add(y, lora.delta(x, self.adapters[name], lora=cfg.lora, in_axes=1, dtype=dtype))
        if bias is not None:
            y = y + bias.astype(dtype)
        return nn.with_logical_constraint(y, axes)

    def project(self, x: Array, positions: Array) -> tuple[Array, Array, Array]:
        """x [batch, length, embed] -> rotated queries [b, l, heads, k], rotated keys and values [b, l, kv_heads, k]."""
        cfg = self.config
        bias = cfg.qkv_bias
        q = self._project(x, "query", self.query_bias if bias else None, (BATCH, LENGTH, HEADS, KV))
        k = self._project(x, "key", self.key_bias if bias else None, (BATCH, LENGTH, KV_HEADS, KV))
        v = self._project(x, "value", self.value_bias if bias else None, (BATCH, LENGTH, KV_HEADS, KV))
        if cfg.qk_norm:
            q, k = self.query_norm(q), self.key_norm(k)
        inv_freq = rope_inverse_frequencies(cfg)
        return apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), v

    def attend(self, q: Array, k: Array, v: Array, mask: Array) -> Array:
        """q [b, q_len, heads, k], k/v [b, k_len, kv_heads, k], mask bool[b, q_len, k_len] -> [b, q_len, embed]."""
        cfg = self.config
        b, q_len, h, d = q.shape
        groups = h // cfg.num_kv_heads
        q = q.reshape(b, q_len, cfg.num_kv_heads, groups, d)
        logits = jnp.einsum("bqngd,bknd->bngqk", q, k).astype(jnp.float32) * (d ** -0.5)
        logits = jnp.where(mask[:, None, None], logits, NEG_INF)
        weights = jax.nn.softmax(logits, axis=-1).astype(cfg.dtype)
        y = jnp.einsum("bngqk,bknd->bqngd", weights, v).reshape(b, q_len, h, d)
        out = jnp.einsum("bqhk,hkd->bqd", y, self.out.astype(cfg.dtype))
        out = lora.add(out, lora.delta(y, self.adapters["out"], lora=cfg.lora, in_axes=2, dtype=cfg.dtype))
        return nn.with_logical_constraint(out, (BATCH, LENGTH, EMBED))


def causal_mask(valid: Array) -> Array:
    """bool[b, l, l]: query i attends to key j <= i that is a valid token."""
    length = valid.shape[1]
    causal = jnp.arange(length)[:, None] >= jnp.arange(length)[None, :]
    return causal[None] & valid[:, None, :]


class LayerAdapter(nn.Module):
    """x + W_up silu(W_down RMSNorm(x)), W_down [embed, adapter_dim], W_up [adapter_dim, embed]: a bottleneck after a
    layer. Both projections are drawn at random (fan-in), as the paper's "randomly initialized adapters" (so the
    adapted network is not its base at the start, unlike LoRA's zero-started B)."""
    config: DecoderOnlyConfig

    def setup(self):
        cfg = self.config
        d, a = cfg.emb_dim, cfg.adapter_dim
        self.norm = RMSNorm(cfg, epsilon=cfg.norm_epsilon)
        self.down = logical_param(self, "down", fan_in_init(1), (d, a), (EMBED, MLP), cfg.param_dtype)
        self.up = logical_param(self, "up", fan_in_init(1), (a, d), (MLP, EMBED), cfg.param_dtype)

    def __call__(self, x: Array) -> Array:
        dtype = self.config.dtype
        h = jax.nn.silu(jnp.einsum("...d,da->...a", self.norm(x).astype(dtype), self.down.astype(dtype)))
        return x + jnp.einsum("...a,ad->...d", h, self.up.astype(dtype))


class DecoderLayer(nn.Module):
    config: DecoderOnlyConfig

    def setup(self):
        cfg = self.config
        self.pre_attention_norm = RMSNorm(cfg, epsilon=cfg.norm_epsilon)
        self.attention = Attention(cfg)
        self.pre_mlp_norm = RMSNorm(cfg, epsilon=cfg.norm_epsilon)
        self.mlp = Mlp(cfg)
        self.adapter = LayerAdapter(cfg) if cfg.adapter_dim else None

    def _finish(self, x: Array, attended: Array, deterministic: bool) -> Array:
        x = x + attended
        x = x + self.mlp(self.pre_mlp_norm(x), deterministic=deterministic)
        if self.adapter is not None:
            x = self.adapter(x)
        return nn.with_logical_constraint(x, (BATCH, LENGTH, EMBED))

    def __call__(self, x: Array, positions: Array, mask: Array, deterministic: bool) -> Array:
        # Positional, so nn.remat can mark `deterministic` static (argument 4, counting self).
        q, k, v = self.attention.project(self.pre_attention_norm(x), positions)
        return self._finish(x, self.attention.attend(q, k, v, mask), deterministic)

    def prefill(self, x: Array, positions: Array, mask: Array) -> tuple[Array, tuple[Array, Array]]:
        """As __call__, also returning this layer's rotated keys and values [b, l, kv_heads, k] for the cache."""
        q, k, v = self.attention.project(self.pre_attention_norm(x), positions)
        return self._finish(x, self.attention.attend(q, k, v, mask), True), (k, v)

    def step(self, x: Array, positions: Array, keys: Array, values: Array, valid: Array, index: Array,
             layer: Optional[Array] = None) -> tuple[Array, tuple[Array, Array]]:
        """One new token per row: x [rows, 1, embed] at positions [rows, 1]; keys/values [rows, max_len, kv_heads,
        k] with slot `index` written here, or with `layer` (int32[], a scanned stack) the whole stack's
        [rows, layers, max_len, kv_heads, k], of which only this layer's slot is written (in place, no copy of the
        cache per step); valid bool[rows, max_len] (this token's slot included)."""
        q, k, v = self.attention.project(self.pre_attention_norm(x), positions)
        (keys, values), (layer_keys, layer_values) = write_cache((keys, values), (k, v), slot=index, layer=layer)
        attended = self.attention.attend(q, layer_keys, layer_values, valid[:, None, :])
        return self._finish(x, attended, True), (keys, values)


class DecoderOnlyTransformer(nn.Module):
    """Token embedding, `num_layers` pre-norm blocks, a final RMSNorm and the output layer (the embedding itself
    under `tie_embeddings`). Logits are float32."""
    config: DecoderOnlyConfig

    def setup(self):
        cfg = self.config
        self.token_embedder = logical_param(self, "token_embedder", nn.initializers.normal(stddev=cfg.emb_dim ** -0.5),
                                            (cfg.vocab, cfg.emb_dim), (VOCAB, EMBED), cfg.param_dtype)
        self.layers: Layers = layer_stack(DecoderLayer, config=cfg, num_layers=cfg.num_layers,
                                          deterministic_argnum=4)
        self.final_norm = RMSNorm(cfg, epsilon=cfg.norm_epsilon)
        if not cfg.tie_embeddings:
            self.output = logical_param(self, "output", fan_in_init(1), (cfg.emb_dim, cfg.vocab),
                                        (EMBED, VOCAB), cfg.param_dtype)

    def embed(self, tokens: Array) -> Array:
        x = jnp.take(self.token_embedder, tokens, axis=0).astype(self.config.dtype)
        return nn.with_logical_constraint(x, (BATCH, LENGTH, EMBED))

    def logits(self, states: Array) -> Array:
        """states [..., embed] (after the final norm) -> float32 logits [..., vocab]."""
        dtype = self.config.dtype
        kernel = self.token_embedder.T if self.config.tie_embeddings else self.output
        return jnp.einsum("...d,dv->...v", states.astype(dtype), kernel.astype(dtype)).astype(jnp.float32)

    def states(self, tokens: Array, *, positions: Optional[Array] = None, valid: Optional[Array] = None,
               enable_dropout: bool = False) -> Array:
        """The final norm's output [batch, length, embed] (a dense tower pools it; `logits` projects it)."""
        positions, valid = _defaults(tokens, positions, valid)
        x = run_layers(self.layers, self.embed(tokens), positions, causal_mask(valid),
                       num_layers=self.config.num_layers, deterministic=not enable_dropout)
        return self.final_norm(x)

    def __call__(self, tokens: Array, *, positions: Optional[Array] = None, valid: Optional[Array] = None,
                 enable_dropout: bool = False) -> Array:
        """tokens [batch, length] -> float32 logits [batch, length, vocab] of each next token."""
        return self.logits(self.states(tokens, positions=positions, valid=valid, enable_dropout=enable_dropout))

    def prefill(self, tokens: Array, *, positions: Array, valid: Array, max_len: int) -> tuple[Array, KVCache]:
        """Runs the prompts [rows, length] once: (float32 logits [rows, length, vocab], a cache of `max_len` slots
        whose first `length` hold them; `decode_step` writes slot `length` next)."""
        cfg = self.config
        rows, length = tokens.shape
        if length > max_len:
            raise ValueError(f"a prompt of {length} tokens does not fit a cache of {max_len}")
        x, mask = self.embed(tokens), causal_mask(valid)
        if cfg.scan_layers:
            def body(layer, x, positions, mask):
                return layer.prefill(x, positions, mask)
            x, (k, v) = scan_stack(body, self.layers, x, num_layers=cfg.num_layers, broadcast=(positions, mask))
            kv = [(jnp.swapaxes(k, 0, 1), jnp.swapaxes(v, 0, 1))]  # rows first: [rows, layers, length, ...]
        else:
            kv = []
            for layer in self.layers:
                x, pair = layer.prefill(x, positions, mask)
                kv.append(pair)
        slots = [(0, 0)] * (kv[0][0].ndim - 4) + [(0, max_len - length), (0, 0), (0, 0)]
        keys = tuple(jnp.pad(k, [(0, 0)] + slots) for k, _ in kv)
        values = tuple(jnp.pad(v, [(0, 0)] + slots) for _, v in kv)
        cache = KVCache(keys=keys, values=values, valid=jnp.pad(valid, ((0, 0), (0, max_len - length))))
        return self.logits(self.final_norm(x)), cache

    def decode_step(self, tokens: Array, *, positions: Array, index: Array, cache: KVCache) -> tuple[Array, KVCache]:
        """tokens, positions int32[rows]: one new token per row, written to cache slot `index` (int32[]) ->
        (float32 logits [rows, vocab] of the token after it, the cache)."""
        cfg = self.config
        x = self.embed(tokens[:, None])
        valid = jax.lax.dynamic_update_slice_in_dim(cache.valid, jnp.ones((tokens.shape[0], 1), bool), index, axis=1)
        positions = positions[:, None]
        if cfg.scan_layers:
            def body(layer, carry, number, positions, valid, index):
                x, keys, values = carry
                x, (keys, values) = layer.step(x, positions, keys, values, valid, index, number)
                return (x, keys, values), None
            (x, k, v), _ = scan_stack(body, self.layers, (x, cache.keys[0], cache.values[0]),
                                      num_layers=cfg.num_layers, xs=(jnp.arange(cfg.num_layers, dtype=jnp.int32),),
                                      broadcast=(positions, valid, index))
            keys, values = (k,), (v,)
        else:
            keys_l, values_l = [], []
            for layer, k, v in zip(self.layers, cache.keys, cache.values):
                x, (k, v) = layer.step(x, positions, k, v, valid, index)
                keys_l.append(k)
                values_l.append(v)
            keys, values = tuple(keys_l), tuple(values_l)
        logits = self.logits(self.final_norm(x))[:, 0]
        return logits, KVCache(keys=keys, values=values, valid=valid)


def _defaults(tokens: Array, positions: Optional[Array], valid: Optional[Array]) -> tuple[Array, Array]:
    """Unpadded rows: positions 0..length-1, every token valid."""
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    if valid is None:
        valid = jnp.ones(tokens.shape, bool)
    return positions, valid


def left_padded_positions(valid: Any) -> Any:
    """int32[b, l]: each valid token's position counted from its row's first valid token (pads at 0)."""
    return jnp.maximum(jnp.cumsum(valid.astype(jnp.int32), axis=-1) - 1, 0)
