"""Trainer and training loop: sharding, learning, exact resume, microbatches, NaN guard, entry points."""
import dataclasses
import io
import hashlib
import json
import math
import pathlib
import re
import shutil
import types

import jax
import numpy as np
import pytest

from gr_jax import actions
from gr_jax import checkpoints
from gr_jax import experiment as experiment_lib
from gr_jax import network
from gr_jax import optimizers
from gr_jax import partitioning
from gr_jax import training
from gr_jax.heads import AtomicHead, PawaHead
from gr_jax.models import EncoderDecoderModel
from gr_jax.run_dir import RunDir
from gr_jax.trainer import Trainer
from gr_jax.vocabulary import train_sentencepiece
from gr_jax.tools.bench.train_step import random_batch

from conftest import FIXTURES

FIXTURE_DATA = FIXTURES / "tasks"
# One layer a side: what these tests check (sharding, the loop, resume, microbatches) does not depend on depth, and
# compiling a layer less a side is most of a micro run's time on CPU. TINY keeps two, whose names the specs test lists.
MICRO = network.T5Config(vocab_size=384, emb_dim=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                         head_dim=8, mlp_dim=64, dropout_rate=0.1)
TINY = network.T5Config(vocab_size=384, emb_dim=256, num_heads=4, num_encoder_layers=2, num_decoder_layers=2,
                        head_dim=64, mlp_dim=512, dropout_rate=0.0)


def _batch(rng, *, batch=8, inputs=12, targets=6, vocab=384):
    return random_batch(rng, batch=batch, inputs=inputs, targets=targets, vocab=vocab)


def _trainer(config, *, mesh, batch=8, num_microbatches=1, lr=3e-3):
    schedule = optimizers.warmup_constant(peak=lr, warmup_steps=1)
    return Trainer(model=EncoderDecoderModel(config=config),
                   optimizer=optimizers.make_optimizer(name="adafactor", learning_rate=schedule), mesh=mesh,
                   input_length=12, target_length=6, batch_size=batch, num_microbatches=num_microbatches)


@pytest.fixture(scope="module")
def tiny_trainer() -> Trainer:
    """TINY's trainer on a 2 x 4 mesh (its init and train step compiled once for the tests below)."""
    return _trainer(TINY, mesh=partitioning.make_mesh(data=2, model=4))


def test_param_partition_specs_on_2x4_mesh(tiny_trainer):
    trainer = tiny_trainer
    expected = {"token_embedder": ("model", None), "logits_dense": (None, "model"), "query": (None, "model", None),
                "key": (None, "model", None), "value": (None, "model", None), "out": ("model", None, None),
                "wi_0": (None, "model"), "wi_1": (None, "model"), "wo": ("model", None), "scale": (None,),
                "rel_embedding": ("model", None)}
    state = trainer.init_state(jax.random.PRNGKey(0))
    flat = jax.tree_util.tree_flatten_with_path(state.params)[0]
    assert len(flat) == 2 + 2 + 2 * (4 * 1 + 3 + 2) + 2 * (4 * 2 + 3 + 3) + 2
    for path, leaf in flat:
        name = path[-1].key
        want = expected[name]
        spec = tuple(leaf.sharding.spec) + (None,) * (leaf.ndim - len(leaf.sharding.spec))
        assert spec == want, (path, leaf.sharding)
        # The abstract state carries the same shardings the init produced.
    abstract = jax.tree_util.tree_flatten_with_path(trainer.abstract_state.params)[0]
    for (_, a), (_, b) in zip(abstract, flat):
        assert a.sharding == b.sharding


def test_given_parameters_replace_the_initialisers_and_leave_the_rest_as_it_gives_them(tiny_trainer):
    """`init_state(rng, given=...)` (how pretrained towers start) equals the full init with those subtrees swapped,
    bit for bit and on the same shardings, optimizer state included; a wrong name or shape is refused."""
    trainer = tiny_trainer
    abstract = trainer.abstract_state.params["encoder_layers_0"]
    loaded = jax.tree.map(lambda a: jax.device_put(np.full(a.shape, 0.5, a.dtype), a.sharding), abstract)
    state = trainer.init_state(jax.random.PRNGKey(0), given={"encoder_layers_0": loaded})
    full = trainer.init_state(jax.random.PRNGKey(0))
    expected = full.replace(params={**full.params, "encoder_layers_0": loaded})
    flat, want = (jax.tree_util.tree_flatten_with_path(tree)[0] for tree in (state, expected))
    assert [path for path, _ in flat] == [path for path, _ in want]
    for (path, leaf), (_, other) in zip(flat, want):
        assert leaf.sharding == other.sharding, path
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(other), err_msg=str(path))
    with pytest.raises(ValueError, match="no such subtree"):
        trainer.init_state(jax.random.PRNGKey(0), given={"tower": loaded})
    with pytest.raises(ValueError, match="not shaped as"):
        trainer.init_state(jax.random.PRNGKey(0), given={"decoder_norm": loaded})


def test_train_steps_on_tiny_lower_the_loss(tiny_trainer):
    trainer = tiny_trainer
    state = trainer.init_state(jax.random.PRNGKey(0))
    batch = _batch(np.random.default_rng(0))
    rng = jax.random.PRNGKey(1)
    losses = []
    for _ in range(8):
        state, metrics = trainer.train_step(state, batch, rng)
        losses.append(float(metrics["loss"].total / metrics["loss"].count))
    assert int(state.step) == 8
    assert losses[-1] < 0.7 * losses[0], losses
    assert all(math.isfinite(x) for x in losses)


def test_microbatches_give_the_same_update_as_one_batch():
    config = network.T5Config(**{**MICRO.__dict__, "dropout_rate": 0.0})
    mesh = partitioning.make_mesh(data=4, model=2)
    batch = _batch(np.random.default_rng(3))
    batch["decoder_loss_weights"][:3, 4:] = 0  # unequal token counts per microbatch: normalisation matters
    results = []
    for micro in (1, 2):
        trainer = _trainer(config, mesh=mesh, num_microbatches=micro)
        state = trainer.init_state(jax.random.PRNGKey(0))
        state, metrics = trainer.train_step(state, batch, jax.random.PRNGKey(1))
        results.append((jax.device_get(state.params), float(metrics["loss"].total)))
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(results[0][0]), jax.tree.leaves(results[1][0])):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)


def test_bad_batch_sizes_are_rejected():
    mesh = partitioning.make_mesh(data=8, model=1)
    with pytest.raises(ValueError, match="not divisible by the 'data' mesh axis"):
        _trainer(MICRO, mesh=mesh, batch=12)
    with pytest.raises(ValueError, match="num_microbatches"):
        _trainer(MICRO, mesh=mesh, batch=16, num_microbatches=3)


# --- The loop, on a real (fixture) data dir --------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("data") / "fixture"
    shutil.copytree(FIXTURE_DATA, path)
    _train_vocabulary(path, vocab_size=320)
    return path


def _train_vocabulary(path: pathlib.Path, *, vocab_size: int) -> None:
    """`path/spm.model`: SentencePiece of the data dir's documents and training queries."""
    texts = [line.split("\t", 1)[1] for name in ("collection.tsv", "queries.train.tsv")
             for line in (path / name).read_text().splitlines()]
    train_sentencepiece(texts=texts * 3, model_path=path / "spm.model", vocab_size=vocab_size)


def _experiment(data_dir, model_dir, *, dropout=0.1, lr=3e-3, name="fixture"):
    return experiment_lib.Experiment(
        model_dir=str(model_dir),
        dataset=experiment_lib.DatasetConfig(name=name, data_dir=str(data_dir), input_length=16, target_length=12),
        network_config=network.T5Config(**{**MICRO.__dict__, "vocab_size": None, "dropout_rate": dropout}),
        learning_rate=optimizers.warmup_constant(peak=lr, warmup_steps=2), batch_size=8, mesh_data=4,
        mesh_model=2)


NO_EVAL = training.EvalConfig(every_steps=-1)


def _records(model_dir) -> dict[int, list[str]]:
    """Step -> example fingerprints of the step's batch (`training.train(record_examples=True)`), the last record of
    each step (a step re-run after a restart is recorded again)."""
    lines = (pathlib.Path(model_dir) / "train_examples-0-of-1.jsonl").read_text().splitlines()
    return {record["step"]: record["examples"] for record in map(json.loads, lines)}


def test_resume_equals_uninterrupted_run(data_dir, tmp_path, caplog):
    def run(experiment, steps):
        training.train(experiment=experiment, num_train_steps=steps, checkpoint_every_steps=3, eval_config=NO_EVAL,
                       progress=False, record_examples=True)

    straight = _experiment(data_dir, tmp_path / "straight")
    run(straight, 7)
    resumed = _experiment(data_dir, tmp_path / "resumed")
    run(resumed, 5)  # checkpoints 3 and 5 (the last step), each with its input iterator state
    state_file = tmp_path / "resumed" / "checkpoints" / "5" / checkpoints.INPUT_ITERATOR_ITEM / "train_ds-0-of-1.json"
    assert json.loads(state_file.read_text())["state"] is True
    # A checkpoint from before the iterator state was kept: the same resume, by re-reading the input.
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "resumed", old)
    shutil.rmtree(old / "checkpoints" / "5" / checkpoints.INPUT_ITERATOR_ITEM)
    # A new process would rebuild everything: so do we, then continue from the checkpoint and its input position.
    with caplog.at_level("INFO"):
        run(resumed, 7)
    assert "Restored the input iterator of step 5" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        run(_experiment(data_dir, old), 7)
    assert "has no input iterator state" in caplog.text
    straight_built = straight.build()
    a, _ = straight_built.restore()
    for model_dir in (tmp_path / "resumed", old):
        b, input_state = _experiment(data_dir, model_dir).build().restore()
        assert int(a.step) == int(b.step) == 7
        assert input_state == {"batches_consumed": 7, "seed": 0, "batch_size": 8, "num_processes": 1,
                               "inputs": straight_built.input_fingerprint()}
        for x, y in zip(jax.tree.leaves(jax.device_get(a)), jax.tree.leaves(jax.device_get(b))):
            np.testing.assert_array_equal(x, y)
        assert _records(model_dir) == _records(tmp_path / "straight") and sorted(_records(model_dir)) == [
            *range(1, 8)]


def test_a_checkpoint_is_never_read_with_a_rebuilt_vocabulary(data_dir, tmp_path):
    """Each checkpoint saves the sha256 of the vocabulary file and of the docid table's tokens; after the data dir's
    SentencePiece model is trained again (other piece ids), evaluating or resuming the run is an error, not a
    model reading token ids that now mean other pieces."""
    own = tmp_path / "data"
    shutil.copytree(data_dir, own)
    experiment = _experiment(own, tmp_path / "run", name="fixture_first_vocabulary")
    training.train(experiment=experiment, num_train_steps=2, checkpoint_every_steps=2, eval_config=NO_EVAL,
                   progress=False)
    built = experiment.build()
    _, input_state = built.restore()
    assert input_state["inputs"]["vocabulary"] == hashlib.sha256((own / "spm.model").read_bytes()).hexdigest()
    assert set(input_state["inputs"]) == {"vocabulary", "docid table"}
    assert built.restore_params()[1] == 2
    _train_vocabulary(own, vocab_size=330)  # other pieces, other ids
    rebuilt = _experiment(own, tmp_path / "run", name="fixture_second_vocabulary")  # its tasks mean other ids
    with pytest.raises(ValueError, match=r"checkpoints/2: the checkpoint was trained on other vocabulary"):
        rebuilt.build().restore_params()
    with pytest.raises(ValueError, match="the data dir was rebuilt since"):
        training.train(experiment=rebuilt, num_train_steps=4, checkpoint_every_steps=2, eval_config=NO_EVAL,
                       progress=False)


def test_resume_position_refuses_another_seed_and_keeps_the_example_across_batch_sizes():
    run = types.SimpleNamespace(seed=0, batch_size=8)
    assert training.resume_position({"batches_consumed": 6, "seed": 0}, experiment=run, where="ckpt") == (6, True)
    assert training.resume_position({"batches_consumed": 6, "seed": 0, "batch_size": 8}, experiment=run,
                                    where="ckpt") == (6, True)
    # 6 batches of 4 are 24 examples: 3 batches of 8, read again (the iterator state is for batches of 4).
    assert training.resume_position({"batches_consumed": 6, "seed": 0, "batch_size": 4}, experiment=run,
                                    where="ckpt") == (3, False)
    with pytest.raises(ValueError, match="ckpt: the run consumed 5 batches of 4 examples \\(20\\), not a whole number"):
        training.resume_position({"batches_consumed": 5, "seed": 0, "batch_size": 4}, experiment=run, where="ckpt")
    with pytest.raises(ValueError, match="ckpt: the run consumed 6 batches of the seed-1 example stream"):
        training.resume_position({"batches_consumed": 6, "seed": 1}, experiment=run, where="ckpt")


def test_non_finite_loss_stops_training_and_keeps_last_good_checkpoint(data_dir, tmp_path):
    experiment = _experiment(data_dir, tmp_path / "nan", lr=1e30)
    with pytest.raises(actions.NonFiniteLossError, match="last good checkpoint"):
        training.train(experiment=experiment, num_train_steps=40, checkpoint_every_steps=1, log_every_steps=1,
                       eval_config=NO_EVAL, progress=False)
    state, _ = experiment.build().restore()
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.device_get(state.params)))


def test_model_selection_stops_after_patience_and_reports_the_best_state(data_dir, tmp_path):
    # Learning rate 1e-30: the parameters never change (in float32), so the second selection evaluation ties
    # the first (no improvement) and patience 1 stops training at step 4 of 8; step 2 stays the selected state.
    experiment = _experiment(data_dir, tmp_path / "run", lr=1e-30)
    config = training.EvalConfig(every_steps=2, num_beams=4, batch_size=8, select_split="train", patience=1)
    final = training.train(experiment=experiment, num_train_steps=8, checkpoint_every_steps=2, eval_config=config,
                           progress=False)
    selection = json.loads((tmp_path / "run" / "selection.json").read_text())
    assert [step for step, _ in selection["history"]] == [2, 4]
    assert selection["history"][0][1] == selection["history"][1][1] == selection["best_value"]
    assert (selection["best_step"], selection["stopped"]) == (2, True)
    assert (final["select/best_step"], final["select/stopped_at"]) == (2, 4)
    built = experiment.build()
    assert built.checkpointer.latest_step() == 4  # the early stop saved where it stopped
    best, _ = checkpoints.Checkpointer(tmp_path / "run" / "best").restore(abstract_state=built.trainer.abstract_state)
    kept, _ = built.restore(2)
    assert int(best.step) == 2
    for a, b in zip(jax.tree.leaves(jax.device_get(best.params)), jax.tree.leaves(jax.device_get(kept.params))):
        np.testing.assert_array_equal(a, b)
    # The reported metrics are the eval split's, for the selected state. Once step 2 has rotated out of
    # checkpoints/, evaluating it reads the selected state from best/ (bit-identical to checkpoint 2, checked above):
    # one evaluation checks both.
    def retrieval(metrics, prefix=""):  # timings left out
        return {k: v for k, v in metrics.items() if k.startswith(prefix) and "second" not in k}

    shutil.rmtree(tmp_path / "run" / "checkpoints" / "2")
    assert 2 not in experiment.build().checkpointer.all_steps()
    reported = retrieval(training.evaluate(experiment=experiment, eval_config=config, step=2, progress=False))
    assert len(reported) >= 4 and retrieval(final, "eval/") == {f"eval/{k}": v for k, v in reported.items()}
    with pytest.raises(FileNotFoundError, match="no checkpoint of step 3"):
        experiment.build().restore_params(3)
    # A stopped run stays stopped when started again, and reports the same.
    again = training.train(experiment=experiment, num_train_steps=8, checkpoint_every_steps=2, eval_config=config,
                           progress=False)
    assert built.checkpointer.latest_step() == 4
    assert retrieval(again, "eval/") == retrieval(final, "eval/") and retrieval(again, "select/") == retrieval(
        final, "select/")
    # It trained no step, and kept the training metrics of the run it repeats (they were replaced by none).
    assert again["train/loss"] == final["train/loss"]
    assert json.loads((tmp_path / "run" / "final_metrics.json").read_text()) == again


def test_model_selection_record_keeps_the_first_best_and_resumes_from_its_checkpoint(tmp_path):
    path = tmp_path / "selection.json"
    selection = actions.ModelSelection.load(path, split="valid", metric="MRR@10", resumed_step=0, patience=2)
    assert [selection.record(step, value) for step, value in ((2, 0.1), (4, 0.3), (6, 0.3), (8, 0.2))] == [
        True, True, False, False]
    assert (selection.best_step, selection.best_value, selection.evaluations_since_best) == (4, 0.3, 2)
    assert selection.stopped  # two evaluations without improvement: patience 2 ran out
    selection.save()
    # Resumed from the step-6 checkpoint: the step-8 evaluation will be redone, so it is dropped (and the
    # stop with it); the best state on disk stays the best.
    resumed = actions.ModelSelection.load(path, split="valid", metric="MRR@10", resumed_step=6, patience=2)
    assert resumed.history == [(2, 0.1), (4, 0.3), (6, 0.3)] and not resumed.stopped
    assert (resumed.best_step, resumed.evaluations_since_best) == (4, 1)
    with pytest.raises(ValueError, match="selects on MRR@10 of split 'valid'"):
        actions.ModelSelection.load(path, split="dev", metric="MRR@10", resumed_step=6)


def test_model_selection_needs_periodic_evaluation():
    with pytest.raises(ValueError, match="needs periodic evaluation"):
        training.EvalConfig(select_split="valid")
    with pytest.raises(ValueError, match="patience=2 needs a select_split"):
        training.EvalConfig(every_steps=10, patience=2)


@pytest.mark.parametrize("head", ["atomic", "pawa"])
def test_docid_head_range_is_filled_from_the_docid_table(data_dir, tmp_path, head):
    experiment = _experiment(data_dir, tmp_path)
    experiment = dataclasses.replace(
        experiment, dataset=dataclasses.replace(experiment.dataset, docid_scheme="atomic"),
        head={"atomic": AtomicHead(), "pawa": PawaHead()}[head])
    built = experiment.build()
    num_docs = len((data_dir / "collection.tsv").read_text().splitlines())
    cfg, built_head = built.model.config, built.model.head
    # Atomic docid i is token 320 + i (the SentencePiece model has 320 pieces): exactly the table's tokens.
    assert (built_head.docid_vocab_start, built_head.docid_vocab_size) == (320, num_docs)
    assert cfg.vocab_size >= 320 + num_docs
    # A range fixed in gin must contain the table's tokens.
    narrow = dataclasses.replace(experiment, head=dataclasses.replace(
        experiment.head, docid_vocab_start=321, docid_vocab_size=num_docs))
    with pytest.raises(ValueError, match=r"docid tokens \[320, .*outside the .* head's range \[321"):
        narrow.build()


def test_indexing_run_starts_from_a_continued_pretraining_run(data_dir, tmp_path):
    from gr_jax import warm_start
    from gr_jax.partitioning import path_str
    # The span corruption run's checkpoint (its data is checked in test_tasks; training it adds nothing here).
    pretrain = _experiment(data_dir, tmp_path / "pt")
    pretrain = dataclasses.replace(pretrain, dataset=dataclasses.replace(pretrain.dataset, row="span_corruption"))
    built = pretrain.build()
    built.checkpointer.save(3, state=built.trainer.init_state(jax.random.PRNGKey(3)),
                            input_state={"batches_consumed": 3, "seed": 0})
    built.checkpointer.wait_until_finished()
    source = {path_str(p): x for p, x in jax.tree_util.tree_leaves_with_path(jax.device_get(built.restore()[0].params))}
    assert RunDir.of(tmp_path / "pt").is_run() and not RunDir.of(data_dir).is_run()  # vs a Hugging Face dir

    def started(experiment):
        built = experiment.build()
        fresh = built.trainer.init_state(jax.random.PRNGKey(7))
        fresh_params = {path_str(p): x for p, x in jax.tree_util.tree_leaves_with_path(jax.device_get(fresh.params))}
        state = warm_start.initialize_from_run(state=fresh, trainer=built.trainer, model_dir=tmp_path / "pt", seed=7)
        assert int(state.step) == 0
        return fresh_params, {path_str(p): x for p, x in jax.tree_util.tree_leaves_with_path(
            jax.device_get(state.params))}

    # The same network and vocabulary (naive docids; the sentinels are in every run's vocabulary): all copied.
    _, params = started(dataclasses.replace(pretrain, dataset=dataclasses.replace(pretrain.dataset,
                                                                                  row="firstp_labeled")))
    assert params.keys() == source.keys()
    for path in source:
        np.testing.assert_array_equal(params[path], source[path], err_msg=path)

    # A larger vocabulary (here fixed at 512; e.g. many atomic docid tokens after the pieces): the embedding keeps
    # the source's rows and the rows beyond come from the fresh init; the atomic head, which the source lacks and
    # which replaces the output layer, is fresh.
    atomic = _experiment(data_dir, tmp_path / "atomic")
    atomic = dataclasses.replace(atomic, dataset=dataclasses.replace(atomic.dataset, docid_scheme="atomic"),
                                 network_config=dataclasses.replace(atomic.network_config, vocab_size=512),
                                 head=AtomicHead())
    fresh, params = started(atomic)
    rows = source["token_embedder"].shape[0]
    assert (rows, params["token_embedder"].shape[0]) == (384, 512)
    np.testing.assert_array_equal(params["token_embedder"][:rows], source["token_embedder"])
    np.testing.assert_array_equal(params["token_embedder"][rows:], fresh["token_embedder"][rows:])
    heads = [path for path in params if path.startswith("atomic_logits_dense")]
    assert heads and all(np.array_equal(params[path], fresh[path]) for path in heads)

    # Another MLP width is another network; a smaller vocabulary would drop trained rows: both refused (checked on
    # shapes alone, before any value is read).
    for name, change in (("wider", {"mlp_dim": 96}), ("smaller", {"vocab_size": 330})):
        other = _experiment(data_dir, tmp_path / name)
        other = dataclasses.replace(other, network_config=dataclasses.replace(other.network_config, **change))
        trainer = other.build().trainer
        boxed = jax.eval_shape(lambda: trainer.model.init(jax.random.PRNGKey(0), input_length=16,
                                                          target_length=12))["params"]
        with pytest.raises(ValueError, match=r"does not hold this network's parameters: 0 missing .* 0 not in this "
                                             r"network \[\], [1-9]\d* with other shapes"):
            warm_start.params_from_run(model_dir=tmp_path / "pt", fresh_params=trainer.abstract_state.params,
                                       shardings=trainer.state_shardings.params,
                                       vocab_axes=warm_start.vocabulary_axes(boxed))


def test_train_eval_search_entry_points(data_dir, tmp_path, capsys, monkeypatch):
    from gr_jax import eval as eval_main
    from gr_jax import search
    from gr_jax import train as train_main
    model_dir = tmp_path / "run"
    common = [f"--gin.DATA_DIR='{data_dir}'", f"--gin.MODEL_DIR={model_dir}", "--gin.DATASET_NAME='fixture'",
              "--gin.INPUT_LENGTH=16", "--gin.TARGET_LENGTH=12", "--gin.BATCH_SIZE=8",
              "--gin.training.EvalConfig.num_beams=4", "--gin.training.EvalConfig.batch_size=8"]
    # tiny.gin sized down to MICRO on _experiment's mesh and schedule: the run's train step and decoding are the
    # programs the tests above compiled (cache hits); what is checked here is the entry points around them.
    micro = [f"--gin.network.T5Config.{name}={getattr(MICRO, name)}" for name in (
        "emb_dim", "num_heads", "num_encoder_layers", "num_decoder_layers", "head_dim", "mlp_dim")]
    import gin
    gin.clear_config()
    train_main.main(["--gin_file=runs/train.gin", "--gin_file=models/t5_1_1/tiny.gin", "--gin.TRAIN_STEPS=2",
                     *micro, "--gin.LEARNING_RATE=3e-3", "--gin.WARMUP_STEPS=2",
                     "--gin.experiment.Experiment.mesh_data=4", "--gin.experiment.Experiment.mesh_model=2", *common])
    final = json.loads((model_dir / "final_metrics.json").read_text())
    assert final["eval/num_queries"] == 4  # every dev query of the fixture was ranked
    assert final["eval/invalid_docid_rate"] == 0.0  # constrained decoding
    assert (model_dir / "run.dev.2.trec").exists() and (model_dir / "config.gin").exists()
    assert list((model_dir).glob("events.out.tfevents*")) or list(model_dir.rglob("*tfevents*"))

    gin.clear_config()
    eval_main.main(["--gin_file", str(model_dir / "config.gin"), "--gin.training.EvalConfig.constrained=False"])
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["num_queries"] == 4 and 0.0 <= metrics["invalid_docid_rate"] <= 1.0

    gin.clear_config()
    search.main(["--model_dir", str(model_dir), "--top_k", "3", "--num_beams", "4", "sourdough bread"])
    out = capsys.readouterr().out
    assert "query: sourdough bread" in out and "  1. " in out
    assert "(not a docid of the corpus)" not in out

    # Without query arguments: one query per line of standard input, each answered with its latency; decoding is
    # compiled for the first query only.
    gin.clear_config()
    monkeypatch.setattr("sys.stdin", io.StringIO("sourdough bread\n\nrye\nwhite rice\n"))
    search.main(["--model_dir", str(model_dir), "--top_k", "3", "--num_beams", "4"])
    out, err = capsys.readouterr()
    assert [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("query: ")] == [
        "sourdough bread", "rye", "white rice"]
    assert "line 2 is blank: nothing to rank" in err
    latencies = [line for line in out.splitlines() if line.startswith("latency: ")]
    assert len(latencies) == 3 and "(compiled decoding" in latencies[0]
    assert not any("compiled" in line for line in latencies[1:])
    assert "(not a docid of the corpus)" not in out


def test_a_run_reads_its_docid_table_once_and_builds_one_trie(data_dir, tmp_path, monkeypatch):
    """Task registration, the model builder and both evaluators (model selection's split and the eval split)
    share the run's DocidSpace: one read (or build) of the table, one trie."""
    from gr_jax.docids import DocidTable, Trie
    from gr_jax.docids.schemes.naive import NaiveScheme
    reads, tries = [], []
    load, build, build_trie = DocidTable.load.__func__, NaiveScheme.build, Trie.build.__func__
    monkeypatch.setattr(DocidTable, "load", classmethod(lambda cls, path: reads.append(path) or load(cls, path)))
    monkeypatch.setattr(NaiveScheme, "build", lambda self, **kwargs: reads.append("built") or build(self, **kwargs))
    monkeypatch.setattr(Trie, "build", classmethod(lambda cls, *args, **kwargs: tries.append(1) or build_trie(
        cls, *args, **kwargs)))
    experiment = _experiment(data_dir, tmp_path / "once")
    config = training.EvalConfig(every_steps=1, num_beams=4, batch_size=8, select_split="train", patience=5)
    final = training.train(experiment=experiment, num_train_steps=2, checkpoint_every_steps=2, eval_config=config,
                           progress=False)
    assert final["eval/num_queries"] == 4 and final["select/best_step"] in (1, 2)
    assert len(reads) == 1 and len(tries) == 1


def test_unknown_gin_binding_is_reported():
    import gin
    from gr_jax import train as train_main
    gin.clear_config()
    # Bad input ends with one line naming it, and exit status 1 (gr_jax.entry_point), not a traceback.
    with pytest.raises(SystemExit, match="^error: .*(No configurable matching 'T5Config.no_such_knob'|no_such_knob)"):
        train_main.main(["--gin_file=runs/train.gin", "--gin.network.T5Config.no_such_knob=3"])


@pytest.mark.parametrize("also_set", [True, False])
def test_a_misspelt_macro_is_one_line_naming_it(data_dir, tmp_path, also_set):
    """`--gin.TRAIN_STEPZ=5` defined a macro nothing used, and the run trained for its configured steps; now the
    run stops before any work, and nothing is written. Where the misspelling leaves a required macro unset, the
    misspelling is named, not gin's `TRAIN_STEPS set to %gin.REQUIRED`."""
    import gin
    from gr_jax import train as train_main
    gin.clear_config()
    with pytest.raises(SystemExit, match=r"^error: the binding of macro TRAIN_STEPZ \(TRAIN_STEPZ\) is used by none "
                                         r"of the gin files \['runs/train.gin'\]: did you mean TRAIN_STEPS\?$"):
        train_main.main(["--gin_file=runs/train.gin", f"--gin.DATA_DIR='{data_dir}'", "--gin.DATASET_NAME='fixture'",
                         f"--gin.MODEL_DIR='{tmp_path / 'run'}'", *(["--gin.TRAIN_STEPS=2"] if also_set else []),
                         "--gin.TRAIN_STEPZ=5"])
    gin.clear_config()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("steps, shown", [("-5", "-5"), ("abc", "'abc'"), ("2.5", "2.5")])
def test_a_bad_number_of_steps_is_one_line_before_any_work(data_dir, tmp_path, steps, shown):
    """TRAIN_STEPS=-5 trained nothing and exited 0 with an untrained step 0 saved; a word or a fraction failed late:
    now each ends at once with the binding named, and nothing is written."""
    import gin
    from gr_jax import train as train_main
    gin.clear_config()
    model_dir = tmp_path / "run"
    with pytest.raises(SystemExit, match=rf"^error: training\.train\.num_train_steps \(TRAIN_STEPS\) must be a whole "
                                         rf"number >= 0, got {re.escape(shown)}$"):
        train_main.main(["--gin_file=runs/train.gin", "--gin_file=models/t5_1_1/tiny.gin",
                         f"--gin.TRAIN_STEPS={steps}", f"--gin.DATA_DIR='{data_dir}'", f"--gin.MODEL_DIR='{model_dir}'",
                         "--gin.DATASET_NAME='fixture'"])
    gin.clear_config()
    assert not model_dir.exists()


def test_logical_axis_rules_chosen_for_an_experiment_shard_its_parameters(data_dir, tmp_path):
    """2-D parameter sharding: rules given to the experiment (gin: `experiment.Experiment.rules`) reach the trainer,
    its parameter shardings and the retriever; the default rules shard `embed` nowhere."""
    import dataclasses
    from gr_jax import partitioning
    two_d = tuple((axis, "data" if axis == "embed" else target) for axis, target in partitioning.LOGICAL_AXIS_RULES)
    default = _experiment(data_dir, tmp_path / "default").build()
    built = dataclasses.replace(_experiment(data_dir, tmp_path / "2d"), rules=two_d).build()
    assert built.trainer.rules == two_d
    spec = lambda b: b.trainer.state_shardings.params["encoder_layers_0"]["mlp"]["wi_0"].spec  # noqa: E731
    assert tuple(spec(default)) == (None, "model") and tuple(spec(built)) == ("data", "model")
