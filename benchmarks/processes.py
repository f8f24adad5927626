"""Section 8: patches in every process: what ``bootstrap()``, ``PATCHREG_DISABLE`` and the agreement check cost.

Each figure comes from fresh processes (``python -m benchmarks.processes ROLE``), since the variables are read
when a process starts: bootstrap's cost at start-up, the MTP block's cycle with ``PATCHREG_DISABLE`` naming
nothing active against it unset (alternating runs), and ``assert_consistent`` over 2 and 8 Ray actors on a
local cluster (where Ray is installed: ``make test-verl`` puts it in ``.cache/verl-overlay``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._report import Check, Section
from benchmarks._settings import Settings

ROOT = Path(__file__).resolve().parent.parent
OVERLAY = ROOT / ".cache" / "verl-overlay"
NOTHING_ACTIVE = "no-such-set.no-such-patch"


def _child(role: str, *args: str, env: dict[str, str] | None = None, timeout: int = 300) -> Any:
    """Run ``python -m benchmarks.processes ROLE ARGS`` in a fresh process; its last stdout line as JSON."""
    drop = ("MASTER_ADDR", "MASTER_PORT")  # this process's gloo rendezvous (sections 1-6): the child makes its own
    full = {k: v for k, v in os.environ.items() if not k.startswith("PATCHREG_") and k not in drop}
    full.update(env or {})
    cmd = [sys.executable, "-m", "benchmarks.processes", role, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=ROOT, check=False, timeout=timeout)
    if done.returncode != 0:
        msg = f"{' '.join(cmd[1:])} exited {done.returncode}: {done.stderr[-1500:]}"
        raise RuntimeError(msg)
    return json.loads(done.stdout.splitlines()[-1])


def processes(settings: Settings) -> Section:
    """Section 8."""
    section = Section(
        8, "Patches in every process: bootstrap, PATCHREG_DISABLE, assert_consistent", ("measure", "figure")
    )
    runs = 3 if settings.quick else 15
    starts = [_child("start") for _ in range(runs)]
    call_us = statistics.median(s["bootstrap_us"] for s in starts)
    import_ms = statistics.median(s["import_ms"] for s in starts)
    section.rows.append(
        ("`import patchreg` in a fresh process (what each vLLM process's plugin loads)", f"{import_ms:.1f} ms")
    )
    section.rows.append(("`bootstrap()` with nothing named, first call in a fresh process", f"{call_us:.1f} µs"))
    section.checks.append(
        Check(
            "bootstrap() with nothing named, added to process start",
            f"{call_us / 1e3:.3f} ms",
            "<= 1 ms",
            call_us <= 1e3,
        )
    )
    cycle = _child("cycle", str(50 if settings.quick else settings.cycle_ops), str(6 if settings.quick else 40))
    plain, disabled, ratio = [cycle["unset"]], [cycle["disabled"]], cycle["ratio"]
    section.rows.append(
        ("mtp_patched enter + exit, PATCHREG_DISABLE unset", f"{statistics.median(plain) / 1e3:.2f} µs")
    )
    section.rows.append(
        (
            f"mtp_patched enter + exit, PATCHREG_DISABLE={NOTHING_ACTIVE!r}",
            f"{statistics.median(disabled) / 1e3:.2f} µs",
        )
    )
    section.checks.append(
        Check("block cycle, PATCHREG_DISABLE naming nothing active ÷ unset", f"{ratio:.3f}x", "<= 1.05x", ratio <= 1.05)
    )
    if (OVERLAY / "ray").is_dir():
        ray = _child("ray", "2,8", str(5 if settings.quick else 30), env={"PYTHONPATH": f"{OVERLAY}{os.pathsep}{ROOT}"})
        for n, row in ray.items():
            section.rows.append(
                (
                    f"assert_consistent over {n} Ray actors (one __ray_call__ each, in flight together)",
                    f"{row['check_ms']:.2f} ms (a no-op method on every actor: {row['noop_ms']:.2f} ms)",
                )
            )
        section.notes.append("Ray 2.60 from .cache/verl-overlay, a local cluster with 2 CPUs; medians.")
    else:
        section.notes.append("assert_consistent over Ray actors not measured: Ray is not installed (`make test-verl`).")
    return section


# -- the fresh processes -----------------------------------------------------------------------


def _start() -> dict[str, float]:
    t0 = time.perf_counter()
    import patchreg

    t1 = time.perf_counter()
    patchreg.bootstrap()
    t2 = time.perf_counter()
    return {"import_ms": (t1 - t0) * 1e3, "bootstrap_us": (t2 - t1) * 1e6}


def _cycle(n: int, reps: int) -> dict[str, Any]:
    """The block's cycle with PATCHREG_DISABLE unset and naming nothing active, alternated in one process (the
    variable re-read by ``patchreg.refresh()``, then the block warmed up again: its plan is remade)."""
    import warnings

    warnings.filterwarnings("ignore")
    import patchreg
    from benchmarks import _model
    from patches.megatron import cpu_patched
    from patches.megatron.mtp import mtp_patched

    samples: dict[str, list[float]] = {"unset": [], "disabled": []}
    with cpu_patched():
        model = _model.build()
        for r in range(reps):
            for name in ("unset", "disabled") if r % 2 else ("disabled", "unset"):
                if name == "unset":
                    os.environ.pop("PATCHREG_DISABLE", None)
                else:
                    os.environ["PATCHREG_DISABLE"] = NOTHING_ACTIVE
                patchreg.refresh()
                for _ in range(20):
                    with mtp_patched(model, detach_encoder=True):
                        pass
                start = time.perf_counter_ns()
                for _ in range(n):
                    with mtp_patched(model, detach_encoder=True):
                        pass
                samples[name].append((time.perf_counter_ns() - start) / n)
    ratios = [d / u for d, u in zip(samples["disabled"], samples["unset"], strict=True)]
    return {k: statistics.median(v) for k, v in samples.items()} | {"ratio": statistics.median(ratios)}


class _Bare:
    """An actor with nothing of its own: the agreement check needs no method on it."""

    def noop(self) -> None:
        return None


def _ray(counts: list[int], calls: int) -> dict[str, dict[str, float]]:
    import ray

    from patchreg.distributed import assert_consistent

    os.environ["HOME"] = tempfile.mkdtemp(prefix="patchreg-bench-ray-")  # Ray writes ~/.ray/auth_token
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        out = {}
        remote = ray.remote(num_cpus=0)(_Bare)
        for n in counts:
            actors = [remote.remote() for _ in range(n)]
            ray.get([a.noop.remote() for a in actors])
            assert_consistent(actors)
            checks, noops = [], []
            for _ in range(calls):
                t0 = time.perf_counter()
                assert_consistent(actors)
                t1 = time.perf_counter()
                ray.get([a.noop.remote() for a in actors])
                noops.append(time.perf_counter() - t1)
                checks.append(t1 - t0)
            out[str(n)] = {"check_ms": statistics.median(checks) * 1e3, "noop_ms": statistics.median(noops) * 1e3}
            for a in actors:
                ray.kill(a)
        return out
    finally:
        ray.shutdown()


if __name__ == "__main__":
    role, *rest = sys.argv[1:]
    if role == "start":
        result: Any = _start()
    elif role == "cycle":
        result = _cycle(int(rest[0]), int(rest[1]))
    else:
        result = _ray([int(n) for n in rest[0].split(",")], int(rest[1]))
    print(json.dumps(result))
