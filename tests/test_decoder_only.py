"""gr_jax.decoder_only: the Llama / Mistral / Qwen2 / Qwen3 network and its Hugging Face loader, against
transformers' logits and greedy continuations (tests/fixtures/decoder_only, made by its make_reference.py) and a
plain numpy forward pass written from transformers' modeling code over the HF-named tensors."""
import dataclasses
import functools
import json
import math
import pathlib
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from safetensors.numpy import load_file, save_file

from gr_jax import partitioning
from gr_jax.data.readers import DataFormatError
from gr_jax.decoder_only import pretrained
from gr_jax.decoder_only.network import DecoderOnlyTransformer, left_padded_positions

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "decoder_only"
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")


def hf_tensors(checkpoint: pathlib.Path) -> dict[str, np.ndarray]:
    tensors = {}
    for path in sorted(checkpoint.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def numpy_forward(checkpoint: pathlib.Path, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """float64 logits [b, l, vocab] as transformers' LlamaForCausalLM family computes them (eager attention,
    position_ids = cumsum(mask) - 1), from config.json and the HF tensors."""
    cfg = json.loads((checkpoint / "config.json").read_text())
    w = {name: t.astype(np.float64) for name, t in hf_tensors(checkpoint).items()}
    d, h, g = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    k = cfg.get("head_dim") or d // h
    eps, rope = cfg["rms_norm_eps"], cfg["rope_parameters"]

    def norm(x, weight):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight

    inv_freq = 1.0 / rope["rope_theta"] ** (np.arange(0, k, 2) / k)
    if rope["rope_type"] == "llama3":  # transformers' _compute_llama3_parameters
        old = rope["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > old / rope["low_freq_factor"], inv_freq / rope["factor"], inv_freq)
        smooth = (old / wavelen - rope["low_freq_factor"]) / (rope["high_freq_factor"] - rope["low_freq_factor"])
        medium = ~(wavelen < old / rope["high_freq_factor"]) & ~(wavelen > old / rope["low_freq_factor"])
        inv_freq = np.where(medium, (1 - smooth) * scaled / rope["factor"] + smooth * scaled, scaled)
    positions = np.maximum(np.cumsum(attention_mask, -1) - 1, 0)
    angles = positions[..., None] * inv_freq
    cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))

    def rotate(x):  # x [b, heads, l, k]
        half = np.concatenate([-x[..., k // 2:], x[..., :k // 2]], -1)
        return x * cos[:, None] + half * sin[:, None]

    b, length = input_ids.shape
    allowed = np.tril(np.ones((length, length), bool))[None] & attention_mask[:, None, :].astype(bool)
    x = w["model.embed_tokens.weight"][input_ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        hs = norm(x, w[p + "input_layernorm.weight"])

        def proj(name, heads):
            y = hs @ w[p + f"self_attn.{name}_proj.weight"].T + w.get(p + f"self_attn.{name}_proj.bias", 0.0)
            return y.reshape(b, length, heads, k).transpose(0, 2, 1, 3)

        q, key, v = proj("q", h), proj("k", g), proj("v", g)
        if p + "self_attn.q_norm.weight" in w:
            q, key = norm(q, w[p + "self_attn.q_norm.weight"]), norm(key, w[p + "self_attn.k_norm.weight"])
        q, key = rotate(q), rotate(key)
        key, v = np.repeat(key, h // g, axis=1), np.repeat(v, h // g, axis=1)
        scores = np.where(allowed[:, None], q @ key.transpose(0, 1, 3, 2) / math.sqrt(k), -1e30)  # pads: uniform
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        attended = (scores / scores.sum(-1, keepdims=True)) @ v
        x = x + attended.transpose(0, 2, 1, 3).reshape(b, length, h * k) @ w[p + "self_attn.o_proj.weight"].T
        hs = norm(x, w[p + "post_attention_layernorm.weight"])
        gate, up = hs @ w[p + "mlp.gate_proj.weight"].T, hs @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return norm(x, w["model.norm.weight"]) @ head.T


def load(checkpoint: pathlib.Path, *, mesh=None, **overrides):
    """(config, model, params) with the parameters sharded by the default rules on `mesh` (default: 4 x 2, the
    fixtures' 2 key/value heads on the 2 'model' shards)."""
    config = pretrained.read_config(checkpoint, **overrides).config
    model = DecoderOnlyTransformer(config)
    mesh = mesh or partitioning.make_mesh(data=4, model=2)
    abstract = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
    shardings = partitioning.logical_shardings(abstract, mesh=mesh)
    return config, model, pretrained.load_params(checkpoint_dir=checkpoint, config=config, shardings=shardings)


def valid_rows(reference):
    return reference["attention_mask"].astype(bool)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_logits_equal_transformers_and_numpy(arch):
    checkpoint = FIXTURES / arch
    reference = np.load(checkpoint / "reference.npz")
    ids, mask = reference["input_ids"], reference["attention_mask"]
    config, model, params = load(checkpoint)
    valid = jnp.asarray(mask.astype(bool))
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(ids, jnp.int32),
                                  positions=left_padded_positions(valid), valid=valid))
    expected = reference["logits"]
    scale = np.abs(expected[valid_rows(reference)]).max()
    np.testing.assert_allclose(ours[valid_rows(reference)], expected[valid_rows(reference)], rtol=0, atol=1e-5 * scale)
    from_numpy = numpy_forward(checkpoint, ids, mask)
    np.testing.assert_allclose(from_numpy[valid_rows(reference)], expected[valid_rows(reference)], rtol=0,
                               atol=1e-5 * scale)
    assert scale > 1.0  # random weights large enough that a wrong layout cannot hide in rounding


def test_lora_and_layer_adapters_start_on_a_checkpoint_from_their_initialisers():
    """Qwen3 with LoRA (rank 2) and per-layer adapters (width 4) over it: the checkpoint's tensors fill the base, the
    adapters come from `fresh`; with the adapters' B at zero and no layer adapter the logits are transformers';
    without `fresh` the adapters are an error."""
    from gr_jax.lora import LoraConfig
    checkpoint = FIXTURES / "qwen3"
    reference = np.load(checkpoint / "reference.npz")
    ids, valid = jnp.asarray(reference["input_ids"], jnp.int32), jnp.asarray(valid_rows(reference))
    _, _, base = load(checkpoint)
    for overrides in ({"lora": LoraConfig(rank=2, alpha=4.0)}, {"adapter_dim": 4}):
        config = pretrained.read_config(checkpoint, **overrides).config
        model = DecoderOnlyTransformer(config)
        fresh = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
        shardings = partitioning.logical_shardings(fresh, mesh=partitioning.make_mesh(data=4, model=2))
        fresh = jax.tree.map(jax.device_put, nn.unbox(fresh), shardings)
        with pytest.raises(ValueError, match="fresh="):
            pretrained.load_params(checkpoint_dir=checkpoint, config=config, shardings=shardings)
        params = pretrained.load_params(checkpoint_dir=checkpoint, config=config, shardings=shardings, fresh=fresh)
        loaded = traverse_util.flatten_dict(params, sep="/")
        initial = traverse_util.flatten_dict(fresh, sep="/")
        from_checkpoint = traverse_util.flatten_dict(base, sep="/")
        added = [path for path in loaded if path not in from_checkpoint]
        assert added and all(np.array_equal(loaded[path], initial[path]) for path in added)
        assert all(np.array_equal(loaded[path], from_checkpoint[path]) for path in from_checkpoint)
        if "lora" in overrides:
            logits = model.apply({"params": params}, ids, positions=left_padded_positions(valid), valid=valid)
            expected = reference["logits"][valid_rows(reference)]
            np.testing.assert_allclose(np.asarray(logits)[valid_rows(reference)], expected, rtol=0,
                                       atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("arch", ["qwen3", "llama"])  # tied embedding; a separate output layer
def test_a_checkpoints_token_rows_follow_the_reserved_ids_and_new_rows_come_from_fresh(arch):
    """A run's vocabulary shifts the checkpoint tokenizer's ids by 2 (PAD and EOS first, `gr_jax.data.hf_tokenizer`)
    and appends docid tokens: token_offset=2 into 128 rows puts the checkpoint's 96 rows at [2, 98), the rest from
    `fresh`, so the network on the shifted ids gives transformers' logits in the checkpoint's columns."""
    checkpoint = FIXTURES / arch
    reference = np.load(checkpoint / "reference.npz")
    ids, valid = jnp.asarray(reference["input_ids"], jnp.int32), jnp.asarray(valid_rows(reference))
    config = pretrained.config_from_checkpoint(checkpoint).with_vocab_size(98)
    assert config.vocab == 128
    model = DecoderOnlyTransformer(config)
    fresh = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
    shardings = partitioning.logical_shardings(fresh, mesh=partitioning.make_mesh(data=4, model=2))
    fresh = jax.tree.map(jax.device_put, nn.unbox(fresh), shardings)
    with pytest.raises(ValueError, match="fresh="):
        pretrained.load_params(checkpoint_dir=checkpoint, config=config, shardings=shardings, token_offset=2)
    with pytest.raises(ValueError, match="do not fit"):
        pretrained.load_params(checkpoint_dir=checkpoint, config=config, shardings=shardings, fresh=fresh,
                               token_offset=33)
    params = pretrained.load_params(checkpoint_dir=checkpoint, config=config, shardings=shardings, fresh=fresh,
                                    token_offset=2)
    tensors = hf_tensors(checkpoint)
    rows = [("token_embedder", 0, tensors["model.embed_tokens.weight"])]
    if not config.tie_embeddings:
        rows.append(("output", 1, tensors["lm_head.weight"].T))
    for name, axis, theirs in rows:
        ours, initial = np.asarray(params[name]), np.asarray(fresh[name])
        np.testing.assert_array_equal(np.take(ours, range(2, 98), axis=axis), theirs, err_msg=name)
        new = [0, 1, *range(98, 128)]
        np.testing.assert_array_equal(np.take(ours, new, axis=axis), np.take(initial, new, axis=axis), err_msg=name)
    shifted = jnp.where(valid, ids + 2, 0)
    logits = np.asarray(model.apply({"params": params}, shifted, positions=left_padded_positions(valid), valid=valid))
    expected = reference["logits"][valid_rows(reference)]
    np.testing.assert_allclose(logits[..., 2:98][valid_rows(reference)], expected, rtol=0,
                               atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_cached_greedy_decoding_continues_as_transformers(arch):
    checkpoint = FIXTURES / arch
    reference = np.load(checkpoint / "reference.npz")
    config, model, params = load(checkpoint)
    ids, valid = jnp.asarray(reference["input_ids"], jnp.int32), jnp.asarray(valid_rows(reference))
    positions = left_padded_positions(valid)
    steps = reference["continuation"].shape[1]
    variables = {"params": params}
    prefill = jax.jit(functools.partial(model.apply, method=DecoderOnlyTransformer.prefill),
                      static_argnames="max_len")
    step = jax.jit(functools.partial(model.apply, method=DecoderOnlyTransformer.decode_step))
    logits, cache = prefill(variables, ids, positions=positions, valid=valid, max_len=ids.shape[1] + steps)
    token, position = jnp.argmax(logits[:, -1], -1), positions[:, -1] + 1
    generated = [token]
    for index in range(ids.shape[1], ids.shape[1] + steps - 1):
        logits, cache = step(variables, token, positions=position, index=jnp.int32(index), cache=cache)
        token, position = jnp.argmax(logits, -1), position + 1
        generated.append(token)
    np.testing.assert_array_equal(np.stack(generated, 1), reference["continuation"])


def test_scanned_and_rematerialised_layers_compute_the_same_network():
    checkpoint = FIXTURES / "qwen3"
    reference = np.load(checkpoint / "reference.npz")
    ids, valid = jnp.asarray(reference["input_ids"], jnp.int32), jnp.asarray(valid_rows(reference))
    positions = left_padded_positions(valid)
    _, model, params = load(checkpoint)
    scanned_config, scanned, scanned_params = load(checkpoint, scan_layers=True, remat=True)
    assert scanned_params["layers"]["mlp"]["wo"].shape == (scanned_config.num_layers, 40, scanned_config.emb_dim)
    unscanned_out = model.apply({"params": params}, ids, positions=positions, valid=valid)
    scanned_out = scanned.apply({"params": scanned_params}, ids, positions=positions, valid=valid)
    np.testing.assert_allclose(np.asarray(scanned_out), np.asarray(unscanned_out), rtol=1e-5, atol=1e-5)
    _, cache = scanned.apply({"params": scanned_params}, ids, positions=positions, valid=valid, max_len=12,
                             method=DecoderOnlyTransformer.prefill)
    step_logits, _ = scanned.apply({"params": scanned_params}, ids[:, -1], positions=positions[:, -1] + 1,
                                   index=jnp.int32(ids.shape[1]), cache=cache,
                                   method=DecoderOnlyTransformer.decode_step)
    full = model.apply({"params": params}, jnp.concatenate([ids, ids[:, -1:]], 1),
                       positions=jnp.concatenate([positions, positions[:, -1:] + 1], 1),
                       valid=jnp.concatenate([valid, jnp.ones((2, 1), bool)], 1))
    np.testing.assert_allclose(np.asarray(step_logits), np.asarray(full[:, -1]), rtol=1e-5, atol=1e-5)
    # The step writes one layer's slot into the rows-first cache: nothing transposes the whole cache.
    step = jax.make_jaxpr(lambda cache: scanned.apply(
        {"params": scanned_params}, ids[:, -1], positions=positions[:, -1] + 1, index=jnp.int32(ids.shape[1]),
        cache=cache, method=DecoderOnlyTransformer.decode_step))(cache)
    cache_shape = cache.keys[0].shape
    transposed = [eqn for eqn in _equations(step.jaxpr) if eqn.primitive.name == "transpose"
                  and any(sorted(getattr(v.aval, "shape", ())) == sorted(cache_shape) for v in eqn.outvars)]
    assert not transposed, transposed


def _equations(jaxpr):
    """Every equation of a jaxpr, those of its sub-jaxprs (scan bodies, remat) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _equations(inner)


def test_parameters_are_sharded_by_their_logical_axes():
    _, _, params = load(FIXTURES / "qwen2")
    attention = params["layers_0"]["attention"]
    assert attention["query"].sharding.spec == jax.sharding.PartitionSpec(None, "model", None)
    assert attention["key_bias"].sharding.spec == jax.sharding.PartitionSpec("model", None)
    assert params["token_embedder"].sharding.spec == jax.sharding.PartitionSpec("model", None)
    assert params["layers_0"]["mlp"]["wo"].sharding.spec == jax.sharding.PartitionSpec("model", None)
    tensors = hf_tensors(FIXTURES / "qwen2")
    np.testing.assert_array_equal(np.asarray(attention["key_bias"]).reshape(-1),
                                  tensors["model.layers.0.self_attn.k_proj.bias"])


def test_config_fields_and_parameter_count():
    config = pretrained.read_config(FIXTURES / "llama").config
    assert (config.emb_dim, config.num_heads, config.num_kv_heads, config.head_dim) == (24, 4, 2, 8)
    assert config.rope_scaling is not None and config.rope_scaling.factor == 8.0 and config.rope_theta == 500000.0
    assert pretrained.read_config(FIXTURES / "qwen2").config.head_dim == 8  # hidden_size // heads: no head_dim key
    qwen3 = pretrained.read_config(FIXTURES / "qwen3").config
    assert qwen3.qk_norm and qwen3.tie_embeddings and not qwen3.qkv_bias
    for arch in ARCHITECTURES:
        config = pretrained.read_config(FIXTURES / arch).config
        params = jax.eval_shape(DecoderOnlyTransformer(config).init, jax.random.PRNGKey(0),
                                jnp.zeros((1, 2), jnp.int32))["params"]
        sizes = {partitioning.path_str(p): math.prod(x.shape) for p, x in
                 jax.tree_util.tree_flatten_with_path(nn.unbox(params))[0]}
        embeddings = sum(n for path, n in sizes.items() if path in ("token_embedder", "output"))
        assert sum(sizes.values()) - embeddings == config.non_embedding_params()
        assert sum(sizes.values()) == sum(t.size for t in hf_tensors(FIXTURES / arch).values())


def _edited(tmp_path, arch, **changes):
    checkpoint = tmp_path / arch
    shutil.copytree(FIXTURES / arch, checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(changes)
    (checkpoint / "config.json").write_text(json.dumps(config, indent=2))
    return checkpoint


@pytest.mark.parametrize("arch, changes, message", [
    ("mistral", {"sliding_window": 4096}, "sliding_window=4096: sliding-window attention"),
    ("qwen3", {"use_sliding_window": True}, "use_sliding_window=true"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_type 'yarn'"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ("llama", {"attention_bias": True}, "attention_bias=true"),
    ("llama", {"model_type": "gemma"}, "model_type='gemma'"),
    ("qwen2", {"architectures": ["Qwen2ForSequenceClassification"]}, "architectures="),
    ("llama", {"num_key_value_heads": 3}, "not a multiple of num_kv_heads=3"),
])
def test_unsupported_configs_are_errors_naming_the_file_and_field(tmp_path, arch, changes, message):
    checkpoint = _edited(tmp_path, arch, **changes)
    with pytest.raises(DataFormatError, match=message) as error:
        pretrained.read_config(checkpoint)
    assert str(checkpoint / "config.json") in str(error.value)
    key = next(iter(changes))
    if key != "num_key_value_heads":
        line = next(i for i, text in enumerate((checkpoint / "config.json").read_text().splitlines(), 1)
                    if f'"{key}"' in text)
        assert f"config.json:{line}:" in str(error.value)


def test_tensors_that_do_not_fit_the_config_are_errors(tmp_path):
    checkpoint = _edited(tmp_path, "llama")
    tensors = load_file(str(checkpoint / "model.safetensors"))
    mesh = partitioning.make_mesh(data=8, model=1)
    config = pretrained.read_config(checkpoint).config
    abstract = jax.eval_shape(DecoderOnlyTransformer(config).init, jax.random.PRNGKey(0),
                              jnp.zeros((1, 2), jnp.int32))["params"]
    shardings = partitioning.logical_shardings(abstract, mesh=mesh)

    def loads(edited):
        save_file(edited, str(checkpoint / "model.safetensors"))
        return pretrained.load_params(checkpoint_dir=checkpoint, config=config, shardings=shardings)

    with pytest.raises(DataFormatError, match="missing, e.g. 'model.norm.weight'"):
        loads({n: t for n, t in tensors.items() if n != "model.norm.weight"})
    with pytest.raises(DataFormatError, match="'model.layers.2.mlp.up_proj.weight' has no place"):
        loads({**tensors, "model.layers.2.mlp.up_proj.weight": tensors["model.layers.0.mlp.up_proj.weight"]})
    with pytest.raises(DataFormatError, match=r"model.norm.weight has shape \(23,\), config.json implies \(24,\)"):
        loads({**tensors, "model.norm.weight": tensors["model.norm.weight"][:23]})
    with pytest.raises(ValueError, match=r"describes another network: fields \['mlp_dim'\]"):
        pretrained.load_params(checkpoint_dir=checkpoint, config=dataclasses.replace(config, mlp_dim=48),
                               shardings=shardings)
