"""The peers: verl 0.9.1's ``mtp_patch.py``, fetched from its wheel at benchmark time and imported by path.

Nothing of verl is committed: ``pip download --no-deps verl==0.9.1 -d benchmarks/.peers`` fetches the
wheel (gitignored), and the one file is read out of it. When that fails (no network, no pip), the
verl columns say so instead of a figure.
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
import types
import zipfile
from pathlib import Path

VERL_VERSION = "0.9.1"
VERL_MEMBER = "verl/models/mcore/mtp_patch.py"
PEERS = Path(__file__).parent / ".peers"
_MODULE_NAME = "_patchreg_bench_verl_mtp_patch"


class PeerUnavailable(RuntimeError):
    """verl's file could not be fetched or imported; the message says why."""


def _wheel() -> Path:
    found = sorted(PEERS.glob(f"verl-{VERL_VERSION}-*.whl"))
    if found:
        return found[0]
    PEERS.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"verl=={VERL_VERSION}", "-d", str(PEERS)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        msg = f"could not run `{' '.join(cmd[2:])}`: {exc}"
        raise PeerUnavailable(msg) from exc
    found = sorted(PEERS.glob(f"verl-{VERL_VERSION}-*.whl"))
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        msg = f"`pip download verl=={VERL_VERSION}` failed (exit {done.returncode}): {tail[0]}"
        raise PeerUnavailable(msg)
    return found[0]


def verl_source() -> tuple[Path, str]:
    """The path of verl's ``mtp_patch.py`` read out of the wheel, and the wheel's sha256 (first 12)."""
    wheel = _wheel()
    target = PEERS / f"verl-{VERL_VERSION}-mtp_patch.py"
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()[:12]
    if not target.exists():
        try:
            with zipfile.ZipFile(wheel) as zf:
                target.write_bytes(zf.read(VERL_MEMBER))
        except (KeyError, zipfile.BadZipFile) as exc:
            msg = f"{wheel.name} has no readable {VERL_MEMBER}: {exc}"
            raise PeerUnavailable(msg) from exc
    return target, digest


def load_verl() -> tuple[types.ModuleType, str]:
    """verl's ``mtp_patch`` module (imported by path, once) and a one-line provenance note."""
    path, digest = verl_source()
    module = sys.modules.get(_MODULE_NAME)
    if module is None:
        spec = importlib.util.spec_from_file_location(_MODULE_NAME, path)
        if spec is None or spec.loader is None:
            msg = f"cannot import {path}"
            raise PeerUnavailable(msg)
        module = importlib.util.module_from_spec(spec)
        sys.modules[_MODULE_NAME] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[_MODULE_NAME]
            msg = f"importing verl {VERL_VERSION}'s {VERL_MEMBER} failed: {exc.__class__.__name__}: {exc}"
            raise PeerUnavailable(msg) from exc
    return module, f"verl {VERL_VERSION} `{VERL_MEMBER}` from the wheel (sha256 {digest}...), imported by path"


class Sink:
    """A stdout that discards: verl prints on every patch and unpatch."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass
