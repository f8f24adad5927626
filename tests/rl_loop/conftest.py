"""The RL loop's tests: Megatron-Bridge 0.6.2 (``make bridge-overlay``) on a tiny DeepSeek-V3-layout model, CPU.

Run by ``make test-rl-loop``, which puts the bridge's overlay on ``PYTHONPATH``; without the bridge every test
here is skipped, saying how to run them. The trainer's code is ``examples/_rl_trainer.py``.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HAVE_BRIDGE = importlib.util.find_spec("megatron.bridge") is not None if importlib.util.find_spec("megatron") else False
_WHY = "Megatron-Bridge 0.6.2 is not importable: run `make test-rl-loop` (it installs `make bridge-overlay`)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip this directory's tests where the bridge is not importable, saying how to run them."""
    if HAVE_BRIDGE:
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.skip(reason=_WHY))


@pytest.fixture(scope="session")
def trainer() -> Any:
    """``examples/_rl_trainer.py`` as a module."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    import _rl_trainer

    return _rl_trainer


@pytest.fixture(scope="session")
def built(trainer: Any) -> Iterator[tuple[Any, Any]]:
    """``(bridge, model)`` built once by the bridge's provider (untrained)."""
    yield trainer.build()
