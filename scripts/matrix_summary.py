"""One release's lines of the megatron-core matrix summary, from the measurements its tests wrote.

Usage: ``python scripts/matrix_summary.py .matrix/<ver>.measurements.jsonl`` (scripts/test-matrix.sh calls it).
Per model class (GPTModel, HybridModel, MambaModel): the max abs diff of the logits and of the MTP
gradients against the independent reference, upstream-RL-mode parity (``labels=None``) where the
release has that mode, the native route against today's patches where the block rides that mode (0.19.2+), and for each detach mode the patches installed, those natively covered (skipped
as not needed: upstream does it right here) and those skipped otherwise (with the reason). Then the
fix-ups of upstream bugs (``MTP_FIXUPS_SET``): active here or not, and why, with the packed-padded
figures with and without the fix-up.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

CLASSES = ("GPTModel", "HybridModel", "MambaModel")
REASON_WIDTH = 90


def model_of(key: str) -> str:
    """The model class a measurement is about (keys without one are GPTModel's)."""
    return next((name for name in CLASSES[1:] if f"({name}" in key), "GPTModel")


def worst(rows: list[dict[str, Any]], prefix: str) -> float:
    values = [float(r["value"]) for r in rows if r["key"].startswith(prefix)]
    return max(values) if values else math.nan


def number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1e}"


def patch_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for row in rows:
        if not row["key"].startswith("patches ("):
            continue
        detach = row["key"].rsplit("detach=", 1)[-1].rstrip(")")
        parts = [f"{name} installed" for name in row["value"]["installed"]]
        unused = []  # the native route's patches, on a release without upstream's RL mode: one part, no reasons
        for name, reason in row["value"]["skipped"].items():
            short = reason if len(reason) <= REASON_WIDTH else reason[: REASON_WIDTH - 1] + "…"
            if "patched: today's patches carry it" in reason:
                unused.append(name)
                continue
            if reason.startswith("not needed"):  # natively covered: upstream does it right on this release
                state = "natively covered" if "upstream" in reason else "not needed"
            else:
                state = "skipped"
            parts.append(f"{name} {state} ({short})")
        if unused:
            parts.append(f"native route not used ({', '.join(unused)}): no RL mode with mtp_detach_heads here")
        lines.append(f"      detach_encoder={detach}: " + "; ".join(parts))
    return lines


def fixup_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The fix-ups' state on this release and the packed-padded figures (max over the cases) with and without."""
    lines = []
    for row in rows:
        if row["key"] == "fixups":
            for name, state in row["value"].items():
                short = state if len(state) <= REASON_WIDTH else state[: REASON_WIDTH - 1] + "…"
                lines.append(f"    fix-up {name}: {short}")
    fixed, unfixed = worst(rows, "packed-padded fixed loss"), worst(rows, "packed-padded unfixed loss")
    if not math.isnan(fixed) or not math.isnan(unfixed):
        lines.append(
            f"      packed-padded vs bshd: with the fix-up loss {number(fixed)} | mtp grads "
            f"{number(worst(rows, 'packed-padded fixed mtp grad'))}; without: loss {number(unfixed)} | mtp grads "
            f"{number(worst(rows, 'packed-padded unfixed mtp grad'))}"
        )
    return lines


def summary(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
    except OSError:
        return ["    (no measurements)"]
    lines = []
    for cls in CLASSES:
        mine = [r for r in rows if model_of(r["key"]) == cls and not r["key"].startswith(("fixups", "packed-padded"))]
        if not mine:
            continue
        rl = worst(mine, "rl-mode parity")
        rl_text = f"rl-mode parity (grads) {number(rl)}" if not math.isnan(rl) else "rl-mode: none on this release"
        route = worst(mine, "route vs patches")  # 0.19.2+: the native route against today's patches, max over all
        route_text = f" | native route vs today's patches {number(route)}" if not math.isnan(route) else ""
        lines.append(
            f"    {cls:<12} logits {number(worst(mine, 'logits'))} | mtp grads {number(worst(mine, 'mtp grad'))} "
            f"| {rl_text}{route_text}"
        )
        lines += patch_lines(mine)
    lines += fixup_lines(rows)
    return lines or ["    (no measurements)"]


if __name__ == "__main__":
    print("\n".join(summary(sys.argv[1])))
