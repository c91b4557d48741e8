"""A new output head is one module that nothing else names: this file defines one with a setting of its own (a scale
of its logits, the inverse of a softmax temperature), binds it in gin as HEAD, trains it with `gr_jax.train` and
evaluates the run with `gr_jax.eval` from the config.gin the run wrote. No other file is edited for it.

Also here: a run's config.gin written before heads owned their settings (`network.T5Config.decoder_head = 'pawa'`,
`network.T5Config.pawa_num_layers = ...`) still builds its experiment (`gin_utils.migrate_head_bindings`).
"""
import dataclasses
import json
import pathlib

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax import gin_utils
from gr_jax import network
from gr_jax.heads import AtomicHead, PawaHead, StandardHead
from gr_jax.heads.standard import StandardLayer
from gr_jax.models import EncoderDecoderModel

from conftest import FIXTURES


# --- The new head: what a user writes -------------------------------------------------------------------------------


class ScaledLayer(StandardLayer):
    """T5.1.1's projection, its logits multiplied by the head's `scale`."""

    def project(self, states):
        return self.head.scale * super().project(states)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScaledHead(StandardHead):
    """T5.1.1's output layer with logits scaled by `scale` (1 / temperature): the same parameters as the standard
    head (so a pretrained lm_head still fills `logits_dense`), a sharper or flatter softmax."""

    scale: float = 1.0

    layer_class = ScaledLayer

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.scale > 0:
            raise ValueError(f"ScaledHead.scale must be > 0, got {self.scale}")


HEAD_GIN = """from __gin__ import dynamic_registration
import test_custom_head

LOGIT_SCALE = 2.0
HEAD = @test_custom_head.ScaledHead()
test_custom_head.ScaledHead.scale = %LOGIT_SCALE
"""


# --- It plugs in -----------------------------------------------------------------------------------------------------


MICRO = network.T5Config(vocab_size=128, emb_dim=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                         head_dim=8, mlp_dim=64, dropout_rate=0.0)


def test_the_scaled_head_scales_the_standard_logits_with_the_same_parameters():
    with pytest.raises(ValueError, match="scale must be > 0"):
        ScaledHead(scale=0.0)
    scaled, standard = (EncoderDecoderModel(config=MICRO, head=ScaledHead(scale=2.5)),
                        EncoderDecoderModel(config=MICRO))
    params = jax.jit(lambda: standard.init(jax.random.PRNGKey(0), input_length=6, target_length=4))()["params"]
    # The trees' shapes (op by op, the scaled model's initialiser would compile each of its ops on its own).
    assert jax.tree.structure(jax.eval_shape(lambda: scaled.init(jax.random.PRNGKey(0), input_length=6,
                                                                 target_length=4))["params"]) == \
        jax.tree.structure(params)
    queries = jax.random.randint(jax.random.PRNGKey(1), (2, 6), 3, 128)
    targets = np.array([[5, 6, 1, 0], [7, 1, 0, 0]], np.int32)
    inputs = np.concatenate([np.zeros((2, 1), np.int32), targets[:, :-1]], axis=1)
    logits = jax.jit(lambda p: (scaled.module.apply({"params": p}, queries, inputs),
                                standard.module.apply({"params": p}, queries, inputs)))(params)
    np.testing.assert_allclose(logits[0], 2.5 * logits[1], rtol=1e-6)
    # Scoring and decoding go through the head: the score is the log-softmax of the scaled logits, and beam search
    # ranks by it (a finished beam's score is its teacher-forced score).
    # Each query's row three times: the beams' rescoring below has the same shapes (one compiled score_batch).
    batch = {"encoder_input_tokens": jnp.repeat(queries, 3, axis=0), "decoder_input_tokens": np.repeat(inputs, 3, 0),
             "decoder_target_tokens": np.repeat(targets, 3, axis=0)}
    log_p = np.asarray(jax.nn.log_softmax(2.5 * logits[1]))
    expected = [float(sum(log_p[i, t, targets[i, t]] for t in range(4) if targets[i, t] > 0)) for i in range(2)]
    score_batch = jax.jit(scaled.score_batch)
    np.testing.assert_allclose(score_batch(params, batch), np.repeat(expected, 3), rtol=1e-5)
    result = jax.jit(lambda p, q: scaled.predict_batch(p, q, num_beams=3, max_decode_len=4))(params, queries)
    rescored = score_batch(params, {
        "encoder_input_tokens": jnp.repeat(queries, 3, axis=0), "decoder_target_tokens": result.sequences.reshape(6, 4),
        "decoder_input_tokens": jnp.pad(result.sequences.reshape(6, 4)[:, :-1], ((0, 0), (1, 0)))})
    sequences = np.asarray(result.sequences).reshape(6, 4)
    # Beams that end with EOS within 4 tokens and hold no PAD before it (teacher forcing does not score a PAD).
    finished = np.array([1 in row and 0 not in row[:list(row).index(1)] for row in sequences])
    assert finished.any()
    np.testing.assert_allclose(np.asarray(result.scores).reshape(6)[finished], np.asarray(rescored)[finished],
                               atol=1e-4)


def test_a_head_bound_in_gin_trains_and_evaluates_through_the_entry_points(spm_data_dir, tmp_path, capsys):
    data_dir = spm_data_dir
    from gr_jax import eval as eval_main
    from gr_jax import train as train_main
    head_gin = tmp_path / "scaled_head.gin"
    head_gin.write_text(HEAD_GIN)
    model_dir = tmp_path / "run"
    gin.clear_config()
    train_main.main(["--gin_file=runs/train.gin", "--gin_file=models/t5_1_1/tiny.gin", f"--gin_file={head_gin}",
                     "--gin.TRAIN_STEPS=2", "--gin.network.T5Config.num_encoder_layers=1",
                     "--gin.network.T5Config.num_decoder_layers=1", f"--gin.DATA_DIR='{data_dir}'",
                     f"--gin.MODEL_DIR={model_dir}", "--gin.DATASET_NAME='custom_head'", "--gin.INPUT_LENGTH=16",
                     "--gin.TARGET_LENGTH=12", "--gin.BATCH_SIZE=8", "--gin.training.EvalConfig.num_beams=4",
                     "--gin.training.EvalConfig.batch_size=8", "--gin.LOGIT_SCALE=3.0",
                     # Evaluated once, by gr_jax.eval below from the run's config.gin (what this test is about):
                     # an evaluation at the end of training too would compile and run the same search twice.
                     "--gin.training.EvalConfig.every_steps=-1"])
    assert (model_dir / "final_metrics.json").exists()
    written = (model_dir / "config.gin").read_text()
    assert "HEAD = @test_custom_head.ScaledHead()" in written and "LOGIT_SCALE = 3.0" in written

    # The run as eval rebuilds it from its config.gin: the head with its setting, trained parameters whose logits
    # are 3x the standard head's.
    gin.clear_config()
    try:
        gin_utils.parse_run_config(model_dir, missing="train first")
        experiment = gin.query_parameter("%EXPERIMENT").scoped_configurable_fn()
    finally:
        gin.clear_config()
    assert experiment.head == ScaledHead(scale=3.0)
    built = experiment.build()
    params, step = built.restore_params()
    assert step == 2 and built.model.head == ScaledHead(scale=3.0)
    queries = jnp.full((1, 16), 5, jnp.int32)
    inputs = jnp.zeros((1, 3), jnp.int32)
    standard = dataclasses.replace(built.model, head=StandardHead())
    scaled_logits, standard_logits = jax.jit(lambda p: (  # one program (op by op, each op compiles on its own)
        built.model.module.apply({"params": p}, queries, inputs), standard.module.apply({"params": p}, queries, inputs)
    ))(params)
    np.testing.assert_allclose(scaled_logits, 3.0 * standard_logits, rtol=1e-5)

    # gr_jax.eval from the run's config.gin decodes every dev query with the rebuilt head.
    capsys.readouterr()
    eval_main.main(["--gin_file", str(model_dir / "config.gin")])
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["num_queries"] == 4 and metrics["invalid_docid_rate"] == 0.0


# --- Run configs written before heads owned their settings -----------------------------------------------------------


OLD_CONFIGS = FIXTURES / "old_configs"  # config.gin files of runs trained by the code before (paths shortened)


def _experiment_of(model_dir: pathlib.Path, *gin_args: str):
    gin.clear_config()
    try:
        gin_utils.parse_run_config(model_dir, gin_args=gin_args, missing="no run")
        return gin.query_parameter("%EXPERIMENT").scoped_configurable_fn()
    finally:
        gin.clear_config()


def _run_dir(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.gin").write_text(text)
    return tmp_path / "run"


@pytest.mark.parametrize("name, experiment_class, head", [
    ("pawa", "Experiment", PawaHead()),
    ("atomic", "Experiment", AtomicHead()),
    ("gdr_pawa", "GdrExperiment", PawaHead()),
])
def test_old_run_configs_build_their_experiment_with_its_head(tmp_path, name, experiment_class, head):
    old = (OLD_CONFIGS / f"{name}.gin").read_text()
    assert "network.T5Config.decoder_head" in old  # as the code before wrote it
    experiment = _experiment_of(_run_dir(tmp_path, old))
    assert type(experiment).__name__ == experiment_class
    assert experiment.head == head  # the settings' macros are None there: the range comes from the docid space
    assert not hasattr(experiment.network_config, "decoder_head")
    assert experiment.network_config.emb_dim == 32 and experiment.network_config.dropout_rate == 0.1
    # An override on the command line still reaches the migrated head.
    if name != "atomic":
        assert _experiment_of(tmp_path / "run", "--gin.PAWA_NUM_LAYERS=2").head == PawaHead(num_layers=2)


def test_migration_rewrites_the_old_bindings_and_keeps_their_values():
    old = (OLD_CONFIGS / "pawa.gin").read_text().replace("PAWA_NUM_LAYERS = None", "PAWA_NUM_LAYERS = 3").replace(
        "network.T5Config.docid_vocab_start = %DOCID_VOCAB_START", "network.T5Config.docid_vocab_start = 320")
    migrated = gin_utils.migrate_head_bindings(old, source="run/config.gin")
    old_lines, new_lines = old.splitlines(), migrated.splitlines()
    # Every line keeps its number (errors name lines of the file as it is); the old bindings become comments.
    for number, line in enumerate(old_lines):
        if line.startswith(("network.T5Config.decoder_head", "network.T5Config.docid_vocab",
                            "network.T5Config.pawa_num_layers")):
            assert new_lines[number] == f"# migrated: {line}"
        else:
            assert new_lines[number] == line
    assert new_lines[len(old_lines):] == [
        "", "# Migrated by gr_jax.gin_utils.migrate_head_bindings: the output head is its own configurable.",
        "import gr_jax.heads.pawa", "HEAD = @gr_jax.heads.pawa.PawaHead()",
        "gr_jax.heads.pawa.PawaHead.docid_vocab_start = 320",
        "gr_jax.heads.pawa.PawaHead.docid_vocab_size = %DOCID_VOCAB_SIZE",
        "gr_jax.heads.pawa.PawaHead.num_layers = %PAWA_NUM_LAYERS", "experiment.Experiment.head = %HEAD"]
    assert gin_utils.migrate_head_bindings(migrated, source="x") == migrated  # nothing old left
    new = (gin_utils.GIN_CONFIGS_DIR / "decoders" / "pawa.gin").read_text()
    assert gin_utils.migrate_head_bindings(new, source="x") == new  # today's files are untouched


def test_migrated_values_reach_the_head(tmp_path):
    old = (OLD_CONFIGS / "pawa.gin").read_text()
    for macro, value in (("PAWA_NUM_LAYERS", 3), ("DOCID_VOCAB_START", 320), ("DOCID_VOCAB_SIZE", 70)):
        old = old.replace(f"{macro} = None", f"{macro} = {value}")
    experiment = _experiment_of(_run_dir(tmp_path, old))
    assert experiment.head == PawaHead(num_layers=3, docid_vocab_start=320, docid_vocab_size=70)


def test_an_old_standard_head_needs_no_binding_and_its_ignored_settings_go(tmp_path):
    old = (OLD_CONFIGS / "pawa.gin").read_text().replace("decoder_head = 'pawa'", "decoder_head = 'standard'")
    experiment = _experiment_of(_run_dir(tmp_path, old))
    assert experiment.head == StandardHead()  # the docid range and PAWA depth had no effect on the standard head


def test_old_bindings_that_cannot_be_migrated_are_one_clear_error(tmp_path):
    old = (OLD_CONFIGS / "pawa.gin").read_text()
    unknown = old.replace("decoder_head = 'pawa'", "decoder_head = 'adaptive'")
    line = next(i + 1 for i, text in enumerate(unknown.splitlines()) if "'adaptive'" in text)
    with pytest.raises(ValueError, match=rf"^run/config.gin:{line}: network.T5Config.decoder_head = 'adaptive' names "
                                         r"no head .*HEAD = @gr_jax.heads.pawa.PawaHead\(\)"):
        gin_utils.migrate_head_bindings(unknown, source="run/config.gin")
    block = "from __gin__ import dynamic_registration\nfrom gr_jax import network\n\nnetwork.T5Config:\n" \
            "  decoder_head = 'pawa'\n"
    with pytest.raises(ValueError, match=r"^my.gin:5: decoder_head is no longer a T5Config setting: .*"
                                         r"HEAD = @pawa.PawaHead\(\)"):
        gin_utils.migrate_head_bindings(block, source="my.gin")
    lone = "from __gin__ import dynamic_registration\nfrom gr_jax import network\n" \
           "network.T5Config.decoder_head = 'atomic'\n"
    with pytest.raises(ValueError, match=r"^decoders.gin:3: .*nothing here takes a network_config.*"
                                         r"HEAD = @gr_jax.heads.atomic.AtomicHead\(\)"):
        gin_utils.migrate_head_bindings(lone, source="decoders.gin")
    gin.clear_config()
    with pytest.raises(ValueError, match=r"^--gin bindings:1: decoder_head is no longer a T5Config setting"):
        gin_utils.parse_gin(gin_files=["runs/train.gin"], bindings=["network.T5Config.decoder_head = 'atomic'"])
    gin.clear_config()
