"""Cross-rank checks: every rank of a job should run with the same patches active.

torch is imported inside :func:`assert_consistent` only, so ``import patchreg`` never
needs it.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from patchreg._registry import Registry
from patchreg.exceptions import PatchError

__all__ = ["assert_consistent"]


def assert_consistent(group: Any = None, registry: Registry | None = None) -> str:
    """All-gather ``registry.fingerprint()`` over ``group``; raise :class:`PatchError` if ranks differ.

    Every rank of ``group`` (default: the whole world) must call it, as with any
    collective; every rank then raises the same error, naming the ranks that differ
    from the majority and what differs. Returns the common fingerprint. With
    pipeline parallelism, stages legitimately patch different layers: pass the
    data-parallel group. The NCCL backend needs the current CUDA device set.
    """
    from patchreg._api import registry as default_registry

    _check_registry(registry)
    dist = _torch_distributed()
    _check_group(dist, group)
    _check_initialized(dist)
    reg = registry if registry is not None else default_registry
    mine = (reg.fingerprint(), reg.fingerprint_lines())
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    ranks = [_global_rank(dist, group, i) for i in range(len(gathered))]
    return _compare(ranks, [(str(g[0]), list(g[1])) for g in gathered])


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


def _compare(ranks: Sequence[int], gathered: Sequence[tuple[str, list[str]]]) -> str:
    """The common fingerprint, or a PatchError naming the ranks that differ from the majority."""
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
        details.append(f"rank(s) {members} have fingerprint {digest} ({_diff(ref_lines, lines)})")
    msg = (
        f"Patch state differs across ranks: rank(s) {by_print[reference]} have fingerprint {reference}, but "
        + "; ".join(details)
        + ". Apply the same patch sets, with the same package versions, on every rank."
    )
    raise PatchError(msg)


def _diff(reference: list[str], lines: list[str]) -> str:
    changes = [
        ("extra " if line[0] == "+" else "missing ") + line[1:].strip()
        for line in difflib.unified_diff(reference, lines, lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    return ", ".join(changes) if changes else "same lines, different digest"
