"""A fresh process for test_consistent.py: vLLM engines with multiprocessing on, patchreg bootstrapped in each of
their processes by the plugin (``PATCHREG_PATCHSETS`` set by the test); assert_consistent over their workers.

Prints one JSON line: the driver's pid, and for an ``LLM`` and an ``AsyncLLM`` what ``assert_consistent`` returned
and the workers' answers.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
from pathlib import Path
from typing import Any


def _llm(model: Path) -> dict[str, Any]:
    from patchreg.distributed import VLLM_METHOD, assert_consistent
    from tests.vllm_engine.engines import running_llm

    with running_llm(model) as llm:
        return {"fingerprint": assert_consistent(llm), "answers": llm.collective_rpc(VLLM_METHOD)}


async def _async_llm(model: Path) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from patchreg.distributed import VLLM_METHOD, assert_consistent_async
    from tests.vllm_engine.engines import MAX_MODEL_LEN

    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=str(model), max_model_len=MAX_MODEL_LEN, enforce_eager=True, seed=0)
    )
    try:
        return {
            "fingerprint": await assert_consistent_async(engine),
            "answers": await engine.collective_rpc(VLLM_METHOD),
        }
    finally:
        engine.shutdown()
        del engine
        gc.collect()


def main(model: Path) -> None:
    import patchreg._bootstrap

    result = {"pid": os.getpid(), "llm": _llm(model), "async": asyncio.run(_async_llm(model))}
    result["driver"] = sorted(patchreg._bootstrap._held)  # the plugin bootstrapped the driver too
    print(json.dumps(result), flush=True)


if __name__ == "__main__":  # spawn re-imports this module in vLLM's processes
    main(Path(sys.argv[1]))
