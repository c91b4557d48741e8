"""Test set-up: CPU-forced JAX with 8 simulated devices, fixed before jax is imported."""
import os

os.environ["JAX_PLATFORMS"] = "cpu"
# The suite compiles hundreds of tiny programs and runs each a few times, so compile time dominates: LLVM at -O0,
# XLA's fast-compile preset, and the classic (not MLIR fusion-emitter) CPU code generator, which compiles a train
# step in about two thirds of the time. Numerics are the same up to float rounding; users' runs keep XLA's defaults.
# docs/performance.md has the suite's time with and without them.
os.environ["XLA_FLAGS"] = " ".join([
    os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8", "--xla_backend_optimization_level=0",
    "--xla_cpu_opt_preset=FAST_COMPILE", "--xla_cpu_use_fusion_emitters=false"]).strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# TensorFlow (used by seqio's tf.data pipelines) must not grab a GPU or many threads.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# Many tests (and the entry points they start in subprocesses) compile the same tiny programs again; JAX's
# persistent compilation cache, in a directory fresh for each session, compiles each once. The cache is keyed by
# the program, the compile options and the backend, so a hit is the same executable.
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache_dir = tempfile.mkdtemp(prefix="gr_jax_tests_xla_cache_")
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pathlib  # noqa: E402

import pytest  # noqa: E402

# The MS MARCO-layout fixtures are tracked as passages.tsv / judgements.{split}.tsv, so that no file of the repo is
# named like the real MS MARCO collection and qrels; each session reads a copy of tests/fixtures with the official
# names (collection.tsv, qrels.{split}.tsv), which the readers expect.
_OFFICIAL_NAMES = {"passages.tsv": "collection.tsv", "judgements.train.tsv": "qrels.train.tsv",
                   "judgements.dev.tsv": "qrels.dev.tsv"}


def _materialise_fixtures() -> pathlib.Path:
    root = pathlib.Path(tempfile.mkdtemp(prefix="gr_jax_tests_fixtures_"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    copy = root / "fixtures"
    shutil.copytree(pathlib.Path(__file__).parent / "fixtures", copy)
    for layout in ("msmarco", "tasks"):
        for tracked, official in _OFFICIAL_NAMES.items():
            (copy / layout / tracked).rename(copy / layout / official)
    return copy


FIXTURES = _materialise_fixtures()


# The longest test files, longest first (their summed test durations in a `make test` run at f0b7a53, with
# `--junitxml`; `make test` prints the slowest tests).
# `make test`'s workers take whole files in collection order: starting these first keeps one worker from running a
# long file alone at the end while the other idles (longest-first scheduling).
LONGEST_FILES = ("test_training.py", "test_pipeline.py", "test_scan_layers.py", "test_variants.py", "test_dense.py",
                 "test_kill_resume.py", "test_multiprocess.py", "test_run_study.py", "test_lora.py",
                 "test_minilm_runs.py", "test_gdr.py", "test_registry.py", "test_decoder_only_retrieval.py",
                 "test_decoding.py", "test_tower_encoder.py", "test_decoder_only_dense.py", "test_ranking_data.py",
                 "test_document_vectors.py", "test_plan_memory.py", "test_cgl.py", "test_custom_head.py",
                 "test_network.py", "test_decoder_only.py", "test_accelerator_bench.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order is kept


@pytest.fixture
def fixtures_dir() -> pathlib.Path:
    return FIXTURES


@pytest.fixture
def wordnet_dir() -> pathlib.Path:
    """WordNet dict files of a few noun.food synsets (data.noun, index.noun)."""
    return FIXTURES / "wordnet"


@pytest.fixture(scope="session")
def spm_data_dir(tmp_path_factory) -> pathlib.Path:
    """The `tasks` fixture with a 320-piece SentencePiece model of its texts: what T5 towers and GDR runs read."""
    from gr_jax.vocabulary import train_sentencepiece
    path = tmp_path_factory.mktemp("spm") / "fixture"
    shutil.copytree(FIXTURES / "tasks", path)
    texts = [line.split("\t", 1)[1] for name in ("collection.tsv", "queries.train.tsv")
             for line in (path / name).read_text().splitlines()]
    train_sentencepiece(texts=texts * 3, model_path=path / "spm.model", vocab_size=320)
    return path


@pytest.fixture
def ranked_hypernyms(wordnet_dir, tmp_path) -> pathlib.Path:
    """An in-context WordNet hypernym ranking data dir (food.n.02's subtree, half of it dev) with a 320-piece
    vocabulary: what micro ranked-list runs train on."""
    from gr_jax.tools import make_vocab, wordnet_hypernyms
    data = tmp_path / "hyp"
    wordnet_hypernyms.main(["--wordnet_dir", str(wordnet_dir), "--out_dir", str(data), "--root", "food.n.02",
                            "--dev_fraction", "0.5", "--seed", "1", "--in_context"])
    make_vocab.main(["--data_dir", str(data), "--vocab_size", "320"])
    return data


def micro_ranked_run_args(*, data, model_dir, name: str, steps: int = 2, gin_files=(), bindings=()) -> list[str]:
    """`python -m gr_jax.train` arguments of a micro run (tiny with one layer each side) on ranked lists of `data`:
    `gin_files` after ranking/ranked_lists.gin (e.g. ranking/trie.gin), `bindings` (`--gin.KEY=VALUE`) last."""
    return ["--gin_file=runs/train.gin", "--gin_file=ranking/ranked_lists.gin",
            *(f"--gin_file={path}" for path in gin_files), "--gin_file=models/t5_1_1/tiny.gin",
            f"--gin.TRAIN_STEPS={steps}", f"--gin.DATA_DIR='{data}'", f"--gin.MODEL_DIR='{model_dir}'",
            f"--gin.DATASET_NAME='{name}'", "--gin.INPUT_LENGTH=192", "--gin.TARGET_LENGTH=32", "--gin.BATCH_SIZE=8",
            "--gin.network.T5Config.num_encoder_layers=1", "--gin.network.T5Config.num_decoder_layers=1",
            "--gin.training.EvalConfig.num_beams=4", "--gin.training.EvalConfig.batch_size=8", *bindings]


@pytest.fixture(scope="session")
def hf_checkpoint_dir(tmp_path_factory) -> pathlib.Path:
    """A tiny Hugging Face Qwen3 checkpoint dir as a user brings one: the Qwen3 fixture's config.json (24 wide, 2
    layers) with random weights and a byte-level BPE tokenizer.json trained on the `tasks` fixture's texts (digits
    one per token, as Qwen's; a post-processor that adds a BOS before every text, as Llama's adds `<s>`). Its
    embedding has 16 rows more than the tokenizer has ids, as published checkpoints pad theirs."""
    import json

    import numpy as np
    import tokenizers
    from safetensors.numpy import save_file
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    from gr_jax.decoder_only.pretrained import read_config, tensor_sources
    path = tmp_path_factory.mktemp("hf") / "qwen3_micro"
    path.mkdir()
    texts = [line.split("\t", 1)[1] for name in ("collection.tsv", "queries.train.tsv", "queries.dev.tsv")
             for line in (FIXTURES / "tasks" / name).read_text().splitlines()]
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                       pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|bos|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.post_processor = processors.TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>", 0)])
    tokenizer.save(str(path / "tokenizer.json"))
    config = json.loads((FIXTURES / "decoder_only" / "qwen3" / "config.json").read_text())
    config["vocab_size"] = tokenizer.get_vocab_size(with_added_tokens=True) + 16
    (path / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)
    weights = {source.name: (1 + 0.1 * rng.standard_normal(source.hf_shape) if "norm" in source.name
                             else 0.3 * rng.standard_normal(source.hf_shape)).astype(np.float32)
               for source in tensor_sources(read_config(path).config).values()}
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def preprocess_examples(args: list[str]) -> dict:
    """`python -m gr_jax.tools.preprocess ARGS` in this process, without its printing: writes the run's examples
    into its PREPROCESSED_DIR (ARGS include data/preprocessed.gin); returns the report."""
    import gin

    from gr_jax import gin_utils
    from gr_jax.tools import preprocess
    gin.clear_config()
    try:
        _, gin_files, bindings = gin_utils.parse_args(args, description="")
        gin_utils.parse_gin(gin_files=[*gin_files, "runs/preprocess.gin"], bindings=bindings)
        return gin.get_configurable(preprocess.preprocess)()
    finally:
        gin.clear_config()


# `python -m gr_jax.train ARGS` as on a JAX-only host (`python -c TRAIN_WITHOUT_TENSORFLOW ARGS`): importing TensorFlow,
# seqio or their extensions fails, so a run that needs them fails too.
TRAIN_WITHOUT_TENSORFLOW = ("import sys\n"
                            "for name in ('tensorflow', 'seqio', 'tensorflow_text', 'tensorflow_datasets'):\n"
                            "    sys.modules[name] = None  # importing any of them now fails\n"
                            "from gr_jax import train\n"
                            "train.main()\n")
