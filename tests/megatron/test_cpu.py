"""cpu_patched: the CPU shims install per release and restore the upstream namespaces exactly."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch

import patchreg
from patches.megatron import CPU_SET, cpu_patched


def _namespaces() -> list[Any]:
    from megatron.core import utils
    from megatron.core.tensor_parallel import mappings, random
    from megatron.core.transformer import multi_token_prediction

    helper = multi_token_prediction.MTPLossLoggingHelper
    return [utils.GlobalMemoryBuffer, random, random.CudaRNGStatesTracker, mappings, helper, multi_token_prediction]


@pytest.mark.no_cpu_shims
def test_cpu_set_restores_every_namespace() -> None:
    """Leaving cpu_patched puts back the same objects under the same names, and says why it skipped."""
    before = [dict(vars(ns)) for ns in _namespaces()]
    with cpu_patched() as report:
        assert report.installed == len(CPU_SET) - len(report.skipped)
        assert all(reason for _, reason in report.skipped)
        assert patchreg.registry.is_active("memory_buffer_on_cpu")
    for ns, snap in zip(_namespaces(), before, strict=True):
        now = vars(ns)
        assert now.keys() == snap.keys() and all(now[k] is snap[k] for k in snap), ns


def test_rng_tracker_fork_is_reproducible_on_cpu() -> None:
    """The model-parallel RNG fork draws from its own seeded CPU state and restores the caller's."""
    from megatron.core.tensor_parallel import random as tp_random

    tp_random.model_parallel_cuda_manual_seed(5)
    outside = torch.get_rng_state()
    with tp_random.get_cuda_rng_tracker().fork():
        first = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), outside)
    tp_random.model_parallel_cuda_manual_seed(5)
    with tp_random.get_cuda_rng_tracker().fork():
        again = torch.rand(3)
    assert torch.equal(first, again)


def test_mtp_tracker_is_shimmed_on_every_release(cpu: Any) -> None:
    """The helpers this release logs the MTP loss with run on the CPU; a tracker shim for a helper the release does
    not log with is skipped as not needed."""
    import inspect

    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper as helper

    skipped = dict(cpu.skipped)
    loss = torch.tensor(0.5)
    dev_form = (
        hasattr(helper, "save_loss_to_tracker")
        and "loss_sum" in inspect.signature(helper.save_loss_to_tracker).parameters
    )
    if hasattr(helper, "save_metrics_to_tracker"):  # megatron-core 0.19+
        assert "mtp_metrics_device" not in skipped
        helper.save_metrics_to_tracker(loss, torch.tensor(3.0), torch.tensor(4.0), layer_number=1, num_layers=2)
        assert helper.tracker["loss_values"].tolist() == [0.0, 0.5]
        assert helper.tracker["total_values"].tolist() == [0.0, 4.0]
        assert helper.tracker["total_values"].device.type == "cpu"
    if dev_form:  # dev: save_loss_to_tracker(loss_sum, num_tokens, ...) beside save_metrics_to_tracker
        assert "mtp_tracker_device" not in skipped and "mtp_acceptance_device" not in skipped
        helper.tracker.clear()
        helper.save_loss_to_tracker(torch.tensor(1.5), torch.tensor(3.0), 0, 2, correct=torch.tensor(2.0),
                                    total=torch.tensor(3.0))  # fmt: skip
        assert helper.tracker["loss_sums"].tolist() == [0.5, 0.0]
        assert helper.tracker["total_values"].tolist() == [3.0, 0.0]
    elif hasattr(helper, "save_metrics_to_tracker"):
        assert "not needed here" in skipped["mtp_tracker_device"]
    else:
        assert "not needed here" in skipped["mtp_metrics_device"]
        helper.save_loss_to_tracker(loss, layer_number=1, num_layers=2)
        assert helper.tracker["values"].tolist() == [0.0, 0.5]
        assert helper.tracker["values"].device.type == "cpu"
