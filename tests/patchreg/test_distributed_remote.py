"""assert_consistent over a vLLM engine's workers: the collective_rpc('patchreg_fingerprint') contract.

The workers' side (the method, in each vLLM worker where patchreg is bootstrapped) is the drafter set's; here
the engine is a stand-in that answers with what :func:`patchreg.distributed.fingerprint_here` gives in this
process and in a child process with a set applied, so the comparison is of real fingerprints. The live engine
is tests/vllm_engine's.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from patchreg import PatchError, Registry
from patchreg.distributed import VLLM_METHOD, assert_consistent, assert_consistent_async, fingerprint_here

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import json
import patchreg
from patchreg.distributed import fingerprint_here
from tests.patchreg.test_distributed import EXTRA
patchreg.apply(EXTRA)
print(json.dumps(fingerprint_here()))
"""


def child_answer() -> dict[str, Any]:
    """A real process's answer, with the EXTRA set applied there."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, check=True)
    return dict(json.loads(out.stdout.splitlines()[-1]))


class Engine:
    """An LLM's collective_rpc as the contract has it: the method by name, one answer per worker, in order."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def collective_rpc(self, method: str, timeout: float | None = None) -> list[Any]:
        self.calls.append(method)
        return self.answers


class AsyncEngine(Engine):
    """An AsyncLLM's: a coroutine."""

    async def collective_rpc(self, method: str, timeout: float | None = None) -> list[Any]:  # type: ignore[override]
        self.calls.append(method)
        return self.answers


def test_workers_that_agree() -> None:
    """Two workers with the same fingerprint: returned; the method is called once, by name."""
    engine = Engine([fingerprint_here(), fingerprint_here()])
    assert assert_consistent(engine) == fingerprint_here()["fingerprint"]
    assert engine.calls == [VLLM_METHOD]


def test_a_worker_that_differs_is_named_with_its_pid_and_patches() -> None:
    """The worker whose patches differ is named by index and pid, with the install it has extra."""
    other = child_answer()
    engine = Engine([fingerprint_here(), fingerprint_here(), other])
    with pytest.raises(PatchError) as info:
        assert_consistent(engine)
    message = str(info.value)
    assert message.startswith(f"Patch state differs across workers: worker(s) [0, 1] (pid {os.getpid()}, pid ")
    assert f"but worker(s) [2] (pid {other['pid']}) have fingerprint {other['fingerprint']}" in message
    assert "extra install child-method" in message


def test_async_engine() -> None:
    """An AsyncLLM is refused by the sync call (pointing to the async one), and compared by the async one."""
    engine = AsyncEngine([fingerprint_here()])
    with pytest.raises(PatchError, match=r"await patchreg\.distributed\.assert_consistent_async"):
        assert_consistent(engine)
    assert asyncio.run(assert_consistent_async(engine)) == fingerprint_here()["fingerprint"]


@pytest.mark.parametrize("answers", [[None], "nope", [{"pid": 1}], []])
def test_answers_outside_the_contract(answers: Any) -> None:
    """Workers that do not answer with the contract's dicts (patchreg not bootstrapped there) are a PatchError."""
    with pytest.raises(PatchError, match=r"collective_rpc|no workers"):
        assert_consistent(Engine(answers))


def test_registry_is_for_torch_only() -> None:
    """registry= with remote processes is refused: each compares its default registry."""
    with pytest.raises(PatchError, match=r"registry= is for torch\.distributed ranks only"):
        assert_consistent(Engine([fingerprint_here()]), registry=Registry("x"))
