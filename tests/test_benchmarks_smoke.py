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
    _module("benchmarks", "--quick", "--out", str(out), timeout=540)
    text = out.read_text()
    assert "| CPU |" in text and "| megatron-core |" in text
    assert "| # | measure | figure | target | result |" in text
    for number in range(1, 7):
        assert f"\n## {number}. " in text, f"section {number} is missing"
    assert "This section failed" not in text, text
    assert "enter + exit, mtp_patched" in text and "per-target cost" in text
    shapes = text.split("\n## 7. ")[1].split("\n## ")[0]  # per shape: how many of the peers' sites are a module's
    assert "| peers' sites on an nn.Module |" in shapes
    rows = [row for row in shapes.splitlines() if row.startswith(("| GPTModel", "| HybridModel"))]
    assert rows, shapes
    for row in rows:  # the model's forward, at least, is an nn.Module's attribute on every route
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        on_modules, of = cells[2].split(" of ")
        assert of == cells[1] and 1 <= int(on_modules) <= int(of), row


def test_cachesim_reads_callgrind_totals_and_renders_the_ratio() -> None:
    """The cache-simulation report takes a callgrind file's summary line and divides our L2 misses by a side's."""
    from benchmarks import cachesim

    text = "version: 1\nevents: Ir I1mr D1mr D1mw ILmr DLmr DLmw\nfn=(1) f\n0 1\nsummary: 100 2 3 4 10 20 10\n"
    assert cachesim.totals(text) == {"Ir": 100, "I1mr": 2, "D1mr": 3, "D1mw": 4, "ILmr": 10, "DLmr": 20, "DLmw": 10}
    with pytest.raises(ValueError, match="not a callgrind output file"):
        cachesim.totals("events: Ir\n")
    ours = cachesim.totals(text)
    peer = {**ours, "ILmr": 5, "DLmr": 10, "DLmw": 5}
    report = cachesim.render({"ours": ours, "monkeypatch": peer}, cycles=1, l2=(2 << 20, 16, 64), installed=2)
    assert "| MonkeyPatch x2 + undo (like for like) | 100 | 2 / 7 | 5 / 15 | 2.000x |" in report
    assert "its L2 (2048 KiB, 16-way, 64 B lines)" in report
    size, ways, line = cachesim.l2_cache()
    assert size >= 64 * 1024 and ways >= 1 and line >= 16


def test_cachesim_child_runs_every_side_without_valgrind() -> None:
    """The process valgrind runs (one side counted, every side interleaved with steps) exits 0 on its own."""
    _module("benchmarks.cachesim", "--side", "ours", "--cycles", "1", timeout=300)


def _module(name: str, *args: str, timeout: int) -> None:
    """``python -m name *args`` from the repository root (no leftover rendezvous of another test); exits 0."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    command = [sys.executable, "-m", name, *args]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
