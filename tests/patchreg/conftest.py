"""Fixtures for the engine's tests."""

from __future__ import annotations

from typing import Any

import pytest

from tests.patchreg import sample
from tests.patchreg.helpers import assert_same_namespace, snapshot


@pytest.fixture
def namespaces() -> list[Any]:
    """The namespaces the sample targets live in."""
    return [sample, sample.Base, sample.Child, sample.Child.Nested]


@pytest.fixture
def pristine(namespaces: list[Any]) -> Any:
    """Snapshot every sample namespace now; the returned callable asserts they are unchanged."""
    before = [(ns, snapshot(ns)) for ns in namespaces]

    def check(*extra: tuple[Any, dict[str, Any]]) -> None:
        for ns, snap in (*before, *extra):
            assert_same_namespace(snap, ns)

    return check
