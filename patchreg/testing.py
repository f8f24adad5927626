"""pytest plugin (entry point ``pytest11``): a fresh registry fixture and a leak guard.

- ``patch_registry``: a new :class:`~patchreg.Registry` for one test, reverted after it.
- Leak guard: a test that leaves patches active in the default registry fails, listing
  them, and they are reverted so later tests start clean. Opt out with
  ``@pytest.mark.patchreg_leaks_ok``, or for a whole run with ``-p no:patchreg``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from patchreg._api import registry as default_registry
from patchreg._registry import Registry

__all__ = ["patch_registry"]

_MARK = "patchreg_leaks_ok"


def pytest_configure(config: Any) -> None:
    """Declare the opt-out marker."""
    config.addinivalue_line("markers", f"{_MARK}: the test may leave patches active in patchreg.registry")


def _snapshot() -> dict[tuple[str, str, str, str], int]:
    """Users per active install; a pending (lazy) install counts as one."""
    snap: dict[tuple[str, str, str, str], int] = {}
    for e in default_registry.active():
        key = (e.patch, e.holder, e.attr, e.state)
        snap[key] = snap.get(key, 0) + max(e.count, 1)
    return snap


@pytest.fixture
def patch_registry() -> Iterator[Registry]:
    """A fresh Registry for this test; whatever it still holds is reverted afterwards."""
    reg = Registry("test")
    yield reg
    reg.revert_all()


@pytest.fixture(autouse=True)
def _patchreg_leak_guard(request: Any) -> Iterator[None]:
    before = _snapshot()
    checkpoint = default_registry.checkpoint()
    yield
    if request.node.get_closest_marker(_MARK) is not None:
        return
    after = _snapshot()
    leaked = sorted(
        f"{p} on {h}.{a} ({state}, count {n})"
        for (p, h, a, state), n in after.items()
        if n > before.get((p, h, a, state), 0)
    )
    if leaked:
        default_registry.rollback(checkpoint)  # only what this test added
        pytest.fail(
            "test left patches active in patchreg.registry: "
            + "; ".join(leaked)
            + f". Revert them (use `with patchreg.patched(...)`), or mark the test @pytest.mark.{_MARK}.",
            pytrace=False,
        )
