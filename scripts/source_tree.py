"""Source trees as users run them: a package's tree first on PYTHONPATH, in an environment without its metadata.

Megatron-LM users run ``megatron/core`` from a git checkout on ``PYTHONPATH``, with no ``megatron-core``
distribution installed. This builds that situation from what is here, faithfully and without touching the
environment it starts from:

- :func:`venv_without` makes a virtual environment whose ``site-packages`` mirrors the running one's
  (symlinks, so it costs a second) without the named distributions' files and metadata, and returns its
  python: there, ``importlib.metadata`` finds no ``megatron-core`` and ``import megatron`` finds nothing
  until a tree is put on ``PYTHONPATH``;
- :func:`unpack` unpacks a snapshot (``.tar.gz``), a wheel or an sdist into a directory to put first on
  ``PYTHONPATH`` (a wheel without its ``.dist-info`` unless ``metadata=True``);
- :func:`wheel` downloads a wheel once (``pip download --no-deps``) into a cache directory;
- :func:`snapshot` finds a Megatron-LM snapshot (:data:`PLACES`: ``$PATCHREG_UPSTREAM_DIR``, ``../shared/upstream``);
- :func:`run` runs that python with a tree (and the repository) on ``PYTHONPATH``.

Command line (for a CI lane)::

    python scripts/source_tree.py venv DEST --without megatron-core   # prints DEST/bin/python
    python scripts/source_tree.py unpack ARCHIVE DEST [--metadata]    # prints the directory for PYTHONPATH
    python scripts/source_tree.py wheel megatron-core==0.18.2 --cache .cache/wheels   # prints the wheel
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]

__all__ = ["PLACES", "REPO", "run", "snapshot", "unpack", "upstream", "venv_without", "wheel"]

#: Where the Megatron-LM source snapshots may be, in order: ``$PATCHREG_UPSTREAM_DIR``, ``<repo>/../shared/upstream``,
#: ``/work/shared/upstream``. Test data, never in the repo.
PLACES = [
    *([Path(os.environ["PATCHREG_UPSTREAM_DIR"])] if os.environ.get("PATCHREG_UPSTREAM_DIR") else []),
    REPO.parent / "shared" / "upstream",
    Path("/work/shared/upstream"),
]


def upstream() -> Path | None:
    """The first of :data:`PLACES` that holds both Megatron-LM snapshots (main and dev), or None."""
    for place in PLACES:
        if all(sorted(place.glob(f"megatron-lm-{branch}-*.tar.gz")) for branch in ("main", "dev")):
            return place
    return None


def snapshot(branch: str) -> Path | None:
    """The Megatron-LM snapshot archive of ``branch`` (``main``, ``dev``) in :func:`upstream`, or None."""
    place = upstream()
    found = sorted(place.glob(f"megatron-lm-{branch}-*.tar.gz")) if place is not None else []
    return found[-1] if found else None


def venv_without(names: Iterable[str], dest: Path, python: str = sys.executable) -> Path:
    """A venv at ``dest`` mirroring ``python``'s site-packages without distributions ``names``; its python.

    Reuses ``dest`` when it was made for the same names (a marker file records them). When none of ``names`` is
    installed in that site-packages (an overlay on ``PYTHONPATH`` does not count), ``python`` itself is returned.
    """
    names = sorted(names)
    marker = dest / ".without"
    target = dest / "bin" / "python"
    if marker.is_file() and marker.read_text() == "\n".join(names) and target.exists():
        return target
    shutil.rmtree(dest, ignore_errors=True)
    site = Path(_purelib(python))
    excluded = _owned(names, site, python)
    if not excluded:  # none of them is installed there: that python is already without them
        return Path(python)
    subprocess.run([python, "-m", "venv", "--without-pip", str(dest)], check=True)
    mirror = Path(_purelib(str(target)))
    shutil.rmtree(mirror)
    _mirror(site, mirror, excluded, "")
    marker.write_text("\n".join(names))
    return target


def _purelib(python: str) -> str:
    if python == sys.executable:
        return sysconfig.get_path("purelib")
    code = "import sysconfig; print(sysconfig.get_path('purelib'))"
    return subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def _owned(names: Sequence[str], site: Path, python: str) -> set[str]:
    """The site-packages paths (posix, relative) the distributions ``names`` installed, from their RECORD."""
    if python != sys.executable:
        msg = "venv_without() reads the distributions' RECORD in this interpreter: run it with that python."
        raise SystemExit(msg)
    owned: set[str] = set()
    for dist in importlib.metadata.distributions(path=[str(site)]):  # those of site-packages only (not an overlay)
        if dist.name is not None and canonicalize_name(dist.name) in {canonicalize_name(n) for n in names}:
            for file in dist.files or ():
                path = Path(str(dist.locate_file(file))).resolve()
                if path.is_relative_to(site.resolve()):
                    owned.add(path.relative_to(site.resolve()).as_posix())
    return owned


def _mirror(src: Path, dst: Path, owned: set[str], prefix: str) -> None:
    """Symlink ``src``'s entries into ``dst``, leaving out ``owned`` files; a directory with some owned files
    is made and mirrored entry by entry, one with only owned files (and caches) is left out."""
    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted(os.listdir(src)):
        rel = f"{prefix}{entry}"
        path = src / entry
        if rel in owned:
            continue
        if path.is_dir() and not path.is_symlink():
            mine = [o for o in owned if o.startswith(f"{rel}/")]
            if mine and not _has_other_files(path, rel, owned):
                continue
            if mine:
                _mirror(path, dst / entry, owned, f"{rel}/")
                continue
        (dst / entry).symlink_to(path)


def _has_other_files(path: Path, rel: str, owned: set[str]) -> bool:
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        base = Path(root).relative_to(path).as_posix()
        for name in files:
            inner = f"{rel}/{name}" if base == "." else f"{rel}/{base}/{name}"
            if inner not in owned:
                return True
    return False


def unpack(archive: Path, dest: Path, *, metadata: bool = False) -> Path:
    """Unpack a ``.tar.gz`` snapshot or sdist, or a wheel, into ``dest``; the directory to put on PYTHONPATH.

    A wheel's ``.dist-info`` is dropped unless ``metadata``. An sdist's single top directory is entered (and its
    ``src/`` when it has one).
    """
    dest.mkdir(parents=True, exist_ok=True)
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            members = [m for m in zf.namelist() if metadata or ".dist-info/" not in m.split("/", 1)[0] + "/"]
            zf.extractall(dest, members)
        return dest
    with tarfile.open(archive) as tf:
        tf.extractall(dest, filter="data")
    entries = list(dest.iterdir())
    project = entries[0] if len(entries) == 1 and entries[0].is_dir() else None
    if project is None or not any((project / f).exists() for f in ("PKG-INFO", "pyproject.toml", "setup.py")):
        return dest  # a snapshot: the packages at its top
    return project / "src" if (project / "src").is_dir() else project


def wheel(requirement: str, cache: Path) -> Path:
    """The wheel of ``requirement`` (pinned: ``name==version``), downloaded into ``cache`` once."""
    name, _, version = requirement.partition("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    found = sorted(cache.glob(f"{stem}*.whl")) if cache.is_dir() else []
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(cache)]
        subprocess.run([*cmd, requirement], check=True)
        found = sorted(cache.glob(f"{stem}*.whl"))
    if not found:
        msg = f"pip download {requirement} left no wheel named {stem}*.whl in {cache}."
        raise SystemExit(msg)
    return found[-1]


def run(
    python: Path, tree: Path | None, args: Sequence[str], *, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python args`` with ``tree`` (when given) then the repository first on PYTHONPATH; output captured."""
    paths = [str(tree)] if tree is not None else []
    full = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([*paths, str(REPO)])}
    return subprocess.run([str(python), *args], env=full, capture_output=True, text=True, check=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("venv", help="a venv mirroring this one's site-packages without some distributions")
    p.add_argument("dest", type=Path)
    p.add_argument("--without", action="append", required=True, metavar="DIST")
    p = sub.add_parser("unpack", help="unpack a snapshot, a wheel or an sdist; prints the directory for PYTHONPATH")
    p.add_argument("archive", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--metadata", action="store_true", help="keep a wheel's .dist-info")
    sub.add_parser("upstream", help="print the folder that holds both Megatron-LM snapshots (exit 1: none does)")
    p = sub.add_parser("snapshot", help="print the Megatron-LM snapshot archive of a branch (exit 1: none)")
    p.add_argument("branch", choices=("main", "dev"))
    p = sub.add_parser("wheel", help="download a wheel once into a cache directory; prints its path")
    p.add_argument("requirement")
    p.add_argument("--cache", type=Path, default=REPO / ".cache" / "wheels")
    args = parser.parse_args(argv)
    if args.command == "venv":
        print(venv_without(args.without, args.dest.resolve()))
    elif args.command == "unpack":
        print(unpack(args.archive, args.dest.resolve(), metadata=args.metadata))
    elif args.command in ("upstream", "snapshot"):
        found = upstream() if args.command == "upstream" else snapshot(args.branch)
        if found is None:
            places = ", ".join(str(p) for p in PLACES)
            print(f"no Megatron-LM snapshots (megatron-lm-main-*.tar.gz and megatron-lm-dev-*.tar.gz) in {places}; "
                  "set PATCHREG_UPSTREAM_DIR to the folder that holds them", file=sys.stderr)  # fmt: skip
            return 1
        print(found.resolve())
    else:
        print(wheel(args.requirement, args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
