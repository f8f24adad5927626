"""``python scripts/route_cost.py``: on megatron-core 0.19.2, the enter + exit of ``mtp_patched(model,
detach_encoder=True)`` on the native route (upstream's RL mode: a config value and two wraps, three installs at any
depth) against today's patches (forced by answering the route's probe "no"; ``_postprocess`` and one
``_get_embeddings`` per MTP layer), on the benchmarks' tiny GPTModel with 1 and with 3 MTP layers, interleaved.

Prints the medians of five alternating rounds (each the best of seven repeats of 3,000 cycles), their ratio, how
many patches each route installs, and what one install more costs.
"""

from __future__ import annotations

import statistics
import sys
import timeit
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    warnings.filterwarnings("ignore")
    for layers in (1, 3):
        route_cost(layers)
    return 0


def route_cost(layers: int) -> None:
    """Both routes' cycle on a model of ``layers`` MTP layers, interleaved, and what they install."""
    import patchreg
    from benchmarks import _model
    from patches.megatron import _native, mtp_patched

    model = _model.build(layers)

    def cycle() -> None:
        with mtp_patched(model, detach_encoder=True):
            pass

    def measure(route: str) -> None:
        """One round of ``route`` (its probe answer already in place): what it installs, and its cycle."""
        for _ in range(10):
            cycle()
        with mtp_patched(model, detach_encoder=True) as report:
            installs[route] = report.installed
        rounds[route].append(min(timeit.repeat(cycle, number=3000, repeat=7)) / 3000 * 1e6)

    probe = _native._rl_mode_probe
    rounds: dict[str, list[float]] = {"native route": [], "today's patches": []}
    installs: dict[str, int] = {}
    try:
        for _ in range(5):
            _native._rl_mode_probe = probe  # type: ignore[attr-defined]
            patchreg.refresh()
            measure("native route")
            _native._rl_mode_probe = lambda: (False, "forced by scripts/route_cost.py")  # type: ignore[attr-defined]
            patchreg.refresh()
            measure("today's patches")
    finally:
        _native._rl_mode_probe = probe  # type: ignore[attr-defined]
        patchreg.refresh()
    native, today = (statistics.median(v) for v in rounds.values())
    n, t = installs["native route"], installs["today's patches"]
    print(
        f"{layers} MTP layer(s): native route {native:.2f} µs ({n} installs), today's patches {today:.2f} µs "
        f"({t} installs), ratio {native / today:.3f}"
    )
    if n != t:  # the routes install different numbers of patches: what one install more or less costs
        print(f"  per install {(native - today) / (n - t):.2f} µs")


if __name__ == "__main__":
    raise SystemExit(main())
