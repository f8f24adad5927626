"""Processes: fork after apply (the child owns its copy), fork while another thread holds the lock, spawn workers."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

import patchreg
from patchreg import Patch, PatchSet, Registry
from tests.reliability import targets
from tests.reliability.helpers import Namespaces, plain, tagging

T = "tests.reliability.targets"
CHILD_TIMEOUT_S = 15

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")


def _set() -> PatchSet:
    return PatchSet(
        "proc",
        [
            Patch("p-func", f"{T}:module_func", plain("patched")),
            Patch("p-method", f"{T}:Child.method", tagging("p"), kind="wrap"),
            Patch("p-forward", "forward", plain("leaf-patched")),
        ],
    )


def _in_child(body: Callable[[], object]) -> dict[str, object]:
    """Run ``body`` in a forked child; return what it returned (a JSON value) or raised, as a dict."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a multi-threaded process
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        signal.alarm(CHILD_TIMEOUT_S)  # a deadlocked child dies instead of hanging the suite
        try:
            out = {"ok": body()}
        except BaseException as exc:
            out = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"child died with status {status} (deadlock -> SIGALRM)"
    return json.loads(b"".join(chunks) or b'{"error": "no output"}')  # type: ignore[no-any-return]


@needs_fork
def test_fork_after_apply_child_reverts_own_memory(patch_registry: Registry, pristine: Callable[[], None]) -> None:
    """A forked child sees the patch, reverts it in its own memory, and the parent stays patched until it reverts."""
    leaf = targets.Leaf()
    before = Namespaces([targets, targets.Child])
    report = patch_registry.apply(_set(), leaf)

    def child() -> object:
        seen = [targets.module_func(1), list(targets.Child().method()), leaf.forward(1)]
        restored = patch_registry.revert(report)
        before.check()
        return {
            "seen": seen,
            "restored": restored,
            "after": [targets.module_func(1), targets.Child().method(), list(leaf.forward(1))],
            "active": len(patch_registry.active()),
            "leaf_keys": sorted(vars(leaf)),
        }

    got = _in_child(child)
    assert got == {
        "ok": {
            "seen": ["patched", ["p", "method"], "leaf-patched"],
            "restored": 3,
            "after": [2, "method", ["leaf", 1]],
            "active": 0,
            "leaf_keys": ["tag"],
        }
    }
    assert targets.module_func(1) == "patched"
    assert leaf.forward(1) == "leaf-patched"
    assert len(patch_registry.active()) == 3
    assert patch_registry.revert(report) == 3
    assert vars(leaf) == {"tag": "leaf"}


@needs_fork
def test_fork_child_applies_without_touching_parent(patch_registry: Registry, pristine: Callable[[], None]) -> None:
    """A child that applies its own set after fork leaves the parent's namespaces and registry untouched."""

    def child() -> object:
        with patch_registry.patched(_set(), targets.Leaf()):
            return targets.module_func(1)

    assert _in_child(child) == {"ok": "patched"}
    assert patch_registry.active() == ()


@needs_fork
def test_fork_while_another_thread_holds_the_lock(patch_registry: Registry, pristine: Callable[[], None]) -> None:
    """A fork while another thread is inside the registry gives a child whose registry still works (no deadlock)."""
    from patchreg import _state

    leaf = targets.Leaf()  # held: the registry keeps only weak references, a dropped leaf may be collected
    report = patch_registry.apply(_set(), leaf)
    inside, done = threading.Event(), threading.Event()

    def busy() -> None:
        with _state.LOCK:  # stands for another thread in the middle of apply/revert
            inside.set()
            done.wait(0.5)

    thread = threading.Thread(target=busy)
    thread.start()
    inside.wait()
    try:
        got = _in_child(lambda: patch_registry.revert(report))
    finally:
        done.set()
        thread.join()
    assert got == {"ok": 3}
    assert patch_registry.revert(report) == 3


def _spawn_worker(rank: int, out_dir: str) -> None:
    """A torch.multiprocessing.spawn worker: apply its own set, check it, revert, report the namespaces."""
    spaces = Namespaces([targets, targets.Child, targets.Leaf])
    parent_patch_seen = targets.module_func(1) != 2
    own = PatchSet(
        f"rank{rank}",
        [
            Patch(f"r{rank}-func", f"{T}:module_func", plain(f"rank{rank}")),
            Patch(f"r{rank}-fw", "forward", tagging(f"rank{rank}"), kind="wrap"),
        ],
    )
    leaf = targets.Leaf()
    with patchreg.patched(own, leaf) as report:
        seen = [targets.module_func(1), list(leaf.forward(1)[0:1])]
        installed = report.installed
    spaces.check()
    result = {
        "rank": rank,
        "pid": os.getpid(),
        "parent_patch_seen": parent_patch_seen,
        "seen": seen,
        "installed": installed,
        "active": len(patchreg.registry.active()),
        "leaf_keys": sorted(vars(leaf)),
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


def test_torch_spawn_workers_apply_their_own_sets(
    patch_registry: Registry, pristine: Callable[[], None], tmp_path: Path
) -> None:
    """Spawned workers start unpatched (a parent's patch is not inherited), apply and revert their own sets."""
    mp = pytest.importorskip("torch.multiprocessing")
    with patch_registry.patched(Patch("parent", f"{T}:module_func", plain("parent"))):
        mp.spawn(_spawn_worker, args=(str(tmp_path),), nprocs=2, join=True)
        assert targets.module_func(1) == "parent"
    results = sorted((json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == [0, 1]
    assert len({r["pid"] for r in results} | {os.getpid()}) == 3
    for r in results:
        assert r["parent_patch_seen"] is False
        assert r["seen"] == [f"rank{r['rank']}", [f"rank{r['rank']}"]]
        assert r["installed"] == 2 and r["active"] == 0 and r["leaf_keys"] == ["tag"]
    assert sys.modules["tests.reliability.targets"] is targets
    time.sleep(0)  # nothing to wait for: join=True returned after both workers exited
