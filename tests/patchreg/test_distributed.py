"""Cross-rank consistency: fingerprints all-gathered over two gloo processes, and the lazy torch import."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from patchreg import Patch, PatchError, PatchSet, Registry
from patchreg.distributed import _compare
from tests.patchreg import sample
from tests.patchreg.helpers import plain, tagging_wrapper

M = "tests.patchreg.sample"
COMMON = PatchSet(
    "common",
    [
        Patch("module-func", f"{M}:module_func", plain("patched")),
        Patch("leaf-forward", "blocks[*].forward", tagging_wrapper("t"), kind="wrap"),
    ],
)
EXTRA = PatchSet("extra", [Patch("child-method", f"{M}:Child.method", plain("extra"))])
ROOT = Path(__file__).resolve().parents[2]


def _worker(rank: int, port: int, out: str) -> None:
    """One rank: the same sets everywhere, then rank 1 alone adds EXTRA; record what assert_consistent says."""
    import torch.distributed as dist

    from patchreg.distributed import assert_consistent

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results: dict[str, Any] = {}
    reg = Registry("dist")
    tree = sample.Tree(3)  # instances live at different addresses in each process
    with reg.patched(COMMON, tree):
        results["consistent"] = assert_consistent(registry=reg)
        results["fingerprint"] = reg.fingerprint()
        if rank == 1:
            reg.apply(EXTRA)
        try:
            assert_consistent(registry=reg)
        except PatchError as exc:
            results["inconsistent"] = str(exc)
        group = dist.new_group([0, 1])
        try:
            assert_consistent(group, registry=reg)
        except PatchError as exc:
            results["group"] = str(exc)
        reg.revert(EXTRA)
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Run _worker on two gloo ranks once; return each rank's results."""
    mp = pytest.importorskip("torch.multiprocessing")
    out = tmp_path_factory.mktemp("ranks")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=2, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_same_patches_on_every_rank_agree(ranks: list[dict[str, Any]]) -> None:
    """With the same sets active, every rank returns the same fingerprint, though instance addresses differ."""
    assert ranks[0]["consistent"] == ranks[1]["consistent"] == ranks[0]["fingerprint"] == ranks[1]["fingerprint"]


def test_a_rank_with_an_extra_set_is_named_on_every_rank(ranks: list[dict[str, Any]]) -> None:
    """When rank 1 alone applies another set, both ranks raise the same error naming rank 1 and the extra patch."""
    message = ranks[0]["inconsistent"]
    assert message == ranks[1]["inconsistent"]
    assert message.startswith("Patch state differs across ranks: rank(s) [0] have fingerprint ")
    assert "but rank(s) [1] have fingerprint" in message
    assert "extra install child-method|tests.patchreg.sample:Child.method|replace|" in message
    assert message.endswith("Apply the same patch sets, with the same package versions, on every rank.")


def test_an_explicit_group_reports_global_ranks(ranks: list[dict[str, Any]]) -> None:
    """Passing a process group checks that group and names ranks by their global rank."""
    assert ranks[0]["group"] == ranks[0]["inconsistent"]


def test_the_majority_is_the_reference() -> None:
    """With three ranks, the one that differs from the other two is the one reported, even if it is rank 0."""
    odd = ("b" * 16, ["install x"])
    same = ("a" * 16, [])
    with pytest.raises(
        PatchError, match=r"rank\(s\) \[1, 2\] have fingerprint a+, but rank\(s\) \[0\] .*extra install x"
    ):
        _compare([0, 1, 2], [odd, same, same])
    assert _compare([0, 1], [same, same]) == "a" * 16


def test_fingerprint_includes_versions_of_required_distributions(patch_registry: Registry) -> None:
    """An active patch guarded by requires() puts the installed version into the fingerprint."""
    import importlib.metadata

    from patchreg import requires

    guarded = Patch("guarded", f"{M}:module_func", plain(1), when=requires("attrs>=20"))
    empty = patch_registry.fingerprint()
    with patch_registry.patched(guarded):
        lines = patch_registry.fingerprint_lines()
        assert f"version attrs=={importlib.metadata.version('attrs')}" in lines
        assert patch_registry.fingerprint() != empty
    assert patch_registry.fingerprint() == empty


def test_without_an_initialized_group_it_says_what_to_do() -> None:
    """Calling it before init_process_group raises a PatchError with the remedy."""
    pytest.importorskip("torch.distributed")
    from patchreg.distributed import assert_consistent

    with pytest.raises(PatchError, match=r"call torch\.distributed\.init_process_group\(\) on every rank first"):
        assert_consistent(registry=Registry("x"))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"registry": "default"}, r"registry= a patchreg\.Registry, got 'default'; pass the Registry object itself"),
        ({"group": "dp"}, r"group= a torch\.distributed ProcessGroup, got 'dp'; pass the group object"),
    ],
)
def test_a_wrong_group_or_registry_is_named_with_the_remedy(kwargs: dict[str, Any], match: str) -> None:
    """A group or registry of the wrong type raises a PatchError naming the argument, before any collective."""
    pytest.importorskip("torch.distributed")
    from patchreg.distributed import assert_consistent

    with pytest.raises(PatchError, match=match):
        assert_consistent(**kwargs)


def test_engine_imports_without_torch() -> None:
    """patchreg and patchreg.distributed import with torch unavailable; the check then names the missing piece."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import patchreg, patchreg.distributed, patchreg.testing\n"
        "assert 'torch' not in {m.split('.')[0] for m in sys.modules if sys.modules[m] is not None}\n"
        "try:\n    patchreg.distributed.assert_consistent()\n"
        "except patchreg.PatchError as exc:\n    print(exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert "assert_consistent() needs torch.distributed, which cannot be imported" in result.stdout
