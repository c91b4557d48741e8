"""gr_jax.pretrained: Hugging Face T5 safetensors checkpoints -> our sharded params, checked against numpy T5.

Each test writes a small checkpoint in exactly the published layout (tensor names, [out, in] shapes, tied
`embed_tokens` copies, config.json keys of google/t5-v1_1-*), with scaled-down dimensions chosen so that every
transposition or head/kv reshaping mistake changes shapes or values (d_model 16 != heads * d_kv 24, and 2 of the
8 heads on each of the 4 'model' shards).
The reference is a plain numpy T5 written from transformers' modeling_t5.py, fed with the HF-named tensors.
"""
import functools
import json
import math
import pathlib
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import sentencepiece as spm
from safetensors.numpy import load_file, save_file

from gr_jax import network
from gr_jax import optimizers
from gr_jax import partitioning
from gr_jax import pretrained
from gr_jax import warm_start
from gr_jax.data.readers import DataFormatError
from gr_jax.heads import AtomicHead, PawaHead, StandardHead
from gr_jax.models import EncoderDecoderModel
from gr_jax.partitioning import path_str, strip_boxes
from gr_jax.trainer import Trainer

D_MODEL, D_KV, HEADS, D_FF, ENC_LAYERS, DEC_LAYERS, VOCAB = 16, 3, 8, 32, 2, 3, 128
STANDARD = StandardHead()  # T5.1.1's output layer, which lm_head fills
# Lengths beyond the exact buckets (8 bidirectional, 16 causal) exercise the log-spaced relative buckets.
ENC_LEN, DEC_LEN = 40, 24


def hf_config(**overrides) -> dict:
    """config.json as published for google/t5-v1_1-*, scaled down."""
    config = {
        "architectures": ["T5ForConditionalGeneration"], "d_ff": D_FF, "d_kv": D_KV, "d_model": D_MODEL,
        "decoder_start_token_id": 0, "dropout_rate": 0.1, "eos_token_id": 1, "feed_forward_proj": "gated-gelu",
        "initializer_factor": 1.0, "is_encoder_decoder": True, "layer_norm_epsilon": 1e-06, "model_type": "t5",
        "num_decoder_layers": DEC_LAYERS, "num_heads": HEADS, "num_layers": ENC_LAYERS, "output_past": True,
        "pad_token_id": 0, "relative_attention_max_distance": 128, "relative_attention_num_buckets": 32,
        "tie_word_embeddings": False, "vocab_size": VOCAB,
    }
    config.update(overrides)
    return config


def our_config(**overrides) -> network.T5Config:
    fields = dict(vocab_size=VOCAB, emb_dim=D_MODEL, num_heads=HEADS, num_encoder_layers=ENC_LAYERS,
                  num_decoder_layers=DEC_LAYERS, head_dim=D_KV, mlp_dim=D_FF, dropout_rate=0.0)
    fields.update(overrides)
    return network.T5Config(**fields)


def hf_weights(seed: int = 0, *, gated: bool = True, tied: bool = False, tied_copies: bool = True,
               enc_layers: int = ENC_LAYERS, dec_layers: int = DEC_LAYERS) -> dict:
    """Random HF-named tensors with T5's shapes ([out, in] linears) and Mesh-TF-like scales."""
    rng = np.random.default_rng(seed)
    inner = HEADS * D_KV

    def normal(*shape, std=1.0):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm():
        return (1.0 + 0.2 * rng.standard_normal(D_MODEL)).astype(np.float32)

    def attention(prefix):
        return {f"{prefix}.q.weight": normal(inner, D_MODEL, std=(D_MODEL * D_KV) ** -0.5),
                f"{prefix}.k.weight": normal(inner, D_MODEL, std=D_MODEL ** -0.5),
                f"{prefix}.v.weight": normal(inner, D_MODEL, std=D_MODEL ** -0.5),
                f"{prefix}.o.weight": normal(D_MODEL, inner, std=inner ** -0.5)}

    def mlp(prefix):
        wi = ({f"{prefix}.wi_0.weight": normal(D_FF, D_MODEL, std=D_MODEL ** -0.5),
               f"{prefix}.wi_1.weight": normal(D_FF, D_MODEL, std=D_MODEL ** -0.5)} if gated else
              {f"{prefix}.wi.weight": normal(D_FF, D_MODEL, std=D_MODEL ** -0.5)})
        return {**wi, f"{prefix}.wo.weight": normal(D_MODEL, D_FF, std=D_FF ** -0.5)}

    w = {"shared.weight": normal(VOCAB, D_MODEL)}
    for stack, layers in (("encoder", enc_layers), ("decoder", dec_layers)):
        w[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = normal(32, HEADS)
        for i in range(layers):
            p = f"{stack}.block.{i}.layer"
            w.update(attention(f"{p}.0.SelfAttention"))
            w[f"{p}.0.layer_norm.weight"] = norm()
            if stack == "decoder":
                w.update(attention(f"{p}.1.EncDecAttention"))
                w[f"{p}.1.layer_norm.weight"] = norm()
            ff = 2 if stack == "decoder" else 1
            w.update(mlp(f"{p}.{ff}.DenseReluDense"))
            w[f"{p}.{ff}.layer_norm.weight"] = norm()
        w[f"{stack}.final_layer_norm.weight"] = norm()
    if tied_copies:
        w["encoder.embed_tokens.weight"] = w["shared.weight"].copy()
        w["decoder.embed_tokens.weight"] = w["shared.weight"].copy()
    if not tied:
        w["lm_head.weight"] = normal(VOCAB, D_MODEL, std=D_MODEL ** -0.5)
    return w


def write_checkpoint(directory: pathlib.Path, weights: dict, config: dict, *, num_shards: int = 0,
                     dtype=np.float32) -> pathlib.Path:
    """`model.safetensors`, or `model-0000i-of-0000n.safetensors` + `model.safetensors.index.json` (HF's layout)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    weights = {k: v.astype(dtype) for k, v in weights.items()}
    if not num_shards:
        save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return directory
    names = sorted(weights)
    weight_map = {}
    for i in range(num_shards):
        filename = f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors"
        part = {n: weights[n] for n in names[i::num_shards]}
        save_file(part, str(directory / filename), metadata={"format": "pt"})
        weight_map.update({n: filename for n in part})
    index = {"metadata": {"total_size": int(sum(v.nbytes for v in weights.values()))}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
    return directory


# ----------------------------------------------------------------------------------------------
# numpy reference (transformers' modeling_t5.py, float64 except the float32 bucket arithmetic)
# ----------------------------------------------------------------------------------------------


def ref_relative_bucket(relative_position, *, bidirectional, num_buckets=32, max_distance=128):
    buckets = np.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0) * num_buckets
        n = np.abs(relative_position)
    else:
        n = -np.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    large = max_exact + (np.log(np.maximum(n, 1).astype(np.float32) / np.float32(max_exact))
                         / np.float32(math.log(max_distance / max_exact))
                         * np.float32(num_buckets - max_exact)).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(n < max_exact, n, large)


def ref_logits(w: dict, config: dict, encoder_tokens: np.ndarray, decoder_tokens: np.ndarray, *,
               output: str | None = None, scale: bool | None = None) -> np.ndarray:
    """output: the tensor projecting onto the vocabulary; scale: whether the decoder output is multiplied by
    d_model**-0.5 first. Both default to transformers 4.x's reading of `tie_word_embeddings` (shared and scaled
    iff tied)."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    eps = config["layer_norm_epsilon"]

    def rms_norm(x, name):
        return w[name] * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)

    def attention(prefix, x_q, x_kv, bias, mask):
        b, lq, lk = x_q.shape[0], x_q.shape[1], x_kv.shape[1]
        q = (x_q @ w[f"{prefix}.q.weight"].T).reshape(b, lq, HEADS, D_KV)
        k = (x_kv @ w[f"{prefix}.k.weight"].T).reshape(b, lk, HEADS, D_KV)
        v = (x_kv @ w[f"{prefix}.v.weight"].T).reshape(b, lk, HEADS, D_KV)
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) + bias  # No 1/sqrt(d_kv).
        scores = np.where(mask, scores, -np.inf)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        out = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, lq, HEADS * D_KV)
        return out @ w[f"{prefix}.o.weight"].T

    def feed_forward(prefix, x):
        if config["feed_forward_proj"] == "gated-gelu":
            h = x @ w[f"{prefix}.wi_0.weight"].T
            gelu = 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))  # gelu_new
            hidden = gelu * (x @ w[f"{prefix}.wi_1.weight"].T)
        else:
            hidden = np.maximum(x @ w[f"{prefix}.wi.weight"].T, 0.0)
        return hidden @ w[f"{prefix}.wo.weight"].T

    def position_bias(name, length, bidirectional):
        rel = np.arange(length)[None, :] - np.arange(length)[:, None]  # memory - query
        buckets = ref_relative_bucket(rel, bidirectional=bidirectional,
                                      num_buckets=config["relative_attention_num_buckets"],
                                      max_distance=config["relative_attention_max_distance"])
        return w[name][buckets].transpose(2, 0, 1)[None]  # [1, heads, q, k]

    enc_mask = (encoder_tokens > 0)[:, None, None, :]
    x = w["shared.weight"][encoder_tokens]
    bias = position_bias("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                         encoder_tokens.shape[1], True)
    for i in range(config["num_layers"]):
        p = f"encoder.block.{i}.layer"
        h = rms_norm(x, f"{p}.0.layer_norm.weight")
        x = x + attention(f"{p}.0.SelfAttention", h, h, bias, enc_mask)
        x = x + feed_forward(f"{p}.1.DenseReluDense", rms_norm(x, f"{p}.1.layer_norm.weight"))
    encoded = rms_norm(x, "encoder.final_layer_norm.weight")

    length = decoder_tokens.shape[1]
    causal = np.tril(np.ones((length, length), bool))[None, None]
    bias = position_bias("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", length, False)
    y = w["shared.weight"][decoder_tokens]
    for i in range(config["num_decoder_layers"]):
        p = f"decoder.block.{i}.layer"
        h = rms_norm(y, f"{p}.0.layer_norm.weight")
        y = y + attention(f"{p}.0.SelfAttention", h, h, bias, causal)
        h = rms_norm(y, f"{p}.1.layer_norm.weight")
        y = y + attention(f"{p}.1.EncDecAttention", h, encoded, 0.0, enc_mask)
        y = y + feed_forward(f"{p}.2.DenseReluDense", rms_norm(y, f"{p}.2.layer_norm.weight"))
    y = rms_norm(y, "decoder.final_layer_norm.weight")
    tied = config["tie_word_embeddings"]
    output = output or ("shared.weight" if tied else "lm_head.weight")
    scale = tied if scale is None else scale
    if scale:
        y = y * config["d_model"] ** -0.5
    return y @ w[output].T


def expected_params(w: dict, *, gated: bool = True, tied: bool = False) -> dict:
    """Our tree from the HF tensors, written out by hand, path -> array (the loader's spec)."""
    def qkv(name):
        return w[name].T.reshape(D_MODEL, HEADS, D_KV)

    def attention(prefix):
        return {"query": qkv(f"{prefix}.q.weight"), "key": qkv(f"{prefix}.k.weight"),
                "value": qkv(f"{prefix}.v.weight"), "out": w[f"{prefix}.o.weight"].T.reshape(HEADS, D_KV, D_MODEL)}

    def mlp(prefix):
        wi = ({"wi_0": w[f"{prefix}.wi_0.weight"].T, "wi_1": w[f"{prefix}.wi_1.weight"].T} if gated else
              {"wi_0": w[f"{prefix}.wi.weight"].T})
        return {**wi, "wo": w[f"{prefix}.wo.weight"].T}

    relpos = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    out = {"token_embedder": w["shared.weight"],
           "logits_dense": (w["shared.weight"].T * D_MODEL ** -0.5) if tied else w["lm_head.weight"].T,
           "encoder_relpos": {"rel_embedding": w[f"encoder.{relpos}"].T},
           "decoder_relpos": {"rel_embedding": w[f"decoder.{relpos}"].T},
           "encoder_norm": {"scale": w["encoder.final_layer_norm.weight"]},
           "decoder_norm": {"scale": w["decoder.final_layer_norm.weight"]}}
    for i in range(ENC_LAYERS):
        p = f"encoder.block.{i}.layer"
        out[f"encoder_layers_{i}"] = {
            "attention": attention(f"{p}.0.SelfAttention"), "mlp": mlp(f"{p}.1.DenseReluDense"),
            "pre_attention_norm": {"scale": w[f"{p}.0.layer_norm.weight"]},
            "pre_mlp_norm": {"scale": w[f"{p}.1.layer_norm.weight"]}}
    for i in range(DEC_LAYERS):
        p = f"decoder.block.{i}.layer"
        out[f"decoder_layers_{i}"] = {
            "self_attention": attention(f"{p}.0.SelfAttention"),
            "encoder_decoder_attention": attention(f"{p}.1.EncDecAttention"), "mlp": mlp(f"{p}.2.DenseReluDense"),
            "pre_self_attention_norm": {"scale": w[f"{p}.0.layer_norm.weight"]},
            "pre_cross_attention_norm": {"scale": w[f"{p}.1.layer_norm.weight"]},
            "pre_mlp_norm": {"scale": w[f"{p}.2.layer_norm.weight"]}}
    return out


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mesh():
    return partitioning.make_mesh(data=2, model=4)


@functools.lru_cache(maxsize=None)
def abstract_params(config, head=STANDARD):
    """The model's params as shapes, boxed with logical axis names (enough where nothing fresh is needed)."""
    model = EncoderDecoderModel(config=config, head=head)
    return jax.eval_shape(lambda rng: model.init(rng, input_length=8, target_length=4)["params"],
                          jax.random.PRNGKey(1))


def fresh_and_shardings(config, mesh, *, concrete=False, head=STANDARD):
    """(fresh_params, shardings) of `config` with `head`. Concrete fresh values are distinct random numbers in the
    boxed tree (the loader only copies them; the real model initialisation is exercised by the Trainer test)."""
    fresh = abstract_params(config, head)
    if concrete:
        rng = np.random.default_rng(99)
        fresh = jax.tree.map(lambda a: jnp.asarray(rng.standard_normal(a.shape), a.dtype), fresh)
    return fresh, partitioning.logical_shardings(fresh, mesh=mesh)


def tokens(rng, *, batch, length, vocab, start_with_pad=False, padding=0):
    t = rng.integers(3, vocab, size=(batch, length)).astype(np.int32)
    if start_with_pad:
        t[:, 0] = 0
    if padding:
        t[-1, -padding:] = 0
    return t


def leaves_by_path(tree):
    return {path_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


# ----------------------------------------------------------------------------------------------
# Numerics against the numpy reference
# ----------------------------------------------------------------------------------------------


def loaded_logits(directory, config, mesh, *, seed: int, padding: int):
    """(encoder tokens, decoder tokens, our teacher-forced logits) of the checkpoint in `directory`, loaded onto
    `mesh`: random queries of 2 rows with `padding` trailing PAD tokens."""
    fresh, shardings = fresh_and_shardings(config, mesh)
    params = pretrained.load_pretrained_params(checkpoint_dir=directory, config=config, head=STANDARD,
                                               fresh_params=fresh, shardings=shardings)
    rng = np.random.default_rng(seed)
    enc = tokens(rng, batch=2, length=ENC_LEN, vocab=VOCAB, padding=padding)
    dec = tokens(rng, batch=2, length=DEC_LEN, vocab=VOCAB, start_with_pad=True)
    return enc, dec, np.asarray(jax.jit(network.Transformer(config, head=STANDARD).apply)({"params": params}, enc, dec))


@pytest.mark.parametrize("variant", ["t5.1.1 single file", "t5.1.1 sharded bf16", "t5 1.0 tied relu"])
def test_teacher_forced_logits_match_numpy_t5(tmp_path, mesh, variant):
    if variant == "t5 1.0 tied relu":
        gated, tied = False, True
        config_json = hf_config(feed_forward_proj="relu", tie_word_embeddings=True)
        config = our_config(mlp_activations=("relu",))
    else:
        gated, tied = True, False
        config_json = hf_config()
        config = our_config()
    weights = hf_weights(3, gated=gated, tied=tied, tied_copies=variant != "t5.1.1 sharded bf16")
    directory = write_checkpoint(tmp_path / "ckpt", weights, config_json,
                                 num_shards=3 if "sharded" in variant else 0,
                                 dtype=ml_dtypes.bfloat16 if "bf16" in variant else np.float32)
    enc, dec, ours = loaded_logits(directory, config, mesh, seed=4, padding=7)
    # The reference reads the tensors back from the files (bf16-rounded in the bf16 variant).
    on_disk = {}
    for path in sorted(directory.glob("*.safetensors")):
        on_disk.update({k: np.asarray(v, np.float32) for k, v in load_file(str(path)).items()})
    reference = ref_logits(on_disk, config_json, enc, dec)
    assert np.abs(reference).max() > 1.0  # Non-trivial logits.
    np.testing.assert_allclose(np.asarray(ours), reference, rtol=1e-4, atol=1e-4 * np.abs(reference).max())


# Checkpoints as each transformers line saves them: config.json overrides, the tensors saved, and the output
# tensor and d_model**-0.5 factor that line applies (read in its models/t5/{configuration,modeling}_t5.py).
# 4.x: `tie_word_embeddings` decides both, lm_head tied to shared. 5.x: `tie_word_embeddings` is forced true and
# `scale_decoder_outputs` (saved) holds the factor; a saved lm_head stays untied where it differs from shared, and
# save_pretrained drops the copies of shared. 5.x's mT5 never scales and writes no `scale_decoder_outputs`.
V4, V5 = "4.57.1", "5.23.0"
GENERATIONS = {
    "4.x tied t5 1.0": (dict(tie_word_embeddings=True, transformers_version=V4), "copies and lm_head copy",
                        "shared.weight", True),
    "4.x untied t5.1.1": (dict(tie_word_embeddings=False, transformers_version=V4), "copies and own lm_head",
                          "lm_head.weight", False),
    "5.x tied t5 1.0": (dict(tie_word_embeddings=True, scale_decoder_outputs=True, transformers_version=V5),
                        "shared only", "shared.weight", True),
    "5.x tied unscaled": (dict(tie_word_embeddings=True, scale_decoder_outputs=False, transformers_version=V5),
                          "shared only", "shared.weight", False),
    "5.x t5.1.1": (dict(tie_word_embeddings=True, scale_decoder_outputs=False, transformers_version=V5),
                   "shared and own lm_head", "lm_head.weight", False),
    "5.x untied differing lm_head": (dict(tie_word_embeddings=False, scale_decoder_outputs=False,
                                          transformers_version=V5), "shared and own lm_head", "lm_head.weight", False),
    "5.x scaled own lm_head": (dict(tie_word_embeddings=True, scale_decoder_outputs=True, transformers_version=V5),
                               "shared and own lm_head", "lm_head.weight", True),
    "5.x mt5": (dict(model_type="mt5", tie_word_embeddings=True, transformers_version=V5), "shared and own lm_head",
                "lm_head.weight", False),
}


@pytest.mark.parametrize("generation", list(GENERATIONS))
def test_teacher_forced_logits_follow_the_transformers_version_that_saved_the_checkpoint(tmp_path, mesh, generation):
    overrides, saved, output, scale = GENERATIONS[generation]
    config_json = hf_config(**overrides)
    weights = hf_weights(15, tied="own lm_head" not in saved, tied_copies="copies" in saved)
    if saved == "copies and lm_head copy":
        weights["lm_head.weight"] = weights["shared.weight"].copy()
    if "own lm_head" in saved:
        assert not np.array_equal(weights["lm_head.weight"], weights["shared.weight"])
    directory = write_checkpoint(tmp_path / "ckpt", weights, config_json)
    enc, dec, ours = loaded_logits(directory, our_config(), mesh, seed=16, padding=5)
    reference = ref_logits(weights, config_json, enc, dec, output=output, scale=scale)
    assert np.abs(reference).max() > 1.0  # Non-trivial logits.
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-4 * np.abs(reference).max())
    # The other factor is far outside that tolerance: the test tells the two readings apart.
    other = ref_logits(weights, config_json, enc, dec, output=output, scale=not scale)
    assert np.abs(ours - other).max() > 0.1 * np.abs(reference).max()


@pytest.mark.parametrize("overrides, tensor", [
    # 4.x ties lm_head to shared when tie_word_embeddings: a saved lm_head that differs contradicts config.json.
    (dict(tie_word_embeddings=True, transformers_version=V4), "lm_head.weight"),
    (dict(tie_word_embeddings=True), "lm_head.weight"),
    # 5.x still ties embed_tokens to shared.
    (dict(tie_word_embeddings=True, scale_decoder_outputs=False, transformers_version=V5),
     "decoder.embed_tokens.weight"),
    (dict(model_type="mt5", tie_word_embeddings=True, transformers_version=V5), "encoder.embed_tokens.weight"),
])
def test_tied_copy_that_differs_is_rejected_in_either_generation(tmp_path, mesh, overrides, tensor):
    weights = hf_weights(17)  # lm_head differs from shared.
    if tensor != "lm_head.weight":
        weights[tensor][7, 2] += 1.0
    directory = write_checkpoint(tmp_path / "ckpt", weights, hf_config(**overrides))
    with pytest.raises(DataFormatError, match=re.escape(f"tensor {tensor!r} differs from 'shared.weight'")):
        _load(directory, our_config(), mesh)


def test_mix_vocabulary_rows_takes_the_first_rows_from_source_and_the_rest_fresh(mesh):
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "model"))
    fresh = np.arange(4 * 12, dtype=np.float32).reshape(4, 12) + 1000
    trimmed = -np.arange(4 * 5, dtype=np.float32).reshape(4, 5)  # Only the trained rows (a smaller run).
    full = np.concatenate([trimmed, np.full((4, 7), np.nan, np.float32)], axis=1)  # Past the rows: ignored.
    expected = np.concatenate([trimmed, fresh[:, 5:]], axis=1)
    for source in (trimmed, full):
        mixed = pretrained.mix_vocabulary_rows(source=jnp.asarray(source), fresh=jnp.asarray(fresh), axis=1, rows=5,
                                               sharding=sharding)
        np.testing.assert_array_equal(np.asarray(mixed), expected)
        assert mixed.sharding == sharding and mixed.dtype == jnp.float32
    with pytest.raises(ValueError, match=r"cannot take 5 rows from 0 along axis 1 of a \(3, 5\) array into a \(4, 12"):
        pretrained.mix_vocabulary_rows(source=jnp.zeros((3, 5)), fresh=jnp.asarray(fresh), axis=1, rows=5,
                                       sharding=sharding)


def test_relative_buckets_agree_with_transformers_formula():
    """Our (t5x-style, +eps in the log) buckets equal HF's over every distance up to past max_distance."""
    rel = np.arange(-300, 301)[None, :]
    for bidirectional in (True, False):
        ours = network.relative_position_bucket(jnp.asarray(rel), bidirectional=bidirectional, num_buckets=32,
                                                max_distance=128)
        np.testing.assert_array_equal(np.asarray(ours), ref_relative_bucket(rel, bidirectional=bidirectional))


# ----------------------------------------------------------------------------------------------
# Sharded loading
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_shards", [0, 4])
def test_params_are_the_hf_tensors_in_our_layout_on_the_requested_shardings(tmp_path, mesh, num_shards):
    weights = hf_weights(5, tied_copies=not num_shards)
    directory = write_checkpoint(tmp_path / "ckpt", weights, hf_config(), num_shards=num_shards)
    config = our_config()
    fresh, shardings = fresh_and_shardings(config, mesh)
    params = pretrained.load_pretrained_params(checkpoint_dir=directory, config=config, head=STANDARD,
                                               fresh_params=fresh, shardings=shardings)
    expected = leaves_by_path(expected_params(weights))
    got, wanted = leaves_by_path(params), leaves_by_path(shardings)
    assert got.keys() == expected.keys()
    model_sharded = 0
    for path, value in got.items():
        assert value.sharding == wanted[path], path
        assert value.dtype == jnp.float32
        model_sharded += "model" in tuple(value.sharding.spec)
        for shard in value.addressable_shards:  # Every device holds exactly its slice.
            np.testing.assert_array_equal(np.asarray(shard.data), expected[path][shard.index], err_msg=path)
    assert model_sharded >= 4 * (ENC_LAYERS + 2 * DEC_LAYERS)  # Heads and mlp really are split over 'model'.


def test_each_device_slice_is_read_once_and_only_that_slice(tmp_path, mesh, monkeypatch):
    directory = write_checkpoint(tmp_path / "ckpt", hf_weights(6), hf_config())
    reads = []
    original = pretrained.SafetensorsCheckpoint.read

    def recording_read(self, name, index):
        block = original(self, name, index)
        reads.append((name, block.shape))
        return block

    monkeypatch.setattr(pretrained.SafetensorsCheckpoint, "read", recording_read)
    config = our_config()
    fresh, shardings = fresh_and_shardings(config, mesh)
    pretrained.load_pretrained_params(checkpoint_dir=directory, config=config, head=STANDARD,
                                      fresh_params=fresh, shardings=shardings)

    def shapes(name):
        return [shape for n, shape in reads if n == name]

    # heads over 'model' (4 shards), replicated over 'data' (2): 4 reads of a quarter of the rows, not 8.
    assert shapes("encoder.block.1.layer.0.SelfAttention.q.weight") == [(HEADS // 4 * D_KV, D_MODEL)] * 4
    assert shapes("decoder.block.2.layer.1.EncDecAttention.o.weight") == [(D_MODEL, HEADS // 4 * D_KV)] * 4
    assert shapes("decoder.block.0.layer.2.DenseReluDense.wo.weight") == [(D_MODEL, D_FF // 4)] * 4
    assert shapes("lm_head.weight") == [(VOCAB // 4, D_MODEL)] * 4
    assert shapes("encoder.final_layer_norm.weight") == [(D_MODEL,)]  # Fully replicated: read once.


def test_larger_vocabulary_keeps_pretrained_rows_and_takes_the_rest_fresh(tmp_path, mesh):
    weights = hf_weights(7)
    directory = write_checkpoint(tmp_path / "ckpt", weights, hf_config())
    config = our_config(vocab_size=2 * VOCAB)  # e.g. 2D semantic docid tokens appended after the word pieces.
    fresh, shardings = fresh_and_shardings(config, mesh, concrete=True)
    params = pretrained.load_pretrained_params(checkpoint_dir=directory, config=config, head=STANDARD,
                                               fresh_params=fresh, shardings=shardings)
    fresh = strip_boxes(fresh)
    embedder, logits = np.asarray(params["token_embedder"]), np.asarray(params["logits_dense"])
    np.testing.assert_array_equal(embedder[:VOCAB], weights["shared.weight"])
    np.testing.assert_array_equal(embedder[VOCAB:], np.asarray(fresh["token_embedder"])[VOCAB:])
    np.testing.assert_array_equal(logits[:, :VOCAB], weights["lm_head.weight"].T)
    np.testing.assert_array_equal(logits[:, VOCAB:], np.asarray(fresh["logits_dense"])[:, VOCAB:])
    assert np.abs(embedder[VOCAB:]).max() > 0  # Really initialised, not the zero padding of the read.
    assert params["token_embedder"].sharding == shardings["token_embedder"]
    assert params["logits_dense"].sharding == shardings["logits_dense"]


def test_separate_output_vocabulary_gets_a_fresh_output_layer(tmp_path, mesh):
    weights = hf_weights(8)
    directory = write_checkpoint(tmp_path / "ckpt", weights, hf_config())
    config = our_config(output_vocab_size=64)  # An atomic docid head: one logit per document.
    fresh, shardings = fresh_and_shardings(config, mesh, concrete=True)
    params = pretrained.load_pretrained_params(checkpoint_dir=directory, config=config, head=STANDARD,
                                               fresh_params=fresh, shardings=shardings)
    np.testing.assert_array_equal(np.asarray(params["logits_dense"]), np.asarray(strip_boxes(fresh)["logits_dense"]))
    np.testing.assert_array_equal(np.asarray(params["token_embedder"]), weights["shared.weight"])
    assert params["logits_dense"].sharding == shardings["logits_dense"]


@pytest.mark.parametrize("head", ["atomic", "pawa"])
def test_new_output_heads_are_fresh_and_the_rest_pretrained(tmp_path, mesh, head):
    weights = hf_weights(14)
    directory = write_checkpoint(tmp_path / "ckpt", weights, hf_config())
    if head == "atomic":  # One output column per docid (+ PAD, EOS), no logits_dense.
        config, output_head = our_config(), AtomicHead(docid_vocab_start=VOCAB - 2, docid_vocab_size=60)
    else:  # 2D semantic docid tokens appended after the text vocabulary; a randomly initialised PAWA stack.
        config, output_head = our_config(vocab_size=2 * VOCAB), PawaHead(docid_vocab_start=VOCAB, docid_vocab_size=100)
    fresh, shardings = fresh_and_shardings(config, mesh, concrete=True, head=output_head)
    params = pretrained.load_pretrained_params(checkpoint_dir=directory, config=config, head=output_head,
                                               fresh_params=fresh, shardings=shardings)
    fresh = leaves_by_path(strip_boxes(fresh))
    got = leaves_by_path(params)
    new = [path for path in got if path.startswith(("atomic_logits_dense", "pawa/"))]
    assert new and len(new) == (1 if head == "atomic" else len([p for p in fresh if p.startswith("pawa/")]))
    for path in new:
        np.testing.assert_array_equal(np.asarray(got[path]), np.asarray(fresh[path]), err_msg=path)
        assert got[path].sharding == leaves_by_path(shardings)[path]
    expected = leaves_by_path(expected_params(weights))
    np.testing.assert_array_equal(np.asarray(got["decoder_layers_2/mlp/wo"]), expected["decoder_layers_2/mlp/wo"])
    np.testing.assert_array_equal(np.asarray(got["token_embedder"])[:VOCAB], weights["shared.weight"])
    if head == "atomic":
        assert "logits_dense" not in got
    else:  # PAWA's shared projection W: lm_head's rows for the text tokens, fresh rows for the docid tokens.
        np.testing.assert_array_equal(np.asarray(got["logits_dense"])[:, :VOCAB], weights["lm_head.weight"].T)
        np.testing.assert_array_equal(np.asarray(got["logits_dense"])[:, VOCAB:],
                                      np.asarray(fresh["logits_dense"])[:, VOCAB:])


def test_abstract_fresh_params_suffice_when_everything_is_pretrained(tmp_path, mesh):
    weights = hf_weights(9)
    directory = write_checkpoint(tmp_path / "ckpt", weights, hf_config())
    config = our_config()
    abstract, shardings = fresh_and_shardings(config, mesh)
    params = pretrained.load_pretrained_params(checkpoint_dir=directory, config=config, head=STANDARD,
                                               fresh_params=abstract, shardings=shardings)
    np.testing.assert_array_equal(np.asarray(params["decoder_layers_1"]["mlp"]["wi_1"]),
                                  weights["decoder.block.1.layer.2.DenseReluDense.wi_1.weight"].T)
    with pytest.raises(ValueError, match=r"params\['logits_dense'\] has no pretrained value and fresh_params holds "
                                         r"only its shape"):
        pretrained.load_pretrained_params(checkpoint_dir=directory, config=config, head=STANDARD,
                                          fresh_params=abstract, shardings=shardings, fresh_patterns=["logits_dense"])


def test_unknown_parameters_fail_unless_declared_fresh(tmp_path, mesh):
    directory = write_checkpoint(tmp_path / "ckpt", hf_weights(10), hf_config())
    config = our_config()
    fresh, shardings = fresh_and_shardings(config, mesh)
    fresh, shardings = dict(strip_boxes(fresh)), dict(shardings)
    fresh["adapter"] = {"kernel": jnp.arange(32.0).reshape(8, 4)}
    shardings["adapter"] = {"kernel": shardings["token_embedder"]}
    with pytest.raises(ValueError, match=r"1 parameter\(s\) have no tensor in a T5 checkpoint: "
                                         r"\['adapter/kernel'\].*fresh_patterns"):
        pretrained.load_pretrained_params(checkpoint_dir=directory, config=config, head=STANDARD,
                                          fresh_params=fresh, shardings=shardings)
    params = pretrained.load_pretrained_params(checkpoint_dir=directory, config=config, head=STANDARD,
                                               fresh_params=fresh, shardings=shardings, fresh_patterns=[r"adapter/.*"])
    np.testing.assert_array_equal(np.asarray(params["adapter"]["kernel"]), np.arange(32.0).reshape(8, 4))
    assert params["adapter"]["kernel"].sharding == shardings["token_embedder"]


def test_initialize_from_pretrained_gives_a_trainable_state(tmp_path, mesh):
    weights = hf_weights(11, enc_layers=1, dec_layers=1)  # One block each: compiling the train step is the cost.
    config_json = hf_config(num_layers=1, num_decoder_layers=1)
    directory = write_checkpoint(tmp_path / "ckpt", weights, config_json)
    config = our_config(num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0)
    trainer = Trainer(model=EncoderDecoderModel(config=config),
                      optimizer=optimizers.make_optimizer(name="adafactor", learning_rate=1e-3), mesh=mesh,
                      input_length=ENC_LEN, target_length=DEC_LEN, batch_size=4)
    state = warm_start.initialize_from_pretrained(state=trainer.init_state(jax.random.PRNGKey(0)), trainer=trainer,
                                                  checkpoint_dir=directory)
    np.testing.assert_array_equal(np.asarray(state.params["encoder_layers_0"]["attention"]["value"]),
                                  weights["encoder.block.0.layer.0.SelfAttention.v.weight"].T.reshape(
                                      D_MODEL, HEADS, D_KV))
    rng = np.random.default_rng(12)
    targets = tokens(rng, batch=4, length=DEC_LEN, vocab=VOCAB)
    batch = {"encoder_input_tokens": tokens(rng, batch=4, length=ENC_LEN, vocab=VOCAB),
             "decoder_target_tokens": targets,
             "decoder_input_tokens": np.concatenate([np.zeros((4, 1), np.int32), targets[:, :-1]], axis=1),
             "decoder_loss_weights": np.ones_like(targets)}
    state, metrics = trainer.train_step(state, batch, jax.random.PRNGKey(1))
    assert int(state.step) == 1
    # The step's loss is that of the pretrained weights (before the update): the numpy reference's cross entropy
    # plus t5x's z-loss (1e-4 * log Z^2).
    logits = ref_logits(weights, config_json, batch["encoder_input_tokens"], batch["decoder_input_tokens"])
    log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    cross_entropy = log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(float(metrics["loss"].total) / float(metrics["loss"].count),
                               np.mean(cross_entropy + 1e-4 * log_z ** 2), rtol=1e-4)


# ----------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------


def _load(directory, config, mesh, **kwargs):
    fresh, shardings = fresh_and_shardings(config, mesh)
    return pretrained.load_pretrained_params(checkpoint_dir=directory, config=config, head=STANDARD,
                                             fresh_params=fresh, shardings=shardings, **kwargs)


def _json_line(directory, key):
    lines = (directory / "config.json").read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if f'"{key}"' in line)


def test_config_json_disagreeing_with_our_config_names_every_difference(tmp_path, mesh):
    directory = write_checkpoint(tmp_path / "ckpt", hf_weights(), hf_config())
    with pytest.raises(DataFormatError) as error:
        _load(directory, our_config(mlp_dim=64, num_decoder_layers=2), mesh)
    message = str(error.value)
    path = directory / "config.json"
    assert f"{path}:{_json_line(directory, 'd_ff')}: d_ff=32 but T5Config.mlp_dim=64" in message
    assert (f"{path}:{_json_line(directory, 'num_decoder_layers')}: num_decoder_layers=3 but "
            f"T5Config.num_decoder_layers=2") in message
    with pytest.raises(DataFormatError, match=r"vocab_size=128 but T5Config.vocab_size=64 is smaller"):
        _load(directory, our_config(vocab_size=64), mesh)
    with pytest.raises(DataFormatError, match=r"feed_forward_proj=\('gelu', 'linear'\) but "
                                              r"T5Config.mlp_activations=\('relu',\)"):
        _load(directory, our_config(mlp_activations=("relu",)), mesh)


@pytest.mark.parametrize("overrides, message", [
    ({"feed_forward_proj": "gelu"}, r"feed_forward_proj='gelu' is not supported"),
    ({"model_type": "umt5"}, r"model_type='umt5'"),
    ({"eos_token_id": 2}, r"eos_token_id=2 but our models use the T5 ids"),
    ({"d_model": "16"}, r"d_model must be an integer"),
    ({"scale_decoder_outputs": "false"}, r"scale_decoder_outputs must be true or false, got 'false'"),
    ({"transformers_version": "five"}, r"transformers_version must be a version such as"),
])
def test_unsupported_config_json(tmp_path, overrides, message):
    directory = write_checkpoint(tmp_path / "ckpt", hf_weights(), hf_config(**overrides))
    key = next(iter(overrides))
    with pytest.raises(DataFormatError, match=re.escape(f"config.json:{_json_line(directory, key)}: ") + message):
        pretrained.read_hf_config(directory)


def test_missing_tensor_names_the_tensor_and_our_parameter(tmp_path, mesh):
    weights = hf_weights()
    del weights["decoder.block.2.layer.1.EncDecAttention.k.weight"]
    directory = write_checkpoint(tmp_path / "ckpt", weights, hf_config())
    with pytest.raises(DataFormatError, match=re.escape(
            "model.safetensors: missing tensor(s) 'decoder.block.2.layer.1.EncDecAttention.k.weight' "
            "(for params['decoder_layers_2/encoder_decoder_attention/key'])")):
        _load(directory, our_config(), mesh)


def test_unexpected_tensor_names_the_tensor_and_its_file(tmp_path, mesh):
    weights = hf_weights()
    weights["encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"] = np.zeros((32, HEADS),
                                                                                                np.float32)
    directory = write_checkpoint(tmp_path / "ckpt", weights, hf_config(), num_shards=2)
    with pytest.raises(DataFormatError, match=r"model-0000\d-of-00002.safetensors: unexpected tensor\(s\) "
                                              r"\['encoder.block.1.layer.0.SelfAttention.relative_attention_bias"
                                              r".weight'\]"):
        _load(directory, our_config(), mesh)


def test_shape_mismatch_names_tensor_expected_and_got(tmp_path, mesh):
    weights = hf_weights()
    weights["encoder.block.1.layer.1.DenseReluDense.wo.weight"] = np.zeros((D_MODEL, D_FF - 1), np.float32)
    directory = write_checkpoint(tmp_path / "ckpt", weights, hf_config())
    with pytest.raises(DataFormatError, match=re.escape(
            "model.safetensors: tensor 'encoder.block.1.layer.1.DenseReluDense.wo.weight' has shape [16, 31], "
            "expected [16, 32]")):
        _load(directory, our_config(), mesh)


def test_tied_copy_that_differs_from_shared_is_rejected(tmp_path, mesh):
    weights = hf_weights()
    weights["decoder.embed_tokens.weight"][5, 3] += 1.0
    directory = write_checkpoint(tmp_path / "ckpt", weights, hf_config())
    with pytest.raises(DataFormatError, match=r"tensor 'decoder.embed_tokens.weight' differs from 'shared.weight'"):
        _load(directory, our_config(), mesh)


def test_embedding_saved_only_under_a_tied_name_is_found(tmp_path, mesh):
    weights = hf_weights(13)
    shared = weights.pop("shared.weight")
    directory = write_checkpoint(tmp_path / "ckpt", weights, hf_config())
    params = _load(directory, our_config(), mesh)
    np.testing.assert_array_equal(np.asarray(params["token_embedder"]), shared)


def test_broken_index_and_missing_files(tmp_path, mesh):
    directory = write_checkpoint(tmp_path / "ckpt", hf_weights(), hf_config(), num_shards=2)
    (directory / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(DataFormatError, match=r"model.safetensors.index.json:\d+: shard "
                                              r"'model-00002-of-00002.safetensors' .* is not a file"):
        _load(directory, our_config(), mesh)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps(hf_config()))
    (empty / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"neither model.safetensors nor model.safetensors.index.json .*"
                                                r"convert them to safetensors"):
        _load(empty, our_config(), mesh)
    (empty / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    with pytest.raises(DataFormatError, match=r"model.safetensors: not a readable safetensors file"):
        _load(empty, our_config(), mesh)
    with pytest.raises(FileNotFoundError, match=r"no Hugging Face config.json"):
        _load(tmp_path / "nowhere", our_config(), mesh)
    (empty / "config.json").write_text('{\n  "d_model": 16,\n  oops\n}')
    with pytest.raises(DataFormatError, match=r"config.json:3: invalid JSON"):
        pretrained.read_hf_config(empty)


# ----------------------------------------------------------------------------------------------
# Config and vocabulary
# ----------------------------------------------------------------------------------------------


def test_t5_config_from_checkpoint(tmp_path):
    directory = write_checkpoint(tmp_path / "ckpt", hf_weights(), hf_config())
    config = pretrained.t5_config_from_checkpoint(checkpoint_dir=directory, dropout_rate=0.0)
    assert config == our_config()
    # Old configs lack relative_attention_max_distance / num_decoder_layers: HF's defaults apply.
    legacy = hf_config()
    del legacy["relative_attention_max_distance"], legacy["num_decoder_layers"]
    (directory / "config.json").write_text(json.dumps(legacy))
    config = pretrained.t5_config_from_checkpoint(checkpoint_dir=directory)
    assert (config.relative_attention_max_distance, config.num_decoder_layers) == (128, ENC_LAYERS)


def test_pretrained_vocabulary(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"spiece.model: the checkpoint has no SentencePiece model"):
        pretrained.pretrained_vocabulary(tmp_path)
    # A tiny model with T5's ids (pad 0, eos 1, unk 2, no bos), as in the published spiece.model.
    texts = [f"query {i} about document {i * 7} and passage {i % 5}" for i in range(200)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_prefix=str(tmp_path / "spiece"),
                                   vocab_size=60, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
    vocab = pretrained.pretrained_vocabulary(tmp_path)
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id, vocab.vocab_size) == (0, 1, 2, 60)
    assert vocab.decode(vocab.encode("query 3 about document 21")) == "query 3 about document 21"
