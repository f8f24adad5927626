"""The pytest plugin (patchreg.testing): the patch_registry fixture, the leak guard and its opt-out marker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import patchreg

pytest_plugins = ["pytester"]

HEADER = """
import pytest
import patchreg
from patchreg import Patch, Registry

class Thing:
    def hello(self):
        return "hello"

HELLO = Patch("loud-hello", f"{__name__}:Thing.hello", lambda self: "HELLO")
"""


@pytest.fixture(autouse=True)
def _default_registry_starts_empty() -> None:
    """Inner sessions share this process's default registry; start each test with it empty."""
    assert patchreg.registry.active() == ()


def test_patch_registry_is_fresh_per_test_and_reverted_after(pytester: pytest.Pytester) -> None:
    """Each test gets its own empty Registry, and what it leaves there is reverted after the test."""
    pytester.makepyfile(
        HEADER
        + '''
seen = []

def test_first(patch_registry):
    """Leaves a patch in the fixture's registry."""
    assert isinstance(patch_registry, Registry) and patch_registry.active() == ()
    patch_registry.apply(HELLO)
    assert Thing().hello() == "HELLO"
    seen.append(patch_registry)

def test_second(patch_registry):
    """Sees the original back and a different registry."""
    assert Thing().hello() == "hello"
    assert patch_registry is not seen[0] and patch_registry.active() == ()
'''
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_leak_guard_fails_a_test_that_leaves_patches_active(pytester: pytest.Pytester) -> None:
    """A test leaving a patch in patchreg.registry errors with the patch named, and the patch is reverted."""
    pytester.makepyfile(
        HEADER
        + '''
def test_leaks():
    """Forgets to revert."""
    patchreg.apply(HELLO)

def test_after():
    """Runs with the leaked patch already reverted."""
    assert Thing().hello() == "hello"
    assert patchreg.registry.active() == ()
'''
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test left patches active in patchreg.registry: loud-hello on test_leak_guard_fails*.Thing.hello "
            "(active, count 1). Revert them (use `with patchreg.patched(...)`), or mark the test "
            "@pytest.mark.patchreg_leaks_ok.*",
            "ERROR *test_leaks*",
        ]
    )


def test_leak_guard_catches_a_leaked_environ_item_and_value(pytester: pytest.Pytester) -> None:
    """A test leaving an os.environ item and a value patch active errors naming both; both are reverted."""
    pytester.makepyfile(
        HEADER
        + '''
import os

FLAG = False
ENV = Patch("env", "os:environ", "1", kind="item", key="PATCHREG_PLUGIN_LEAK", create=True)
ON = Patch("on", f"{__name__}:FLAG", True, kind="value")

def test_leaks():
    """Forgets to revert."""
    patchreg.apply(ENV)
    patchreg.apply(ON)

def test_after():
    """Runs with both reverted."""
    assert "PATCHREG_PLUGIN_LEAK" not in os.environ and FLAG is False
'''
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test left patches active in patchreg.registry: env on os:environ[[]'PATCHREG_PLUGIN_LEAK'[]] (active, count 1);"
            " on on test_leak_guard_catches*.FLAG (active, count 1).*"
        ]
    )


def test_leak_guard_accepts_tests_that_revert(pytester: pytest.Pytester) -> None:
    """Tests that use patched(), or apply then revert, pass without a leak report."""
    pytester.makepyfile(
        HEADER
        + '''
def test_block():
    """A with block reverts."""
    with patchreg.patched(HELLO):
        assert Thing().hello() == "HELLO"

def test_apply_revert():
    """An explicit revert of the report."""
    report = patchreg.apply(HELLO)
    patchreg.revert(report)
'''
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert "test left patches active" not in result.stdout.str()


def test_opt_out_marker_is_registered_and_skips_the_guard(pytester: pytest.Pytester) -> None:
    """@pytest.mark.patchreg_leaks_ok passes under --strict-markers and leaves the patch active."""
    pytester.makepyfile(
        HEADER
        + '''
@pytest.mark.patchreg_leaks_ok
def test_means_to_leak():
    """Leaves the patch on purpose."""
    patchreg.apply(HELLO)
'''
    )
    try:
        result = pytester.runpytest("-p", "no:cacheprovider", "--strict-markers")
        result.assert_outcomes(passed=1)
        assert [e.patch for e in patchreg.registry.active()] == ["loud-hello"]
    finally:
        patchreg.registry.revert_all()


def test_patches_active_before_the_test_are_not_blamed(pytester: pytest.Pytester) -> None:
    """A patch applied by a module-scoped fixture is not a leak of the tests that run while it is held."""
    pytester.makepyfile(
        HEADER
        + '''
@pytest.fixture(scope="module")
def held():
    with patchreg.patched(HELLO):
        yield

def test_one(held):
    """Runs under the module fixture's patch."""
    assert Thing().hello() == "HELLO"

def test_two(held):
    """So does this one."""
    assert Thing().hello() == "HELLO"
'''
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)


LATE = """
import importlib
import sys

import pytest
import patchreg
from patchreg import Patch

GREET = Patch("greet", "late_mod_guard_xyz:greet", lambda: "patched")
"""


def _run_late_tests(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tests: str) -> pytest.RunResult:
    """Run ``tests`` (after LATE, beside a not yet imported module late_mod_guard_xyz) in a pytest subprocess.

    A subprocess has its own ``sys.meta_path`` for wrapt's import hook. The checkout goes on PYTHONPATH: the
    subprocess imports this patchreg, and finds its plugin entry point (the checkout's egg-info) where patchreg
    is not installed (the matrix lanes).
    """
    pytester.makepyfile(late_mod_guard_xyz='def greet():\n    return "hello"\n')
    pytester.makepyfile(test_late=LATE + tests)
    root = str(Path(patchreg.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    return pytester.runpytest_subprocess("-p", "no:cacheprovider")


def test_lazy_patch_of_a_wider_fixture_is_not_blamed_when_a_test_imports_its_module(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lazy patch a module-scoped fixture holds turns from pending to active on the test's import: no leak."""
    result = _run_late_tests(
        pytester,
        monkeypatch,
        '''
@pytest.fixture(scope="module")
def held():
    sys.modules.pop("late_mod_guard_xyz", None)
    report = patchreg.registry.apply(GREET, lazy=True)
    assert [e.state for e in patchreg.registry.active()] == ["pending"]
    yield report
    patchreg.registry.revert(report)

def test_imports_the_module(held):
    """The fixture's patch fires on this import."""
    assert importlib.import_module("late_mod_guard_xyz").greet() == "patched"
    assert [e.state for e in patchreg.registry.active()] == ["active"]

def test_after(held):
    """Still held, still not blamed."""
    assert importlib.import_module("late_mod_guard_xyz").greet() == "patched"
''',
    )
    result.assert_outcomes(passed=2)
    assert "test left patches active" not in result.stdout.str()


def test_lazy_patch_a_test_leaves_pending_or_fired_is_blamed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lazy patch the test itself applies and leaves (pending, or fired by its import) is a leak."""
    result = _run_late_tests(
        pytester,
        monkeypatch,
        '''
def test_leaves_it_pending():
    """Applies lazily and never imports."""
    sys.modules.pop("late_mod_guard_xyz", None)
    patchreg.registry.apply(GREET, lazy=True)

def test_fires_and_leaves_it():
    """Applies lazily, imports, and forgets to revert."""
    sys.modules.pop("late_mod_guard_xyz", None)
    patchreg.registry.apply(GREET, lazy=True)
    assert importlib.import_module("late_mod_guard_xyz").greet() == "patched"
''',
    )
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*test left patches active in patchreg.registry: greet on late_mod_guard_xyz.greet (pending, count 1)*",
            "*test left patches active in patchreg.registry: greet on late_mod_guard_xyz.greet (active, count 1)*",
        ]
    )


def test_plugin_can_be_disabled(pytester: pytest.Pytester) -> None:
    """`-p no:patchreg` turns the plugin off: no leak guard and no fixture."""
    pytester.makepyfile(
        HEADER
        + '''
def test_leaks():
    """Nobody checks."""
    patchreg.apply(HELLO)

def test_fixture(patch_registry):
    """The fixture is not there."""
'''
    )
    try:
        result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:patchreg")
        result.assert_outcomes(passed=1, errors=1)
        result.stdout.fnmatch_lines(["*fixture 'patch_registry' not found*"])
    finally:
        patchreg.registry.revert_all()
