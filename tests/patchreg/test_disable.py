"""PATCHREG_DISABLE: the patches and sets it names are never installed, by every path, and say so."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import patchreg
from patchreg import Patch, PatchError, PatchSet, Registry
from patchreg._cli import run
from patchreg._disable import _ESSENTIAL, REASON
from patchreg._discovery import Discovery, Found
from tests.patchreg import sample


def louder(x: int) -> int:
    return x + 100


def doubled(self: Any) -> str:
    return "patched"


FUNC = Patch("func", "tests.patchreg.sample:module_func", louder)
METHOD = Patch("method", "method", doubled)  # on an object given at apply time
GLOBAL_SET = PatchSet("dis-global", [FUNC])
OBJ_SET = PatchSet("dis-obj", [METHOD, Patch("inherited", "inherited", doubled)])


@pytest.fixture
def disable(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Set PATCHREG_DISABLE and re-read it (patchreg.refresh()); unset and re-read after the test."""

    def set_to(value: str) -> None:
        monkeypatch.setenv("PATCHREG_DISABLE", value)
        patchreg.refresh()

    yield set_to
    monkeypatch.delenv("PATCHREG_DISABLE", raising=False)
    patchreg.refresh()


@pytest.fixture
def essential_method() -> Iterator[None]:
    """METHOD declared essential for one test."""
    patchreg.essential(METHOD)
    yield
    _ESSENTIAL.pop(id(METHOD), None)


@pytest.mark.parametrize("value", ["dis-global.func", "func", "dis-global", " other , dis-global.func "])
def test_apply_skips_every_spelling(patch_registry: Registry, disable: Callable[[str], None], value: str) -> None:
    """set.patch, a bare patch name and a set name each disable the patch; the report says why."""
    disable(value)
    report = patch_registry.apply(GLOBAL_SET)
    assert report.installed == 0
    assert sample.module_func(1) == 2
    assert ("func", REASON) in report.skipped


def test_read_once_until_refresh(patch_registry: Registry, monkeypatch: pytest.MonkeyPatch, disable: Any) -> None:
    """The variable is read at import and by refresh(), not per apply."""
    monkeypatch.setenv("PATCHREG_DISABLE", "func")  # not re-read yet
    report = patch_registry.apply(GLOBAL_SET)
    assert report.installed == 1
    patch_registry.revert(report)
    patchreg.refresh()
    assert patch_registry.apply(GLOBAL_SET).installed == 0


def test_plan_keeps_the_skip_and_refresh_drops_it(patch_registry: Registry, disable: Callable[[str], None]) -> None:
    """A block's planned enters keep skipping the disabled patch; after the variable is emptied they install it."""
    obj = sample.Child()
    disable("dis-obj.method")
    for _ in range(4):  # the third enter on is planned
        with patch_registry.patched(OBJ_SET, obj) as report:
            assert obj.method() == "child-method"
            assert obj.inherited() == "patched"
            assert ("method", REASON) in report.skipped
    disable("")
    with patch_registry.patched(OBJ_SET, obj):
        assert obj.method() == "patched"


def test_lazy_patch_never_waits(patch_registry: Registry, disable: Callable[[str], None], tmp_path: Path) -> None:
    """A disabled lazy patch is skipped at once, not installed when its module is imported."""
    name = f"patchreg_dis_{id(tmp_path):x}"
    (tmp_path / f"{name}.py").write_text("def greet():\n    return 'hello'\n")
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    try:
        disable("lazy-set.greet")
        lazy = PatchSet("lazy-set", [Patch("greet", f"{name}:greet", lambda: "patched")])
        report = patch_registry.apply(lazy, lazy=True)
        assert not report.waiting
        assert ("greet", REASON) in report.skipped
        module = importlib.import_module(name)
        assert module.greet() == "hello"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def test_lazy_patch_disabled_before_its_import(
    patch_registry: Registry, disable: Callable[[str], None], tmp_path: Path
) -> None:
    """A lazy patch waiting when the variable is re-read to name it is skipped at its import."""
    name = f"patchreg_dis2_{id(tmp_path):x}"
    (tmp_path / f"{name}.py").write_text("def greet():\n    return 'hello'\n")
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    try:
        lazy = PatchSet("lazy-set2", [Patch("greet", f"{name}:greet", lambda: "patched")])
        report = patch_registry.apply(lazy, lazy=True)
        assert report.waiting
        disable("greet")
        module = importlib.import_module(name)
        assert module.greet() == "hello"
        assert ("greet", REASON) in report.skipped
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def test_strict_apply_does_not_refuse(patch_registry: Registry, disable: Callable[[str], None]) -> None:
    """A disabled patch is the operator's decision: strict=True does not raise for it."""
    disable("func")
    assert patch_registry.apply(GLOBAL_SET, strict=True).installed == 0


def test_essential_refuses_naming_the_variable(
    patch_registry: Registry, disable: Callable[[str], None], essential_method: None
) -> None:
    """A block whose essential patch is disabled refuses to enter, names PATCHREG_DISABLE, installs nothing."""
    obj = sample.Child()
    disable("dis-obj.method")
    for _ in range(3):  # every enter refuses: no plan is ever made that would run without it
        refused = pytest.raises(PatchError, match=r"dis-obj\.method is disabled by PATCHREG_DISABLE='dis-obj\.method'")
        with refused, patch_registry.patched(OBJ_SET, obj):
            pass  # pragma: no cover
        assert obj.inherited() == "base"
    assert not patch_registry.active()
    rows = patch_registry.explain(OBJ_SET, obj).rows
    assert rows[0][:3] == ("method", "-", "error")


def test_essential_not_disabled_costs_nothing(patch_registry: Registry, essential_method: None) -> None:
    """An essential patch that is not disabled installs as any other."""
    obj = sample.Child()
    with patch_registry.patched(OBJ_SET, obj):
        assert obj.method() == "patched"


def test_essential_takes_patches() -> None:
    """essential() refuses what is not a Patch."""
    with pytest.raises(PatchError, match="takes Patch records"):
        patchreg.essential("postprocess")  # type: ignore[arg-type]


def test_explain_says_disabled(patch_registry: Registry, disable: Callable[[str], None]) -> None:
    """explain() shows a disabled patch as skipped, with the reason."""
    disable("dis-obj.method")
    rows = patch_registry.explain(OBJ_SET, sample.Child()).rows
    assert ("method", "-", "skip", REASON) in rows
    assert any(r[0] == "inherited" and r[2] == "install" for r in rows)


def test_doctor_says_disabled(disable: Callable[[str], None], capsys: pytest.CaptureFixture[str]) -> None:
    """doctor shows a disabled patch as 'disabled' with the reason, and it does not fail the run."""
    import io

    disable("dis-global.func")
    found = Discovery((Found(GLOBAL_SET, "module tests", "tests"),), ())
    out = io.StringIO()
    assert run(["doctor", "--json"], finder=lambda _extra: found, out=out) == 0
    assert '"reason": "disabled by PATCHREG_DISABLE"' in out.getvalue()
    out = io.StringIO()
    run(["doctor"], finder=lambda _extra: found, out=out)
    assert "disabled" in out.getvalue()


def test_doctor_fails_for_an_essential_patch(
    disable: Callable[[str], None], essential_method: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """doctor exits 1 when a disabled patch is essential to its set (an apply would refuse)."""
    import io

    disable("method")
    found = Discovery((Found(OBJ_SET, "module tests", "tests"),), ())
    out = io.StringIO()
    assert run(["doctor", "--json"], finder=lambda _extra: found, out=out) == 1
    assert "cannot run without it" in out.getvalue()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "PATCHREG_DISABLE" in r.getMessage()]


def test_a_typo_is_warned_at_the_sets_first_apply_once(
    patch_registry: Registry, disable: Callable[[str], None], caplog: pytest.LogCaptureFixture
) -> None:
    """'set.typo' and 'near-set.patch' are warned about at the set's first apply, once, each with the name meant."""
    disable("dis-global.fnuc,dis-glbal.func,other-set.x,bare-name")
    with caplog.at_level("WARNING", logger="patchreg"):
        patch_registry.revert(patch_registry.apply(GLOBAL_SET))
        patch_registry.revert(patch_registry.apply(GLOBAL_SET))
    (line,) = _warnings(caplog)
    assert "'dis-global.fnuc' (did you mean 'dis-global.func'?)" in line
    assert "'dis-glbal.func' (did you mean 'dis-global.func'?)" in line
    assert "no patch of set 'dis-global' (applied here)" in line
    assert "other-set.x" not in line and "bare-name" not in line  # another set's names: checked where all are known


def test_the_check_loads_no_other_set_and_refresh_rearms_it(
    patch_registry: Registry,
    disable: Callable[[str], None],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first-apply check runs without discovery (no patch set is loaded), and again after refresh()."""
    import patchreg._discovery

    def no_discovery(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the PATCHREG_DISABLE check loaded the patch sets")

    monkeypatch.setattr(patchreg._discovery, "discover", no_discovery)
    disable("dis-obj.metod")
    obj = sample.Child()
    with caplog.at_level("WARNING", logger="patchreg"):
        patch_registry.revert(patch_registry.apply(OBJ_SET, obj))
        patchreg.refresh()
        patch_registry.revert(patch_registry.apply(OBJ_SET, obj))
    assert len(_warnings(caplog)) == 2
    assert "did you mean 'dis-obj.method'?" in _warnings(caplog)[0]


def test_valid_names_are_not_warned_about(
    patch_registry: Registry, disable: Callable[[str], None], caplog: pytest.LogCaptureFixture
) -> None:
    """A set name, 'set.patch', a bare patch name and another set's near name with that set's patch: no warning."""
    disable("dis-global,dis-global.func,func,dis-global-x.other")
    with caplog.at_level("WARNING", logger="patchreg"):
        patch_registry.apply(GLOBAL_SET)
    assert _warnings(caplog) == []
