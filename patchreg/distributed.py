"""Cross-process checks: every process of a job should run with the same patches active.

One comparison for every way a job's processes are reached: the ranks of a ``torch.distributed``
group (each rank calls, as a collective), a list of Ray actor handles, or a vLLM engine's workers
(the driver calls, once). Each process gives its fingerprint in one round trip.

torch, Ray and vLLM are imported inside these functions only, so ``import patchreg`` never needs them.
"""

from __future__ import annotations

import difflib
import inspect
import os
from collections.abc import Mapping, Sequence
from typing import Any

from patchreg._registry import Registry
from patchreg.exceptions import PatchError

__all__ = ["VLLM_METHOD", "assert_consistent", "assert_consistent_async", "fingerprint_here"]

#: The worker method a vLLM engine answers ``collective_rpc`` with: ``{"pid", "fingerprint", "lines"}``.
VLLM_METHOD = "patchreg_fingerprint"


def assert_consistent(group: Any = None, registry: Registry | None = None) -> str:
    """Gather every process's ``fingerprint()``; raise :class:`PatchError` naming those that differ, and how.

    ``group`` says which processes:

    - ``None`` or a ``torch.distributed`` ProcessGroup (default: the whole world): every rank of it
      must call, as with any collective; every rank then raises the same error. With pipeline
      parallelism, stages legitimately patch different layers: pass the data-parallel group. The NCCL
      backend needs the current CUDA device set.
    - a list of Ray actor handles: the caller (the driver) asks each actor's process, through Ray's
      ``__ray_call__`` (no method to add to the actor class); ``ray.get`` waits for all at once.
    - a vLLM ``LLM``: each of its workers answers ``collective_rpc("patchreg_fingerprint")`` (where
      patchreg is bootstrapped in them); for an ``AsyncLLM`` await :func:`assert_consistent_async`.

    The processes that differ from the majority are named (rank, or index in the list and pid) with
    the installs they miss or have extra. Returns the common fingerprint. ``registry`` (torch only)
    compares another registry than ``patchreg.registry``; a remote process always gives its default one.
    """
    from patchreg._registry import registry as default_registry

    _check_registry(registry)
    if _is_ray_handles(group):
        _remote_registry(registry, "Ray actors")
        return _assert_ray(list(group))
    if _is_vllm(group):
        _remote_registry(registry, "vLLM workers")
        if inspect.iscoroutinefunction(group.collective_rpc):
            msg = (
                f"assert_consistent() got {type(group).__name__}, whose collective_rpc is a coroutine; "
                "use `await patchreg.distributed.assert_consistent_async(engine)` for an AsyncLLM."
            )
            raise PatchError(msg)
        return _compare_answers("worker", _vllm_answers(group.collective_rpc(VLLM_METHOD), group))
    dist = _torch_distributed()
    _check_group(dist, group)
    _check_initialized(dist)
    reg = registry if registry is not None else default_registry
    mine = (reg.fingerprint(), reg.fingerprint_lines())
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    ranks = [_global_rank(dist, group, i) for i in range(len(gathered))]
    return _compare(ranks, [(str(g[0]), list(g[1])) for g in gathered])


async def assert_consistent_async(engine: Any) -> str:
    """:func:`assert_consistent` for an ``AsyncLLM`` (or any engine whose ``collective_rpc`` is a coroutine)."""
    if not _is_vllm(engine):
        msg = f"assert_consistent_async() takes a vLLM AsyncLLM, got {engine!r}; use assert_consistent() otherwise."
        raise PatchError(msg)
    answers = engine.collective_rpc(VLLM_METHOD)
    if inspect.isawaitable(answers):
        answers = await answers
    return _compare_answers("worker", _vllm_answers(answers, engine))


def fingerprint_here(_instance: object = None) -> dict[str, Any]:
    """This process's ``{"pid", "fingerprint", "lines"}`` of ``patchreg.registry`` (what a remote process answers;
    ``_instance``: the Ray actor a ``__ray_call__`` passes, named by its class)."""
    from patchreg._registry import registry

    answer: dict[str, Any] = {"pid": os.getpid(), "fingerprint": registry.fingerprint()}
    answer["lines"] = registry.fingerprint_lines()
    if _instance is not None:
        answer["name"] = type(_instance).__name__
    return answer


def _is_ray_handles(group: object) -> bool:
    return isinstance(group, (list, tuple)) and bool(group) and all(hasattr(h, "__ray_call__") for h in group)


def _is_vllm(group: object) -> bool:
    return group is not None and callable(getattr(group, "collective_rpc", None))


def _remote_registry(registry: Registry | None, what: str) -> None:
    if registry is not None:
        msg = (
            f"assert_consistent() compares the default registry (patchreg.registry) of {what}; registry= is for "
            "torch.distributed ranks only. Leave it out."
        )
        raise PatchError(msg)


def _assert_ray(handles: list[Any]) -> str:
    """One ``__ray_call__`` per actor, all in flight at once; then the shared comparison."""
    import ray  # type: ignore[import-not-found,unused-ignore]

    answers = ray.get([h.__ray_call__.remote(fingerprint_here) for h in handles])
    return _compare_answers("actor", answers)


def _vllm_answers(answers: Any, engine: object) -> list[Mapping[str, Any]]:
    """The workers' answers, checked against the contract (a list of dicts with pid, fingerprint, lines)."""
    if not isinstance(answers, list) or not all(
        isinstance(a, Mapping) and {"pid", "fingerprint", "lines"} <= a.keys() for a in answers
    ):
        msg = (
            f"{type(engine).__name__}.collective_rpc({VLLM_METHOD!r}) answered {answers!r}, not one "
            "{'pid', 'fingerprint', 'lines'} dict per worker: bootstrap patchreg in the workers with the set that "
            "gives them that method (PATCHREG_PATCHSETS), or check the workers run this patchreg."
        )
        raise PatchError(msg)
    return list(answers)


def _compare_answers(kind: str, answers: Sequence[Mapping[str, Any]]) -> str:
    """The shared comparison of remote answers: processes by index, labelled with their pid (and actor class)."""
    if not answers:
        msg = f"assert_consistent() got no {kind}s to compare; pass at least one."
        raise PatchError(msg)
    labels = {i: (f"{a['name']} " if a.get("name") else "") + f"pid {a['pid']}" for i, a in enumerate(answers)}
    gathered = [(str(a["fingerprint"]), [str(line) for line in a["lines"]]) for a in answers]
    return _compare(list(range(len(answers))), gathered, kind, labels)


def _torch_distributed() -> Any:
    try:
        import torch.distributed as dist
    except ImportError as exc:
        msg = f"assert_consistent() needs torch.distributed, which cannot be imported ({exc}); install torch."
        raise PatchError(msg) from None
    return dist


def _check_registry(registry: object) -> None:
    if registry is not None and not isinstance(registry, Registry):
        msg = (
            f"assert_consistent() takes registry= a patchreg.Registry, got {registry!r}; "
            "pass the Registry object itself, or leave it out for patchreg.registry."
        )
        raise PatchError(msg)


def _check_group(dist: Any, group: object) -> None:
    process_group = getattr(dist, "ProcessGroup", None)  # absent where torch.distributed is not available
    if group is None or process_group is None or isinstance(group, process_group):
        return
    msg = (
        f"assert_consistent() takes group= a torch.distributed ProcessGroup, got {group!r}; pass the group "
        "object (from torch.distributed.new_group() or your framework's parallel state, e.g. the data-parallel "
        "group), or leave it out for the whole world."
    )
    raise PatchError(msg)


def _check_initialized(dist: Any) -> None:
    if not dist.is_available() or not dist.is_initialized():
        msg = (
            "assert_consistent() needs an initialized torch.distributed process group; "
            "call torch.distributed.init_process_group() on every rank first."
        )
        raise PatchError(msg)


def _global_rank(dist: Any, group: Any, index: int) -> int:
    if group is None:
        return index
    return int(dist.get_global_rank(group, index))


def _compare(
    ranks: Sequence[int],
    gathered: Sequence[tuple[str, list[str]]],
    kind: str = "rank",
    labels: Mapping[int, str] | None = None,
) -> str:
    """The common fingerprint, or a PatchError naming the processes (``kind``: rank, actor, worker) that differ
    from the majority, each with its label (a pid) where given."""
    by_print: dict[str, list[int]] = {}
    for rank, (digest, _lines) in zip(ranks, gathered, strict=True):
        by_print.setdefault(digest, []).append(rank)
    if len(by_print) == 1:
        return next(iter(by_print))
    # The majority is the reference; a tie goes to the group holding the lowest rank.
    reference = max(by_print, key=lambda d: (len(by_print[d]), -min(by_print[d])))
    ref_lines = gathered[ranks.index(by_print[reference][0])][1]
    details = []
    for digest, members in by_print.items():
        if digest == reference:
            continue
        lines = gathered[ranks.index(members[0])][1]
        details.append(f"{_who(kind, members, labels)} have fingerprint {digest} ({_diff(ref_lines, lines)})")
    msg = (
        f"Patch state differs across {kind}s: {_who(kind, by_print[reference], labels)} have fingerprint "
        f"{reference}, but "
        + "; ".join(details)
        + f". `python -m patchreg doctor --env` in a process shows what its PATCHREG_PATCHSETS and PATCHREG_DISABLE "
        f"install. Apply the same patch sets, with the same package versions, on every {kind}."
    )
    raise PatchError(msg)


def _diff(reference: list[str], lines: list[str]) -> str:
    changes = [
        ("extra " if line[0] == "+" else "missing ") + line[1:].strip()
        for line in difflib.unified_diff(reference, lines, lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    return ", ".join(changes) if changes else "same lines, different digest"


def _who(kind: str, members: list[int], labels: Mapping[int, str] | None) -> str:
    named = f" ({', '.join(labels[m] for m in members)})" if labels else ""
    return f"{kind}(s) {members}{named}"
