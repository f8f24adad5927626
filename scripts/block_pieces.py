"""``python scripts/block_pieces.py [--layers N] [--json]``: what the pieces of one ``mtp_patched`` enter + exit
cost, in the tight loop and right after a training step, beside MonkeyPatch installing the same attributes.

On the benchmarks' tiny GPTModel (1 MTP layer unless ``--layers``), whatever route this megatron-core takes, each
side timed as the benchmarks time it (``benchmarks._timing.compare``, sides interleaved; after a step, one cycle
right after a forward + backward of another model). The sides, each a part of the one above it:

- ``mtp_patched`` block: the whole cycle a training loop pays;
- engine block: ``registry.patched(set, model)`` entered and exited (no model lookup, no MTP report);
- store: the plan's installs made and released in one pass each (``take_planned`` + ``release``: the lock, the
  ownership checks, the counts, the records), no block and no guard;
- guard: the plan's check that its selectors and import paths still lead to the same objects;
- the lock twice: an RLock acquired and released twice, as one enter + exit does.

Differences between them are printed as the cost of each layer. Engine privates are read here (a diagnostic, not a
benchmark): the split is not observable through the public API.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=1, help="MTP layers of the model (default 1)")
    parser.add_argument("--json", action="store_true", help="print the medians as JSON")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    found = pieces(args.layers)
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        print(render(found))
    return 0


def pieces(layers: int) -> dict[str, Any]:
    """Medians (µs) of each side, tight and right after a step, and the route and installs of the block."""
    import patchreg
    from benchmarks import _model
    from benchmarks._settings import Settings
    from benchmarks._sides import (
        _engine_cycle,
        _lock_cycle,
        _monkeypatch_cycle,
        _patchreg_cycle,
        installed_sites,
        targets_at,
    )
    from benchmarks._timing import compare, looped
    from benchmarks.cycles import _after_a_step
    from patches.megatron import mtp_patched

    model = _model.build(layers)
    sites = installed_sites(model)
    peer_model = _model.build(layers)
    with mtp_patched(model, detach_encoder=True) as report:
        installed = [entry.patch for entry in report.entries]

    engine_model = _model.build(layers)
    engine = _engine_cycle(engine_model)
    for _ in range(4):  # from the third enter, the plan is used in one pass
        engine()
    registry = patchreg.registry
    store = registry._installs
    plan = store.last
    if plan is None or plan.fast is None:
        raise SystemExit("block_pieces: the engine block did not reach its one-pass plan; nothing to split")

    def take_release() -> None:
        store.release(store.take_planned(registry, plan))

    def guard() -> None:
        plan.holds(engine_model)

    sides: dict[str, Callable[[int], float]] = {
        "MonkeyPatch x3 + undo (like for like)": looped(
            _monkeypatch_cycle(peer_model, targets=targets_at(peer_model, sites))
        ),
        "mtp_patched block": looped(_patchreg_cycle(model)),
        "engine block": looped(engine),
        "store (take_planned + release)": looped(take_release),
        "guard": looped(guard),
        "the lock twice": looped(_lock_cycle(None)),
    }
    settings = dataclasses.replace(Settings(), after_steps=151)
    tight = compare(sides, number=300, repeat=31, warmup=2)
    after = _after_a_step(sides, settings)
    return {
        "megatron_layers": layers,
        "installs": installed,
        "tight_us": {name: tight.stats[name].median / 1e3 for name in sides},
        "after_a_step_us": {name: after.stats[name].median / 1e3 for name in sides},
        "tight_ratio_vs_monkeypatch": tight.ratio("mtp_patched block", "MonkeyPatch x3 + undo (like for like)").median,
        "after_ratio_vs_monkeypatch": after.ratio("mtp_patched block", "MonkeyPatch x3 + undo (like for like)").median,
    }


def render(found: dict[str, Any]) -> str:
    """The sides and the layers between them as a table."""
    tight, after = found["tight_us"], found["after_a_step_us"]

    def layer(t: dict[str, float], name: str) -> float:
        if name == "MTP report and model lookup":
            return t["mtp_patched block"] - t["engine block"]
        if name == "block (threads, nesting, hooks)":
            return t["engine block"] - t["store (take_planned + release)"] - t["guard"]
        return t[name]

    lines = [
        f"mtp_patched on a GPTModel with {found['megatron_layers']} MTP layer(s): installs {', '.join(found['installs'])}",
        "",
        f"{'side':42} {'tight, µs':>10} {'after a step, µs':>17}",
    ]
    lines += [f"{name:42} {tight[name]:10.2f} {after[name]:17.2f}" for name in tight]
    lines += ["", "the layers (differences of the medians above):"]
    for name in (
        "MTP report and model lookup",
        "block (threads, nesting, hooks)",
        "guard",
        "store (take_planned + release)",
    ):
        lines.append(f"  {name:40} {layer(tight, name):10.2f} {layer(after, name):17.2f}")
    lines.append(
        f"\nmtp_patched ÷ MonkeyPatch (pair by pair): tight {found['tight_ratio_vs_monkeypatch']:.3f}x, "
        f"after a step {found['after_ratio_vs_monkeypatch']:.3f}x"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
