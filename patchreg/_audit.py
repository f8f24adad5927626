"""``python -m patchreg doctor --against CANDIDATE``: the audit before an upgrade, importing nothing of the candidate.

The candidate is a requirement (``vllm==0.34.0``, fetched with ``pip download --no-deps`` into a temporary
folder), a wheel, an sdist or a source tree (a directory to put on ``PYTHONPATH``). Its files are read, never
imported: each patch of the sets that touch it is judged by ``Predicate.against`` on a :class:`~patchreg._versions.Code`
(the candidate's tree for its packages, the installed files for the rest), its import-path target is looked up
in the source, and its verified upstream body (``Patch(verified=...)``) is fingerprinted from the candidate's
file. One verdict per patch:

- ``install``: it would install;
- ``not needed``: skipped as not needed there (natively done upstream, a fixed bug);
- ``changed``: a body it was verified against changed (the function's diff against the installed body, shortened);
- ``no``: it would not install (a version, a name, a parameter it needs is not there);
- ``unknown``: a behavioural probe (``check()``) needs the import: run ``doctor`` where the candidate is installed.

Exit status: 0 every patch installs or is not needed; 1 one changed or would not install (or a set failed to
load); 3 nothing failed but some are unknown; 2 a usage error (no such candidate).
"""

from __future__ import annotations

import difflib
import email.parser
import json
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

import attrs
from packaging.requirements import InvalidRequirement, Requirement

from patchreg._discovery import VERSION, Found, LoadError
from patchreg._drift import Verified, body_fingerprint_node, compare, defined_at, unreadable
from patchreg._format import WIDTH, table, wrap
from patchreg._predicates import distributions
from patchreg._records import Patch, named_modules
from patchreg._sources import Found as SourceFound
from patchreg._sources import find, locate, reader
from patchreg._targets import ImportPath
from patchreg._versions import Code, Static, provider

__all__ = ["CandidateError", "Verdict", "audit", "candidate", "judge", "touches"]

OK, FAILED, UNKNOWN = 0, 1, 3
Kind = Literal["install", "not needed", "changed", "no", "unknown"]
DIFF_LINES = 24  # a changed body's diff is cut after this many lines


class CandidateError(Exception):
    """The candidate cannot be read: no such directory or file, a requirement pip cannot download."""


@attrs.frozen
class Verdict:
    """One patch judged on the candidate: ``verdict``, why, and for a changed body the drift sentence and diff."""

    set: str
    patch: str
    verdict: Kind
    reason: str
    body: str = ""
    diff: str = ""
    path: str = ""  # the verified upstream function (``Patch(verified=...)``), when it has one

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return attrs.asdict(self)


# -- the candidate ---------------------------------------------------------------------------------


def candidate(spec: str, workdir: Path) -> Code:
    """The code of candidate ``spec`` (a directory, a wheel, an sdist or a requirement), unpacked under ``workdir``."""
    path = Path(spec)
    if path.is_dir():
        return _tree(_project_root(path), spec)
    if path.is_file():
        return _archive(path, workdir, path.name)
    if any(sep in spec for sep in ("/", "\\")) or spec.endswith((".whl", ".tar.gz", ".zip", ".tgz")):
        msg = f"candidate {spec!r}: no such file or directory; give a source tree, a wheel, an sdist or a requirement."
        raise CandidateError(msg)
    return _archive(_download(spec, workdir / "download"), workdir, spec)


def _download(spec: str, dest: Path) -> Path:
    try:
        Requirement(spec)
    except InvalidRequirement as exc:
        msg = f"candidate {spec!r} is not a directory, a file or a requirement ({exc}); e.g. 'vllm==0.34.0'."
        raise CandidateError(msg) from None
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(dest), spec]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    files = sorted(dest.iterdir()) if dest.is_dir() else []
    if done.returncode != 0 or len(files) != 1:
        why = (done.stderr.strip().splitlines() or ["no file downloaded"])[-1]
        msg = f"`pip download --no-deps {spec}` failed ({why}); download the wheel or sdist and pass its path."
        raise CandidateError(msg)
    return files[0]


def _archive(path: Path, workdir: Path, label: str) -> Code:
    """A wheel (a zip with a ``.dist-info``), or an sdist (a ``.tar.gz`` or ``.zip`` with one project folder)."""
    dest = workdir / "candidate"
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                zf.extractall(dest)
        else:
            with tarfile.open(path) as tf:  # the "data" filter refuses links and paths out of dest (3.10.12+)
                if hasattr(tarfile, "data_filter"):
                    tf.extractall(dest, filter="data")
                else:
                    tf.extractall(dest)
    except (OSError, tarfile.TarError, zipfile.BadZipFile) as exc:
        msg = f"candidate {label!r} is neither a wheel nor an sdist ({type(exc).__name__}: {exc})."
        raise CandidateError(msg) from None
    return _tree(_project_root(dest), label)


def _project_root(path: Path) -> Path:
    """The folder to put on PYTHONPATH: an sdist's single project folder entered, then its ``src/``."""
    entries = [p for p in path.iterdir() if not p.name.startswith(".")]
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].name.isidentifier():  # name-1.0/
        path = entries[0]
    return path / "src" if (path / "src").is_dir() and not (path / "src" / "__init__.py").exists() else path


def _tree(root: Path, label: str) -> Code:
    packages = frozenset(_packages(root, ""))
    if not packages:
        msg = f"candidate {label!r} holds no Python package at {root}; give the folder you would put on PYTHONPATH."
        raise CandidateError(msg)
    name, version = _metadata(root)
    return Code((str(root),), packages, label, name, version)


def _packages(folder: Path, prefix: str) -> Iterator[str]:
    """The packages and modules a tree holds, dotted; a namespace folder (``megatron/``, no ``__init__.py``) is
    not held itself, only what it holds (``megatron.core``), so that another distribution's part of the namespace
    (``megatron.bridge``) stays the installed one."""
    for p in sorted(folder.iterdir()):
        if p.suffix == ".py" and p.stem.isidentifier():
            yield f"{prefix}{p.stem}"
        elif p.is_dir() and p.name.isidentifier() and (p / "__init__.py").is_file():
            yield f"{prefix}{p.name}"
        elif p.is_dir() and p.name.isidentifier() and any(p.glob("**/*.py")):
            yield from _packages(p, f"{prefix}{p.name}.")


def _metadata(root: Path) -> tuple[str | None, str | None]:
    """Name and version from a wheel's ``.dist-info/METADATA`` or an sdist's ``PKG-INFO``, when there is one."""
    for file in [*root.glob("*.dist-info/METADATA"), root / "PKG-INFO", root.parent / "PKG-INFO"]:
        if file.is_file():
            headers = email.parser.Parser().parsestr(
                file.read_text(encoding="utf-8", errors="replace"), headersonly=True
            )
            return headers.get("Name"), headers.get("Version")
    return None, None


# -- the verdicts ----------------------------------------------------------------------------------


def _modules(patch: Patch) -> set[str]:
    """The modules a patch names: its target's, its predicate's paths', its requirements' and its verified body's."""
    modules = set(named_modules(patch))
    modules.update(reader(name).package for name in distributions(patch.when))
    if patch.verified is not None:
        modules.update({patch.verified.path.partition(":")[0], reader(patch.verified.distribution).package})
    return modules


def touches(code: Code, found: Found) -> bool:
    """Whether any patch of the set names a module the candidate holds."""
    return any(code.owns(m) for p in found.patch_set for m in _modules(p))


def judge(patch: Patch, found: Found, code: Code) -> Verdict:
    """``patch``'s verdict on ``code``."""
    answer = patch.when.against(code)
    if answer.ok is not False:
        answer = _with_target(patch, code, answer)
    if answer.ok is False:
        return Verdict(found.name, patch.name, "no" if answer.needed else "not needed", answer.reason)
    if patch.verified is None:
        return Verdict(found.name, patch.name, "install" if answer.ok else "unknown", answer.reason)
    body, diff = _body(patch.verified, code)
    kind: Kind = "changed" if diff else "install" if answer.ok else "unknown"
    return Verdict(found.name, patch.name, kind, answer.reason, body, diff, patch.verified.path)


def _with_target(patch: Patch, code: Code, answer: Static) -> Static:
    """The answer, unless the import-path target the candidate holds is not in its source (and not created)."""
    where = patch.where
    if not isinstance(where, ImportPath) or patch.create or not code.owns(where.module):
        return answer
    target = code.find(str(where))
    if target.state == "found":
        return answer
    reason = code.where(target.reason, str(where))
    if target.state == "missing" and (answer.ok or answer.needed):  # it fails either way: no install
        return Static(False, reason)
    return Static(None, f"{answer.reason}; {reason}", answer.needed)


def _body(verified: Verified, code: Code) -> tuple[str, str]:
    """The drift sentence for the candidate's body of ``verified.path``, and its diff against the installed one."""
    if not code.holds(verified.distribution):
        return "", ""
    mine = code.find(verified.path)
    version = code.provider(verified.distribution).version or "unknown"
    named = verified.path.partition(":")[2]
    where = f"{named}, {verified.distribution} {version} in {code.label}"
    if mine.state != "found" or mine.node is None or not mine.source():
        return unreadable(where, mine.reason or "not a def"), "(no body in the candidate to compare)"
    where = defined_at(named, mine.where.partition(":")[2], where)
    fingerprint = body_fingerprint_node(mine.node)
    drift = compare(verified, fingerprint, version, where)
    if drift.ok:
        return drift.text, ""
    installed = find(verified.path, locate)
    if installed.node is not None and body_fingerprint_node(installed.node) == fingerprint:
        return f"{drift.text}; the same body as installed here: the upgrade does not change it", ""
    return drift.text, _diff(verified, installed, mine.source())


def _diff(verified: Verified, installed: SourceFound, candidate_source: str) -> str:
    """A unified diff of the installed body (read from its file) to the candidate's, cut to :data:`DIFF_LINES`."""
    if installed.state != "found" or not installed.source():
        return f"(no installed body of {verified.path} to compare with)"
    was = provider(verified.distribution).version_or("installed")
    lines = list(
        difflib.unified_diff(
            installed.source().splitlines(),
            candidate_source.splitlines(),
            f"installed ({verified.distribution} {was})",
            "candidate",
            n=1,
            lineterm="",
        )
    )
    if not lines:  # another fingerprint from the same text: a Python version's syntax tree differs
        return f"(the installed body of {verified.path} reads the same; its fingerprint differs)"
    cut = lines[:DIFF_LINES]
    more = len(lines) - len(cut)
    return "\n".join(cut + ([f"... ({more} more diff lines)"] if more else []))


# -- the report ------------------------------------------------------------------------------------


def audit(spec: str, sets: Sequence[Found], errors: Sequence[LoadError], out: TextIO, *, as_json: bool = False) -> int:
    """Judge every patch of ``sets`` that touch candidate ``spec``; write the report to ``out``; the exit status."""
    with tempfile.TemporaryDirectory(prefix="patchreg-against-") as tmp:
        code = candidate(spec, Path(tmp))
        judged = [f for f in sets if touches(code, f)]
        rows = [judge(p, f, code) for f in judged for p in f.patch_set]
        versions = _versions(code, judged)
    untouched = [f.name for f in sets if f not in judged]
    status = _status(rows, errors)
    if as_json:
        report: dict[str, Any] = {"candidate": spec, "versions": versions, "patches": [r.as_dict() for r in rows]}
        report |= {"untouched": untouched, "not_loaded": [e.reason for e in errors], "status": status}
        out.write(json.dumps(report, indent=2) + "\n")
        return status
    _write(spec, versions, rows, untouched, errors, out)
    return status


def _versions(code: Code, judged: Sequence[Found]) -> dict[str, str]:
    names = sorted({n for f in judged for p in f.patch_set for n in _requirements(p) if code.holds(n)})
    return {name: code.provider(name).describe() for name in names}


def _requirements(patch: Patch) -> set[str]:
    names = set(distributions(patch.when))
    return names | ({patch.verified.distribution} if patch.verified is not None else set())


def _status(rows: Sequence[Verdict], errors: Sequence[LoadError]) -> int:
    if errors or any(r.verdict in ("changed", "no") for r in rows):
        return FAILED
    return UNKNOWN if any(r.verdict == "unknown" for r in rows) else OK


def _write(
    spec: str,
    versions: dict[str, str],
    rows: Sequence[Verdict],
    untouched: Sequence[str],
    errors: Sequence[LoadError],
    out: TextIO,
) -> None:
    found = "; ".join(versions.values()) or "no version read"
    head = [f"patchreg {VERSION} doctor --against {spec}", f"candidate: {found}; nothing of it is imported"]
    out.writelines(f"{line}\n" for text in head for line in wrap(text, WIDTH))
    out.write("\n")
    cells = [(r.set, r.patch, r.verdict, r.reason) for r in rows]
    text = table(("set", "patch", "verdict", "reason"), cells, width=WIDTH, truncate=True, floors=(0, 0, 0, 30))
    out.write(text + "\n")
    for line in _details(rows):
        out.write(line + "\n")
    if errors:
        out.write("\nnot loaded:\n")
        out.writelines(f"  {e.reason}\n" for e in errors)
    counts = {
        kind: sum(r.verdict == kind for r in rows) for kind in ("install", "not needed", "changed", "no", "unknown")
    }
    said = ", ".join(f"{n} {_COUNTED[kind]}" for kind, n in counts.items() if n)
    out.write(f"\n{len(rows)} patch(es) judged: {said or 'none'}.\n")
    notes = ["unknown: a behavioural probe needs the import; run `patchreg doctor` where the candidate is installed."]
    notes = notes if counts["unknown"] else []
    notes += (
        [f"Sets not touching the candidate, not judged (see `doctor`): {', '.join(untouched)}."] if untouched else []
    )
    out.writelines(f"{line}\n" for note in notes for line in wrap(note, WIDTH))


_COUNTED = {
    "install": "would install",
    "not needed": "not needed",
    "changed": "changed upstream",
    "no": "would not install",
    "unknown": "unknown",
}


def _details(rows: Sequence[Verdict]) -> Iterator[str]:
    """Each changed upstream body once: the patches relying on it, the drift sentence and the shortened diff."""
    changed: dict[str, list[Verdict]] = {}
    for r in rows:
        if r.verdict == "changed":
            changed.setdefault(r.path, []).append(r)
    if changed:
        yield "\nchanged upstream bodies (each matters where its patches install):"
    for path, group in changed.items():
        yield f"  {path}"
        patches = ", ".join(f"{r.set}.{r.patch}" for r in group)
        yield from (f"      {line}" for line in wrap(f"for {patches}: {group[0].body}", WIDTH - 6))
        yield from (f"      {line}"[:WIDTH] for line in group[0].diff.splitlines())
