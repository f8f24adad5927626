"""Smoke test: ``python -m benchmarks --quick`` runs end to end and writes its table (no timing assertions)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("megatron.core")


def test_quick_benchmark_writes_the_table(tmp_path: Path) -> None:
    """The quick mode exits 0 and writes a report with the machine, every target row and every section."""
    out = tmp_path / "RESULTS.md"
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    text = out.read_text()
    assert "| CPU |" in text and "| megatron-core |" in text
    assert "| # | measure | figure | target | result |" in text
    for number in range(1, 7):
        assert f"\n## {number}. " in text, f"section {number} is missing"
    assert "This section failed" not in text, text
    assert "enter + exit, mtp_patched" in text and "per-target cost" in text
