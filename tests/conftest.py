"""Test set-up: CPU-forced JAX with 8 simulated devices, fixed before jax is imported."""
import os

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# TensorFlow (used by seqio's tf.data pipelines) must not grab a GPU or many threads.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import pathlib  # noqa: E402

import pytest  # noqa: E402

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures_dir() -> pathlib.Path:
    return FIXTURES
