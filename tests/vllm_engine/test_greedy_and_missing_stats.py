"""Speculative greedy output is the plain engine's greedy output; an engine without the metrics setting gives no stats.

Compared on the known-acceptance checkpoint, whose logits have wide margins: on random weights the
two engines part at near-ties (bf16 sums differ between a verify batch and single-token decoding;
measured here: one of three requests differed from its 9th token), which says nothing about the draft.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patches.vllm import mtp_engine_kwargs, rollout_metrics, spec_decode_stats
from patches.vllm.checkpoints import greedy_chain
from tests.vllm_engine.engines import KNOWN_PROMPTS, MAX_TOKENS, greedy, running_llm, token_prompt

PROMPTS = list(KNOWN_PROMPTS.values())  # every draft accepted, some, none


@pytest.fixture(scope="module")
def outputs(checkpoints: dict[str, Path]) -> Iterator[dict[str, Any]]:
    """Greedy outputs of two engines, one after the other: plain, and MTP (k=2) without the metrics setting."""
    prompts = [token_prompt(p) for p in PROMPTS]
    with running_llm(checkpoints["known"]) as llm:
        plain = llm.generate(prompts, greedy(), use_tqdm=False)
    kwargs = mtp_engine_kwargs(num_speculative_tokens=2)
    del kwargs["per_request_spec_decode_metrics"]  # an engine started without it
    with running_llm(checkpoints["known"], **kwargs) as llm:
        spec = llm.generate(prompts, greedy(), use_tqdm=False)
        level = llm.llm_engine.vllm_config.observability_config.per_request_spec_decode_metrics
    yield {"plain": plain, "spec": spec, "level": level}


def test_speculative_greedy_equals_plain_greedy(outputs: dict[str, Any]) -> None:
    """MTP speculative decoding changes no greedy token, whether the drafts are all right, partly or all wrong."""
    plain = [list(o.outputs[0].token_ids) for o in outputs["plain"]]
    spec = [list(o.outputs[0].token_ids) for o in outputs["spec"]]
    assert spec == plain == [greedy_chain(p, MAX_TOKENS) for p in PROMPTS]


def test_engine_without_metrics_gives_none_and_one_warning(
    outputs: dict[str, Any], fresh_missing_warning: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Without per_request_spec_decode_metrics every request gives None, with one warning naming the remedy."""
    assert outputs["level"] == "none"
    with caplog.at_level(logging.WARNING, logger="patchreg.vllm"):
        stats = [spec_decode_stats(o) for o in outputs["spec"]]
    assert stats == [None, None, None]
    warned = [r.getMessage() for r in caplog.records if r.name == "patchreg.vllm"]
    assert len(warned) == 1
    assert "per_request_spec_decode_metrics='summary'" in warned[0] and "mtp_engine_kwargs" in warned[0]
    assert rollout_metrics(stats)["rollout/spec_num_requests_missing"] == 3
