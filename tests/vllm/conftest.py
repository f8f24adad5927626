"""Fixtures for the vLLM patch-set tests: tiny local Hugging Face config dirs and vLLM's own config classes.

vLLM runs offline on CPU here (``HF_HUB_OFFLINE=1``, ``VLLM_TARGET_DEVICE=cpu``)
and caches what it learns about model classes under ``<repo>/.cache/vllm``
(gitignored): the first run inspects each architecture in a subprocess (about
15-40 s each), later runs read the cache.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.vllm.tiny_models import TINY_CONFIGS

REPO = Path(__file__).resolve().parents[2]
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["VLLM_TARGET_DEVICE"] = "cpu"
os.environ["VLLM_CACHE_ROOT"] = str(REPO / ".cache" / "vllm")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


@pytest.fixture(scope="session")
def vllm() -> Any:
    """The installed vLLM package; skips the test when vLLM is not installed."""
    return pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm]')")


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny local Hugging Face model dirs (config.json only), one per MTP family."""
    root = tmp_path_factory.mktemp("hf-models")
    dirs = {}
    for kind, config in TINY_CONFIGS.items():
        path = root / kind
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config, indent=1))
        dirs[kind] = path
    return dirs


@pytest.fixture(scope="session")
def target_config(vllm: Any, model_dirs: dict[str, Path]) -> Any:
    """``target_config(kind)``: the vLLM ``ModelConfig`` of a tiny model, built once per session."""
    from vllm.config import ModelConfig

    built: dict[str, Any] = {}

    def get(kind: str) -> Any:
        if kind not in built:
            built[kind] = ModelConfig(model=str(model_dirs[kind]), skip_tokenizer_init=True, max_model_len=256)
        return built[kind]

    return get


@pytest.fixture(scope="session")
def make_speculative_config(vllm: Any, target_config: Any) -> Any:
    """Build ``vllm.config.SpeculativeConfig(**spec, target_model_config=..., target_parallel_config=...)``."""
    from vllm.config import ParallelConfig, SpeculativeConfig

    def make(kind: str, spec: dict[str, Any]) -> Any:
        return SpeculativeConfig(
            **spec, target_model_config=target_config(kind), target_parallel_config=ParallelConfig()
        )

    return make


@pytest.fixture
def fresh_missing_warning() -> Iterator[None]:
    """Re-arm spec_decode_stats' once-per-process warning for this test, and again afterwards."""
    from patches.vllm import mtp

    mtp._reset_missing_warning()
    yield
    mtp._reset_missing_warning()
