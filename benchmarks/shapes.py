"""Section 7: enter + exit of ``mtp_patched`` vs the like-for-like peers, per model shape (GPTModel with one and with
three MTP layers, HybridModel with one and with three), in the tight loop and right after a training step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from benchmarks import _hybrid, _model
from benchmarks._report import Check, Section
from benchmarks._settings import Settings
from benchmarks._sides import (
    FLOOR,
    _floor_cycle,
    _mock_cycle,
    _monkeypatch_cycle,
    _patchreg_cycle,
    _quiet_stdout,
    _wrapt_cycle,
    installed_sites,
    targets_at,
)
from benchmarks._timing import compare, looped

#: (label, builder) per model shape
SHAPES: list[tuple[str, Callable[[], Any]]] = [
    ("GPTModel, 1 MTP layer", lambda: _model.build(1)),
    ("GPTModel, 3 MTP layers", lambda: _model.build(3)),
    ("HybridModel, 1 MTP layer", lambda: _hybrid.build(1)),
    ("HybridModel, 3 MTP layers", lambda: _hybrid.build(3)),
]
PEERS = {
    "MonkeyPatch + undo": _monkeypatch_cycle,
    "mock.patch.object": _mock_cycle,
    "wrapt + manual restore": _wrapt_cycle,
}
OURS = "patchreg mtp_patched"


def shapes(settings: Settings) -> Section:
    """Section 7: per model shape, ours vs each like-for-like peer, tight and right after a step."""
    from benchmarks.cycles import _after_a_step

    section = Section(
        7,
        "Enter + exit per model shape: `mtp_patched` vs the like-for-like peers",
        (
            "shape",
            "installs",
            "peers' sites on an nn.Module",
            "ours per cycle",
            "÷ floor",
            "÷ MonkeyPatch",
            "÷ mock",
            "÷ wrapt",
        ),
    )
    for label, build in SHAPES:
        if label.startswith("HybridModel") and not _hybrid.available():
            section.notes.append(f"{label}: this megatron-core has no HybridModel with MTP; not measured.")
            continue
        sides: dict[str, Any] = {}
        probe = build()
        sites = installed_sites(probe)
        on_modules = sum(isinstance(holder, torch.nn.Module) for holder, _attr, _new in targets_at(probe, sites))
        sides[OURS] = looped(_patchreg_cycle(build()))
        for peer, cycle in {FLOOR: _floor_cycle, **PEERS}.items():
            peer_model = build()  # each side on its own model of the same shape
            sides[peer] = looped(cycle(peer_model, targets=targets_at(peer_model, sites)))
        with _quiet_stdout():
            tight = compare(sides, number=settings.cycle_ops, repeat=settings.repeat, warmup=2)
        after = _after_a_step(sides, settings)
        for when, cmp in (("tight loop", tight), ("right after a training step", after)):
            ratios = [cmp.ratio(OURS, peer).median for peer in (FLOOR, *PEERS)]
            section.rows.append(
                (
                    f"{label}, {when}",
                    str(len(sites)),
                    f"{on_modules} of {len(sites)}",
                    cmp.stats[OURS].us(),
                    *(f"{r:.3f}x" for r in ratios),
                )
            )
        r = tight.ratio(OURS, FLOOR).median  # issue 43's bounds
        section.checks.append(Check(f"{label}: tight loop vs the floor", f"{r:.3f}x", "<= 2.5x", r <= 2.5))
        r = tight.ratio(OURS, "MonkeyPatch + undo").median
        section.checks.append(Check(f"{label}: tight loop vs MonkeyPatch", f"{r:.3f}x", "<= 0.75x", r <= 0.75))
        for peer in PEERS:
            r = after.ratio(OURS, peer).median
            section.checks.append(Check(f"{label}: after a step vs {peer}", f"{r:.3f}x", "<= 1.0x", r <= 1.0))
    section.notes.append(
        f"The floor ({FLOOR!r}, `benchmarks/_sides.py:_floor_cycle`, about 20 lines) installs the same objects on "
        "the same attributes as our block: into the holders' own dicts under a lock, and checks that every "
        "attribute still holds its object before any is put back. What it leaves out is what the engine adds: "
        "counts, records (what `summary()`, `explain()` and the backup read), plans and their guards, a second "
        "registry or an outer block on the same attribute, conflicts, the block's report."
    )
    section.notes.append(
        "Each peer installs, on its own model of the same shape, the very attributes our block installs on this "
        "shape (found by comparing the model's and its submodules' `__dict__` inside the block with outside), so "
        "every row is equal work. Ratios are medians of pair-wise ratios within one run; section 1's notes describe "
        "the after-a-step harness."
    )
    section.notes.append(
        "\"Peers' sites on an nn.Module\": how many of those attributes are an `nn.Module`'s, where MonkeyPatch, mock "
        "and wrapt set (and put back) through `nn.Module.__setattr__`; our block writes the instance's `__dict__` "
        "wherever it installs. The others are a plain `setattr` for the peers: on megatron-core 0.19.2 the native "
        "route installs a config value and a module-level function there, so the like-for-like peers do less "
        "work per install than on the releases whose patches replace nn.Module methods (`make bench-release "
        "RELEASE=0.18.2` times the same sections on 0.18.2)."
    )
    return section
