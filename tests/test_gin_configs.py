"""Every gin file parses and means what it says (a test per config file, as levanter does)."""

import gin
import pytest

from gr_jax import experiment as experiment_lib
from gr_jax import gin_utils
from gr_jax import network
from gr_jax.heads import PawaHead, StandardHead

GIN_DIR = gin_utils.GIN_CONFIGS_DIR
# T5.1.1 dimensions (emb, heads, layers per stack, mlp, head_dim): the published sizes, our CPU tiny, and the
# scaling grid's sizes with their non-embedding parameters (docs/scaling.md).
T5_1_1 = {"small": (512, 6, 8, 1024, 64), "base": (768, 12, 12, 2048, 64), "large": (1024, 16, 24, 2816, 64),
          "xl": (2048, 32, 24, 5120, 64), "xxl": (4096, 64, 24, 10240, 64), "tiny": (256, 4, 4, 512, 64),
          "p100k": (64, 2, 1, 128, 32), "p800k": (128, 4, 2, 256, 32), "p2m": (192, 3, 2, 384, 64),
          "p16m": (384, 6, 4, 1024, 64)}
NON_EMBEDDING = {"p100k": 98_880, "p800k": 788_224, "p2m": 1_771_968, "tiny": 6_297_344, "p16m": 16_523_904}


@pytest.fixture(autouse=True)
def _clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.mark.parametrize("size", sorted(T5_1_1))
def test_size_gins_set_only_dimensions(size):
    path = GIN_DIR / "models" / "t5_1_1" / f"{size}.gin"
    gin_utils.parse_gin(gin_files=[str(path)], bindings=[])
    config = gin.get_configurable(network.T5Config)()
    emb, heads, layers, mlp, head_dim = T5_1_1[size]
    assert (config.emb_dim, config.num_heads, config.num_encoder_layers, config.num_decoder_layers,
            config.mlp_dim, config.head_dim) == (emb, heads, layers, layers, mlp, head_dim)
    if size in NON_EMBEDDING:
        import dataclasses
        from gr_jax.tools.model_stats import non_embedding_param_count
        assert non_embedding_param_count(dataclasses.replace(config, vocab_size=2048)) == NON_EMBEDDING[size]
    defaults = network.T5Config()
    assert (config.dropout_rate, config.dtype, config.vocab_size) == (defaults.dropout_rate, defaults.dtype, None)
    bound = {line.split("=")[0].strip() for line in path.read_text().splitlines()
             if "=" in line and not line.startswith("#")}
    assert bound == {f"network.T5Config.{k}" for k in
                     ("emb_dim", "num_heads", "num_encoder_layers", "num_decoder_layers", "head_dim", "mlp_dim")}


@pytest.mark.parametrize("size", ["p100k", "p800k", "p2m", "p16m"])
def test_decoder_only_grid_sizes_match_the_t5_grid_in_non_embedding_parameters(size):
    """decoder_only/{size}.gin: the T5 size's width, heads and head size, twice its layers per stack and a wider
    MLP, within 0.2% of T5's non-embedding parameters (NON_EMBEDDING, which counts its norms and relative-position
    tables too) for the scaling comparison of experiment 1 (docs/decoder_only.md)."""
    config = gin_utils.decoder_only_config([f"decoder_only/{size}.gin"], vocab_size=2048)
    emb, heads, layers, mlp, head_dim = T5_1_1[size]
    assert (config.emb_dim, config.num_heads, config.num_kv_heads, config.head_dim, config.num_layers) == (
        emb, heads, heads, head_dim, 2 * layers)
    assert config.mlp_dim == round(mlp + 2 * heads * head_dim / 3)  # absorbs the decoder's cross-attention
    assert abs(config.non_embedding_params() - NON_EMBEDDING[size]) <= 0.002 * NON_EMBEDDING[size]
    assert config.tie_embeddings and config.dropout_rate == 0.0


def test_train_gin_requires_its_macros():
    from gr_jax import training  # noqa: F401  (registers nothing: dynamic registration happens in the gin file)
    with pytest.raises(ValueError, match="MODEL_DIR.*gin.REQUIRED"):
        gin_utils.parse_gin(gin_files=["runs/train.gin"], bindings=[])


@pytest.mark.parametrize("path", sorted(p.relative_to(GIN_DIR) for p in (GIN_DIR / "experiments").glob("*.gin")))
def test_experiment_gins_bind_a_complete_experiment(path):
    gin_utils.parse_gin(gin_files=[str(path)], bindings=["MODEL_DIR = '/tmp/unused'"])
    experiment = gin.get_configurable(experiment_lib.Experiment)()
    assert experiment.model_dir and experiment.dataset.data_dir
    assert experiment.network_config.emb_dim > 0
    assert gin.query_parameter("training.train.num_train_steps") is not None


def test_pretrain_gin_turns_an_experiment_into_span_corruption_without_retrieval_eval():
    from gr_jax import training
    gin_utils.parse_gin(gin_files=["experiments/study_cpu.gin", "runs/pretrain.gin"],
                        bindings=["MODEL_DIR = '/tmp/unused'"])
    experiment = gin.get_configurable(experiment_lib.Experiment)()
    assert experiment.dataset.row == "span_corruption" and experiment.dataset.docid_scheme == "naive"
    assert gin.get_configurable(training.EvalConfig)().every_steps == -1
    assert experiment.learning_rate(10**6) == 3e-3  # the experiment's own settings are kept


def test_select_gin_turns_on_early_stopping_on_the_valid_split():
    from gr_jax import training
    gin_utils.parse_gin(gin_files=["experiments/study_cpu.gin", "runs/select.gin"],
                        bindings=["MODEL_DIR = '/tmp/unused'", "PATIENCE = 5"])
    config = gin.get_configurable(training.EvalConfig)()
    assert (config.every_steps, config.select_split, config.select_metric, config.patience) == (
        100, "valid", "MRR@10", 5)
    assert config.num_beams == 20  # the experiment's own settings are kept


@pytest.mark.parametrize("gin_files, check", [
    (["dense/minilm.gin"], lambda e: type(e.model.tower).__name__ == "MiniLMTower" and e.dataset.target_length == 256
     and not e.model.multi_vector and e.model.temperature == 0.05),
    (["dense/t5.gin", "models/t5_1_1/tiny.gin"], lambda e: type(e.model.tower).__name__ == "T5EncoderTower"
     and e.model.tower.config.emb_dim == 256 and e.model.tower.config.dropout_rate == 0.1),
    (["dense/minilm.gin", "dense/mvdr.gin"], lambda e: e.model.multi_vector and e.model.projection_dim == 128),
    (["dense/minilm.gin", "dense/normaliser_gap.gin"],
     lambda e: [(type(a).__name__, a.every_steps) for a in (
         ref.scoped_configurable_fn() for ref in gin.query_parameter("training.train.actions"))] == [
         ("NormaliserGap", 500)]),
])
def test_dense_gins_bind_a_dense_experiment_through_the_experiment_macro(gin_files, check):
    """The entry points build whatever EXPERIMENT names: a DenseExperiment for the dense gins."""
    from gr_jax.dense.experiment import DenseExperiment
    gin_utils.parse_gin(gin_files=gin_files, bindings=["MODEL_DIR = '/tmp/unused'", "DATA_DIR = '/tmp/data'",
                                                       "TRAIN_STEPS = 5"])
    experiment = gin.query_parameter("%EXPERIMENT").scoped_configurable_fn()
    assert isinstance(experiment, DenseExperiment) and experiment.dataset.data_dir == "/tmp/data"
    assert check(experiment)
    assert isinstance(gin.query_parameter("training.train.experiment").scoped_configurable_fn(), DenseExperiment)


@pytest.mark.parametrize("extra", [[], ["decoders/pawa.gin"]])
def test_the_minilm_encoder_gin_gives_a_generative_experiment_minilm_as_its_encoder(extra):
    """encoders/minilm.gin after any generative gin: the same experiment (its head, scheme, decoder) with MiniLM as
    its encoder, trained at 0.02 times the decoder's rate."""
    gin_utils.parse_gin(gin_files=["runs/train.gin", "models/t5_1_1/tiny.gin", *extra, "encoders/minilm.gin"],
                        bindings=["MODEL_DIR = '/tmp/unused'", "DATA_DIR = '/tmp/data'", "DATASET_NAME = 'd'",
                                  "TRAIN_STEPS = 5", "DOCID_SCHEME = 'semantic'"])
    experiment = gin.query_parameter("%EXPERIMENT").scoped_configurable_fn()
    assert isinstance(experiment, experiment_lib.Experiment) and experiment.dataset.docid_scheme == "semantic"
    assert type(experiment.encoder_tower).__name__ == "MiniLMTower" and experiment.train_encoder_tower
    assert experiment.head == (PawaHead() if extra else StandardHead())
    assert list(gin.query_parameter("optimizers.make_optimizer.learning_rate_scales")) == ["tower/.*"]
    assert gin.query_parameter("%TOWER_LEARNING_RATE_SCALE") == 0.02


def test_the_dense_run_encoder_gin_gives_minilm_with_the_dense_runs_weights():
    """encoders/dense_run.gin: encoders/minilm.gin whose tower's weights are DENSE_RUN's, at its kept step unless
    DENSE_RUN_STEP is given."""
    gin_utils.parse_gin(gin_files=["runs/train.gin", "models/t5_1_1/tiny.gin", "encoders/dense_run.gin"],
                        bindings=["MODEL_DIR = '/tmp/unused'", "DATA_DIR = '/tmp/data'", "DATASET_NAME = 'd'",
                                  "TRAIN_STEPS = 5", "DENSE_RUN = '/tmp/dense'", "DENSE_RUN_STEP = 300"])
    experiment = gin.query_parameter("%EXPERIMENT").scoped_configurable_fn()
    tower = experiment.encoder_tower
    assert type(tower).__name__ == "DenseRunTower" and type(tower.tower).__name__ == "MiniLMTower"
    assert (tower.model_dir, tower.step, experiment.train_encoder_tower) == ("/tmp/dense", 300, True)
    assert gin.query_parameter("%TOWER_LEARNING_RATE_SCALE") == 0.02


@pytest.mark.parametrize("gin_files, check", [
    (["gdr/train.gin", "models/t5_1_1/tiny.gin"], lambda e: e.query_tower is None
     and e.network_config.emb_dim == 256 and e.head == StandardHead()
     and e.loss.cluster_negative_weight == 2.0 and e.dataset.num_cluster_negatives == 8),
    (["gdr/minilm.gin", "models/t5_1_1/tiny.gin"], lambda e: type(e.query_tower).__name__ == "MiniLMTower"
     and e.query_tower_from_document_encoder
     and list(gin.query_parameter("optimizers.make_optimizer.learning_rate_scales")) == ["tower/.*"]
     and gin.query_parameter("%TOWER_LEARNING_RATE_SCALE") == 0.02),
    (["gdr/train.gin", "models/t5_1_1/tiny.gin", "decoders/pawa.gin"],
     lambda e: e.head == PawaHead() and e.dataset.token_targets is None),
    (["gdr/minilm.gin", "models/t5_1_1/tiny.gin", "ranking/trie.gin"],  # soft cluster targets of ranked lists
     lambda e: type(e.dataset.token_targets).__name__ == "TrieTargets" and e.dataset.token_targets.beta == 2.0
     and e.dataset.run_file is None and e.dataset.depth is None),
])
def test_gdr_gins_bind_a_gdr_experiment_through_the_experiment_macro(gin_files, check):
    from gr_jax.gdr.experiment import GdrExperiment
    gin_utils.parse_gin(gin_files=gin_files, bindings=["MODEL_DIR = '/tmp/unused'", "DATA_DIR = '/tmp/data'",
                                                       "GDR_INDEX = '/tmp/index'", "TRAIN_STEPS = 5"])
    experiment = gin.query_parameter("%EXPERIMENT").scoped_configurable_fn()
    assert isinstance(experiment, GdrExperiment) and experiment.dataset.index_dir == "/tmp/index"
    assert check(experiment)
    eval_config = gin.query_parameter("training.train.eval_config").scoped_configurable_fn()
    assert (eval_config.num_beams, eval_config.depth) == (10, 100)  # 10 clusters recalled, 100 documents ranked


@pytest.mark.parametrize("family_gin, family_binding", [("gdr/minilm.gin", "GDR_INDEX = '/tmp/index'"),
                                                         ("runs/train.gin", "DATASET_NAME = 'unused'"),
                                                         ("dense/t5.gin", None)])
def test_the_linear_decay_gin_warms_up_to_the_learning_rate_then_decays_to_zero_at_the_last_step(family_gin,
                                                                                               family_binding):
    """Any family reads the schedule from SCHEDULE: the same gin decays the generative, dense and GDR runs' rate."""
    gin_utils.parse_gin(gin_files=[family_gin, "models/t5_1_1/tiny.gin", "schedules/linear_decay.gin"],
                        bindings=["MODEL_DIR = '/tmp/unused'", "DATA_DIR = '/tmp/data'", "TRAIN_STEPS = 300",
                                  "LEARNING_RATE = 3e-4", "WARMUP_STEPS = 100", *filter(None, [family_binding])])
    schedule = gin.query_parameter("%EXPERIMENT").scoped_configurable_fn().learning_rate
    assert [float(schedule(step)) for step in (0, 50, 100, 200, 300)] == pytest.approx(
        [0.0, 1.5e-4, 3e-4, 1.5e-4, 0.0], abs=1e-9)


@pytest.mark.parametrize("extra, weights, targets", [
    ([], "TopOne()", None),
    (["ranking/fractional.gin"], "Fractional(alpha=2.0)", None),
    (["ranking/stepwise.gin"], "Stepwise()", None),
    (["ranking/trie.gin"], "TopOne()", "TrieTargets(beta=2.0, from_rank=False, max_children=24)"),
    (["ranking/combined.gin"], "Fractional(alpha=2.0)", "TrieTargets(beta=2.0, from_rank=True, max_children=24)"),
])
def test_ranking_gins_train_a_generative_experiment_on_ranked_lists(extra, weights, targets):
    from gr_jax.ranking.data import RankedListData
    gin_utils.parse_gin(gin_files=["experiments/study_cpu.gin", "ranking/ranked_lists.gin", *extra],
                        bindings=["MODEL_DIR = '/tmp/unused'", "DATA_DIR = '/tmp/data'"])
    experiment = gin.query_parameter("%EXPERIMENT").scoped_configurable_fn()
    data = experiment.dataset
    assert isinstance(data, RankedListData) and data.data_dir == "/tmp/data" and data.input_length == 64
    assert repr(data.item_weights) == weights and repr(data.token_targets) == str(targets)
    assert (data.run_file, data.depth, data.indexing) == (None, None, False)


def test_the_decoder_only_experiment_gin_switches_the_family_and_keeps_the_study_and_its_data():
    from gr_jax.decoder_only.experiment import DecoderOnlyExperiment
    from gr_jax.ranking.data import RankedListData
    gin_utils.parse_gin(gin_files=["experiments/study_cpu.gin", "ranking/ranked_lists.gin", "ranking/trie.gin",
                                   "decoder_only/experiment.gin", "decoder_only/p2m.gin"],
                        bindings=["MODEL_DIR = '/tmp/unused'", "DATA_DIR = '/tmp/data'"])
    experiment = gin.query_parameter("%EXPERIMENT").scoped_configurable_fn()
    assert isinstance(experiment, DecoderOnlyExperiment) and isinstance(experiment.dataset, RankedListData)
    assert repr(experiment.dataset.token_targets) == "TrieTargets(beta=2.0, from_rank=False, max_children=24)"
    # study_cpu.gin's settings, which decoder_only/train.gin (runs/train.gin again) would have reset.
    assert (experiment.batch_size, experiment.learning_rate(10_000)) == (32, pytest.approx(3e-3))
    assert experiment.network_config.num_layers == 4  # T5 p2m's 2 + 2 layers as one stack


def test_ngram_gin_binds_an_ngram_experiment():
    from gr_jax.ngrams.experiment import NgramData, NgramExperiment
    gin_utils.parse_gin(gin_files=["experiments/study_cpu.gin", "ngrams/train.gin"],
                        bindings=["MODEL_DIR = '/tmp/unused'", "DATA_DIR = '/tmp/data'"])
    experiment = gin.query_parameter("%EXPERIMENT").scoped_configurable_fn()
    assert isinstance(experiment, NgramExperiment) and isinstance(experiment.dataset, NgramData)
    data = experiment.dataset
    assert (data.width, data.num_spans, data.indexing, data.target_length) == (10, 10, True, 32)
    assert experiment.network_config.emb_dim == 256 and experiment.batch_size == 32  # study_cpu's tiny
    assert experiment.head == StandardHead()  # HEAD, which a decoder gin swaps
    eval_config = gin.query_parameter("training.train.eval_config").scoped_configurable_fn()
    assert (eval_config.num_beams, eval_config.depth) == (20, 100)  # 20 spans generated, 100 documents ranked


@pytest.mark.parametrize("family", ["generative", "dense", "gdr"])
def test_a_runs_config_gin_written_before_the_families_shared_one_setup_still_reads(family, fixtures_dir, tmp_path):
    """A run dir's config.gin of the code before (tests/fixtures/config_gin/README.md) binds the families' own
    names (`experiment.Experiment.num_microbatches`, `dense.experiment.DenseExperiment.seed`, `training.EvalConfig`):
    read back as eval, infer and search read it, with a user's override on top, it gives the experiment and settings
    it gave then."""
    from gr_jax import training
    from gr_jax.dense.experiment import DenseExperiment
    from gr_jax.family import ModelFamily
    from gr_jax.gdr.experiment import GdrExperiment
    from gr_jax.retrievers.settings import EvalConfig
    (tmp_path / "config.gin").write_text((fixtures_dir / "config_gin" / f"{family}.gin").read_text())
    gin_utils.parse_run_config(tmp_path, gin_args=["--gin.training.EvalConfig.batch_size=8"], missing="")
    experiment = gin.query_parameter("%EXPERIMENT").scoped_configurable_fn()
    settings = gin.get_configurable(training.EvalConfig)()
    assert isinstance(experiment, ModelFamily) and type(settings) is EvalConfig and settings.batch_size == 8
    assert (experiment.model_dir, experiment.dataset.data_dir, experiment.dataset.eval_split) == ("RUN", "DATA", "dev")
    assert experiment.learning_rate(10**6) == pytest.approx(1e-3 if family != "dense" else 2e-5)
    if family == "generative":
        assert type(experiment) is experiment_lib.Experiment
        assert (experiment.batch_size, experiment.num_microbatches, experiment.seed) == (32, 2, 0)
        assert (experiment.dataset.docid_scheme, experiment.network_config.emb_dim) == ("naive", 256)
        assert (settings.num_beams, settings.constrained, settings.depth) == (20, True, 20)
    elif family == "dense":
        assert type(experiment) is DenseExperiment
        assert (experiment.batch_size, experiment.num_microbatches, experiment.seed) == (32, 1, 3)
        assert (experiment.dataset.input_length, experiment.dataset.target_length) == (32, 256)  # minilm.gin
        assert experiment.model.temperature == 0.05 and settings.depth == 100
    else:
        assert type(experiment) is GdrExperiment
        assert (experiment.mesh_model, experiment.query_tower_from_document_encoder) == (1, True)
        assert (experiment.dataset.index_dir, experiment.network_config.emb_dim) == ("INDEX", 256)
        assert (settings.num_beams, settings.depth) == (10, 100)


@pytest.mark.parametrize("family", [[], ["decoder_only/experiment.gin", "decoder_only/p2m.gin"]])
def test_the_preprocessed_gin_trains_either_family_on_its_rows_preprocessed_examples(family):
    from gr_jax.data.records import PreprocessedData
    from gr_jax.tools import preprocess
    gin_utils.parse_gin(gin_files=["experiments/study_cpu.gin", *family, "data/preprocessed.gin",
                                   "runs/preprocess.gin"],
                        bindings=["MODEL_DIR = '/tmp/unused'", "DATA_DIR = '/tmp/data'", "PREPROCESSED_DIR = '/tmp/p'",
                                  "experiment.DatasetConfig.row = 'firstp_d2q'"])
    experiment = gin.query_parameter("%EXPERIMENT").scoped_configurable_fn()
    data = experiment.dataset
    assert isinstance(data, PreprocessedData) and data.directory == "/tmp/p"
    assert isinstance(data.source, experiment_lib.DatasetConfig)
    assert (data.source.data_dir, data.source.row, data.input_length) == ("/tmp/data", "firstp_d2q", 64)
    assert str(gin.query_parameter("preprocess.preprocess.experiment")) == "%EXPERIMENT"
    assert experiment.input_vocabulary_dir() is None  # no tower: the run's own vocabulary
    assert callable(gin.get_configurable(preprocess.preprocess))  # what runs/preprocess.gin binds
