"""The examples/mtp_rollout_config.py walk-through runs and prints what it promises."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tests.vllm.engine_config import skip_where_the_platform_refuses

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mtp_rollout_config.py"


def test_example_prints_config_draft_and_metrics(vllm: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The example prints our engine keywords, vLLM's resolved MTP draft and the batch metrics."""
    spec = importlib.util.spec_from_file_location("mtp_rollout_config_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with skip_where_the_platform_refuses():
        module.main()
    out = capsys.readouterr().out
    assert '"per_request_spec_decode_metrics": "summary"' in out
    assert "draft architectures=['DeepSeekMTPModel']" in out
    assert "rollout/spec_accept_rate_pooled = 0.6667" in out
