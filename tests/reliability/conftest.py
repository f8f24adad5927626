"""Fixtures for the reliability suite: namespace snapshots and the figures recorder.

Tests record what they exercised (cycles run, inputs tried, objects freed) with the
``figures`` fixture; when ``PATCHREG_RELIABILITY_JSON`` names a file, the totals are
written there at the end of the session (``scripts/reliability_report.py`` reads it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.reliability import targets
from tests.reliability.helpers import FIGURES, Figures, Namespaces


@pytest.fixture
def figures() -> Figures:
    """The session's figures recorder."""
    return Figures()


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Write the figures to ``$PATCHREG_RELIABILITY_JSON`` when it is set."""
    path = os.environ.get("PATCHREG_RELIABILITY_JSON")
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(FIGURES, fh, indent=2, sort_keys=True)


@pytest.fixture
def pristine() -> Iterator[Callable[..., None]]:
    """Snapshot the target namespaces; the callable asserts they are identical (``is``) to the snapshot."""
    spaces = Namespaces([targets, targets.Base, targets.Child, targets.Leaf])
    yield spaces.check
    spaces.check()
