"""What the figures were measured on: CPU model, cores, Python and library versions, date."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path


def cpu_model() -> str:
    """The ``model name`` line of /proc/cpuinfo, else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cores() -> str:
    """Cores this process may run on, and the machine's count."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{usable} usable of {os.cpu_count()}"


def load() -> str:
    """The load averages: how busy the machine was (figures from a busy machine are noisier)."""
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def describe() -> list[tuple[str, str]]:
    """(field, value) pairs for the report's header."""
    return [
        ("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        ("CPU", cpu_model()),
        ("cores", cores()),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("load average at start (1/5/15 min)", load()),
        ("Python", platform.python_version()),
        ("torch", version("torch")),
        ("megatron-core", version("megatron-core")),
        ("wrapt", version("wrapt")),
        ("patchreg", f"{version('patchreg')} (commit {git_commit()})"),
    ]
