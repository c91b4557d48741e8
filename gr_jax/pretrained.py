"""Initialise our T5.1.1 from a pretrained Hugging Face checkpoint (`config.json` + safetensors), straight into shards.

Why: DSI-style retrieval fine-tunes a pretrained T5 (google/t5-v1_1-{small,base,large,xl,xxl}); the public weights
are on the Hugging Face hub as safetensors, which can be read slice by slice without torch. Each of our parameters
is built with `jax.make_array_from_callback`: every device asks for its own index of the global array and gets just
that slice of the checkpoint tensor (memory-mapped, read with `safe_open(...).get_slice`), so an XXL model is never
copied whole onto one device, and host memory peaks at about one tensor.

Name and layout mapping (HF `nn.Linear.weight` is [out, in]; see transformers' `modeling_t5.py`):

    shared.weight [vocab, d]                                  -> token_embedder [vocab, embed]
    {enc,dec}oder.block.0.layer.0.SelfAttention.relative_attention_bias.weight [buckets, heads]
                                                              -> {enc,dec}oder_relpos/rel_embedding [heads, buckets]
    encoder.block.{i}.layer.0.SelfAttention.{q,k,v}.weight [heads*d_kv, d]
                                                              -> encoder_layers_{i}/attention/{query,key,value}
                                                                 [embed, heads, head_dim]
    encoder.block.{i}.layer.0.SelfAttention.o.weight [d, heads*d_kv] -> .../attention/out [heads, head_dim, embed]
    encoder.block.{i}.layer.0.layer_norm.weight                -> encoder_layers_{i}/pre_attention_norm/scale
    encoder.block.{i}.layer.1.layer_norm.weight                -> encoder_layers_{i}/pre_mlp_norm/scale
    encoder.block.{i}.layer.1.DenseReluDense.{wi_0,wi_1}.weight [d_ff, d] -> .../mlp/{wi_0,wi_1} [embed, mlp]
    encoder.block.{i}.layer.1.DenseReluDense.wo.weight [d, d_ff]           -> .../mlp/wo [mlp, embed]
    decoder.block.{i}.layer.{0,1,2}: SelfAttention / EncDecAttention / DenseReluDense, each with its layer_norm
                                                              -> decoder_layers_{i}/{self_attention,
                                                                 encoder_decoder_attention, mlp} and
                                                                 pre_{self_attention,cross_attention,mlp}_norm
    {enc,dec}oder.final_layer_norm.weight                      -> {enc,dec}oder_norm/scale
    lm_head.weight [vocab, d]                                  -> logits_dense [embed, vocab]

Numerics checked against HF: neither implementation scales attention logits by 1/sqrt(d_kv) (Mesh TensorFlow
folded it into the query initialisation). T5 1.0 (tied embeddings, a non-gated ReLU MLP `DenseReluDense.wi`)
multiplies the decoder output by d_model**-0.5 before the output projection, T5.1.1 (its own `lm_head`) does not;
we fold the factor into `logits_dense`. Which a checkpoint needs depends on the transformers that saved it
(`models/t5/configuration_t5.py` and `modeling_t5.py` of each line):
  - 4.x scales iff `tie_word_embeddings`, and then ties `lm_head` to `shared` (a saved one is a copy);
  - 5.x forces `tie_word_embeddings` to true, so it no longer tells whether `lm_head` is tied, and keeps the decision
    as `scale_decoder_outputs` (derived from the old flag when config.json lacks it, and saved); its loader ties
    `lm_head` only where the file lacks it or holds it equal to `shared`. A T5.1.1 saved by 5.x thus reads
    `tie_word_embeddings: true, scale_decoder_outputs: false` and keeps its own `lm_head`. 5.x's mT5 never scales
    (`MT5Config` writes no `scale_decoder_outputs`).
So the factor applies where `scale_decoder_outputs` says so, never to an mT5 saved by 5.x (`transformers_version`),
otherwise iff `tie_word_embeddings`; a saved `lm_head` is the output layer except under 4.x's tying (the flag true,
no `scale_decoder_outputs`, not saved by 5.x), where it must equal `shared`. Reading the scale from the tied flag
alone would shrink a 5.x T5.1.1's logits by d_model**-0.5 without any error.
`feed_forward_proj: "gated-gelu"` is GELU with the tanh approximation (HF's `gelu_new`), as our network's "gelu".
`encoder/decoder.embed_tokens.weight`, where saved, are tied copies of `shared.weight`; they are checked equal.

Vocabulary: with the checkpoint's SentencePiece model (`pretrained_vocabulary`), set `T5Config.vocab_size` to the
checkpoint's (32128 for T5). A larger vocabulary (extra docid tokens for 2D semantic ids) keeps the pretrained rows
of `token_embedder` / `logits_dense` and takes the rows beyond from the model's own initialisation (`fresh_params`);
the head decides what of it a checkpoint fills: `lm_head` goes to the parameter it names (`lm_head_parameter`: the
standard and PAWA heads' `logits_dense`, when it covers the input vocabulary), and its parameters no T5 has start
from the model's own initialisation (`fresh_param_patterns`: an output layer over another vocabulary, atomic docid
columns, the PAWA stack). Any other parameter the checkpoint has no tensor for is an error unless named in
`fresh_patterns`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional

import jax
import numpy as np
from jax.sharding import Sharding
from safetensors import safe_open

from gr_jax import layer_layout
from gr_jax import network
from gr_jax import partitioning
from gr_jax.data.readers import DataFormatError

if TYPE_CHECKING:
    import seqio

    from gr_jax.heads import OutputHead

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike

CONFIG_FILENAME = "config.json"
SINGLE_FILENAME = "model.safetensors"
INDEX_FILENAME = "model.safetensors.index.json"
VOCABULARY_FILENAME = "spiece.model"

_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
_SHARED = "shared.weight"
_TIED_COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
_LM_HEAD = "lm_head.weight"


# HF `feed_forward_proj` -> our `T5Config.mlp_activations`. HF maps "gated-gelu" to the tanh approximation
# ("gelu_new"), but plain "gelu" to exact GELU, which our network does not have.
_FEED_FORWARD_ACTIVATIONS = {
    "gated-gelu": ("gelu", "linear"),
    "gated-relu": ("relu", "linear"),
    "relu": ("relu",),
}


# ----------------------------------------------------------------------------------------------
# config.json
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class HFT5Config:
    """The fields of a Hugging Face T5 `config.json` that fix the network; defaults are HF's `T5Config` ones."""
    path: pathlib.Path
    text: str = dataclasses.field(repr=False)
    model_type: str
    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_decoder_layers: int
    num_heads: int
    relative_attention_num_buckets: int
    relative_attention_max_distance: int
    layer_norm_epsilon: float
    feed_forward_proj: str
    tie_word_embeddings: bool
    # Resolved as transformers does for the version that saved the file (see the module docstring): whether the
    # decoder output is multiplied by d_model**-0.5, and whether a saved `lm_head.weight` is a copy of `shared.weight`
    # (4.x tying) rather than the output layer.
    scale_decoder_outputs: bool
    lm_head_is_tied_copy: bool
    pad_token_id: int
    eos_token_id: int
    decoder_start_token_id: int

    @property
    def mlp_activations(self) -> tuple[str, ...]:
        return _FEED_FORWARD_ACTIVATIONS[self.feed_forward_proj]

    @property
    def gated(self) -> bool:
        return len(self.mlp_activations) == 2

    def line_of(self, key: str) -> int:
        """1-based line of `"key":` in the file (1 when the key is absent and HF's default applies)."""
        return json_line(self.text, key)

    def error(self, key: str, message: str) -> DataFormatError:
        return DataFormatError.at(self.path, self.line_of(key), message)


def read_config_json(checkpoint_dir: PathLike) -> tuple[pathlib.Path, dict[str, Any], str]:
    """A Hugging Face checkpoint's config.json: (its path, the parsed object, its text for error lines)."""
    path = pathlib.Path(checkpoint_dir) / CONFIG_FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no Hugging Face config.json; a checkpoint directory holds config.json "
                                f"and {SINGLE_FILENAME} (or {INDEX_FILENAME} with its shards)")
    text = path.read_text(encoding="utf-8")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataFormatError.at(path, e.lineno, f"invalid JSON: {e.msg}") from None
    if not isinstance(raw, dict):
        raise DataFormatError.at(path, 1, "expected a JSON object")
    return path, raw, text


def read_hf_config(checkpoint_dir: PathLike) -> HFT5Config:
    """Parses and validates `checkpoint_dir/config.json` (model_type t5 or mt5, a supported feed-forward)."""
    path, raw, text = read_config_json(checkpoint_dir)

    def get(key: str, default: Any, kind: type) -> Any:
        return json_field(raw, key=key, default=default, kind=kind, path=path, text=text)

    num_layers = get("num_layers", 6, int)
    model_type = get("model_type", "t5", str)
    tied = get("tie_word_embeddings", True, bool)
    version = get("transformers_version", "", str)
    major = re.match(r"(\d+)\.", version)
    if version and not major:
        raise DataFormatError.at(path, json_line(text, "transformers_version"),
                                 f"transformers_version must be a version such as '4.57.1', got {version!r}")
    has_scale = raw.get("scale_decoder_outputs") is not None
    saved_by_5 = has_scale or (major is not None and int(major.group(1)) >= 5)
    if has_scale:
        scale = get("scale_decoder_outputs", False, bool)
    else:
        scale = tied and not (model_type == "mt5" and saved_by_5)
    hf = HFT5Config(
        path=path, text=text,
        model_type=model_type,
        vocab_size=get("vocab_size", 32128, int),
        d_model=get("d_model", 512, int),
        d_kv=get("d_kv", 64, int),
        d_ff=get("d_ff", 2048, int),
        num_layers=num_layers,
        num_decoder_layers=get("num_decoder_layers", num_layers, int),
        num_heads=get("num_heads", 8, int),
        relative_attention_num_buckets=get("relative_attention_num_buckets", 32, int),
        relative_attention_max_distance=get("relative_attention_max_distance", 128, int),
        layer_norm_epsilon=get("layer_norm_epsilon", 1e-6, float),
        feed_forward_proj=get("feed_forward_proj", "relu", str),
        tie_word_embeddings=tied,
        scale_decoder_outputs=scale,
        lm_head_is_tied_copy=tied and not saved_by_5,
        pad_token_id=get("pad_token_id", 0, int),
        eos_token_id=get("eos_token_id", 1, int),
        decoder_start_token_id=get("decoder_start_token_id", 0, int),
    )
    if hf.model_type not in ("t5", "mt5"):
        raise hf.error("model_type", f"model_type={hf.model_type!r}: only 't5' and 'mt5' checkpoints share our "
                                     f"network (umt5 has per-layer relative biases, longt5 other attention)")
    if hf.feed_forward_proj not in _FEED_FORWARD_ACTIVATIONS:
        raise hf.error("feed_forward_proj", f"feed_forward_proj={hf.feed_forward_proj!r} is not supported; expected "
                                            f"one of {sorted(_FEED_FORWARD_ACTIVATIONS)} (T5.1.1 is 'gated-gelu')")
    for key, ours in (("pad_token_id", 0), ("eos_token_id", 1), ("decoder_start_token_id", 0)):
        if getattr(hf, key) != ours:
            raise hf.error(key, f"{key}={getattr(hf, key)} but our models use the T5 ids PAD=0 (decoder start), "
                                f"EOS=1")
    return hf


def json_field(raw: Mapping[str, Any], *, key: str, default: Any, kind: type, path: pathlib.Path, text: str) -> Any:
    """config.json's `key` (absent or null: `default`) checked to be a `kind` (int, float, bool or str); a value of
    another type is an error naming the file and line."""
    value = raw.get(key, default)
    if value is None:
        value = default
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise DataFormatError.at(path, json_line(text, key), f"{key} must be an integer, got {value!r}")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise DataFormatError.at(path, json_line(text, key), f"{key} must be a number, got {value!r}")
    if kind is bool and not isinstance(value, bool):
        raise DataFormatError.at(path, json_line(text, key), f"{key} must be true or false, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise DataFormatError.at(path, json_line(text, key), f"{key} must be a string, got {value!r}")
    return kind(value)


def json_line(text: str, key: str) -> int:
    """1-based line of the first `"key":` in a JSON text; 1 when absent."""
    match = re.search(r'"' + re.escape(key) + r'"\s*:', text)
    return text.count("\n", 0, match.start()) + 1 if match else 1


def check_config(*, hf: HFT5Config, config: network.T5Config) -> None:
    """Fails (naming config.json, the line and both values) on every dimension where `config` and `hf` differ."""
    if config.vocab_size is None:
        raise ValueError("T5Config.vocab_size is unset; set it (e.g. with config.with_vocab_size) before loading")
    pairs = (
        ("d_model", hf.d_model, "emb_dim", config.emb_dim),
        ("d_kv", hf.d_kv, "head_dim", config.head_dim),
        ("d_ff", hf.d_ff, "mlp_dim", config.mlp_dim),
        ("num_layers", hf.num_layers, "num_encoder_layers", config.num_encoder_layers),
        ("num_decoder_layers", hf.num_decoder_layers, "num_decoder_layers", config.num_decoder_layers),
        ("num_heads", hf.num_heads, "num_heads", config.num_heads),
        ("relative_attention_num_buckets", hf.relative_attention_num_buckets,
         "relative_attention_num_buckets", config.relative_attention_num_buckets),
        ("relative_attention_max_distance", hf.relative_attention_max_distance,
         "relative_attention_max_distance", config.relative_attention_max_distance),
        ("feed_forward_proj", hf.mlp_activations, "mlp_activations", tuple(config.mlp_activations)),
    )
    problems = [(key, f"{key}={theirs!r} but T5Config.{field}={ours!r}")
                for key, theirs, field, ours in pairs if theirs != ours]
    epsilon = network.RMSNorm.epsilon
    if not math.isclose(hf.layer_norm_epsilon, epsilon, rel_tol=1e-6):
        problems.append(("layer_norm_epsilon", f"layer_norm_epsilon={hf.layer_norm_epsilon} but our RMSNorm uses "
                                               f"{epsilon}"))
    if config.vocab_size < hf.vocab_size:
        problems.append(("vocab_size", f"vocab_size={hf.vocab_size} but T5Config.vocab_size={config.vocab_size} is "
                                       f"smaller; pretrained rows are never dropped: set T5Config.vocab_size >= "
                                       f"{hf.vocab_size}"))
    if problems:
        raise DataFormatError("; ".join(f"{hf.path}:{hf.line_of(key)}: {message}" for key, message in problems))


def t5_config_from_checkpoint(*, checkpoint_dir: PathLike, **overrides: Any) -> network.T5Config:
    """Our `T5Config` with the checkpoint's dimensions; `overrides` set the rest (dropout_rate, dtype, ...)."""
    return t5_config_from_hf(read_hf_config(checkpoint_dir), **overrides)


def t5_config_from_hf(hf: HFT5Config, **overrides: Any) -> network.T5Config:
    fields: dict[str, Any] = dict(vocab_size=hf.vocab_size, emb_dim=hf.d_model, num_heads=hf.num_heads,
                  num_encoder_layers=hf.num_layers, num_decoder_layers=hf.num_decoder_layers, head_dim=hf.d_kv,
                                  mlp_dim=hf.d_ff, mlp_activations=hf.mlp_activations,
                                  relative_attention_num_buckets=hf.relative_attention_num_buckets,
                                  relative_attention_max_distance=hf.relative_attention_max_distance)
    fields.update(overrides)
    return network.T5Config(**fields)


def pretrained_vocabulary(checkpoint_dir: PathLike) -> "seqio.SentencePieceVocabulary":
    """The checkpoint's SentencePiece model (`spiece.model`, T5 ids PAD=0 EOS=1 UNK=2, no sentinels).

    Use it as the dataset's vocabulary when fine-tuning from the checkpoint, with `T5Config.vocab_size` set to the
    checkpoint's `vocab_size` (32128 for T5: 32000 pieces, 100 unused sentinels, padding to a multiple of 128).
    """
    from gr_jax.vocabulary import load_vocabulary

    path = pathlib.Path(checkpoint_dir) / VOCABULARY_FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the checkpoint has no SentencePiece model; the published T5 ones ship "
                                f"{VOCABULARY_FILENAME} beside config.json")
    return load_vocabulary(path)


# ----------------------------------------------------------------------------------------------
# safetensors files
# ----------------------------------------------------------------------------------------------


class SafetensorsCheckpoint(contextlib.AbstractContextManager):
    """Tensor names -> memory-mapped safetensors files (one, or shards listed by an index); reads slices."""

    def __init__(self, checkpoint_dir: PathLike):
        directory = pathlib.Path(checkpoint_dir)
        self._stack = contextlib.ExitStack()
        self._files: dict[str, pathlib.Path] = {}
        self._handles: dict[str, Any] = {}
        index_path, single_path = directory / INDEX_FILENAME, directory / SINGLE_FILENAME
        try:
            if index_path.is_file():
                self._open_index(index_path)
            elif single_path.is_file():
                self._open_file(single_path, expected=None)
            else:
                found = sorted(p.name for p in directory.glob("*")) if directory.is_dir() else []
                hint = (" (only PyTorch/TF/Flax weights: convert them to safetensors first)"
                        if any(n.endswith((".bin", ".h5", ".msgpack")) for n in found) else "")
                raise FileNotFoundError(f"{directory}: neither {SINGLE_FILENAME} nor {INDEX_FILENAME} found{hint}; "
                                        f"directory holds {found}")
        except BaseException:
            self._stack.close()
            raise

    def _open_index(self, index_path: pathlib.Path) -> None:
        text = index_path.read_text(encoding="utf-8")
        try:
            index = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataFormatError.at(index_path, e.lineno, f"invalid JSON: {e.msg}") from None
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise DataFormatError.at(index_path, json_line(text, "weight_map"),
                                     "expected {\"weight_map\": {tensor name: file name, ...}}")
        by_file: dict[str, set[str]] = {}
        for name, filename in weight_map.items():
            by_file.setdefault(filename, set()).add(name)
        for filename, names in sorted(by_file.items()):
            path = index_path.parent / filename
            if pathlib.PurePath(filename).name != filename or not path.is_file():
                raise DataFormatError.at(index_path, json_line(text, next(iter(sorted(names)))),
                                         f"shard {filename!r} (holding e.g. {sorted(names)[0]!r}) is not a file "
                                         f"in {index_path.parent}")
            self._open_file(path, expected=names, index_path=index_path, index_text=text)

    def _open_file(self, path: pathlib.Path, *, expected: Optional[set[str]],
                   index_path: Optional[pathlib.Path] = None, index_text: str = "") -> None:
        try:
            handle = self._stack.enter_context(safe_open(str(path), framework="numpy"))
        except Exception as e:  # safetensors raises its own SafetensorError (or OSError) on a damaged header.
            raise DataFormatError(f"{path}: not a readable safetensors file: {e}") from e
        names = set(handle.keys())
        if expected is not None:
            if index_path is None:
                raise ValueError(f"{path}: the tensors expected of a shard come with the index naming them")
            absent = sorted(expected - names)
            if absent:
                raise DataFormatError.at(index_path, json_line(index_text, absent[0]),
                                         f"tensor {absent[0]!r} is mapped to {path.name}, which does not hold it")
            unlisted = sorted(names - expected)
            if unlisted:
                raise DataFormatError(f"{path}: holds tensor {unlisted[0]!r}, which {index_path.name} does not "
                                      f"map to this file")
        for name in names:
            if name in self._files:
                raise DataFormatError(f"{path}: tensor {name!r} is also in {self._files[name]}")
            self._files[name] = path
            self._handles[name] = handle

    def __exit__(self, *exc_info) -> None:
        self._stack.close()

    def close(self) -> None:
        self._stack.close()

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._files)

    def path(self, name: str) -> pathlib.Path:
        return self._files[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[name].get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        return self._handles[name].get_slice(name).get_dtype()

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """A slice of a tensor (the file is memory-mapped: only that part is read)."""
        return self._handles[name].get_slice(name)[index]


# ----------------------------------------------------------------------------------------------
# Mapping HF tensors onto our parameters
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TensorSource:
    """Where one of our parameters comes from: an HF tensor and how its [out, in] layout becomes ours.

    layout: 'copy' (same layout), 'transpose' (2-D, ours = hf.T), 'qkv' ([h*k, d] -> [d, h, k]), 'out'
    ([d, h*k] -> [h, k, d]) or 'heads' (a projection's bias, [h*k] -> [h, k]). `vocab_axis`: our axis indexing
    tokens, which holds the checkpoint's `pretrained_rows` rows from our row `first_row` on (a vocabulary whose ids
    are the checkpoint's shifted, `gr_jax.data.hf_tokenizer`); our rows outside them are fresh. `scale` multiplies
    the values (d_model**-0.5 for an output layer whose input HF scales).
    """
    name: str
    layout: str
    hf_shape: tuple[int, ...]
    shape: tuple[int, ...]
    vocab_axis: Optional[int] = None
    pretrained_rows: Optional[int] = None
    scale: float = 1.0
    first_row: int = 0

    def __post_init__(self) -> None:
        if (self.vocab_axis is None) != (self.pretrained_rows is None):
            raise ValueError(f"{self.name}: a vocabulary axis comes with its number of pretrained rows")
        if self.vocab_axis is not None and self.pretrained_rows is not None and not (
                0 <= self.first_row and self.first_row + self.pretrained_rows <= self.shape[self.vocab_axis]):
            raise ValueError(f"{self.name}: {self.pretrained_rows} pretrained rows from row {self.first_row} do not "
                             f"fit its {self.shape[self.vocab_axis]} rows")

    @property
    def fresh_rows(self) -> bool:
        """Whether some of our vocabulary rows are not the checkpoint's (they come from the fresh parameters)."""
        return (self.vocab_axis is not None and self.pretrained_rows is not None
                and self.shape[self.vocab_axis] > self.pretrained_rows)


def _attention_sources(prefix: str, hf_prefix: str, hf: HFT5Config) -> dict[str, TensorSource]:
    d, h, k = hf.d_model, hf.num_heads, hf.d_kv
    sources = {f"{prefix}/{ours}": TensorSource(f"{hf_prefix}.{theirs}.weight", "qkv", (h * k, d), (d, h, k))
               for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v"))}
    sources[f"{prefix}/out"] = TensorSource(f"{hf_prefix}.o.weight", "out", (d, h * k), (h, k, d))
    return sources


def _mlp_sources(prefix: str, hf_prefix: str, hf: HFT5Config) -> dict[str, TensorSource]:
    d, f = hf.d_model, hf.d_ff
    inputs = ("wi_0", "wi_1") if hf.gated else ("wi",)
    sources = {f"{prefix}/wi_{i}": TensorSource(f"{hf_prefix}.{name}.weight", "transpose", (f, d), (d, f))
               for i, name in enumerate(inputs)}
    sources[f"{prefix}/wo"] = TensorSource(f"{hf_prefix}.wo.weight", "transpose", (d, f), (f, d))
    return sources


def _norm_source(name: str, hf: HFT5Config) -> TensorSource:
    return TensorSource(name, "copy", (hf.d_model,), (hf.d_model,))


def hf_tensor_sources(*, hf: HFT5Config, config: network.T5Config) -> dict[str, TensorSource]:
    """Our parameter path ('encoder_layers_0/attention/query') -> its HF tensor, for the T5.1.1 trunk (embedding,
    encoder, decoder); the output layer is the head's (`lm_head_source`)."""
    d, h, b, v = hf.d_model, hf.num_heads, hf.relative_attention_num_buckets, hf.vocab_size
    sources = {
        "token_embedder": TensorSource(_SHARED, "copy", (v, d), (_vocab_size(config), d), vocab_axis=0,
                                       pretrained_rows=v),
        "encoder_relpos/rel_embedding": TensorSource(
            "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", "transpose", (b, h), (h, b)),
        "decoder_relpos/rel_embedding": TensorSource(
            "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", "transpose", (b, h), (h, b)),
        "encoder_norm/scale": _norm_source("encoder.final_layer_norm.weight", hf),
        "decoder_norm/scale": _norm_source("decoder.final_layer_norm.weight", hf),
    }
    for i in range(hf.num_layers):
        ours, theirs = f"encoder_layers_{i}", f"encoder.block.{i}.layer"
        sources.update(_attention_sources(f"{ours}/attention", f"{theirs}.0.SelfAttention", hf))
        sources[f"{ours}/pre_attention_norm/scale"] = _norm_source(f"{theirs}.0.layer_norm.weight", hf)
        sources.update(_mlp_sources(f"{ours}/mlp", f"{theirs}.1.DenseReluDense", hf))
        sources[f"{ours}/pre_mlp_norm/scale"] = _norm_source(f"{theirs}.1.layer_norm.weight", hf)
    for i in range(hf.num_decoder_layers):
        ours, theirs = f"decoder_layers_{i}", f"decoder.block.{i}.layer"
        sources.update(_attention_sources(f"{ours}/self_attention", f"{theirs}.0.SelfAttention", hf))
        sources[f"{ours}/pre_self_attention_norm/scale"] = _norm_source(f"{theirs}.0.layer_norm.weight", hf)
        sources.update(_attention_sources(f"{ours}/encoder_decoder_attention", f"{theirs}.1.EncDecAttention", hf))
        sources[f"{ours}/pre_cross_attention_norm/scale"] = _norm_source(f"{theirs}.1.layer_norm.weight", hf)
        sources.update(_mlp_sources(f"{ours}/mlp", f"{theirs}.2.DenseReluDense", hf))
        sources[f"{ours}/pre_mlp_norm/scale"] = _norm_source(f"{theirs}.2.layer_norm.weight", hf)
    return sources


def lm_head_source(*, hf: HFT5Config, config: network.T5Config) -> TensorSource:
    """The HF tensor of T5's output layer, as the parameter [embed, config.vocab_size] that a head names to take it
    (`OutputHead.lm_head_parameter`; the standard head's `logits_dense`)."""
    d, v = hf.d_model, hf.vocab_size
    # Tied: `shared`, or a 5.x checkpoint's own `lm_head` where saved (load_pretrained_params). HF multiplies the
    # decoder output by d_model**-0.5 before the projection where `scale_decoder_outputs`; folded into the kernel.
    return TensorSource(_SHARED if hf.tie_word_embeddings else _LM_HEAD, "transpose", (v, d), (d, _vocab_size(config)),
                        vocab_axis=1, pretrained_rows=v, scale=d ** -0.5 if hf.scale_decoder_outputs else 1.0)


def _vocab_size(config: network.T5Config) -> int:
    if config.vocab_size is None:
        raise ValueError("T5Config.vocab_size is unset; set it (e.g. with config.with_vocab_size) before loading")
    return config.vocab_size


def _expected_tensors(hf: HFT5Config) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint with this config.json may hold -> its shape (whether our tree uses it or not)."""
    expected = {s.name: s.hf_shape for s in hf_tensor_sources(hf=hf, config=t5_config_from_hf(hf)).values()}
    for name in _TIED_COPIES + (_LM_HEAD,):
        expected[name] = (hf.vocab_size, hf.d_model)
    return expected


def _check_tensors(ckpt: SafetensorsCheckpoint, hf: HFT5Config, needed: Mapping[str, str],
                   expected: Mapping[str, tuple[int, ...]]) -> None:
    """Missing (naming the parameter that needs it), unexpected, non-float and wrongly shaped tensors."""
    present = ckpt.names
    missing = sorted(set(needed) - present)
    if missing:
        listing = ", ".join(f"{name!r} (for params[{needed[name]!r}])" for name in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        files = sorted({str(ckpt.path(n)) for n in present})
        raise DataFormatError(f"{files[0] if len(files) == 1 else hf.path.parent}: missing tensor(s) {listing}{more}")
    unexpected = sorted(present - set(expected))
    if unexpected:
        raise DataFormatError(
            f"{ckpt.path(unexpected[0])}: unexpected tensor(s) {unexpected[:5]}"
            f"{f' and {len(unexpected) - 5} more' if len(unexpected) > 5 else ''}: not part of a T5 checkpoint with "
            f"{hf.num_layers} encoder / {hf.num_decoder_layers} decoder blocks and feed_forward_proj="
            f"{hf.feed_forward_proj!r} ({hf.path})")
    for name in sorted(present):
        if ckpt.dtype(name) not in _FLOAT_DTYPES:
            raise DataFormatError(f"{ckpt.path(name)}: tensor {name!r} has dtype {ckpt.dtype(name)}; expected one "
                                  f"of {_FLOAT_DTYPES}")
        if ckpt.shape(name) != expected[name]:
            raise DataFormatError(f"{ckpt.path(name)}: tensor {name!r} has shape {list(ckpt.shape(name))}, expected "
                                  f"{list(expected[name])} from {hf.path.name} (d_model={hf.d_model}, "
                                  f"num_heads={hf.num_heads}, d_kv={hf.d_kv}, d_ff={hf.d_ff}, "
                                  f"vocab_size={hf.vocab_size})")


def _check_tied_copies(ckpt: SafetensorsCheckpoint, *, embedding: str, copies: Sequence[str],
                       rows_per_block: int = 4096) -> None:
    """Saved tied copies (`encoder/decoder.embed_tokens.weight`, a tied `lm_head`) must equal the embedding.

    Compared in blocks of rows, so host memory stays at a few blocks even for mT5's 250k-row vocabulary.
    """
    if not copies:
        return
    rows = ckpt.shape(embedding)[0]
    for start in range(0, rows, rows_per_block):
        block = (slice(start, min(start + rows_per_block, rows)), slice(None))
        reference = ckpt.read(embedding, block)
        for name in copies:
            if not np.array_equal(ckpt.read(name, block), reference):
                raise DataFormatError(f"{ckpt.path(name)}: tensor {name!r} differs from {embedding!r} "
                                      f"({ckpt.path(embedding)}), but T5 ties them and our network has one copy")


# ----------------------------------------------------------------------------------------------
# Building sharded parameters
# ----------------------------------------------------------------------------------------------


def _read_block(ckpt: SafetensorsCheckpoint, source: TensorSource, bounds: Sequence[tuple[int, int]]) -> np.ndarray:
    """The block `bounds` (per our axis, [start, stop)) of the parameter, in our layout, from the HF tensor."""
    s = [slice(a, b) for a, b in bounds]
    if source.layout == "copy":
        return ckpt.read(source.name, tuple(s))
    if source.layout == "transpose":
        return ckpt.read(source.name, (s[1], s[0])).T
    if source.layout == "heads":  # hf [h*k] -> ours [h, k].
        (h0, h1), _ = bounds
        k = source.shape[1]
        return ckpt.read(source.name, (slice(h0 * k, h1 * k),)).reshape(h1 - h0, k)[:, s[1]]
    k = source.shape[2] if source.layout == "qkv" else source.shape[1]
    if source.layout == "qkv":  # hf [h*k, d] -> ours [d, h, k]; rows h*k are heads-major.
        (d0, d1), (h0, h1), _ = bounds
        raw = ckpt.read(source.name, (slice(h0 * k, h1 * k), s[0]))
        return raw.reshape(h1 - h0, k, d1 - d0)[:, s[2], :].transpose(2, 0, 1)
    if source.layout == "out":  # hf [d, h*k] -> ours [h, k, d].
        (h0, h1), _, (d0, d1) = bounds
        raw = ckpt.read(source.name, (s[2], slice(h0 * k, h1 * k)))
        return raw.reshape(d1 - d0, h1 - h0, k)[:, :, s[1]].transpose(1, 2, 0)
    raise ValueError(f"unknown layout {source.layout!r}")


def _host_slice_fn(ckpt: SafetensorsCheckpoint, source: TensorSource, dtype: np.dtype
                   ) -> Callable[[Optional[tuple[slice, ...]]], np.ndarray]:
    """The `make_array_from_callback` callback: one device's index -> that block, zeros beyond pretrained rows.

    Devices that hold the same index (replication over a mesh axis) share one read and one host buffer.
    """
    cache: dict[tuple[tuple[int, int], ...], np.ndarray] = {}

    def host_slice(index: Optional[tuple[slice, ...]]) -> np.ndarray:
        if index is None:  # jax's type of the callback allows it; jax passes a device's index
            raise ValueError(f"{source.name}: no device index to read")
        bounds = []
        for axis, (sl, size) in enumerate(zip(index, source.shape)):
            start, stop, step = sl.indices(size)
            if step != 1:
                raise ValueError(f"{source.name}: strided device index {index} along axis {axis}")
            bounds.append((start, stop))
        key = tuple(bounds)
        if key not in cache:
            out_shape = tuple(b - a for a, b in bounds)
            read = list(bounds)  # in the checkpoint's rows along the vocabulary axis
            placed = [slice(0, b - a) for a, b in bounds]  # where the read block sits in this device's block
            if source.vocab_axis is not None and source.pretrained_rows is not None:  # both or neither
                a, b = read[source.vocab_axis]
                first, rows = source.first_row, source.pretrained_rows
                start = max(a, first)
                stop = max(start, min(b, first + rows))
                read[source.vocab_axis] = (start - first, stop - first)
                placed[source.vocab_axis] = slice(start - a, stop - a)
            read_shape = tuple(b - a for a, b in read)
            if 0 in read_shape:
                block = np.zeros(out_shape, dtype)
            else:
                block = _read_block(ckpt, source, read)
                if source.scale != 1.0:
                    block = block.astype(np.float32) * np.float32(source.scale)
                block = np.ascontiguousarray(block, dtype=dtype)
                if read_shape != out_shape:  # Rows outside the pretrained ones: filled from fresh_params.
                    padded = np.zeros(out_shape, dtype)
                    padded[tuple(placed)] = block
                    block = padded
            cache[key] = block
        return cache[key]

    return host_slice


def sharded_tensor(ckpt: SafetensorsCheckpoint, source: TensorSource, *, sharding: Sharding,
                   dtype: Any) -> jax.Array:
    """One parameter in our layout on `sharding`, each device reading only its own block of the HF tensor."""
    dtype = np.dtype(dtype)
    return jax.make_array_from_callback(source.shape, sharding, _host_slice_fn(ckpt, source, dtype), dtype=dtype)


def fresh_value(path: str, fresh: Any, sharding: Sharding) -> jax.Array:
    """`fresh` (an initialised parameter) on `sharding`; a shape alone (`jax.ShapeDtypeStruct`) is an error naming
    `path`: the parameter has rows or entries no checkpoint gives."""
    if isinstance(fresh, jax.ShapeDtypeStruct):
        raise ValueError(f"params[{path!r}] has no pretrained value and fresh_params holds only its shape; pass "
                         f"initialised fresh_params (e.g. Trainer.init_state(rng).params)")
    return jax.device_put(fresh, sharding)


def mix_vocabulary_rows(*, source: Any, fresh: Any, axis: int, rows: int, sharding: Sharding,
                        first: int = 0) -> jax.Array:
    """The `rows` entries from `first` on along `axis` from `source`, the rest from `fresh`, in `fresh`'s dtype on
    `sharding`.

    Why: a run with more tokens than its starting point (docid tokens appended after the word pieces, or new ids
    before a checkpoint's shifted ones) keeps the trained rows and takes the new ones from its own initialisation.
    `fresh` has the result's shape; `source` may be just as large (entries outside the rows ignored) or end with
    the trained rows; other axes must be equal.
    """
    source_shape, fresh_shape = tuple(source.shape), tuple(fresh.shape)
    if (len(source_shape) != len(fresh_shape) or not 0 <= axis < len(fresh_shape) or first < 0
            or not first + rows <= min(source_shape[axis], fresh_shape[axis])
            or any(a != b for i, (a, b) in enumerate(zip(source_shape, fresh_shape)) if i != axis)):
        raise ValueError(f"cannot take {rows} rows from {first} along axis {axis} of a {source_shape} array into a "
                         f"{fresh_shape} one: only the vocabulary axis may differ, and both must hold the rows")
    kept = (slice(None),) * axis + (slice(first, first + rows),)

    def mix(source, fresh):
        return fresh.at[kept].set(source[kept].astype(fresh.dtype))

    return jax.jit(mix, out_shardings=sharding)(source, fresh)


def with_fresh_rows(value: jax.Array, *, source: TensorSource, fresh: Any, sharding: Sharding) -> jax.Array:
    """`value` (`sharded_tensor` of `source`, zeros outside the checkpoint's rows) with those rows from `fresh`."""
    if source.vocab_axis is None or source.pretrained_rows is None:
        raise ValueError(f"{source.name} has no vocabulary axis")
    return mix_vocabulary_rows(source=value, fresh=fresh, axis=source.vocab_axis, rows=source.pretrained_rows,
                               first=source.first_row, sharding=sharding)


def load_pretrained_params(*, checkpoint_dir: PathLike, config: network.T5Config, fresh_params: Any,
                           shardings: Any, head: Optional[OutputHead] = None, fresh_patterns: Sequence[str] = (),
                           encoder_only: bool = False) -> Any:
    """Our parameter tree filled from a Hugging Face T5 checkpoint, each leaf on its `shardings` entry.

    checkpoint_dir: `config.json` + `model.safetensors`, or `model.safetensors.index.json` + its shards.
    config: our network's config; its dimensions must equal config.json's (each difference is reported).
    head: the network's output head (`gr_jax.heads.OutputHead`): which of its parameters T5's `lm_head` fills
      (`lm_head_parameter`) and which start fresh (`fresh_param_patterns`); needed unless `encoder_only`.
    fresh_params: the model's initialised params (boxed or not), with the structure of the result; the source of
      vocabulary rows beyond the checkpoint's, of a separate output layer (atomic docid head) and of parameters
      matched by `fresh_patterns`. Leaves that are fully pretrained may be `jax.ShapeDtypeStruct`s (e.g.
      `Trainer.abstract_state.params`), which avoids holding a second copy of a large model on the devices.
    shardings: `NamedSharding` per leaf (e.g. `Trainer.state_shardings.params` or `partitioning.logical_shardings`
      of the boxed abstract params).
    fresh_patterns: regular expressions (full match) over '/'-joined parameter paths to take from `fresh_params`
      instead of the checkpoint, besides the head's own (`OutputHead.fresh_param_patterns`). A parameter neither
      mapped nor matched is an error.
    encoder_only: `fresh_params` is the encoder alone (a dual encoder's T5 tower, `gr_jax.dense.towers`): the
      checkpoint's decoder and output layer are not loaded.

    With `config.scan_layers` (and `fresh_params` / `shardings` in the scanned layout) the unscanned tree is loaded
    (HF has one block per layer) and its layers stacked onto `shardings` (`gr_jax.layer_layout`): the devices hold
    the stacks' parameters twice while they are stacked.
    """
    if encoder_only:
        head = None
    elif head is None:
        raise ValueError("load_pretrained_params needs the network's output head (head=..., e.g. "
                         "gr_jax.heads.StandardHead()) unless encoder_only")
    if config.scan_layers:
        unscanned = dataclasses.replace(config, scan_layers=False)
        params = load_pretrained_params(
            checkpoint_dir=checkpoint_dir, config=unscanned, head=head, fresh_patterns=fresh_patterns,
            encoder_only=encoder_only,
            fresh_params=layer_layout.unstack_layers(partitioning.strip_boxes(fresh_params), config=config, head=head),
            shardings=layer_layout.unstack_layers(shardings, config=config, head=head))
        return jax.jit(functools.partial(layer_layout.stack_layers, config=config, head=head),
                       out_shardings=shardings)(params)
    hf = read_hf_config(checkpoint_dir)
    check_config(hf=hf, config=config)
    sources = hf_tensor_sources(hf=hf, config=config)
    if encoder_only:
        sources = {path: source for path, source in sources.items() if not path.startswith("decoder_")}
    output_layer = None if head is None else head.lm_head_parameter(config)
    if output_layer is not None:
        sources[output_layer] = lm_head_source(hf=hf, config=config)
    head_patterns = () if head is None else head.fresh_param_patterns(config)
    patterns = [re.compile(p) for p in (*head_patterns, *fresh_patterns)]

    params = partitioning.strip_boxes(fresh_params)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    sharding_leaves, sharding_treedef = jax.tree_util.tree_flatten(
        shardings, is_leaf=lambda x: isinstance(x, Sharding))
    # jaxlib ships no stub of its PyTreeDef, which mypy then cannot compare: hence the ignore.
    if sharding_treedef != treedef:  # type: ignore[operator]
        raise ValueError(f"shardings do not have the structure of fresh_params:\n{sharding_treedef}\nvs\n{treedef}")
    paths = [partitioning.path_str(p) for p, _ in leaves]
    plan: dict[str, Optional[TensorSource]] = {}  # None: fresh
    unknown = []
    for path, (_, leaf) in zip(paths, leaves):
        if any(p.fullmatch(path) for p in patterns):
            plan[path] = None
        elif path in sources:
            plan[path] = sources[path]
            if tuple(leaf.shape) != sources[path].shape:
                raise ValueError(f"params[{path!r}] has shape {tuple(leaf.shape)} but {hf.path} implies "
                                 f"{sources[path].shape} (from {sources[path].name!r})")
        else:
            unknown.append(path)
    if unknown:
        raise ValueError(f"{len(unknown)} parameter(s) have no tensor in a T5 checkpoint: {unknown[:8]}"
                         f"{' ...' if len(unknown) > 8 else ''}; initialise them fresh with fresh_patterns "
                         f"(regular expressions over these paths)")
    our_paths = set(paths)
    orphaned = sorted(p for p in sources if p not in our_paths)
    if orphaned:
        raise ValueError(f"the checkpoint's {sources[orphaned[0]].name!r} maps to params[{orphaned[0]!r}], which "
                         f"the model does not have ({len(orphaned)} such): the network's parameter names differ "
                         f"from the standard T5.1.1 ones")

    with SafetensorsCheckpoint(checkpoint_dir) as ckpt:
        names = ckpt.names
        output = plan.get(output_layer) if output_layer is not None else None
        if (output_layer is not None and output is not None and output.name == _SHARED and _LM_HEAD in names
                and not hf.lm_head_is_tied_copy):
            # Saved by transformers 5.x, whose `tie_word_embeddings` is always true: a saved lm_head is the output
            # layer (T5.1.1's own), which 5.x also leaves untied where it differs from shared.
            plan[output_layer] = dataclasses.replace(output, name=_LM_HEAD)
        # The tied embedding may have been saved under one of its other names only (safetensors keeps one).
        tied_names = [n for n in (_SHARED,) + _TIED_COPIES + ((_LM_HEAD,) if hf.lm_head_is_tied_copy else ())
                      if n in names]
        embedding = tied_names[0] if tied_names and tied_names[0] != _LM_HEAD else _SHARED
        plan = {p: (dataclasses.replace(s, name=embedding) if s is not None and s.name == _SHARED else s)
                for p, s in plan.items()}
        needed = {s.name: path for path, s in plan.items() if s is not None}
        _check_tensors(ckpt, hf, needed, _expected_tensors(hf))
        if embedding in names:
            _check_tied_copies(ckpt, embedding=embedding, copies=[n for n in tied_names if n != embedding])

        out = []
        counts = {"pretrained": 0, "fresh": 0, "mixed": 0}
        for path, (_, leaf), sharding in zip(paths, leaves, sharding_leaves):
            source = plan[path]
            if source is None:
                out.append(fresh_value(path, leaf, sharding))
                counts["fresh"] += 1
                continue
            value = sharded_tensor(ckpt, source, sharding=sharding, dtype=leaf.dtype)
            if source.fresh_rows:
                value = with_fresh_rows(value, source=source, fresh=fresh_value(path, leaf, sharding),
                                        sharding=sharding)
                counts["mixed"] += 1
            else:
                counts["pretrained"] += 1
            out.append(value)
    used = {s.name for s in plan.values() if s is not None}
    unused = sorted(n for n in names if n not in used and n not in tied_names)
    logger.info("loaded %s: %d parameters pretrained, %d with fresh vocabulary rows beyond %d, %d fresh (%s); "
                "unused tensors: %s", checkpoint_dir, counts["pretrained"], counts["mixed"], hf.vocab_size,
                counts["fresh"], [p for p in paths if plan[p] is None], unused)
    return jax.tree_util.tree_unflatten(treedef, out)
