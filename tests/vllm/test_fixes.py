"""SPEC_DECODE_METRICS_FIXES: the version-gated RequestOutput.add patch for vLLM 0.29-0.31."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from patches.vllm import SPEC_DECODE_METRICS_FIXES, spec_decode_stats
from patches.vllm._compat import LOSES_METRICS_ON_DELTA_MERGE
from patches.vllm.fixes import keep_spec_decode_metrics
from patchreg import PatchSet, Registry, always


def chunk(vllm: Any, text: str, metrics: Any = None, finished: bool = False) -> Any:
    """One DELTA RequestOutput chunk of a single-completion request."""
    from vllm.outputs import CompletionOutput, RequestOutput

    completion = CompletionOutput(
        index=0,
        text=text,
        token_ids=[len(text)],
        cumulative_logprob=None,
        logprobs=None,
        finish_reason="stop" if finished else None,
        spec_decode_metrics=metrics,
    )
    return RequestOutput("r", None, [0], None, [completion], finished=finished)


def metrics(vllm: Any) -> Any:
    """Real per-request metrics: one verify step with 2 drafted, 1 accepted."""
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    m = RequestSpecDecodeMetrics.new(2)
    m.observe(num_draft_tokens=2, num_accepted=1)
    return m


def add_as_in_vllm_0_29(self: Any, next_output: Any, aggregate: bool) -> None:
    """A stand-in for vLLM 0.29-0.31's RequestOutput.add body on DELTA merges (restated, abridged).

    It merges text, tokens and finish reason into the earlier completion and,
    like those releases, leaves spec_decode_metrics behind.
    """
    self.finished |= next_output.finished
    for nxt in next_output.outputs:
        for cur in self.outputs:
            if cur.index == nxt.index and aggregate:
                cur.text += nxt.text
                cur.token_ids = [*cur.token_ids, *nxt.token_ids]
                cur.finish_reason = nxt.finish_reason


def test_patch_is_skipped_on_releases_that_keep_the_metrics(vllm: Any, patch_registry: Registry) -> None:
    """On vLLM >= 0.32 (and < 0.29) the set installs nothing and says why."""
    from patches.vllm._compat import vllm_version

    if LOSES_METRICS_ON_DELTA_MERGE.evaluate().ok:
        pytest.skip(f"vLLM {vllm_version()} needs the patch")
    report = patch_registry.apply(SPEC_DECODE_METRICS_FIXES)
    assert report.installed == 0
    [(name, reason)] = report.skipped
    assert name == "vllm.request-output-add-keeps-spec-decode-metrics"
    assert vllm_version() in reason and reason.startswith("not needed here")
    assert SPEC_DECODE_METRICS_FIXES.patches[0].when.evaluate().needed is False


def test_installed_release_keeps_metrics_on_delta_merge(vllm: Any) -> None:
    """vLLM's own RequestOutput.add, patched or not, leaves the terminal metrics on the merged output."""
    first, last = chunk(vllm, "ab"), chunk(vllm, "c", metrics(vllm), finished=True)
    first.add(last, aggregate=True)
    assert spec_decode_stats(first) is not None


def test_wrapper_carries_metrics_over_a_lossy_merge(vllm: Any) -> None:
    """Around an add() that drops them, the wrapper puts the newer completion's metrics on the merged one."""
    first, last = chunk(vllm, "ab"), chunk(vllm, "c", metrics(vllm), finished=True)
    keep_spec_decode_metrics(lambda *a, **k: add_as_in_vllm_0_29(first, *a, **k), first, (last, True), {})
    assert first.outputs[0].text == "abc"
    assert spec_decode_stats(first) == spec_decode_stats(last)


def test_wrapper_leaves_replace_merges_and_empty_chunks_alone(vllm: Any) -> None:
    """With aggregate=False, or when the new chunk has no metrics, the wrapper changes nothing."""
    first, mid = chunk(vllm, "a", metrics(vllm)), chunk(vllm, "b")
    keep_spec_decode_metrics(lambda *a, **k: add_as_in_vllm_0_29(first, *a, **k), first, (mid,), {"aggregate": True})
    assert first.outputs[0].spec_decode_metrics is not None
    other = chunk(vllm, "x")
    keep_spec_decode_metrics(lambda *a, **k: None, other, (chunk(vllm, "y", metrics(vllm)),), {"aggregate": False})
    assert other.outputs[0].spec_decode_metrics is None


def test_patch_installs_on_the_real_class_and_reverts_exactly(vllm: Any, patch_registry: Registry) -> None:
    """Installed unconditionally, the wrap patch works on vLLM's RequestOutput and reverting restores vars()."""
    from vllm.outputs import RequestOutput

    [patch] = list(SPEC_DECODE_METRICS_FIXES.patches)
    forced = PatchSet("forced", [attrs.evolve(patch, when=always)])
    before = dict(vars(RequestOutput))
    with patch_registry.patched(forced) as report:
        assert report.installed == 1
        first, last = chunk(vllm, "ab"), chunk(vllm, "c", metrics(vllm), finished=True)
        first.add(last, aggregate=True)
        assert spec_decode_stats(first) == spec_decode_stats(last)
    assert dict(vars(RequestOutput)) == before
    assert all(vars(RequestOutput)[k] is v for k, v in before.items())
