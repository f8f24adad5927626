"""The command line: list, doctor (text and JSON, exit status), show, usage errors, python -m."""

from __future__ import annotations

import importlib.metadata
import inspect
import io
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from packaging.version import Version

from patchreg import Patch, PatchSet, has, requires
from patchreg.__main__ import main
from patchreg._cli import Finder, run
from patchreg._discovery import Discovery, Found, discover

SAMPLE = "tests.patchreg.cli_sample"
DUPES = "tests.patchreg.cli_sample_dupes"
ROOT = Path(__file__).resolve().parents[2]
ATTRS = importlib.metadata.version("attrs")


def _sample(extra: Sequence[str]) -> Discovery:
    return discover((SAMPLE, *extra), (), group=None)


def cli(*argv: str) -> tuple[int, str]:
    """Run the CLI in-process on the sample sets; return (status, stdout)."""
    out = io.StringIO()
    status = run(list(argv), finder=_sample, out=out)
    return status, out.getvalue()


def test_list_names_each_set_with_source_count_and_first_doc_line() -> None:
    """`list` prints one row per set: name, number of patches, source module, first line of its doc."""
    status, out = cli("list")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == ["set", "patches", "source", "description"]
    assert lines[2].split() == [
        "sample-ready",
        "3",
        "module",
        SAMPLE,
        "Patches",
        "that",
        "install",
        "in",
        "any",
        "environment.",
    ]
    assert "second paragraph" not in out
    assert lines[3].split()[:4] == ["sample-skipping", "3", "module", SAMPLE]


def test_list_reports_a_module_that_cannot_be_imported() -> None:
    """A scanned module that does not exist is listed under 'not loaded', and list still succeeds."""
    status, out = cli("--module", "tests.patchreg.no_such_module", "list")
    assert status == 0
    assert "not loaded:\n  module tests.patchreg.no_such_module is not installed" in out


def test_doctor_all_installable_exits_zero_with_versions() -> None:
    """`doctor SET` exits 0 when every patch would install, and prints the version its predicate found."""
    status, out = cli("doctor", "sample-ready")
    assert status == 0
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("sample-ready ")}
    assert set(rows) == {"shout", "tag-method", "tag-forward"}
    assert rows["shout"].split()[2:6] == ["yes", "attrs", ATTRS, "attrs"]
    assert f"attrs {ATTRS} satisfies >=20" in rows["shout"]
    assert rows["tag-forward"].endswith("…") and all(len(line) <= 100 for line in out.splitlines())
    assert "selector is resolved on the model at apply time" in _reasons("sample-ready")["tag-forward"]
    assert out.splitlines()[0].startswith("patchreg ") and "megatron-core" in out.splitlines()[0]
    assert out.rstrip().endswith("3 of 3 patch(es) would install.")


def _reasons(name: str, *options: str) -> dict[str, str]:
    """The whole reason per patch of set ``name``, from `doctor --json` (the table cuts long ones to fit)."""
    _status, out = cli(*options, "doctor", "--json", name)
    return {row["patch"]: row["reason"] for row in json.loads(out)}


def test_doctor_exits_one_and_says_why_a_patch_would_not_install() -> None:
    """`doctor` exits 1 when a patch would be skipped, with the version found or the missing target."""
    status, out = cli("doctor", "sample-skipping")
    assert status == 1
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("sample-skipping ")}
    assert rows["future"].split()[2] == "no"
    assert f"attrs {ATTRS} does not satisfy >=999" in rows["future"]
    assert rows["missing-target"].split()[2] == "no"
    assert "tests.patchreg.sample:Child.no_such_method does not exist" in _reasons("sample-skipping")["missing-target"]
    assert rows["shout"].split()[2] == "yes"
    assert out.rstrip().endswith("1 of 3 patch(es) would install.")


def test_doctor_without_names_checks_every_set_and_counts_load_failures() -> None:
    """Plain `doctor` covers all sets, lists modules that failed to load, and then exits 1."""
    status, out = cli("--module", "tests.patchreg.no_such_module", "doctor")
    assert status == 1
    assert "sample-ready " in out and "sample-skipping " in out
    assert "not loaded:" in out and out.rstrip().endswith("4 of 6 patch(es) would install; 1 not loaded.")


def test_doctor_counts_not_needed_patches_as_fine() -> None:
    """A patch skipped as not needed here (not_needed_when) keeps doctor's exit status 0 and says so."""
    status, out = cli("-m", "tests.patchreg.cli_sample_fixed", "doctor", "sample-fixed")
    assert status == 0
    row = next(line for line in out.splitlines() if line.startswith("sample-fixed ") and "workaround" in line)
    assert "not needed" in row and f"not needed here: attrs {ATTRS}" in row
    assert "1 of 2 patch(es) would install, 1 not needed here." in out


def test_doctor_json_is_a_list_of_objects_with_the_same_facts() -> None:
    """`doctor --json` prints one object per patch with install, reason and versions."""
    status, out = cli("doctor", "--json", "sample-skipping", "sample-ready")
    assert status == 1
    objects = json.loads(out)
    assert [(o["set"], o["patch"]) for o in objects][:3] == [
        ("sample-skipping", "future"),
        ("sample-skipping", "missing-target"),
        ("sample-skipping", "shout"),
    ]
    future = objects[0]
    assert future == {
        "set": "sample-skipping",
        "source": f"module {SAMPLE}",
        "patch": "future",
        "target": "tests.patchreg.sample:module_func",
        "kind": "replace",
        "install": False,
        "reason": f"attrs {ATTRS} does not satisfy >=999",
        "versions": {"attrs": ATTRS},
        "needed": True,
        "body": "",
        "body_ok": True,
    }
    assert all(o["install"] for o in objects if o["set"] == "sample-ready")


def test_doctor_json_lists_load_failures_as_objects() -> None:
    """A module that failed to load appears in the JSON list as an object with install false and the reason."""
    status, out = cli("--module", "tests.patchreg.no_such_module", "doctor", "--json")
    assert status == 1
    failed = [o for o in json.loads(out) if o["set"] is None]
    assert failed == [
        {
            "set": None,
            "source": "module tests.patchreg.no_such_module",
            "patch": None,
            "target": None,
            "kind": None,
            "install": False,
            "reason": "module tests.patchreg.no_such_module is not installed "
            "(no module named 'tests.patchreg.no_such_module')",
            "versions": {},
            "needed": True,
            "body": "",
            "body_ok": True,
        }
    ]


def test_doctor_json_load_failures_have_the_keys_of_patch_objects() -> None:
    """A load failure's JSON object has the same keys, in the same order, as a patch's; it counts as needed."""
    status, out = cli("--module", "tests.patchreg.no_such_module", "doctor", "--json")
    objects = json.loads(out)
    failed = next(o for o in objects if o["set"] is None)
    patch = next(o for o in objects if o["set"] is not None)
    assert status == 1
    assert list(failed) == list(patch)
    assert not (failed["install"] or not failed["needed"])  # `install or not needed` is doctor's test of fine


def test_doctor_selects_sets_by_module_name() -> None:
    """A module name selects every set defined in it."""
    status, out = cli("doctor", "--json", SAMPLE)
    assert status == 1
    assert {o["set"] for o in json.loads(out)} == {"sample-ready", "sample-skipping"}


def test_doctor_unknown_set_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown set name exits 2 and names the known sets on stderr."""
    status, out = cli("doctor", "no-such-set")
    assert status == 2
    assert out == ""
    err = capsys.readouterr().err
    assert "unknown patch set 'no-such-set'; known sets: sample-ready, sample-skipping" in err


def test_show_prints_target_kind_predicate_answer_and_docstring() -> None:
    """`show set.patch` prints the target, kind, predicate with its answer, and the whole docstring."""
    status, out = cli("show", "sample-ready.shout")
    assert status == 0
    fields = dict(line.split(None, 1) for line in out.split("\n\n")[0].splitlines())
    assert fields["patch"] == "sample-ready.shout"
    assert fields["source"] == f"module {SAMPLE}"
    assert fields["target"] == "tests.patchreg.sample:module_func (import path)"
    assert fields["kind"] == "replace"
    assert fields["predicate"] == "requires('attrs>=20')"
    assert fields["answer"] == f"yes: attrs {ATTRS} satisfies >=20"
    assert "replacement tests.patchreg.cli_sample.shout:\n    Return a marker instead of x + 1." in out
    assert "Used by the CLI tests to check that ``show`` prints the whole docstring." in out


def test_show_accepts_a_unique_patch_name_and_describes_selectors() -> None:
    """A patch name unique across sets is enough; a selector target says it resolves at apply time."""
    status, out = cli("show", "tag-forward")
    assert status == 0
    assert "target     blocks[*].forward (selector, resolved on the object given to apply())" in out
    assert "kind       wrap" in out


def test_show_ambiguous_or_unknown_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A name shared by two sets, or no patch at all, exits 2 with a remedy."""
    assert cli("show", "shout")[0] == 2
    assert (
        f"'shout' names 2 patches: patch 'shout' of set 'sample-ready' from module {SAMPLE} "
        f"(write 'sample-ready.shout'); patch 'shout' of set 'sample-skipping' from module {SAMPLE} "
        "(write 'sample-skipping.shout')."
    ) in capsys.readouterr().err
    assert cli("show", "sample-ready.nope")[0] == 2
    assert "no patch named 'sample-ready.nope'" in capsys.readouterr().err


def test_show_ambiguous_set_patch_names_each_source_and_a_name_that_works(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A 'set.patch' two sets share (by name, or by splitting a dotted name) names each source and a working name."""
    assert cli("-m", DUPES, "show", "sample-ready.shout")[0] == 2
    err = capsys.readouterr().err
    assert f"patch 'shout' of set 'sample-ready' from module {SAMPLE} (write '{SAMPLE}:sample-ready.shout')" in err
    assert f"patch 'shout' of set 'sample-ready' from module {DUPES} (write '{DUPES}.shout')" in err
    status, out = cli("-m", DUPES, "show", f"{DUPES}.shout")
    assert status == 0 and f"source     module {DUPES}\n" in out and "Child.static" in out
    status, out = cli("-m", DUPES, "show", f"{SAMPLE}:sample-ready.shout")
    assert status == 0 and f"source     module {SAMPLE}\n" in out and "sample:module_func" in out
    assert cli("-m", DUPES, "show", "dotted.set.p")[0] == 2
    err = capsys.readouterr().err
    assert f"patch 'p' of set 'dotted.set' from module {DUPES} (write '{DUPES}.p')" in err
    assert f"patch 'set.p' of set 'dotted' from module {DUPES} (write '{DUPES}.set.p')" in err
    status, out = cli("-m", DUPES, "show", f"{DUPES}.set.p")
    assert status == 0 and "patch      dotted.set.p\n" in out and "Base.method" in out


def test_a_module_that_exits_at_import_is_listed_not_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A -m module raising SystemExit at import is listed under 'not loaded' with its exit code; list and doctor run."""
    (tmp_path / "cli_exits_xyz.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    status, out = cli("-m", "cli_exits_xyz", "list")
    assert status == 0 and "sample-ready " in out
    assert "not loaded:\n  importing cli_exits_xyz failed: SystemExit with exit code 3: it exits when loaded" in out
    status, out = cli("-m", "cli_exits_xyz", "doctor", "--json", "cli_exits_xyz")
    assert status == 1
    assert [(o["source"], o["install"]) for o in json.loads(out)] == [("module cli_exits_xyz", False)]


def test_bad_arguments_exit_two(capsys: pytest.CaptureFixture[str]) -> None:
    """A missing or unknown command exits 2 with argparse's usage line."""
    assert main([]) == 2
    assert main(["frobnicate"]) == 2
    assert "usage: patchreg" in capsys.readouterr().err


def test_python_dash_m_piped_output_is_plain_and_stable() -> None:
    """`python -m patchreg` in a pipe prints the plain table, without escape codes, and returns doctor's status."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    cmd = [sys.executable, "-m", "patchreg", "--module", SAMPLE, "doctor", "sample-ready"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    assert first.returncode == 0, first.stderr
    assert "\x1b[" not in first.stdout
    assert next(line.split()[:3] for line in first.stdout.splitlines() if line.startswith("sample-ready ")) == [
        "sample-ready",
        "shout",
        "yes",
    ]


def test_doctor_on_this_environment_lists_the_mtp_set() -> None:
    """`doctor megatron-mtp` with the default discovery covers every MTP patch, with megatron-core's version."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    from patches.megatron import MTP_SET

    out = io.StringIO()
    status = run(["doctor", "--json", "megatron-mtp"], out=out)
    rows = json.loads(out.getvalue())
    assert [(r["set"], r["patch"]) for r in rows] == [("megatron-mtp", name) for name in MTP_SET.names]
    assert all(r["reason"] for r in rows)
    assert status == (0 if all(r["install"] or not r["needed"] for r in rows) else 1)
    postprocess = next(r for r in rows if r["patch"] == "postprocess")
    mcore = importlib.metadata.version("megatron-core")
    assert postprocess["install"] is MTP_SET["postprocess"].when.evaluate().ok
    assert postprocess["versions"] == {"megatron-core": mcore}
    if Version(mcore) >= Version("0.19"):  # the release the project is developed on: upstream's RL mode carries it
        assert postprocess["install"] is False and postprocess["needed"] is False
        assert next(r for r in rows if r["patch"] == "rl_mode_forward")["install"] is True
        assert status == 0  # today's replacements and checkpointed_forward are not needed here


ODD = textwrap.dedent(
    """
    from patchreg import Patch, PatchSet, check, has

    class Boom:
        @property
        def inner(self):
            raise RuntimeError("backend not initialised")

    holder = Boom()

    class Probe:  # a callable with __eq__, hence unhashable
        def __eq__(self, other):
            return isinstance(other, Probe)

        def __call__(self):
            return True

    def f():
        return 1

    def g():
        return 2

    def replacement():
        return 0

    ODD = PatchSet(
        "odd",
        [
            Patch("through-property", "cli_odd_xyz:holder.inner.attr", replacement),
            Patch("has-through-property", "cli_odd_xyz:f", replacement, when=has("cli_odd_xyz:holder.inner.attr")),
            Patch("unhashable-check", "cli_odd_xyz:g", replacement, when=check(Probe(), "probe")),
        ],
    )

    NOISY = PatchSet(
        "noisy",
        [Patch("kernel", "cli_noisy_lib_xyz:kernel", replacement, when=has("cli_noisy_lib_xyz:kernel"))],
    )
    """
)

NOISY_LIB = 'print("noisy lib: using fallback kernels")\n\ndef kernel():\n    return 1\n'


@pytest.fixture
def odd_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Modules cli_odd_xyz (odd targets and predicates) and cli_noisy_lib_xyz (prints at import)."""
    (tmp_path / "cli_odd_xyz.py").write_text(ODD)
    (tmp_path / "cli_noisy_lib_xyz.py").write_text(NOISY_LIB)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "cli_odd_xyz"
    for name in ("cli_odd_xyz", "cli_noisy_lib_xyz"):
        sys.modules.pop(name, None)


def test_doctor_and_show_report_odd_targets_and_predicates_without_a_traceback(odd_modules: str) -> None:
    """A target or has() through a raising property is a 'no' row with the reason; an unhashable check() works."""
    status, out = cli("-m", odd_modules, "doctor", "odd")
    assert status == 1
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("odd ")}
    reason = "cli_odd_xyz:holder.inner raised RuntimeError: backend not initialised"
    reasons = _reasons("odd", "-m", odd_modules)
    assert rows["through-property"].split()[2] == "no" and reason in reasons["through-property"]
    assert rows["has-through-property"].split()[2] == "no" and reason in reasons["has-through-property"]
    assert rows["unhashable-check"].split()[2] == "yes" and "probe is true" in rows["unhashable-check"]
    status, out = cli("-m", odd_modules, "show", "odd.through-property")
    assert status == 0
    assert f"install    no: {reason}" in out
    status, out = cli("-m", odd_modules, "show", "odd.unhashable-check")
    assert status == 0 and "answer     yes: probe is true" in out


def test_doctor_json_stays_valid_when_a_library_prints_at_import(
    odd_modules: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a library prints to stdout while it is imported goes to stderr; stdout is only the JSON."""
    status = run(["-m", odd_modules, "doctor", "--json", "noisy"], finder=_sample)
    captured = capsys.readouterr()
    assert status == 0
    assert [(o["patch"], o["install"]) for o in json.loads(captured.out)] == [("kernel", True)]
    assert "noisy lib: using fallback kernels" in captured.err


def test_show_says_the_answer_once() -> None:
    """`show` prints the predicate's reason on the answer line only; the install line adds only what differs."""
    status, out = cli("show", "sample-ready.shout")
    assert status == 0
    assert out.count(f"attrs {ATTRS} satisfies >=20") == 1
    assert "install    yes\n" in out


def test_show_prints_the_patch_doc_instead_of_repeating_the_replacement_docstring() -> None:
    """A patch with its own doc shows that doc under the replacement's name, not also the replacement's docstring."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    from patches.megatron import POSTPROCESS
    from patches.megatron._native import native

    out = io.StringIO()
    assert run(["show", "megatron-mtp.postprocess"], out=out) == 0
    text = out.getvalue()
    assert POSTPROCESS.doc.strip() in text
    assert (inspect.getdoc(POSTPROCESS.replacement) or "").splitlines()[0] not in text
    assert text.count("satisfies >=0.13") == (0 if native() else 1)  # 0.19.2: answered "natively covered" first


def test_doctor_fits_100_columns_on_this_environment() -> None:
    """Plain `doctor` over every known set prints no line wider than 100 columns; --json keeps whole reasons."""
    out = io.StringIO()
    run(["doctor"], out=out)
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    whole = io.StringIO()
    run(["doctor", "--json"], out=whole)
    longest = max(len(row["reason"] or "") for row in json.loads(whole.getvalue()))
    assert longest > 60  # this environment has reasons longer than the table's column: they were cut, not lost


# -- doctor: what it covers by default -----------------------------------------------------------------------------

ELSEWHERE = PatchSet(
    "ours-elsewhere", [Patch("gone", "no_such_pkg_xyz.mod:f", len), Patch("gone2", "no_such_pkg_xyz:g", len)]
)
BY_REQUIRES = PatchSet("ours-by-requires", [Patch("needs", "os:sep", "/", kind="value", when=requires("no-such-dist"))])
HERE = PatchSet("ours-here", [Patch("fine", "tests.patchreg.sample:module_func", len)])
USERS = PatchSet("users-missing", [Patch("theirs", "no_such_pkg_xyz:h", len)])


def _coverage(*sets: tuple[PatchSet, bool]) -> Finder:
    """A finder of ``sets``, each marked bundled (patchreg's own) or not (the user's)."""
    found = tuple(Found(s, "module m", "m", bundled) for s, bundled in sets)
    return lambda extra: Discovery(found, ())


def _doctor(finder: Finder, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return run(["doctor", *argv], finder=finder, out=out), out.getvalue()


def test_doctor_by_default_gives_bundled_sets_for_missing_packages_one_line() -> None:
    """Bundled sets whose packages are not installed are not checked (one line names them and what they need),
    so doctor exits 0 when everything installed here is fine; --all checks them too and exits 1."""
    finder = _coverage((ELSEWHERE, True), (BY_REQUIRES, True), (HERE, True))
    status, out = _doctor(finder)
    assert status == 0, out
    assert "ours-here" in out and "gone" not in out.split("not checked")[0]
    text = " ".join(out.split())
    assert "not checked: 2 bundled set(s), 3 patch(es), for packages not installed here:" in text
    assert "ours-elsewhere (needs no_such_pkg_xyz)" in text and "ours-by-requires (needs no-such-dist)" in text
    assert "`patchreg doctor --all` checks them too" in text
    assert out.rstrip().endswith("1 of 1 patch(es) would install.")
    assert all(len(line) <= 100 for line in out.splitlines())
    status, out = _doctor(finder, "--all")
    assert status == 1 and "not checked" not in out and "gone2" in out
    assert [o["set"] for o in json.loads(_doctor(finder, "--json")[1])] == ["ours-here"]


def test_doctor_checks_a_users_set_and_a_named_set_whatever_is_installed() -> None:
    """A set of the user's (not bundled) and a set named on the command line are always checked."""
    status, out = _doctor(_coverage((USERS, False), (ELSEWHERE, True)))
    assert status == 1 and "theirs" in out and "ours-elsewhere (needs no_such_pkg_xyz)" in " ".join(out.split())
    status, out = _doctor(_coverage((USERS, False), (ELSEWHERE, True)), "ours-elsewhere")
    assert status == 1 and "gone2" in out and "not checked" not in out


def test_a_module_a_release_lacks_inside_an_installed_package_is_checked_not_skipped() -> None:
    """A bundled set naming a module its installed package lacks (HybridModel's on megatron-core 0.17) is checked:
    its predicates judge the release; only a package that is not installed sends a set to the one line."""
    partly = PatchSet("ours-partly", [Patch("absent-here", "tests.patchreg.no_such_module_xyz:f", len)])
    status, out = _doctor(_coverage((partly, True)))
    assert status == 1 and "absent-here" in out and "not checked" not in out


def test_doctor_with_nothing_to_check_says_so_and_exits_zero() -> None:
    """Where none of the bundled sets' packages is installed and the user has none, doctor is green in a few lines."""
    status, out = _doctor(_coverage((ELSEWHERE, True)))
    assert status == 0 and "no patch set to check here." in out and len(out.splitlines()) < 10


def test_list_and_show_fit_100_columns() -> None:
    """A long source, description, predicate and docstring wrap: no line of list or show passes 100 columns."""
    long_doc = "A description " * 20
    patch = Patch(
        "long",
        "tests.patchreg.sample:module_func",
        len,
        when=requires("attrs>=20") & has("tests.patchreg.sample:module_func") & has("tests.patchreg.sample:Child"),
        doc="A docstring line " * 12,
    )
    found = (Found(PatchSet("a-set-with-a-rather-long-name", [patch], doc=long_doc), "entry point " + "x" * 90, "m"),)
    for argv in (["list"], ["show", "a-set-with-a-rather-long-name.long"]):
        out = io.StringIO()
        assert run(argv, finder=lambda extra: Discovery(found, ()), out=out) == 0
        assert max(len(line) for line in out.getvalue().splitlines()) <= 100, out.getvalue()


def test_doctor_header_fits_100_columns_where_nothing_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every stack distribution missing, the header line (their versions) still fits 100 columns."""
    import patchreg._cli

    monkeypatch.setattr(patchreg._cli, "_version", lambda name: "not installed")
    status, out = _doctor(_coverage((HERE, False)))
    assert status == 0 and max(len(line) for line in out.splitlines()) <= 100, out
    assert "torch not installed" in " ".join(out.split())
