"""Hugging Face Llama / Mistral / Qwen2 / Qwen3 checkpoints (`config.json` + safetensors, sharded index files
included) into the decoder-only network's sharded parameters.

Why: the follow-up papers start from these checkpoints. Each parameter is built on its sharding with every device
reading only its own block of the memory-mapped tensor (`gr_jax.pretrained.sharded_tensor`, as for T5.1.1), so a
70B model is never whole on one host. A config whose architecture or options the network does not implement
(sliding-window attention, another rope type, biases the four architectures do not have) is an error naming the
file, line and field, never an approximation.

Name and layout mapping (HF `nn.Linear.weight` is [out, in]; transformers' `modeling_llama.py`, `modeling_qwen3.py`):

    model.embed_tokens.weight [vocab, d]                         -> token_embedder [vocab, embed]
    model.layers.{i}.self_attn.{q,k,v}_proj.weight [heads*k, d]  -> layers_{i}/attention/{query,key,value}
                                                                    [embed, heads (or kv_heads), head_dim]
    model.layers.{i}.self_attn.{q,k,v}_proj.bias [heads*k]       -> .../attention/{query,key,value}_bias (Qwen2)
    model.layers.{i}.self_attn.o_proj.weight [d, heads*k]        -> .../attention/out [heads, head_dim, embed]
    model.layers.{i}.self_attn.{q,k}_norm.weight [k]             -> .../attention/{query,key}_norm/scale (Qwen3)
    model.layers.{i}.input_layernorm.weight                      -> layers_{i}/pre_attention_norm/scale
    model.layers.{i}.post_attention_layernorm.weight             -> layers_{i}/pre_mlp_norm/scale
    model.layers.{i}.mlp.{gate,up}_proj.weight [mlp, d]          -> layers_{i}/mlp/{wi_0,wi_1} [embed, mlp]
    model.layers.{i}.mlp.down_proj.weight [d, mlp]               -> layers_{i}/mlp/wo [mlp, embed]
    model.norm.weight                                            -> final_norm/scale
    lm_head.weight [vocab, d]                                    -> output [embed, vocab] (absent when tied)
"""
from __future__ import annotations

import dataclasses
import logging
import pathlib
import re
from collections.abc import Mapping
from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import traverse_util
from jax.sharding import Sharding

from gr_jax.data.readers import DataFormatError
from gr_jax.decoder_only.network import DecoderOnlyConfig, Llama3RopeScaling
from gr_jax.lora import LoraConfig
from gr_jax.run_dir import hugging_face_checkpoint
from gr_jax.pretrained import (
    PathLike, SafetensorsCheckpoint, TensorSource, fresh_value, json_field, json_line, read_config_json,
    sharded_tensor, with_fresh_rows)

logger = logging.getLogger(__name__)

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}


@dataclasses.dataclass(frozen=True)
class HFDecoderOnly:
    """A checkpoint's config.json as read: the network's config and what the loader needs besides."""
    path: pathlib.Path
    model_type: str
    config: DecoderOnlyConfig


def read_config(checkpoint_dir: PathLike, **overrides: Any) -> HFDecoderOnly:
    """Parses and validates `checkpoint_dir/config.json`; `overrides` replace fields of the network's config that
    config.json does not fix (dtype, param_dtype, scan_layers, remat, dropout_rate; lora and adapter_dim, which
    add parameters beside the checkpoint's)."""
    path, raw, text = read_config_json(checkpoint_dir)

    def get(key: str, default: Any, kind: type) -> Any:
        return json_field(raw, key=key, default=default, kind=kind, path=path, text=text)

    def refuse(key: str, message: str) -> DataFormatError:
        return DataFormatError.at(path, json_line(text, key), message)

    model_type = get("model_type", "", str)
    if model_type not in ARCHITECTURES:
        raise refuse("model_type", f"model_type={model_type!r} is not one of {sorted(ARCHITECTURES)}")
    architectures = raw.get("architectures") or [ARCHITECTURES[model_type]]
    if architectures != [ARCHITECTURES[model_type]]:
        raise refuse("architectures", f"architectures={architectures!r}: only {ARCHITECTURES[model_type]!r} "
                                      f"(the causal language model) is read")
    if get("hidden_act", "silu", str) != "silu":
        raise refuse("hidden_act", f"hidden_act={raw['hidden_act']!r}: the network's MLP is SwiGLU ('silu')")
    if get("mlp_bias", False, bool):
        raise refuse("mlp_bias", "mlp_bias=true: MLP biases are not implemented")
    if model_type in ("llama", "qwen3") and get("attention_bias", False, bool):
        raise refuse("attention_bias", "attention_bias=true: biases on the output projection are not implemented "
                                       "(Qwen2's query/key/value biases are)")
    if model_type == "mistral" and raw.get("sliding_window") is not None:
        raise refuse("sliding_window", f"sliding_window={raw['sliding_window']}: sliding-window attention is not "
                                       f"implemented (Mistral-7B-v0.3 has none)")
    if get("use_sliding_window", False, bool):
        raise refuse("use_sliding_window", "use_sliding_window=true: sliding-window attention is not implemented")
    layer_types = raw.get("layer_types")
    if layer_types is not None and set(layer_types) != {"full_attention"}:
        raise refuse("layer_types", f"layer_types={sorted(set(layer_types))}: only full attention is implemented")
    rope_theta, rope_scaling = _rope(raw, path=path, text=text)
    hidden, heads = get("hidden_size", 0, int), get("num_attention_heads", 0, int)
    if not hidden or not heads:
        raise refuse("hidden_size", "hidden_size and num_attention_heads are required")
    fields = dict(
        vocab_size=get("vocab_size", 0, int), emb_dim=hidden, num_layers=get("num_hidden_layers", 0, int),
        num_heads=heads, num_kv_heads=get("num_key_value_heads", heads, int),
        head_dim=get("head_dim", hidden // heads, int), mlp_dim=get("intermediate_size", 0, int),
        rope_theta=rope_theta, rope_scaling=rope_scaling, norm_epsilon=get("rms_norm_eps", 1e-6, float),
        qkv_bias=model_type == "qwen2", qk_norm=model_type == "qwen3",
        tie_embeddings=get("tie_word_embeddings", False, bool))
    fixed = sorted(set(overrides) & set(fields))
    if fixed:
        raise ValueError(f"{path} fixes {fixed}: only the numerics and layout can be overridden")
    try:
        config = DecoderOnlyConfig(**fields, **overrides)
    except ValueError as e:
        raise DataFormatError(f"{path}: {e}") from None
    return HFDecoderOnly(path=path, model_type=model_type, config=config)


def _rope(raw: Mapping[str, Any], *, path: pathlib.Path, text: str) -> tuple[float, Optional[Llama3RopeScaling]]:
    """(theta, Llama 3 scaling or None) from transformers 5's `rope_parameters` or 4's `rope_theta` +
    `rope_scaling` (what the hub's Llama-3 files hold)."""
    key = "rope_parameters" if raw.get("rope_parameters") is not None else "rope_scaling"
    params = dict(raw.get(key) or {})
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        raise DataFormatError.at(path, json_line(text, key), f"{key}: rope_type {rope_type!r} is not implemented "
                                                             f"('default' and 'llama3' are)")
    try:
        return float(theta), Llama3RopeScaling(
            factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]))
    except KeyError as e:
        raise DataFormatError.at(path, json_line(text, key), f"{key}: the llama3 rope type needs {e.args[0]!r}"
                                 ) from None


def config_from_checkpoint(checkpoint_dir: PathLike, *, dtype: str = "float32", param_dtype: str = "float32",
                           scan_layers: bool = False, remat: bool = False, dropout_rate: float = 0.0,
                           lora: Optional[LoraConfig] = None, adapter_dim: int = 0) -> DecoderOnlyConfig:
    """The network of `checkpoint_dir/config.json` (or of the checkpoint a gr_jax run dir started from,
    `run_dir.hugging_face_checkpoint`) with the numerics and options a run chooses (gin:
    `decoder_only/from_checkpoint.gin`). Its vocab_size is left unset: a run's vocabulary puts new ids before the
    checkpoint's rows and its docid tokens after them (`gr_jax.data.hf_tokenizer`), and sets the size."""
    hf = read_config(hugging_face_checkpoint(checkpoint_dir), dtype=dtype, param_dtype=param_dtype,
                     scan_layers=scan_layers, remat=remat, dropout_rate=dropout_rate, lora=lora,
                     adapter_dim=adapter_dim)
    return dataclasses.replace(hf.config, vocab_size=None)


def tensor_sources(config: DecoderOnlyConfig, *, checkpoint_vocab_size: Optional[int] = None,
                   token_offset: int = 0) -> dict[str, TensorSource]:
    """Our unscanned parameter paths -> the HF tensor each is read from, with its layout. The checkpoint's
    `checkpoint_vocab_size` token rows (default: ours) sit in our rows from `token_offset` on; our other rows are
    not the checkpoint's (`TensorSource.fresh_rows`)."""
    d, h, g, k, m, v = (config.emb_dim, config.num_heads, config.num_kv_heads, config.head_dim, config.mlp_dim,
                        config.vocab)
    rows = v if checkpoint_vocab_size is None else checkpoint_vocab_size
    vocab = dict(pretrained_rows=rows, first_row=token_offset)
    sources = {"token_embedder": TensorSource("model.embed_tokens.weight", "copy", (rows, d), (v, d), vocab_axis=0,
                                              **vocab),
               "final_norm/scale": TensorSource("model.norm.weight", "copy", (d,), (d,))}
    if not config.tie_embeddings:
        sources["output"] = TensorSource("lm_head.weight", "transpose", (rows, d), (d, v), vocab_axis=1, **vocab)
    for i in range(config.num_layers):
        ours, theirs = f"layers_{i}", f"model.layers.{i}"
        attention = f"{theirs}.self_attn"
        for name, proj, heads in (("query", "q", h), ("key", "k", g), ("value", "v", g)):
            sources[f"{ours}/attention/{name}"] = TensorSource(f"{attention}.{proj}_proj.weight", "qkv",
                                                               (heads * k, d), (d, heads, k))
            if config.qkv_bias:
                sources[f"{ours}/attention/{name}_bias"] = TensorSource(f"{attention}.{proj}_proj.bias", "heads",
                                                                        (heads * k,), (heads, k))
        sources[f"{ours}/attention/out"] = TensorSource(f"{attention}.o_proj.weight", "out", (d, h * k), (h, k, d))
        if config.qk_norm:
            for name, proj in (("query", "q"), ("key", "k")):
                sources[f"{ours}/attention/{name}_norm/scale"] = TensorSource(f"{attention}.{proj}_norm.weight",
                                                                              "copy", (k,), (k,))
        sources[f"{ours}/pre_attention_norm/scale"] = TensorSource(f"{theirs}.input_layernorm.weight", "copy",
                                                                   (d,), (d,))
        sources[f"{ours}/pre_mlp_norm/scale"] = TensorSource(f"{theirs}.post_attention_layernorm.weight", "copy",
                                                             (d,), (d,))
        for name, proj in (("wi_0", "gate"), ("wi_1", "up")):
            sources[f"{ours}/mlp/{name}"] = TensorSource(f"{theirs}.mlp.{proj}_proj.weight", "transpose", (m, d),
                                                         (d, m))
        sources[f"{ours}/mlp/wo"] = TensorSource(f"{theirs}.mlp.down_proj.weight", "transpose", (d, m), (m, d))
    return sources


def load_params(*, checkpoint_dir: PathLike, config: DecoderOnlyConfig, shardings: Any,
                fresh: Optional[Any] = None, token_offset: int = 0) -> Any:
    """The network's parameter tree from the checkpoint, each leaf on its `shardings` entry (`shardings` has the
    structure of the network's params, e.g. `partitioning.logical_shardings` of `jax.eval_shape(model.init, ...)`;
    scanned or not as `config.scan_layers`). Every tensor of the checkpoint must be used and every parameter
    found, with the shape config.json implies: a difference is an error naming the file. The parameters a
    checkpoint cannot hold are taken from `fresh` (the network's initialised parameters, placed as `shardings`):
    those `config` adds to its network (LoRA's adapters, the per-layer adapters) and the token rows that are not
    the checkpoint's. The checkpoint's token rows become ours from `token_offset` on (a vocabulary whose ids are
    the checkpoint's shifted, `gr_jax.data.hf_tokenizer`); `config.vocab_size` may be larger than config.json's
    (docid tokens after them)."""
    flat_fresh = traverse_util.flatten_dict(fresh, sep="/") if fresh is not None else {}
    added = {path for path in traverse_util.flatten_dict(shardings, sep="/") if _added_by_config(path)}
    if added and fresh is None:
        raise ValueError(f"the network adds {len(added)} parameters no checkpoint holds (e.g. {sorted(added)[0]}): "
                         "give their initial values as fresh=")
    hf = read_config(checkpoint_dir, **_numerics(config))
    rows = hf.config.vocab
    if token_offset < 0 or token_offset + rows > config.vocab:
        raise ValueError(f"{hf.path}: its {rows} token rows from row {token_offset} on do not fit the network's "
                         f"vocab_size {config.vocab}")
    if hf.config != dataclasses.replace(config, vocab_size=rows):
        differing = [f.name for f in dataclasses.fields(config)
                     if f.name != "vocab_size" and getattr(config, f.name) != getattr(hf.config, f.name)]
        raise ValueError(f"{hf.path} describes another network: fields {differing} differ")
    sources = tensor_sources(dataclasses.replace(config, scan_layers=False, lora=None, adapter_dim=0),
                             checkpoint_vocab_size=rows, token_offset=token_offset)
    if fresh is None and any(source.fresh_rows for source in sources.values()):
        raise ValueError(f"the network has {config.vocab} token rows, {hf.path} {rows} (from row {token_offset}): "
                         "give the other rows' initial values as fresh=")
    flat_shardings = {path: sharding for path, sharding in traverse_util.flatten_dict(shardings, sep="/").items()
                      if path not in added}
    wanted = {_unscanned_path(path, layer) for path in flat_shardings
              for layer in (range(config.num_layers) if config.scan_layers and path.startswith("layers/") else [None])}
    if wanted != set(sources):
        raise ValueError(f"the network's parameters {sorted(wanted ^ set(sources))[:6]} have no place in the "
                         f"checkpoint mapping (or the reverse)")
    with SafetensorsCheckpoint(checkpoint_dir) as ckpt:
        names = ckpt.names
        missing = sorted(s.name for s in sources.values() if s.name not in names)
        if missing:
            raise DataFormatError(f"{checkpoint_dir}: {len(missing)} tensor(s) missing, e.g. {missing[0]!r}")
        unused = sorted(names - {s.name for s in sources.values()} - _tied_copies(config))
        if unused:
            raise DataFormatError(f"{ckpt.path(unused[0])}: tensor {unused[0]!r} has no place in the network "
                                  f"({len(unused)} such)")
        for source in sources.values():
            if ckpt.shape(source.name) != source.hf_shape:
                raise DataFormatError(f"{ckpt.path(source.name)}: {source.name} has shape "
                                      f"{ckpt.shape(source.name)}, config.json implies {source.hf_shape}")
        dtype = jnp.dtype(config.param_dtype)
        flat: dict[str, jax.Array] = {}
        for path, sharding in flat_shardings.items():
            if config.scan_layers and path.startswith("layers/"):
                layers = [sharded_tensor(ckpt, sources[_unscanned_path(path, i)], sharding=_drop_layer_axis(sharding),
                                         dtype=dtype) for i in range(config.num_layers)]
                flat[path] = jax.jit(lambda *xs: jnp.stack(xs), out_shardings=sharding)(*layers)
            else:
                source = sources[path]
                flat[path] = sharded_tensor(ckpt, source, sharding=sharding, dtype=dtype)
                if source.fresh_rows:
                    flat[path] = with_fresh_rows(flat[path], source=source, sharding=sharding,
                                                 fresh=fresh_value(path, flat_fresh[path], sharding))
    flat.update({path: flat_fresh[path] for path in added})
    logger.info("loaded %s (%s): %d tensors", checkpoint_dir, hf.model_type, len(sources))
    return traverse_util.unflatten_dict(flat, sep="/")


def _added_by_config(path: str) -> bool:
    """A parameter of an option layered on the checkpoint's network: a LoRA adapter or a per-layer adapter."""
    parts = path.split("/")
    return parts[-1].endswith(("_lora_a", "_lora_b")) or "adapter" in parts[:-1]


def _numerics(config: DecoderOnlyConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in ("mlp_activations", "dropout_rate", "dropout_broadcast_dims",
                                                     "dtype", "param_dtype", "scan_layers", "remat", "lora",
                                                     "adapter_dim")}


def _tied_copies(config: DecoderOnlyConfig) -> set[str]:
    """A tied checkpoint may still hold lm_head.weight (a copy of the embedding), which is not read."""
    return {"lm_head.weight"} if config.tie_embeddings else set()


def _unscanned_path(path: str, layer: Optional[int]) -> str:
    return path if layer is None else re.sub(r"^layers/", f"layers_{layer}/", path)


def _drop_layer_axis(sharding: Sharding) -> Sharding:
    """A scanned leaf's sharding without its leading (replicated) 'layers' axis: one layer's."""
    if not isinstance(sharding, jax.sharding.NamedSharding):
        raise ValueError(f"a scanned parameter's sharding must be a NamedSharding, got {sharding}")
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*sharding.spec[1:]))
