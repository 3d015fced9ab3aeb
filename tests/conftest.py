import os
import tempfile

# Before any other import: Triton reads TRITON_INTERPRET when kernels are decorated, huggingface_hub reads its
# variables when imported, gradio phones home unless told not to. Tests that need the (fake) hub drop
# HF_HUB_OFFLINE and set HF_ENDPOINT for themselves.
os.environ.setdefault("TRITON_INTERPRET", "1")
# One CPU thread: with 2 cores shared by other jobs, torch's default OpenMP threads spin-wait and make the
# tiny models' small matmuls ~100x slower. CI may override.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
_SESSION_HOME = tempfile.mkdtemp(prefix="flash-dllm-tests-")
os.environ["FLASH_DLLM_HOME"] = os.path.join(_SESSION_HOME, "app")
os.environ["HF_HOME"] = os.path.join(_SESSION_HOME, "hf")
os.environ.pop("HF_HUB_CACHE", None)
os.environ.pop("HUGGINGFACE_HUB_CACHE", None)
os.environ.pop("HF_ENDPOINT", None)
os.environ.pop("HF_TOKEN", None)

import shutil  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # tests/fakehub.py

from fakehub import FakeHub  # noqa: E402
from flash_dllm.engine.tiny import TinySpec, write_tiny_model  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SESSION_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_llada(tmp_path_factory) -> Path:
    """LLaDA format, sharded into 2 safetensors files with an index."""
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llada", TinySpec(family="llada"), shards=2)


@pytest.fixture(scope="session")
def tiny_dream(tmp_path_factory) -> Path:
    """Dream (Qwen2) format with grouped-query attention: 4 query heads share 2 KV heads."""
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-dream", TinySpec(family="dream", n_kv_heads=2))


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """A running fake Hub with an empty per-test HF cache; the environment points at it (online)."""
    hub = FakeHub(root=tmp_path / "hub-root").start()
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield hub
    hub.stop()
