"""Scanned layer stacks (`T5Config.scan_layers`): the unscanned network's outputs, decoding, training and loading.

Every comparison runs the scanned network on the unscanned network's parameters converted by `gr_jax.layer_layout`,
in float32 with dropout off (the scan splits the dropout keys per layer, so masks differ between the layouts).
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from gr_jax import gin_utils
from gr_jax import layer_layout
from gr_jax import network
from gr_jax import optimizers
from gr_jax import partitioning
from gr_jax import pretrained
from gr_jax import warm_start
from gr_jax.checkpoints import Checkpointer
from gr_jax.docids.trie import Trie
from gr_jax.heads import AtomicHead, PawaHead, StandardHead
from gr_jax.models import EncoderDecoderModel
from gr_jax.partitioning import path_str
from gr_jax.run_dir import RunDir
from gr_jax.tools.bench.train_step import random_batch
from gr_jax.trainer import Trainer, TrainState

from test_pretrained import fresh_and_shardings, hf_config, hf_weights, our_config, write_checkpoint

# heads=4 so that the 'model' axis of a 2x4 mesh divides every sharded dimension; 3 encoder and 2 decoder layers so
# that a stack mixed up with the other fails on shapes.
MICRO = network.T5Config(vocab_size=128, emb_dim=32, num_heads=4, num_encoder_layers=3, num_decoder_layers=2,
                         head_dim=8, mlp_dim=64, dropout_rate=0.0)
DOCIDS_START, POSITIONS, VALUES = 100, 3, 4  # 2D semantic ids for PAWA: 3 positions x 4 values after 100 pieces
STANDARD = StandardHead()
HEADS = {
    "standard": STANDARD,
    "atomic": AtomicHead(docid_vocab_start=100, docid_vocab_size=200),
    "pawa": PawaHead(docid_vocab_start=DOCIDS_START, docid_vocab_size=POSITIONS * VALUES, num_layers=3),
}


def scanned(config: network.T5Config) -> network.T5Config:
    return dataclasses.replace(config, scan_layers=True)


def _variables(config: network.T5Config, head=STANDARD):
    return EncoderDecoderModel(config=config, head=head).init(jax.random.PRNGKey(0), input_length=7, target_length=4)


def init(config: network.T5Config, head=STANDARD, *, boxed: bool = False, abstract: bool = False):
    if not abstract:  # the same values each time: computed once per config (remat: the same), in fresh containers
        params = _params(dataclasses.replace(config, remat=False), head)
        return jax.tree.map(lambda x: x, params) if boxed else nn.unbox(params)
    variables = jax.eval_shape(lambda: _variables(config, head))
    return variables["params"] if boxed else nn.unbox(variables)["params"]


@functools.cache
def _params(config: network.T5Config, head):
    """The boxed parameters of `config` with `head`, initialised op by op: the initialiser's ops compile once per
    shape, for every config (one compiled initialiser per config compiles a threefry program for each parameter)."""
    return _variables(config, head)["params"]


def started(trainer: Trainer, boxed_params) -> TrainState:
    """What `trainer.init_state` gives (step 0, the optimizer's initial state, every leaf on the trainer's
    shardings), with `boxed_params` as the network's initial parameters: a small program, where `init_state`
    compiles the network's initialiser again for each trainer."""
    def start(params):
        return partitioning.strip_boxes(TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                                   opt_state=trainer.optimizer.init(params)))

    with trainer.sharding_context():
        return jax.jit(start, out_shardings=trainer.state_shardings)(boxed_params)


def queries(n: int = 3, length: int = 7) -> jax.Array:
    return jax.random.randint(jax.random.PRNGKey(1), (n, length), 3, DOCIDS_START).at[0, 5:].set(0)


def docid_table(n: int) -> np.ndarray:
    """n distinct 2D semantic ids (token of value v at position p: DOCIDS_START + p * VALUES + v), then EOS."""
    codes = np.random.default_rng(0).choice(VALUES ** POSITIONS, size=n, replace=False)
    digits = np.stack([(codes // VALUES ** p) % VALUES for p in reversed(range(POSITIONS))], axis=1)
    tokens = DOCIDS_START + np.arange(POSITIONS) * VALUES + digits
    return np.concatenate([tokens, np.ones((n, 1), np.int64)], axis=1).astype(np.int32)


def decoder_inputs(n: int = 3) -> np.ndarray:
    table = docid_table(n)
    return np.concatenate([np.zeros((n, 1), np.int32), table[:, :-1]], axis=1)


def count(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def by_path(tree) -> dict:
    return {path_str(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def assert_trees_close(a, b, *, atol=1e-5):
    a, b = by_path(a), by_path(b)
    assert a.keys() == b.keys()
    for path in a:
        np.testing.assert_allclose(np.asarray(a[path]), np.asarray(b[path]), atol=atol, rtol=1e-5, err_msg=path)


# --- The parameter tree --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head", sorted(HEADS))
def test_scanned_tree_stacks_each_layer_stack_with_the_same_parameters(head):
    config, output_head = MICRO, HEADS[head]
    flat = init(config, output_head, boxed=True, abstract=True)
    stacked = init(scanned(config), output_head, boxed=True, abstract=True)
    assert count(nn.unbox(flat)) == count(nn.unbox(stacked))
    stacks = layer_layout.layer_stacks(config, head=output_head)
    assert set(stacks) == {"encoder_layers", "decoder_layers"} | ({"pawa/layers"} if head == "pawa" else set())
    for path, box in jax.tree_util.tree_flatten_with_path(stacked, is_leaf=partitioning.is_box)[0]:
        path = path_str(path)
        stack = next((s for s in stacks if path.startswith(s + "/")), None)
        if stack is None:
            assert network.LAYERS not in box.names, path
        else:
            assert box.names[0] == network.LAYERS and box.value.shape[0] == stacks[stack], (path, box.names)
    # The converter of boxed shapes gives the scanned init's tree: same paths, shapes and logical names.
    converted = layer_layout.stack_layers(flat, config=config, head=output_head)
    expected = jax.tree_util.tree_flatten_with_path(stacked, is_leaf=partitioning.is_box)[0]
    got = jax.tree_util.tree_flatten_with_path(converted, is_leaf=partitioning.is_box)[0]
    assert [(path_str(p), b.value.shape, b.names) for p, b in got] == \
        [(path_str(p), b.value.shape, b.names) for p, b in expected]


@pytest.mark.parametrize("rules_2d", [False, True])
def test_layers_axis_is_replicated_and_every_other_axis_shards_as_unscanned(rules_2d):
    """On the 8 simulated devices (2 x 4): a scanned stack's leaf is its layers' sharding with the layer axis
    unsharded, under both rule tables."""
    rules = partitioning.LOGICAL_AXIS_RULES_2D if rules_2d else partitioning.LOGICAL_AXIS_RULES
    assert ("layers", None) in rules
    mesh = partitioning.make_mesh(data=2, model=4)
    config, head = MICRO, HEADS["pawa"]
    flat = partitioning.logical_shardings(init(config, head, boxed=True, abstract=True), mesh=mesh, rules=rules)
    stacked = partitioning.logical_shardings(init(scanned(config), head, boxed=True, abstract=True), mesh=mesh,
                                             rules=rules)
    for path, sharding in by_path(stacked).items():
        if path.startswith(("encoder_layers/", "decoder_layers/", "pawa/layers/")):
            assert sharding.spec[0] is None, path
    assert by_path(layer_layout.unstack_layers(stacked, config=config, head=head)) == by_path(flat)
    some = by_path(stacked)["decoder_layers/mlp/wi_0"]
    assert tuple(some.spec) == (None, "data" if rules_2d else None, "model")


def filled(tree, *, seed: int):
    """`tree`'s shapes and dtypes filled with distinct random numbers (numpy arrays): converting layouts only moves
    arrays, so any values test it, and none needs the network's initialiser to run."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda leaf: rng.normal(size=leaf.shape).astype(leaf.dtype), tree)


def test_converter_round_trip_is_exact():
    config, head = MICRO, HEADS["pawa"]
    flat = jax.tree.map(jnp.asarray, filled(init(config, head, abstract=True), seed=0))
    stacked = layer_layout.stack_layers(flat, config=config, head=head)
    assert stacked["encoder_layers"]["mlp"]["wo"].shape == (3, 64, 32)
    assert stacked["pawa"]["layers"]["self_attention"]["query"].shape == (3, 32, 4, 8)
    back = layer_layout.unstack_layers(stacked, config=config, head=head)
    assert jax.tree.structure(back) == jax.tree.structure(flat)
    for path, leaf in by_path(flat).items():
        np.testing.assert_array_equal(np.asarray(by_path(back)[path]), np.asarray(leaf), err_msg=path)
    np.testing.assert_array_equal(stacked["decoder_layers"]["mlp"]["wi_1"][1], flat["decoder_layers_1"]["mlp"]["wi_1"])
    # The other direction from a scanned init, on host (numpy stays numpy), and each function passes through a tree
    # already in its layout.
    host = filled(init(scanned(config), head, abstract=True), seed=1)
    unstacked = layer_layout.unstack_layers(host, config=config, head=head)
    assert isinstance(unstacked["encoder_layers_2"]["attention"]["key"], np.ndarray)
    restacked = layer_layout.stack_layers(unstacked, config=config, head=head)
    assert isinstance(restacked["encoder_layers"]["attention"]["key"], np.ndarray)
    for path, leaf in by_path(host).items():
        np.testing.assert_array_equal(by_path(restacked)[path], leaf, err_msg=path)
    assert by_path(layer_layout.stack_layers(host, config=config, head=head)).keys() == by_path(host).keys()
    assert by_path(layer_layout.unstack_layers(flat, config=config, head=head)).keys() == by_path(flat).keys()
    assert layer_layout.is_scanned(by_path(host), config=config, head=head) is True
    assert layer_layout.is_scanned(by_path(flat), config=config, head=head) is False
    assert layer_layout.is_scanned(["token_embedder"], config=config, head=head) is None


def test_converter_refuses_a_tree_of_another_depth():
    config, head = MICRO, STANDARD
    # The trees' shapes (initialising the scanned stacks would compile a scan of each's initialiser).
    deeper = init(dataclasses.replace(config, num_decoder_layers=3), abstract=True)
    with pytest.raises(ValueError, match=r"decoder_layers_\*/.*layers \[0, 1, 2\], but the config's stack has 2"):
        layer_layout.stack_layers(deeper, config=config, head=head)
    with pytest.raises(ValueError, match="a scanned stack of 2 layers has them first"):
        layer_layout.unstack_layers(init(scanned(dataclasses.replace(config, num_decoder_layers=3)), abstract=True),
                                    config=config, head=head)


def test_gin_binds_scan_layers():
    config = gin_utils.t5_config(["models/t5_1_1/tiny.gin"], bindings=["network.T5Config.scan_layers = True"],
                                 vocab_size=256)
    assert config.scan_layers and config.num_encoder_layers == 4


# --- Outputs -------------------------------------------------------------------------------------------------------


# The heads whose layers the scan runs: the trunk's stacks (standard, rematerialised) and PAWA's own stack besides
# them. The atomic head adds no scanned layer (its output layer is one unstacked kernel, `atomic_logits_dense`, on
# the same trunk): its tree's conversion is checked above and its ranking in test_variants.py.
@pytest.mark.parametrize("head,remat", [("standard", True), ("pawa", False)])
def test_teacher_forced_outputs_and_gradients_equal_the_unscanned_network(head, remat):
    config, head = dataclasses.replace(MICRO, remat=remat), HEADS[head]
    flat = init(config, head)
    stacked = layer_layout.stack_layers(flat, config=config, head=head)
    enc, dec = queries(), decoder_inputs()

    def outputs(cfg, params):
        module = network.Transformer(cfg, head=head)
        logits, states = module.apply({"params": params}, enc, dec, return_states=True)
        return logits, states, module.apply({"params": params}, enc, method=network.Transformer.encode)

    def loss(cfg, params):
        logits = network.Transformer(cfg, head=head).apply({"params": params}, enc, dec)
        return jnp.sum(jnp.where(logits > network.NEG_INF / 2, jax.nn.log_softmax(logits), 0.0)[..., 3])

    def outputs_and_grads(cfg, params):
        return outputs(cfg, params), jax.grad(lambda p: loss(cfg, p))(params)

    # Each side compiled as one program (op by op, the unscanned stack's hundreds of ops compile one at a time). The
    # reference is the unscanned network without remat: remat changes neither outputs nor gradients
    # (test_network.py::test_remat_gives_the_same_logits_and_gradients), and the unrolled stack's remat'd
    # gradient compiles in twice the time.
    reference = dataclasses.replace(config, remat=False)
    flat_outputs, flat_grads = jax.jit(lambda p: outputs_and_grads(reference, p))(flat)
    scanned_outputs, scanned_grads = jax.jit(lambda p: outputs_and_grads(scanned(config), p))(stacked)
    for a, b in zip(flat_outputs, scanned_outputs):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=1e-5)

    # Gradients through the scan (rematerialised or not) are the unscanned ones, stacked.
    assert_trees_close(scanned_grads, layer_layout.stack_layers(flat_grads, config=config, head=head), atol=1e-5)


@pytest.mark.parametrize("head", ["standard", "pawa"])
def test_incremental_decoding_equals_the_unscanned_network(head):
    config, output_head = MICRO, HEADS[head]
    model, flat = EncoderDecoderModel(config=config, head=output_head), init(config, output_head)
    scanned_model = EncoderDecoderModel(config=scanned(config), head=output_head)
    stacked = layer_layout.stack_layers(flat, config=config, head=output_head)
    enc, dec = queries(), decoder_inputs()
    full = model.module.apply({"params": flat}, enc, dec)

    def steps(m, params):
        context, cache = m._prefill(params, enc, 4), m.init_cache(rows=3, max_decode_len=4)
        out = []
        for t in range(4):
            logits, cache = m._step_fn(params, context)(jnp.asarray(dec[:, t]), jnp.int32(t), cache)
            out.append(logits)
        return np.stack(out, 1), context, cache

    a, _, flat_cache = steps(model, flat)
    b, context, cache = steps(scanned_model, stacked)
    np.testing.assert_allclose(a, full, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=1e-5)
    # One (keys, values) pair per stack, rows first (beam search reorders axis 0), layers second.
    stacks = 2 if head == "pawa" else 1
    assert len(cache) == stacks and len(flat_cache) == config.num_decoder_layers + (3 if head == "pawa" else 0)
    assert cache[0][0].shape == (3, config.num_decoder_layers, 4, 4, 8)
    np.testing.assert_allclose(cache[0][0][:, 1], flat_cache[1][0], atol=1e-5)
    assert context.cross_kv[0][0].shape == (config.num_decoder_layers, 3, 7, 4, 8)


def test_beam_search_and_greedy_decoding_equal_the_unscanned_network():
    config, head = MICRO, STANDARD
    flat = init(config, head)
    stacked = layer_layout.stack_layers(flat, config=config, head=head)
    enc = queries()
    results = []
    for cfg, params in ((config, flat), (scanned(config), stacked)):
        model = EncoderDecoderModel(config=cfg, head=head)
        beams = jax.jit(lambda p, q: model.beam_search(p, q, num_beams=4, max_decode_len=5))(params, enc)
        greedy = jax.jit(lambda p, q: model.sample_batch(p, q, rng=jax.random.PRNGKey(0), max_decode_len=5,
                                                         temperature=0.0))(params, enc)
        results.append((beams, greedy))
    (beams, greedy), (scanned_beams, scanned_greedy) = results
    np.testing.assert_array_equal(scanned_beams.sequences, beams.sequences)
    np.testing.assert_allclose(scanned_beams.scores, beams.scores, atol=1e-5)
    np.testing.assert_array_equal(scanned_greedy.sequences, greedy.sequences)
    np.testing.assert_allclose(scanned_greedy.log_probs, greedy.log_probs, atol=1e-5)


def test_pawa_constrained_beam_search_equals_the_unscanned_network():
    config, head = MICRO, HEADS["pawa"]
    flat = init(config, head)
    stacked = layer_layout.stack_layers(flat, config=config, head=head)
    trie = Trie.build(docid_table(20), vocab_size=head.logits_vocab_size(config))
    results = []
    for cfg, params in ((config, flat), (scanned(config), stacked)):
        model = EncoderDecoderModel(config=cfg, head=head)
        results.append(jax.jit(lambda p, q, t: model.predict_batch(p, q, num_beams=5, max_decode_len=4, trie=t))(
            params, queries(2), trie))
    np.testing.assert_array_equal(results[1].sequences, results[0].sequences)
    np.testing.assert_allclose(results[1].scores, results[0].scores, atol=1e-5)


# --- Training and loading ------------------------------------------------------------------------------------------


def test_train_step_with_scanned_layers():
    """Two Adafactor steps with weight decay of the scanned network from converted parameters are the unscanned
    steps (Adafactor normalises per parameter block: `optimizers.per_layer` makes each layer a block; a plain
    per-element optimizer would not test that). Then Adafactor with remat and dropout, as a real run, trains on the
    2 x 4 mesh."""
    mesh = partitioning.make_mesh(data=2, model=4)
    batch = random_batch(np.random.default_rng(0), batch=8, inputs=12, targets=6, vocab=MICRO.vocab_size)

    def trainer(config, optimizer):
        return Trainer(model=EncoderDecoderModel(config=config), mesh=mesh, input_length=12, target_length=6,
                       batch_size=8, optimizer=optimizer)

    # Per-layer statistics, update clipping, parameter scale and decay mask (`optimizers.per_layer`).
    def adafactor():
        return optimizers.make_optimizer(name="adafactor", learning_rate=1e-2, weight_decay=1e-3)

    flat_trainer, scanned_trainer = trainer(MICRO, adafactor()), trainer(scanned(MICRO), adafactor())
    flat_params = init(MICRO, boxed=True)
    flat_state = started(flat_trainer, flat_params)
    state = started(scanned_trainer, layer_layout.stack_layers(flat_params, config=MICRO, head=STANDARD))
    assert tuple(state.params["decoder_layers"]["mlp"]["wi_0"].sharding.spec) == (None, None, "model")
    for _ in range(2):
        flat_state, flat_metrics = flat_trainer.train_step(flat_state, batch, jax.random.PRNGKey(1))
        state, metrics = scanned_trainer.train_step(state, batch, jax.random.PRNGKey(1))
        np.testing.assert_allclose(float(metrics["loss"].total), float(flat_metrics["loss"].total), rtol=1e-6)
    assert_trees_close(state.params, layer_layout.stack_layers(flat_state.params, config=MICRO, head=STANDARD),
                       atol=1e-5)

    config = dataclasses.replace(scanned(MICRO), remat=True, dropout_rate=0.1)
    real = trainer(config, optimizers.make_optimizer(name="adafactor", learning_rate=1e-2))
    state = started(real, layer_layout.stack_layers(init(MICRO, boxed=True), config=MICRO, head=STANDARD))
    assert real.param_count() == flat_trainer.param_count()
    losses = []
    for _ in range(3):
        state, metrics = real.train_step(state, batch, jax.random.PRNGKey(1))
        losses.append(float(metrics["loss"].total / metrics["loss"].count))
    assert int(state.step) == 3 and all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_pretrained_checkpoint_loads_into_a_scanned_network(tmp_path):
    mesh = partitioning.make_mesh(data=2, model=4)
    directory = write_checkpoint(tmp_path / "hf", hf_weights(3), hf_config())
    config = our_config()
    results = []
    for cfg in (config, scanned(config)):
        fresh, shardings = fresh_and_shardings(cfg, mesh)
        params = pretrained.load_pretrained_params(checkpoint_dir=directory, config=cfg, head=STANDARD,
                                                   fresh_params=fresh, shardings=shardings)
        for path, leaf in by_path(params).items():
            assert leaf.sharding == by_path(shardings)[path], path
        results.append(params)
    flat, stacked = results
    expected = layer_layout.stack_layers(flat, config=config, head=STANDARD)
    for path, leaf in by_path(expected).items():
        np.testing.assert_array_equal(np.asarray(by_path(stacked)[path]), np.asarray(leaf), err_msg=path)


@pytest.mark.parametrize("source_scanned", [False, True])
def test_warm_start_reads_a_run_of_the_other_layout(tmp_path, source_scanned):
    mesh = partitioning.make_mesh(data=2, model=4)
    config = MICRO
    source_config = dataclasses.replace(config, scan_layers=source_scanned)
    target_config = dataclasses.replace(config, scan_layers=not source_scanned)
    saved = init(config)
    with Checkpointer(RunDir.of(tmp_path / "run").checkpoints, asynchronous=False) as checkpointer:
        checkpointer.save(5, state={"params": layer_layout.convert_layers(saved, config=source_config, head=STANDARD)},
                          input_state={})
    boxed = init(target_config, boxed=True, abstract=True)
    shardings = partitioning.logical_shardings(boxed, mesh=mesh)
    # Zeros of the target's shapes (from its abstract tree: initialising a scanned network compiles a scan of its
    # initialiser).
    fresh = jax.device_put(jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype),
                                        init(target_config, abstract=True)), shardings)
    params = warm_start.params_from_run(model_dir=tmp_path / "run", fresh_params=fresh, shardings=shardings,
                                        vocab_axes=warm_start.vocabulary_axes(boxed), config=target_config,
                                        head=STANDARD)
    expected = layer_layout.convert_layers(saved, config=target_config, head=STANDARD)
    for path, leaf in by_path(params).items():
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(by_path(expected)[path]), err_msg=path)
        assert leaf.sharding == by_path(shardings)[path], path
    with pytest.raises(ValueError, match="does not hold this network's parameters"):  # without the config: by path
        warm_start.params_from_run(model_dir=tmp_path / "run", fresh_params=fresh, shardings=shardings,
                                   vocab_axes=warm_start.vocabulary_axes(boxed))


def test_a_warm_start_takes_what_the_source_checkpoints_leave_out_from_where_the_source_started(tmp_path):
    """A source run whose checkpoints leave its frozen parameters out (a LoRA run's base; here every parameter but
    the encoder's layers) has them rebuilt by `source_start` from its start record; parameters outside its frozen
    pattern that are missing stay an error, and so does a source that leaves parameters out with nothing to rebuild
    them."""
    mesh = partitioning.make_mesh(data=2, model=4)
    params = init(MICRO)
    boxed = init(MICRO, boxed=True, abstract=True)
    shardings = partitioning.logical_shardings(boxed, mesh=mesh)
    run = RunDir.of(tmp_path / "run")
    with Checkpointer(run.checkpoints, asynchronous=False) as checkpointer:
        checkpointer.save(4, state={"params": {k: v for k, v in params.items() if k.startswith("encoder_")}},
                          input_state={})
    run.write_start(seed=3, init_checkpoint=None, frozen="(?!encoder_).*")
    base = jax.tree.map(lambda leaf: leaf + 1.0, params)  # where the source started: not the saved values
    fresh = jax.tree.map(jnp.zeros_like, params)
    starts = []

    def source_start(start):
        starts.append(start)
        return base

    kwargs = dict(model_dir=run.path, fresh_params=fresh, shardings=shardings,
                  vocab_axes=warm_start.vocabulary_axes(boxed))
    restored = warm_start.params_from_run(**kwargs, source_start=source_start)
    assert starts == [{"seed": 3, "init_checkpoint": None, "frozen": "(?!encoder_).*", "fingerprint": None}]
    for path, leaf in by_path(restored).items():
        expected = by_path(params if path.startswith("encoder_") else base)[path]
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(expected), err_msg=path)
    with pytest.raises(ValueError, match="leaves out its frozen parameters"):
        warm_start.params_from_run(**kwargs)
    run.write_start(seed=3, init_checkpoint=None, frozen="(?!encoder_|decoder_).*")  # the decoder is not frozen
    with pytest.raises(ValueError, match="does not hold this network's parameters"):
        warm_start.params_from_run(**kwargs, source_start=source_start)


def test_scan_layers_benchmark_reports_both_layouts():
    from gr_jax.tools.bench import scan_layers
    # One layer a stack: both stacks still scanned (a scan of length 1) and both layouts compiled, timed and reported,
    # in half the time of MICRO's 3 + 2 layers; and no dropout, whose masks' random bits add to both compiles (what
    # is checked here is the report, not the figures).
    config = dataclasses.replace(MICRO, num_encoder_layers=1, num_decoder_layers=1)
    result = scan_layers.run(config=config, batch=4, inputs=8, targets=4, steps=1)
    assert result["params"] == count(init(config, abstract=True))
    for key in ("unscanned_compile_s", "scanned_compile_s", "unscanned_steps_per_s", "scanned_steps_per_s"):
        assert result[key] > 0, key
    assert result["steps_per_s_ratio"] == result["scanned_steps_per_s"] / result["unscanned_steps_per_s"]
