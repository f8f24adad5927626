"""Drift detection: a patch's verified upstream body, and what doctor and the report say when it changed."""

from __future__ import annotations

import importlib
import io
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import patchreg
from patchreg import Patch, PatchSet, Verified, body_fingerprint, drift
from patchreg._cli import run
from patchreg._discovery import Discovery, discover
from patchreg.exceptions import PatchDefinitionError

BODY = '''
def area(width, height):
    """The area."""
    return width * height
'''
CHANGED = '''
def area(width, height):
    """The area."""
    return width * height + 1
'''
REFORMATTED = '''
def area(
    width,
    height,
):  # same code, other layout
    """Another docstring: not part of the body."""
    # a comment
    return (width * height)
'''


@pytest.fixture
def upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, ModuleType]]:
    """A fresh importable module ``drift_upstream`` standing for an upstream library (written to tmp_path)."""
    path = tmp_path / "drift_upstream.py"
    path.write_text(textwrap.dedent(BODY))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("drift_upstream", None)
    module = importlib.import_module("drift_upstream")
    yield path, module
    sys.modules.pop("drift_upstream", None)


def _rewrite(path: Path, source: str) -> ModuleType:
    path.write_text(textwrap.dedent(source))
    return importlib.reload(sys.modules["drift_upstream"])


def _verified(digest: str, spec: str = ">=1") -> Verified:
    return Verified("pytest", "drift_upstream:area", {spec: digest})


def test_verified_body_reads_verified(upstream: tuple[Path, ModuleType]) -> None:
    """The body the fingerprint was taken from reads "verified against this body"."""
    found = drift(_verified(body_fingerprint(upstream[1].area)))
    assert found.ok and found.state == "verified"
    assert found.text.startswith("verified against this body (area, pytest ")


def test_an_inherited_body_is_named_where_it_is_defined(upstream: tuple[Path, ModuleType]) -> None:
    """A path to a method a subclass inherits (MambaModel.forward on 0.18+) says whose body it is."""
    path, _ = upstream
    module = _rewrite(
        path, BODY + "\n\nclass Base:\n    def forward(self):\n        return 1\n\n\nclass Child(Base):\n    pass\n"
    )
    found = drift(Verified("pytest", "drift_upstream:Child.forward", {">=1": body_fingerprint(module.Base.forward)}))
    assert found.ok and "(Child.forward, defined as Base.forward, pytest " in found.text
    own = drift(Verified("pytest", "drift_upstream:Base.forward", {">=1": body_fingerprint(module.Base.forward)}))
    assert "defined as" not in own.text and "(Base.forward, pytest " in own.text


def test_body_changed_under_the_same_signature_reads_review(upstream: tuple[Path, ModuleType]) -> None:
    """A function whose code changed but whose signature did not is caught: "changed since verification"."""
    import inspect

    path, module = upstream
    declared = _verified(body_fingerprint(module.area))
    before = inspect.signature(module.area)
    changed = _rewrite(path, CHANGED)
    assert inspect.signature(changed.area) == before
    found = drift(declared)
    assert not found.ok and found.state == "changed"
    assert found.text.startswith("upstream body changed since verification: review (area, pytest ")


def test_layout_comments_and_docstrings_are_not_the_body(upstream: tuple[Path, ModuleType]) -> None:
    """Reformatting, comments and a new docstring keep the fingerprint; the code is what counts."""
    path, module = upstream
    digest = body_fingerprint(module.area)
    assert body_fingerprint(_rewrite(path, REFORMATTED).area) == digest
    assert body_fingerprint(_rewrite(path, CHANGED).area) != digest


def test_a_release_never_verified_with_an_other_body_reads_review(upstream: tuple[Path, ModuleType]) -> None:
    """Outside every verified range, a body that is none of the verified ones asks for review too."""
    path, module = upstream
    declared = _verified(body_fingerprint(module.area), spec="<1")
    assert drift(declared).ok  # the same body verifies whatever the release
    _rewrite(path, CHANGED)
    found = drift(declared)
    assert found.state == "unverified" and "review" in found.text and "never verified" in found.text


def test_report_warns_but_installs(upstream: tuple[Path, ModuleType]) -> None:
    """A changed body is a warning in the report; the patch is installed all the same."""
    path, module = upstream
    declared = _verified(body_fingerprint(module.area))
    changed = _rewrite(path, CHANGED)
    patch = Patch("area_twice", "drift_upstream:area", lambda width, height: 2 * width * height, verified=declared)
    registry = patchreg.Registry("drift-test")
    with registry.patched(PatchSet("drift-set", (patch,))) as report:
        assert changed.area(2, 3) == 12
        ((name, found),) = report.drift
        assert name == "area_twice" and not found.ok
        assert "review   area_twice" in str(report) and "changed since verification" in str(report)
    assert changed.area(2, 3) == 7


def _finder(module: str) -> object:
    def find(extra: object) -> Discovery:
        return discover((module,), (), group=None)

    return find


def test_doctor_says_verified_or_review(upstream: tuple[Path, ModuleType], tmp_path: Path) -> None:
    """doctor lists each declared body: "ok ... verified against this body" (exit 0), then "WARNING ... review" and
    exits 1: drift is something wrong."""
    path, module = upstream
    (tmp_path / "drift_sets.py").write_text(
        textwrap.dedent(f"""
        from patchreg import Patch, PatchSet, Verified
        SET = PatchSet("drift-sample", (
            Patch("area_twice", "drift_upstream:area", lambda w, h: 2 * w * h,
                  verified=Verified("pytest", "drift_upstream:area", {{">=1": "{body_fingerprint(module.area)}"}})),
        ))
        """)
    )
    sys.modules.pop("drift_sets", None)

    def doctor() -> tuple[int, str]:
        out = io.StringIO()
        status = run(["doctor", "drift-sample"], finder=_finder("drift_sets"), out=out)  # type: ignore[arg-type]
        return status, out.getvalue()

    status, text = doctor()
    assert status == 0 and "ok drift-sample.area_twice: verified against this body" in text
    _rewrite(path, CHANGED)
    status, text = doctor()
    assert status == 1
    assert "WARNING drift-sample.area_twice: upstream body changed since verification: review" in text
    assert text.rstrip().endswith("1 of 1 patch(es) would install; 1 upstream body(ies) drifted.")
    sys.modules.pop("drift_sets", None)


@pytest.mark.parametrize(
    ("bodies", "match"),
    [({}, "non-empty mapping"), ({"not a version!": "0" * 16}, "neither a version"), ({"1.0": "abc"}, "16 hex")],
)
def test_bad_declarations_are_refused_with_the_remedy(bodies: dict[str, str], match: str) -> None:
    """An empty table, a bad specifier or a malformed fingerprint is a PatchDefinitionError saying what to write."""
    with pytest.raises(PatchDefinitionError, match=match):
        Verified("pytest", "drift_upstream:area", bodies)


def test_verified_must_be_a_verified_record() -> None:
    """Patch(verified=...) takes a Verified; anything else is refused at definition."""
    with pytest.raises(PatchDefinitionError, match="is not a Verified"):
        Patch("p", "drift_upstream:area", len, verified="46d5249fdb6a8283")  # type: ignore[arg-type]
    with pytest.raises(PatchDefinitionError, match="import path"):
        Verified("pytest", "drift_upstream.area", {"1": "0" * 16})


def test_body_command_prints_the_fingerprint_to_declare(upstream: tuple[Path, ModuleType]) -> None:
    """`patchreg body PATH` prints the fingerprint a Verified declaration takes; a bad path is a usage error."""
    out = io.StringIO()
    assert run(["body", "drift_upstream:area"], finder=_finder("drift_upstream"), out=out) == 0  # type: ignore[arg-type]
    assert out.getvalue() == f"{body_fingerprint(upstream[1].area)}  drift_upstream:area\n"
    assert run(["body", "drift_upstream:nothing"], finder=_finder("drift_upstream"), out=io.StringIO()) == 2  # type: ignore[arg-type]


def test_doctor_reads_the_displaced_body_while_the_patch_is_installed(
    upstream: tuple[Path, ModuleType], tmp_path: Path
) -> None:
    """Inside a block of the very set doctor checks, the verified body is the one the patch displaced: no false
    drift, exit 0 (drift is exit 1)."""
    _path, module = upstream
    (tmp_path / "drift_active.py").write_text(
        textwrap.dedent(f"""
        from patchreg import Patch, PatchSet, Verified
        SET = PatchSet("drift-active", (
            Patch("area", "drift_upstream:area", lambda w, h: 0,
                  verified=Verified("pytest", "drift_upstream:area", {{">=1": "{body_fingerprint(module.area)}"}})),
        ))
        """)
    )
    sys.modules.pop("drift_active", None)
    sys.path.insert(0, str(tmp_path))
    try:
        import drift_active

        with patchreg.registry.patched(drift_active.SET):
            out = io.StringIO()
            status = run(["doctor", "drift-active"], finder=_finder("drift_active"), out=out)  # type: ignore[arg-type]
        assert status == 0, out.getvalue()
        assert "ok drift-active.area: verified against this body" in out.getvalue()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("drift_active", None)
