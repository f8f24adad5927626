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

from patchreg._registry import Registry
from patchreg._registry import registry as default_registry

__all__ = ["patch_registry"]

_MARK = "patchreg_leaks_ok"


def pytest_configure(config: Any) -> None:
    """Declare the opt-out marker."""
    config.addinivalue_line("markers", f"{_MARK}: the test may leave patches active in patchreg.registry")


def _snapshot() -> tuple[dict[tuple[str, ...], int], dict[tuple[str, ...], tuple[str, str]]]:
    """Users per install, and how to name each in a leak report; a pending (lazy) install counts as one.

    An import-path install is keyed by its patch and target, whatever its state: a lazy patch
    that a wider-scoped fixture applied stays the same install when a test's import fires it
    (pending, then active). A selector install is keyed by its patch, holder and attribute.
    """
    snap: dict[tuple[str, ...], int] = {}
    labels: dict[tuple[str, ...], tuple[str, str]] = {}  # key -> (patch on where, state)
    for e in default_registry.active():
        key = (e.patch, e.target) if ":" in e.target else (e.patch, e.holder, e.attr)
        snap[key] = snap.get(key, 0) + max(e.count, 1)
        where = e.where if e.holder else e.target
        labels[key] = (f"{e.patch} on {where}", e.state)
    return snap, labels


@pytest.fixture
def patch_registry() -> Iterator[Registry]:
    """A fresh Registry for this test; whatever it still holds is reverted afterwards."""
    reg = Registry("test")
    yield reg
    reg.revert_all()


@pytest.fixture(autouse=True)
def _patchreg_leak_guard(request: Any) -> Iterator[None]:
    before, _ = _snapshot()
    checkpoint = default_registry.checkpoint()
    yield
    if request.node.get_closest_marker(_MARK) is not None:
        return
    after, labels = _snapshot()
    leaked = sorted(
        f"{labels[key][0]} ({labels[key][1]}, count {n})" for key, n in after.items() if n > before.get(key, 0)
    )
    if leaked:
        default_registry.rollback(checkpoint)  # only what this test added
        pytest.fail(
            "test left patches active in patchreg.registry: "
            + "; ".join(leaked)
            + f". Revert them (use `with patchreg.patched(...)`), or mark the test @pytest.mark.{_MARK}.",
            pytrace=False,
        )
