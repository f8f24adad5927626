"""Reports read by path: holders are named from the object passed to apply(), tables fit 100 columns."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from patchreg import Patch, PatchSet, Registry

WIDE = "a reason long enough to need wrapping in a table that is meant to fit one hundred columns " * 3


class Layer:
    """An MTP-like layer with a method to patch."""

    def _get_embeddings(self) -> str:
        return "upstream"


class Block:
    """Holds a list of layers."""

    def __init__(self, n: int) -> None:
        self.layers = [Layer() for _ in range(n)]


class Model:
    """A model with a forward and an MTP block."""

    def __init__(self, n: int = 2) -> None:
        self.mtp = Block(n)

    def forward(self) -> str:
        return "upstream"


class Wrapper:
    """A DDP/Float16Module-like wrapper: the model is its .module."""

    def __init__(self, module: Any) -> None:
        self.module = module


def _embed(self: Any) -> str:
    return "patched"


def _forward(self: Any) -> str:
    return "patched"


LAYERS = Patch("detach_embeddings", "mtp.layers[*]._get_embeddings", _embed)
FORWARD = Patch("forward", "forward", _forward)


@pytest.fixture
def reg() -> Any:
    """A fresh registry, everything in it reverted afterwards."""
    registry = Registry("paths")
    yield registry
    registry.revert_all()


def test_holders_read_as_paths_from_the_object_passed(reg: Registry) -> None:
    """An install on the object itself reads `model`; one on its MTP layers reads `model.mtp.layers[i]`."""
    model = Model()
    report = reg.apply(PatchSet("set", [FORWARD, LAYERS]), model)
    holders = [f"{e.holder}.{e.attr}" for e in report.entries]
    assert holders == ["model.forward", "model.mtp.layers[0]._get_embeddings", "model.mtp.layers[1]._get_embeddings"]
    for text in (str(report), reg.summary(), str(reg.explain(LAYERS, model))):
        assert "@0x" not in text
    assert "model.mtp.layers[1]._get_embeddings" in reg.summary()


def test_holders_through_wrappers_and_chunk_lists_name_each_step(reg: Registry) -> None:
    """Through `.module` the path says so; in a list of chunks each holder starts with `chunks[i]`."""
    wrapped = Wrapper(Model(1))
    report = reg.apply(LAYERS, wrapped)
    assert [e.holder for e in report.entries] == ["model.module.mtp.layers[0]"]
    reg.revert(report)
    chunks = [Wrapper(Model(1)), Wrapper(Model(2))]
    report = reg.apply(LAYERS, chunks)
    assert [e.holder for e in report.entries] == [
        "chunks[0].module.mtp.layers[0]",
        "chunks[1].module.mtp.layers[0]",
        "chunks[1].module.mtp.layers[1]",
    ]


def test_import_path_holders_keep_their_qualified_name(reg: Registry) -> None:
    """A class attribute patched by import path is named by its module and class, as before."""
    patch = Patch("leaf-forward", "tests.patchreg.sample:Leaf.forward", _forward)
    report = reg.apply(patch)
    assert [e.holder for e in report.entries] == ["tests.patchreg.sample.Leaf"]


def test_summary_and_explain_fit_100_columns(reg: Registry) -> None:
    """summary() and explain() wrap long cells so that no line is wider than 100 columns."""
    deep = Patch("a-patch-with-a-rather-long-name-for-a-table", "mtp.layers[*]._get_embeddings", _embed, doc=WIDE)
    model = Model(3)
    reg.apply(deep, model)
    reg.apply(Patch("leaf-forward", "tests.patchreg.sample:Leaf.forward", _forward))
    for text in (reg.summary(), str(reg.explain(deep, model))):
        assert max(len(line) for line in text.splitlines()) <= 100, text


def test_a_target_not_found_warns_once_per_patch_and_process(reg: Registry, caplog: pytest.LogCaptureFixture) -> None:
    """A selector that finds nothing logs one warning naming the patch; applying it again logs nothing more."""
    typo = Patch("typo-in-selector", "mtp.layerz[*]._get_embeddings", _embed)
    with caplog.at_level(logging.WARNING, logger="patchreg"):
        for _ in range(3):
            report = reg.apply(typo, Model())
            assert report.skipped and report.installed == 0
    warnings = [r for r in caplog.records if "typo-in-selector" in r.getMessage()]
    assert len(warnings) == 1
    assert "layerz" in warnings[0].getMessage() and warnings[0].levelno == logging.WARNING


def test_skips_a_predicate_decides_do_not_warn(reg: Registry, caplog: pytest.LogCaptureFixture) -> None:
    """A predicate saying no, or not needed here, is no surprise: no warning by default."""
    from patchreg import not_needed_when, requires

    no = Patch("predicate-no", "forward", _forward, when=requires("attrs<1"))
    fixed = Patch("fixed-upstream", "forward", _forward, when=not_needed_when(requires("attrs>=1")))
    with caplog.at_level(logging.WARNING, logger="patchreg"):
        reg.apply(PatchSet("decided", [no, fixed]), Model())
    assert [r for r in caplog.records if r.name == "patchreg"] == []


def test_an_import_path_that_does_not_exist_warns_once(reg: Registry, caplog: pytest.LogCaptureFixture) -> None:
    """An import-path target missing from its module is a target not found: one warning."""
    gone = Patch("gone-attr", "tests.patchreg.sample:no_such_function_xyz", _forward)
    with caplog.at_level(logging.WARNING, logger="patchreg"):
        reg.apply(gone)
        reg.apply(gone)
    assert len([r for r in caplog.records if "gone-attr" in r.getMessage()]) == 1


def test_warn_false_silences_the_not_found_warning(reg: Registry, caplog: pytest.LogCaptureFixture) -> None:
    """apply(..., warn=False) opts out: a set that expects some targets to be absent (a pipeline stage) says so."""
    quiet = Patch("expected-absent", "mtp.layerz[*]._get_embeddings", _embed)
    with caplog.at_level(logging.WARNING, logger="patchreg"):
        reg.apply(quiet, Model(), warn=False)
    assert [r for r in caplog.records if "expected-absent" in r.getMessage()] == []


def test_a_report_fits_one_hundred_columns(reg: Registry) -> None:
    """`str(report)`: a skip reason too long for one line goes on under itself, every line within 100 columns."""
    from patchreg import check

    skipped = Patch("someday", "forward", lambda self: "patched", when=check(lambda: (False, WIDE.strip()), "never"))
    report = reg.apply(PatchSet("set", [FORWARD, skipped]), Model())
    lines = str(report).splitlines()
    assert max(map(len, lines)) <= 100 and len(lines) > 3
    start = next(i for i, line in enumerate(lines) if line.startswith("  skipped  someday"))
    lead = len("  skipped  ") + 25
    assert " ".join(line[lead:] for line in lines[start:]) == WIDE.strip()  # all of it, in order
    assert all(line[:lead].isspace() for line in lines[start + 1 :])
