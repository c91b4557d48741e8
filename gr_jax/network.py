"""T5.1.1 encoder-decoder in Flax Linen, with logical axis names on every parameter.

Differences from T5 1.0 that define T5.1.1: RMSNorm without bias, gated-GELU MLP, no biases anywhere, an untied
output projection, dropout off in pre-training but on (0.1) when fine-tuning. Relative position biases are one
table per stack, shared by all its layers.

Every parameter is created with `nn.with_logical_partitioning`, so `jax.eval_shape(model.init, ...)` yields boxed
abstract values from which `gr_jax.partitioning` derives shardings; activations carry `nn.with_logical_constraint`.

Two decoding paths share the same parameters:
  * `__call__` runs teacher-forced training / scoring over whole target sequences;
  * `encode` + `prefill` + `decode_step` run one token per step for beam search and sampling. Cross-attention
    keys/values and the decoder's relative-position bias are computed once per query by `prefill` and are never
    repeated per beam: a step reshapes its `batch * beams` queries to `[batch, beams, ...]` against `[batch, ...]`
    keys.

The output head is given to the `Transformer` (`head`: a `gr_jax.heads.OutputHead`, chosen and set in gin as its own
configurable, `gin_configs/decoders/*.gin`): 'standard' (T5.1.1's output projection), 'atomic' (one column per
document) and 'pawa' (NCI's prefix-aware weight-adaptive decoder). This module never imports the heads (they build
on its layers); the Transformer shares its scope with the head's layer, so a head's parameters sit at the top of the
tree (`logits_dense`, `atomic_logits_dense`, `pawa/...`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional, Protocol, Sequence, cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from gr_jax import lora
from gr_jax.lora import LoraConfig
from gr_jax.vocabulary import PAD_ID

Array = jax.Array
Initializer = Callable[..., Array]

# Logical axis names used for parameters and activations (see gr_jax.partitioning.LOGICAL_AXIS_RULES).
BATCH, LENGTH, EMBED, MLP, HEADS, KV, VOCAB, RELPOS = (
    "batch", "length", "embed", "mlp", "heads", "kv", "vocab", "relpos_buckets")
LAYERS = "layers"  # the leading axis of a scanned stack's parameters (T5Config.scan_layers)

NEG_INF = -1e10  # finite, so fully masked rows stay NaN-free


@dataclasses.dataclass(frozen=True)
class T5Config:
    """Dimensions and numerics of a T5.1.1 network; gin binds it (size gins change only dimensions).

    `vocab_size` may be left None: entry points fill it from the run's docid space (rounded up to a multiple of
    128, as T5's 32,128). `output_vocab_size` lets the decoder's output layer cover a different vocabulary from the
    input embedding; None means the head's default (see `gr_jax.heads`). The output head and its settings are not
    the network's: a head is its own configurable, given where the model is built (`Transformer.head`).

    `dropout_broadcast_dims`: the axes along which one dropout mask is shared, as t5x's T5.1.1 does by default
    (`broadcast_dims=(-2,)`): each activation [batch, length, features] drops the same features at every position,
    and attention weights [batch, heads, q, k] drop the same keys for every query. That draws length times fewer
    random bits (1.3x the train steps/s of tiny-sized models on CPU, docs/performance.md) and is how t5x
    fine-tunes; `()` draws an independent mask per element (this network's behaviour before: a different
    regulariser, not only a slower one).

    `scan_layers` runs each layer stack (encoder, decoder, PAWA) as one `nn.scan` over a single layer whose
    parameters carry a leading logical axis 'layers' (`encoder_layers/attention/query`: [layers, embed, heads, kv]
    instead of `encoder_layers_{i}/...`), as t5x's `scan_layers`: compile time hardly grows with depth (XL's train
    step: 34 s scanned, 410 s unscanned on a loaded 2-core CPU), at some speed per step (0.82-0.86x on CPU; see
    docs/performance.md). The outputs are the unscanned network's for the same parameters (`gr_jax.layer_layout`
    converts trees between the layouts); dropout masks differ, since the scan splits each layer's key. `remat`
    rematerialises each scanned layer.

    `lora`: low-rank adapters beside every attention and MLP kernel (`gr_jax.lora`), the rest frozen.
    """
    vocab_size: Optional[int] = None
    emb_dim: int = 512
    num_heads: int = 6
    num_encoder_layers: int = 8
    num_decoder_layers: int = 8
    head_dim: int = 64
    mlp_dim: int = 1024
    mlp_activations: tuple[str, ...] = ("gelu", "linear")
    dropout_rate: float = 0.1
    dropout_broadcast_dims: tuple[int, ...] = (-2,)
    dtype: str = "float32"
    param_dtype: str = "float32"
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    output_vocab_size: Optional[int] = None
    remat: bool = False
    scan_layers: bool = False
    lora: Optional[LoraConfig] = None

    def __post_init__(self):
        if self.vocab_size is not None and self.vocab_size <= 0:
            raise ValueError(f"vocab_size must be positive, got {self.vocab_size}")
        for act in self.mlp_activations:
            _activation(act)  # Fails early on an unknown name.
        dims = self.dropout_broadcast_dims
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
            raise ValueError(f"dropout_broadcast_dims must be axis numbers, e.g. (-2,), got {dims!r}")
        object.__setattr__(self, "dropout_broadcast_dims", tuple(dims))  # gin may give a list; configs hash

    def with_vocab_size(self, vocab_size: int, *, multiple_of: int = 128) -> "T5Config":
        """Returns a copy whose vocab_size covers `vocab_size`, padded so the vocab axis shards evenly."""
        padded = -(-vocab_size // multiple_of) * multiple_of
        return dataclasses.replace(self, vocab_size=padded)


class Head(Protocol):
    """What the network's modules ask of an output head (`gr_jax.heads.OutputHead` is one; this module never imports
    the heads, which build on its layers)."""

    def layer(self, config: T5Config) -> nn.Module:
        """The head's Flax layer (`gr_jax.heads.HeadLayer`) for the network `config`."""

    def num_cached_layers(self, config: T5Config) -> int:
        """Decoder layers of the head's own whose self-attention cache incremental decoding keeps."""

    def layer_stacks(self, config: T5Config) -> dict[str, int]:
        """The head's own layer stacks: parameter path -> depth (`gr_jax.layer_layout`)."""


def _activation(name: str) -> Callable[[Array], Array]:
    if name == "linear":
        return lambda x: x
    if name == "gelu":
        # T5.1.1 used the tanh approximation of GELU.
        return functools.partial(jax.nn.gelu, approximate=True)
    if name == "relu":
        return jax.nn.relu
    if name == "silu":
        return jax.nn.silu
    raise ValueError(f"Unknown MLP activation {name!r}; expected one of 'gelu', 'relu', 'silu', 'linear'.")


def teacher_forced_stack(embedded: Array, encoded: Array, *, layers: Layers, num_layers: int, relpos: nn.Module,
                         norm: nn.Module, dropout: nn.Module, cross_mask: Array, deterministic: bool) -> Array:
    """A causal decoder stack over whole targets (the main decoder and the PAWA decoder share it):
    embedded [batch, tgt_len, embed] -> normalised states, same shape."""
    tgt_len = embedded.shape[1]
    self_mask = jnp.tril(jnp.ones((tgt_len, tgt_len), bool))[None, None]
    bias = relpos(tgt_len, tgt_len)[None]
    x = dropout(embedded, deterministic=deterministic)
    x = run_layers(layers, x, encoded, self_mask, cross_mask, bias, num_layers=num_layers, deterministic=deterministic)
    return dropout(norm(x), deterministic=deterministic)


# --- Layer stacks: a Python list of layers, or one scanned layer (T5Config.scan_layers) ------------------------------
#
# A stack's layers are made by `layer_stack` in its parent's `setup`; the functions below run them either way, so the
# encoder, the decoder and the PAWA decoder share one implementation of each layout. Scanned, a stack is one module
# whose parameters have a leading 'layers' axis, and its decoding cache is one (keys, values) pair
# [rows, layers, max_len, heads, kv]: rows first, so beam search reorders it along axis 0 like any cache leaf.

Layers = Any  # a scanned stack's one layer module, or the list of an unscanned stack's layers


def layer_stack(layer_cls: type[nn.Module], *, config: Numerics, num_layers: int,
                deterministic_argnum: int) -> Layers:
    """A stack's layers, made in its parent's `setup`: `num_layers` modules (parameters `{attribute}_{i}/...`), or
    with `config.scan_layers` one module the stack functions scan (parameters `{attribute}/...`, [layers, ...]).
    `deterministic_argnum`: the positional index (self counted) of the layer's `deterministic` argument, static
    under `config.remat`."""
    if config.remat:
        # Inside a scan the loop already keeps XLA from merging the recomputation into the forward pass, so t5x turns
        # CSE prevention (extra optimisation barriers) off there.
        layer_cls = nn.remat(layer_cls, static_argnums=(deterministic_argnum,), prevent_cse=not config.scan_layers)
    if config.scan_layers:
        return layer_cls(config)
    return [layer_cls(config) for _ in range(num_layers)]


def _is_scanned(layers: Layers) -> bool:
    return isinstance(layers, nn.Module)


def scan_stack(body: Callable[..., tuple[Any, Any]], layer: nn.Module, carry: Any, *, num_layers: int,
               xs: tuple = (), broadcast: tuple = ()) -> tuple[Any, Any]:
    """`body(layer, carry, *xs_i, *broadcast) -> (carry, y_i)` once per layer of a scanned stack: (the last carry,
    the y_i stacked on a leading axis). Parameters are created and read stacked on axis 0 under the logical name
    'layers'; every layer draws its own initialisation and dropout keys."""
    scan = nn.scan(body, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                   in_axes=(0,) * len(xs) + (nn.broadcast,) * len(broadcast), length=num_layers,
                   metadata_params={nn.PARTITION_NAME: LAYERS})
    return scan(layer, carry, *xs, *broadcast)


def run_layers(layers: Layers, x: Array, *args: Array, num_layers: int, deterministic: bool) -> Array:
    """x [batch, length, embed] through every layer of a stack, `layer(x, *args, deterministic)`."""
    if _is_scanned(layers):
        def body(layer, x, *args):
            return layer(x, *args, deterministic), None
        return scan_stack(body, layers, x, num_layers=num_layers, broadcast=args)[0]
    for layer in layers:
        x = layer(x, *args, deterministic)
    return x


def stack_cross_kv(layers: Layers, encoded: Array, *, num_layers: int) -> tuple:
    """A decoder stack's cross-attention keys/values for decoding, from encoded [batch, src_len, embed]: per layer
    (keys, values) [batch, src_len, heads, kv]; scanned, one pair [layers, batch, src_len, heads, kv]."""
    if _is_scanned(layers):
        def body(layer, carry, encoded):
            return carry, layer.encoder_decoder_attention.project_kv(encoded)
        return (scan_stack(body, layers, (), num_layers=num_layers, broadcast=(encoded,))[1],)
    return tuple(layer.encoder_decoder_attention.project_kv(encoded) for layer in layers)


def stack_step(layers: Layers, x: Array, *, num_layers: int, position: Array, cache: tuple, cross_kv: tuple,
               cross_mask: Array, bias_row: Array) -> tuple[Array, tuple]:
    """One decoding position through a decoder stack (`DecoderLayer.step`): x [rows, 1, embed] -> (x, the stack's
    updated cache). `cache` as `stack_cache` makes it, `cross_kv` as `stack_cross_kv`."""
    if _is_scanned(layers):
        def body(layer, carry, kv, index, position, cross_mask, bias_row):
            x, stacked = carry
            x, stacked = layer.step(x, position=position, self_cache=stacked, cross_kv=kv, cross_mask=cross_mask,
                                    bias_row=bias_row, layer=index)
            return (x, stacked), None
        (stacked,), (kv,) = cache, cross_kv
        (x, stacked), _ = scan_stack(body, layers, (x, stacked), num_layers=num_layers,
                                     xs=(kv, jnp.arange(num_layers, dtype=jnp.int32)),
                                     broadcast=(position, cross_mask, bias_row))
        return x, (stacked,)
    new_cache = []
    for layer, layer_cache, kv in zip(layers, cache, cross_kv):
        x, layer_cache = layer.step(x, position=position, self_cache=layer_cache, cross_kv=kv, cross_mask=cross_mask,
                                    bias_row=bias_row)
        new_cache.append(layer_cache)
    return x, tuple(new_cache)


def write_cache(cache: tuple[Array, Array], new: tuple[Array, Array], *, slot: Array, layer: Optional[Array] = None
                ) -> tuple[tuple[Array, Array], tuple[Array, Array]]:
    """One decoding step's keys and values new [rows, 1, heads, k] written into slot `slot` of the cache: a layer's
    (keys, values) [rows, slots, heads, k], or with `layer` (int32[]) a scanned stack's [rows, layers, slots, heads,
    k], of which only that layer's slot is written, in place. -> (the cache, this layer's keys and values
    [rows, slots, heads, k])."""
    written = []
    for stored, fresh in zip(cache, new):
        if layer is None:
            written.append(jax.lax.dynamic_update_slice_in_dim(stored, fresh.astype(stored.dtype), slot, axis=1))
        else:
            written.append(jax.lax.dynamic_update_slice(stored, fresh[:, None].astype(stored.dtype),
                                                        (0, layer, slot, 0, 0)))
    keys, values = written
    if layer is None:
        return (keys, values), (keys, values)
    return (keys, values), (jax.lax.dynamic_index_in_dim(keys, layer, axis=1, keepdims=False),
                            jax.lax.dynamic_index_in_dim(values, layer, axis=1, keepdims=False))


def stack_cache(config: T5Config, *, num_layers: int, rows: int, max_decode_len: int) -> tuple:
    """A decoder stack's zeroed self-attention cache: per layer (keys, values) [rows, max_decode_len, heads, kv];
    with `config.scan_layers` one pair [rows, layers, max_decode_len, heads, kv] (a step writes one position of one
    layer in place). Empty for no layers."""
    shape: tuple[int, ...] = (rows, max_decode_len, config.num_heads, config.head_dim)
    if config.scan_layers:
        shape = (rows, num_layers) + shape[1:]
        return ((jnp.zeros(shape, config.dtype), jnp.zeros(shape, config.dtype)),) if num_layers else ()
    return tuple((jnp.zeros(shape, config.dtype), jnp.zeros(shape, config.dtype)) for _ in range(num_layers))


def stack_cache_entries(config: T5Config, *, num_layers: int) -> int:
    """How many entries of the decoding cache (`init_cache`) a stack of `num_layers` layers takes."""
    return min(num_layers, 1) if config.scan_layers else num_layers


def logical_param(module: nn.Module, name: str, init: Initializer, shape: Sequence[int], axes: Sequence[str],
           dtype: Any) -> Array:
    # `param` unboxes (unbox=True): it returns the array, which flax types as the init's LogicallyPartitioned box.
    return cast(Array, module.param(name, nn.with_logical_partitioning(init, tuple(axes)), tuple(shape), dtype))


def fan_in_init(fan_in_axes: int, scale: float = 1.0) -> Initializer:
    """Variance scaling over the first `fan_in_axes` dims (truncated normal), as in Mesh TensorFlow's T5."""
    def init(key, shape, dtype=jnp.float32):
        fan_in = int(np.prod(shape[:fan_in_axes]))
        # A Python float is weakly typed: the kernel keeps `dtype` (a numpy float64 would promote bf16 to f32).
        std = float(np.sqrt(scale / fan_in) / 0.87962566103423978)  # Std of a unit normal truncated to [-2, 2].
        return std * jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)
    return init


class Dropout(nn.Module):
    """Inverted dropout as t5x applies it to attention weights: `x * mask / keep` with the {0, 1} mask drawn at the
    broadcast shape (`broadcast_dims` set to 1). Flax's `nn.Dropout` broadcasts a boolean mask to the full shape
    and selects, which XLA keeps at full size for the backward pass. Same draws as `nn.Dropout` (one `bernoulli`
    from the module's 'dropout' key); values equal up to rounding (`x * (1 / keep)` against `x / keep`)."""
    rate: float
    broadcast_dims: tuple[int, ...] = ()

    @nn.compact
    def __call__(self, x: Array, *, deterministic: bool) -> Array:
        if deterministic or self.rate == 0.0:
            return x
        if self.rate == 1.0:
            return jnp.zeros_like(x)
        keep = 1.0 - self.rate
        shape = list(x.shape)
        for dim in self.broadcast_dims:
            shape[dim] = 1
        mask = jax.random.bernoulli(self.make_rng("dropout"), p=keep, shape=shape)
        return x * (mask.astype(x.dtype) / jnp.asarray(keep, x.dtype))


class Numerics(Protocol):
    """What a layer reads of its network's config beyond its own dimensions: T5Config and the decoder-only
    family's config both are one."""

    @property
    def dtype(self) -> str: ...

    @property
    def param_dtype(self) -> str: ...

    @property
    def scan_layers(self) -> bool: ...

    @property
    def remat(self) -> bool: ...


class RMSNorm(nn.Module):
    """T5's layer norm (and Llama's): scale only, no mean subtraction, computed in float32."""
    config: Numerics
    epsilon: float = 1e-6
    axis: str = EMBED  # the logical name of the normalised axis (Qwen3's per-head norms: 'kv')

    @nn.compact
    def __call__(self, x: Array) -> Array:
        scale = logical_param(self, "scale", nn.initializers.ones, (x.shape[-1],), (self.axis,),
                              self.config.param_dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.epsilon)
        return (y * scale.astype(jnp.float32)).astype(self.config.dtype)


def relative_position_bucket(relative_position: Array, *, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> Array:
    """Maps key_pos - query_pos to T5's log-spaced buckets: exact for small distances, log-binned up to max."""
    ret: Array | int = 0
    n = -relative_position
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).astype(jnp.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_if_large = max_exact + (
        jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact + np.finfo(np.float32).eps)
        / np.log(max_distance / max_exact) * (num_buckets - max_exact)).astype(jnp.int32)
    val_if_large = jnp.minimum(val_if_large, num_buckets - 1)
    return ret + jnp.where(is_small, n, val_if_large)


class RelativePositionBias(nn.Module):
    """One bias table per stack; returns float32[heads, q_len, k_len] for a block of positions."""
    config: T5Config
    bidirectional: bool

    def setup(self):
        cfg = self.config
        self.rel_embedding = logical_param(
            self, "rel_embedding", nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
            (cfg.num_heads, cfg.relative_attention_num_buckets), (HEADS, RELPOS), cfg.param_dtype)

    def __call__(self, q_len: int, k_len: int) -> Array:
        cfg = self.config
        rel = jnp.arange(k_len)[None, :] - jnp.arange(q_len)[:, None]
        buckets = relative_position_bucket(rel, bidirectional=self.bidirectional,
                                           num_buckets=cfg.relative_attention_num_buckets,
                                           max_distance=cfg.relative_attention_max_distance)
        return jnp.take(self.rel_embedding.astype(jnp.float32), buckets, axis=1)  # [heads, q, k]


class Attention(nn.Module):
    """Multi-head dot-product attention without biases or 1/sqrt(d) scaling (folded into the query init)."""
    config: T5Config

    def setup(self):
        cfg = self.config
        d, h, k = cfg.emb_dim, cfg.num_heads, cfg.head_dim
        self.query = logical_param(self, "query", fan_in_init(1, scale=1.0 / k), (d, h, k), (EMBED, HEADS, KV),
                            cfg.param_dtype)
        self.key = logical_param(self, "key", fan_in_init(1), (d, h, k), (EMBED, HEADS, KV), cfg.param_dtype)
        self.value = logical_param(self, "value", fan_in_init(1), (d, h, k), (EMBED, HEADS, KV), cfg.param_dtype)
        self.out = logical_param(self, "out", fan_in_init(2), (h, k, d), (HEADS, KV, EMBED), cfg.param_dtype)
        self.adapters = {
            name: lora.adapter(self, name, lora=cfg.lora, shape=shape, axes=axes, in_axes=in_axes,
                               dtype=cfg.param_dtype)
            for name, shape, axes, in_axes in (("query", (d, h, k), (EMBED, HEADS, KV), 1),
                                               ("key", (d, h, k), (EMBED, HEADS, KV), 1),
                                               ("value", (d, h, k), (EMBED, HEADS, KV), 1),
                                               ("out", (h, k, d), (HEADS, KV, EMBED), 2))}
        self.dropout = Dropout(cfg.dropout_rate, broadcast_dims=cfg.dropout_broadcast_dims)

    def _project(self, name: str, x: Array) -> Array:
        cfg, dtype = self.config, self.config.dtype
        y = jnp.einsum("...d,dhk->...hk", x.astype(dtype), getattr(self, name).astype(dtype))
        y = lora.add(y, lora.delta(x, self.adapters[name], lora=cfg.lora, in_axes=1, dtype=dtype))
        return nn.with_logical_constraint(y, (BATCH, LENGTH, HEADS, KV)[-y.ndim:] if y.ndim <= 4 else None)

    def project_kv(self, inputs_kv: Array) -> tuple[Array, Array]:
        """inputs_kv: [batch, k_len, embed] -> keys, values: [batch, k_len, heads, head_dim]."""
        return self._project("key", inputs_kv), self._project("value", inputs_kv)

    def project_q(self, inputs_q: Array) -> Array:
        return self._project("query", inputs_q)

    def attend(self, q: Array, k: Array, v: Array, *, mask: Optional[Array], bias: Optional[Array],
               deterministic: bool) -> Array:
        """q: [b, q_len, h, kv], k/v: [b, k_len, h, kv], mask: bool broadcastable to [b, h, q_len, k_len],
        bias: float32 broadcastable to the same. Returns [b, q_len, embed]."""
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
        if bias is not None:
            logits = logits + bias
        if mask is not None:
            logits = jnp.where(mask, logits, NEG_INF)
        weights = jax.nn.softmax(logits, axis=-1).astype(self.config.dtype)
        weights = self.dropout(weights, deterministic=deterministic)
        y = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        return self.output(y)

    def output(self, y: Array) -> Array:
        dtype = self.config.dtype
        out = jnp.einsum("...hk,hkd->...d", y, self.out.astype(dtype))
        out = lora.add(out, lora.delta(y, self.adapters["out"], lora=self.config.lora, in_axes=2, dtype=dtype))
        return nn.with_logical_constraint(out, (BATCH, LENGTH, EMBED))

    def __call__(self, inputs_q: Array, inputs_kv: Array, *, mask: Optional[Array], bias: Optional[Array],
                 deterministic: bool) -> Array:
        k, v = self.project_kv(inputs_kv)
        return self.attend(self.project_q(inputs_q), k, v, mask=mask, bias=bias, deterministic=deterministic)


class MlpConfig(Numerics, Protocol):
    """What the gated MLP reads of its network's config."""

    @property
    def emb_dim(self) -> int: ...

    @property
    def mlp_dim(self) -> int: ...

    @property
    def mlp_activations(self) -> tuple[str, ...]: ...

    @property
    def dropout_rate(self) -> float: ...

    @property
    def dropout_broadcast_dims(self) -> tuple[int, ...]: ...

    @property
    def lora(self) -> Optional[LoraConfig]: ...


class Mlp(nn.Module):
    """Gated MLP: (act_0(x W_0) * act_1(x W_1)) W_out, T5.1.1's gated-GELU for ('gelu', 'linear'), Llama's SwiGLU
    for ('silu', 'linear')."""
    config: MlpConfig

    def setup(self):
        cfg = self.config
        self.wi = [logical_param(self, f"wi_{i}", fan_in_init(1), (cfg.emb_dim, cfg.mlp_dim), (EMBED, MLP),
                          cfg.param_dtype) for i in range(len(cfg.mlp_activations))]
        self.wo = logical_param(self, "wo", fan_in_init(1), (cfg.mlp_dim, cfg.emb_dim), (MLP, EMBED), cfg.param_dtype)
        self.wi_adapters = [lora.adapter(self, f"wi_{i}", lora=cfg.lora, shape=(cfg.emb_dim, cfg.mlp_dim),
                                         axes=(EMBED, MLP), in_axes=1, dtype=cfg.param_dtype)
                            for i in range(len(cfg.mlp_activations))]
        self.wo_adapter = lora.adapter(self, "wo", lora=cfg.lora, shape=(cfg.mlp_dim, cfg.emb_dim), axes=(MLP, EMBED),
                                       in_axes=1, dtype=cfg.param_dtype)
        self.dropout = Dropout(cfg.dropout_rate, broadcast_dims=cfg.dropout_broadcast_dims)

    def __call__(self, x: Array, *, deterministic: bool) -> Array:
        cfg = self.config
        h = None
        for act, w, adapter in zip(cfg.mlp_activations, self.wi, self.wi_adapters):
            y = jnp.einsum("...d,dm->...m", x, w.astype(cfg.dtype))
            y = _activation(act)(lora.add(y, lora.delta(x, adapter, lora=cfg.lora, in_axes=1, dtype=cfg.dtype)))
            h = y if h is None else h * y
        h = nn.with_logical_constraint(h, (BATCH, LENGTH, MLP))
        h = self.dropout(h, deterministic=deterministic)
        out = jnp.einsum("...m,md->...d", h, self.wo.astype(cfg.dtype))
        out = lora.add(out, lora.delta(h, self.wo_adapter, lora=cfg.lora, in_axes=1, dtype=cfg.dtype))
        return nn.with_logical_constraint(out, (BATCH, LENGTH, EMBED))


class EncoderLayer(nn.Module):
    config: T5Config

    def setup(self):
        self.pre_attention_norm = RMSNorm(self.config)
        self.attention = Attention(self.config)
        self.pre_mlp_norm = RMSNorm(self.config)
        self.mlp = Mlp(self.config)
        self.dropout = Dropout(self.config.dropout_rate, broadcast_dims=self.config.dropout_broadcast_dims)

    def __call__(self, x: Array, mask: Array, bias: Array, deterministic: bool) -> Array:
        # Positional, so nn.remat can mark `deterministic` static (argument 4, counting self).
        h = self.pre_attention_norm(x)
        x = x + self.dropout(self.attention(h, h, mask=mask, bias=bias, deterministic=deterministic),
                             deterministic=deterministic)
        x = x + self.dropout(self.mlp(self.pre_mlp_norm(x), deterministic=deterministic),
                             deterministic=deterministic)
        return nn.with_logical_constraint(x, (BATCH, LENGTH, EMBED))


class DecoderLayer(nn.Module):
    config: T5Config

    def setup(self):
        cfg = self.config
        self.pre_self_attention_norm = RMSNorm(cfg)
        self.self_attention = Attention(cfg)
        self.pre_cross_attention_norm = RMSNorm(cfg)
        self.encoder_decoder_attention = Attention(cfg)
        self.pre_mlp_norm = RMSNorm(cfg)
        self.mlp = Mlp(cfg)
        self.dropout = Dropout(cfg.dropout_rate, broadcast_dims=cfg.dropout_broadcast_dims)

    def __call__(self, x: Array, encoded: Array, self_mask: Array, cross_mask: Array, bias: Array,
                 deterministic: bool) -> Array:
        h = self.pre_self_attention_norm(x)
        y = self.self_attention(h, h, mask=self_mask, bias=bias, deterministic=deterministic)
        x = x + self.dropout(y, deterministic=deterministic)
        h = self.pre_cross_attention_norm(x)
        y = self.encoder_decoder_attention(h, encoded, mask=cross_mask, bias=None, deterministic=deterministic)
        x = x + self.dropout(y, deterministic=deterministic)
        x = x + self.dropout(self.mlp(self.pre_mlp_norm(x), deterministic=deterministic),
                             deterministic=deterministic)
        return nn.with_logical_constraint(x, (BATCH, LENGTH, EMBED))

    def step(self, x: Array, *, position: Array, self_cache: tuple[Array, Array], cross_kv: tuple[Array, Array],
             cross_mask: Array, bias_row: Array, layer: Optional[Array] = None) -> tuple[Array, tuple[Array, Array]]:
        """One decoding position for `batch * beams` rows against per-query cross-attention keys/values.

        x: [batch*beams, 1, embed]; self_cache: keys/values [batch*beams, max_len, heads, kv] (filled below
        `position`), or with `layer` (int32[], a scanned stack) the whole stack's [batch*beams, layers, max_len,
        heads, kv], of which only this layer's new position is written; cross_kv: [batch, src_len, heads, kv];
        cross_mask: bool[batch, src_len]; bias_row: float32[heads, max_len] = the decoder bias for query `position`.
        """
        h = self.pre_self_attention_norm(x)
        (cache_k, cache_v), (keys, values) = write_cache(self_cache, self.self_attention.project_kv(h),
                                                         slot=position, layer=layer)
        max_len = keys.shape[1]
        causal = (jnp.arange(max_len) <= position)[None, None, None, :]
        y = self.self_attention.attend(self.self_attention.project_q(h), keys, values, mask=causal,
                                       bias=bias_row[None, :, None, :], deterministic=True)
        x = x + y
        # Cross-attention: queries grouped per source query so keys/values are shared by all its beams.
        h = self.pre_cross_attention_norm(x)
        q = self.encoder_decoder_attention.project_q(h)[:, 0]  # [batch*beams, heads, kv]
        ck, cv = cross_kv
        batch = ck.shape[0]
        q = q.reshape((batch, -1) + q.shape[1:])  # [batch, beams, heads, kv]
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, ck).astype(jnp.float32)
        logits = jnp.where(cross_mask[:, None, None, :], logits, NEG_INF)
        weights = jax.nn.softmax(logits, axis=-1).astype(self.config.dtype)
        y = jnp.einsum("bhqk,bkhd->bqhd", weights, cv)
        y = self.encoder_decoder_attention.output(y.reshape((-1, 1) + y.shape[2:]))
        x = x + y
        x = x + self.mlp(self.pre_mlp_norm(x), deterministic=True)
        return x, (cache_k, cache_v)


class Transformer(nn.Module):
    """T5.1.1 encoder-decoder with an output head (`head`, e.g. `gr_jax.heads.StandardHead()`; None: no output layer,
    for the encoder alone, as a dense tower uses it). Token 0 is padding and the decoder start token."""
    config: T5Config
    head: Optional[Head] = None

    def setup(self):
        cfg = self.config
        if cfg.vocab_size is None:
            raise ValueError("T5Config.vocab_size is unset (see T5Config.with_vocab_size).")
        self.token_embedder = logical_param(self, "token_embedder", nn.initializers.normal(stddev=1.0),
                                            (cfg.vocab_size, cfg.emb_dim), (VOCAB, EMBED), cfg.param_dtype)
        self.encoder_relpos = RelativePositionBias(cfg, bidirectional=True)
        # `encoder_layers_{i}/...` each, or scanned (cfg.scan_layers) one `encoder_layers/...` with a 'layers' axis.
        self.encoder_layers = layer_stack(EncoderLayer, config=cfg, num_layers=cfg.num_encoder_layers,
                                          deterministic_argnum=4)
        self.encoder_norm = RMSNorm(cfg)
        self.decoder_relpos = RelativePositionBias(cfg, bidirectional=False)
        self.decoder_layers = layer_stack(DecoderLayer, config=cfg, num_layers=cfg.num_decoder_layers,
                                          deterministic_argnum=6)
        self.decoder_norm = RMSNorm(cfg)
        self.output_layer: Optional[nn.Module]
        if self.head is not None:
            self.output_layer = self.head.layer(cfg)
            nn.share_scope(self, self.output_layer)  # the head's parameters keep top-level names (checkpoints, HF)
        else:
            self.output_layer = None
        self.dropout = Dropout(cfg.dropout_rate, broadcast_dims=cfg.dropout_broadcast_dims)

    def _output_layer(self) -> nn.Module:
        if self.output_layer is None:
            raise ValueError("this Transformer has no output head (head=None): give it one to decode, e.g. "
                             "gr_jax.heads.StandardHead()")
        return self.output_layer

    def embed(self, tokens: Array) -> Array:
        """tokens: int32[...] -> embeddings [..., embed] in the compute dtype."""
        x = jnp.take(self.token_embedder, tokens, axis=0).astype(self.config.dtype)
        return nn.with_logical_constraint(x, (BATCH, LENGTH, EMBED))

    def encode(self, encoder_input_tokens: Array, *, enable_dropout: bool = False) -> Array:
        """encoder_input_tokens: int32[batch, src_len] -> encoded: [batch, src_len, embed]."""
        deterministic = not enable_dropout
        mask = (encoder_input_tokens > 0)[:, None, None, :]
        src_len = encoder_input_tokens.shape[1]
        bias = self.encoder_relpos(src_len, src_len)[None]
        x = self.dropout(self.embed(encoder_input_tokens), deterministic=deterministic)
        x = run_layers(self.encoder_layers, x, mask, bias, num_layers=self.config.num_encoder_layers,
                       deterministic=deterministic)
        return self.dropout(self.encoder_norm(x), deterministic=deterministic)

    def _decoder_states(self, embedded: Array, encoded: Array, *, cross_mask: Array, deterministic: bool) -> Array:
        """Teacher-forced main decoder stack: embedded [batch, tgt_len, embed] -> normalised states, same shape."""
        return teacher_forced_stack(embedded, encoded, layers=self.decoder_layers,
                                    num_layers=self.config.num_decoder_layers, relpos=self.decoder_relpos,
                                    norm=self.decoder_norm, dropout=self.dropout, cross_mask=cross_mask,
                                    deterministic=deterministic)

    def decode(self, encoded: Array, encoder_input_tokens: Array, decoder_input_tokens: Array, *,
               enable_dropout: bool = False, return_states: bool = False) -> Array | tuple[Array, Array]:
        """Teacher-forced decoder. decoder_input_tokens: int32[batch, tgt_len] (targets shifted right, start 0).

        Returns the head's float32 logits [batch, tgt_len', columns] (the standard head: tgt_len' = tgt_len and
        columns = logits_vocab_size; see `gr_jax.heads` for the others), and with `return_states` also the decoder's
        final states [batch, tgt_len', embed] (what the output layer reads; NCI's consistency loss compares them).
        """
        deterministic = not enable_dropout
        output_layer = self._output_layer()
        decoder_input_tokens = output_layer.teacher_forced_inputs(decoder_input_tokens)
        cross_mask = (encoder_input_tokens > 0)[:, None, None, :]
        embedded = self.embed(decoder_input_tokens)
        x = self._decoder_states(embedded, encoded, cross_mask=cross_mask, deterministic=deterministic)
        logits = output_layer(x, embedded=embedded, encoded=encoded, cross_mask=cross_mask, deterministic=deterministic)
        return (logits, x) if return_states else logits

    def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array, *,
                 enable_dropout: bool = False, return_states: bool = False) -> Array | tuple[Array, Array]:
        encoded = self.encode(encoder_input_tokens, enable_dropout=enable_dropout)
        return self.decode(encoded, encoder_input_tokens, decoder_input_tokens, enable_dropout=enable_dropout,
                           return_states=return_states)

    def start_states(self, encoder_input_tokens: Array) -> Array:
        """The decoder's normalised state at the start position, [batch, embed]: all a one-token head needs."""
        encoded = self.encode(encoder_input_tokens)
        start = jnp.full((encoder_input_tokens.shape[0], 1), PAD_ID, jnp.int32)
        cross_mask = (encoder_input_tokens > 0)[:, None, None, :]
        return self._decoder_states(self.embed(start), encoded, cross_mask=cross_mask, deterministic=True)[:, 0]

    # --- Incremental decoding -------------------------------------------------------------------------------

    def prefill(self, encoder_input_tokens: Array, *, max_decode_len: int) -> "DecodeContext":
        """Everything that is constant across decoding steps for a query, computed once."""
        return self.prefill_encoded(self.encode(encoder_input_tokens), encoder_input_tokens > 0,
                                    max_decode_len=max_decode_len)

    def prefill_encoded(self, encoded: Array, cross_mask: Array, *, max_decode_len: int) -> "DecodeContext":
        """`prefill` from given encoder states [batch, src_len, emb_dim] and their mask bool[batch, src_len]: for
        networks that use the encoding for more than decoding (GDR's query vector)."""
        cross_kv = stack_cross_kv(self.decoder_layers, encoded, num_layers=self.config.num_decoder_layers)
        return DecodeContext(cross_kv=cross_kv, cross_mask=cross_mask,
                             decoder_bias=self.decoder_relpos(max_decode_len, max_decode_len),
                             head=self._output_layer().prefill(encoded, max_decode_len=max_decode_len))

    def decode_step(self, tokens: Array, *, position: Array, cache: tuple, context: "DecodeContext"
                    ) -> tuple[Array, tuple]:
        """tokens: int32[batch*beams] (the previous tokens), position: int32[] -> float32 logits
        [batch*beams, logits_vocab_size] and the updated self-attention cache (see `init_cache`)."""
        output_layer = self._output_layer()
        embedded = self.embed(output_layer.step_inputs(tokens, position=position)[:, None])
        bias_row = jax.lax.dynamic_index_in_dim(context.decoder_bias, position, axis=1, keepdims=False)
        cfg = self.config
        num_main = stack_cache_entries(cfg, num_layers=cfg.num_decoder_layers)
        x, new_cache = stack_step(self.decoder_layers, embedded, num_layers=cfg.num_decoder_layers, position=position,
                                  cache=cache[:num_main], cross_kv=context.cross_kv, cross_mask=context.cross_mask,
                                  bias_row=bias_row)
        logits, head_cache = output_layer.step(self.decoder_norm(x), embedded=embedded, position=position,
                                               cache=cache[num_main:], context=context.head,
                                               cross_mask=context.cross_mask)
        return logits, (*new_cache, *head_cache)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeContext:
    """Per-query decoding constants. cross_kv: per decoder layer (keys, values) [batch, src_len, heads, kv], or
    scanned one pair [layers, batch, src_len, heads, kv] (`stack_cross_kv`); cross_mask: bool[batch, src_len];
    decoder_bias: float32[heads, max_len, max_len]; head: the head's own constants (`HeadLayer.prefill`; () for the
    standard head)."""
    cross_kv: tuple
    cross_mask: Array
    decoder_bias: Array
    head: Any = ()


def init_cache(config: T5Config, *, head: Head, rows: int, max_decode_len: int) -> tuple:
    """Zeroed self-attention cache: the decoder's, then `head`'s own stack's (PAWA), each as `stack_cache` makes it:
    per layer (keys, values) [rows, max_decode_len, heads, kv], or with `scan_layers` one pair per stack
    [rows, layers, max_decode_len, heads, kv]. Every leaf has `rows` first: beam search reorders the cache along
    axis 0 (`gr_jax.decoding`)."""
    def stack(num_layers: int) -> tuple:
        return stack_cache(config, num_layers=num_layers, rows=rows, max_decode_len=max_decode_len)
    return (*stack(config.num_decoder_layers), *stack(head.num_cached_layers(config)))
