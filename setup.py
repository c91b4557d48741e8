"""gr_jax: generative retrieval with T5.1.1 in JAX/Flax."""
import setuptools

# Pinned to versions verified to install together (Python 3.11, CPU; the same pins run on GPU/TPU
# hosts with the matching jax[cuda]/jax[tpu] extra installed on top).
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "seqio==0.0.20",
    "tensorflow==2.21.0",
    "tensorflow-text==2.21.1",
    "tensorflow-datasets==4.9.10",
    "sentencepiece==0.2.3",
    "gin-config==0.5.0",
    "numpy==2.4.6",
    "tqdm==4.70.1",
    "bm25s==0.3.16",
    "PyStemmer==3.1.0",
    "faiss-cpu==1.15.1",
    "scipy==1.17.1",  # paired significance tests (gr_jax.significance)
    "ranx==0.3.21",  # rank fusion (gr_jax.fusion): RRF, interpolation, their parameters chosen on a split
    "scikit-learn==1.9.1",  # dictionary learning and OMP of the sparse docids (SToICaL's ESCI setting)
    "safetensors==0.8.0",
    "tokenizers==0.23.3",
    "matplotlib==3.11.2",
    "tensorboard==2.20.0",  # event files without TensorFlow (metric_writers)
    "grain==0.2.18",  # preprocessed training examples read by index (gr_jax.data.records)
    "array-record==0.8.6",  # their file format
]
TEST_REQUIRES = [
    "pytest==9.2.0",
    "pytest-xdist==3.8.0",  # `make test` runs the suite in two worker processes
    "hypothesis==6.170.15",
    "ir-measures==0.4.3",
    "pytrec-eval-terrier==0.5.11",
    "ruff==0.17.6",  # `make test` lints first (ruff.toml)
    "mypy==2.4.1",  # type checks gr_jax/ (mypy.ini)
]

setuptools.setup(
    name="gr_jax",
    version="0.1.0",
    description="Generative retrieval (DSI-style) with T5.1.1 in JAX/Flax, t5x-style.",
    python_requires=">=3.10",
    # The repository's `tasks/` and `tools/` folders install as `gr_jax.tasks` and `gr_jax.tools`: top-level
    # packages named `tasks` and `tools` would shadow (or be shadowed by) any other package of that name.
    packages=[*setuptools.find_packages(include=["gr_jax", "gr_jax.*"]),
              *(f"gr_jax.{name}"
                for name in setuptools.find_packages(include=["tasks", "tasks.*", "tools", "tools.*"]))],
    package_dir={"gr_jax": "gr_jax", "gr_jax.tasks": "tasks", "gr_jax.tools": "tools"},
    package_data={"": ["*.gin"]},
    install_requires=INSTALL_REQUIRES,
    extras_require={"test": TEST_REQUIRES},
    entry_points={"console_scripts": ["gr-jax=gr_jax.cli:main"]},
)
