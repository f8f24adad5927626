"""Fixtures for the engine's tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
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


# -- source trees: a package's tree on PYTHONPATH, with or without its distribution metadata ----------


@pytest.fixture(scope="session")
def no_megatron_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a venv mirroring this one without megatron-core's files and metadata (scripts/source_tree.py)."""
    from scripts.source_tree import venv_without

    return venv_without(["megatron-core"], tmp_path_factory.mktemp("venv") / "no-megatron-core")


@pytest.fixture(scope="session")
def megatron_tree(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``megatron_tree("main")``, ``megatron_tree("0.18.2", metadata=False)``: an unpacked snapshot or wheel, once."""
    from scripts.source_tree import REPO, unpack, wheel
    from scripts.source_tree import snapshot as archive_of

    made: dict[tuple[str, bool], Path] = {}

    def make(which: str, *, metadata: bool = False) -> Path:
        if (which, metadata) not in made:
            cache = REPO / ".cache" / "wheels"
            archive = archive_of(which) if which in ("main", "dev") else wheel(f"megatron-core=={which}", cache)
            if archive is None:
                pytest.skip(f"no Megatron-LM {which} snapshot in ../shared/upstream: set PATCHREG_UPSTREAM_DIR to its folder")
            made[which, metadata] = unpack(archive, tmp_path_factory.mktemp(f"tree-{which}"), metadata=metadata)
        return made[which, metadata]

    return make
