"""mtp_patched on tiny real HybridModels (0.18.2+) and MambaModels (0.17): what only the hybrid family has.

The guarantees every family shares (logits, gradients, wrappers, chunks, labels=None, recompute, the
report) run for HybridModel too, in test_families.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

from tests.megatron.hybrid_models import hybrid_skip_reason

if hybrid_skip_reason() is not None:
    pytest.skip(str(hybrid_skip_reason()), allow_module_level=True)

import torch

from patches.megatron import UnsupportedModelError, mtp_patched
from patches.megatron.mtp import HYBRID_MTP_DETACH_SET, HYBRID_MTP_SET
from tests.megatron.conftest import make_config


def test_wrapper_of_an_unsupported_model_names_the_innermost() -> None:
    """Float16Module around a non-MTP model is refused naming 'Float16Module → Linear' and what to pass instead."""
    from megatron.core.transformer.module import Float16Module

    wrapped = Float16Module(make_config(bf16=True), torch.nn.Linear(2, 2))
    with pytest.raises(UnsupportedModelError, match=r"Float16Module → Linear.*HybridModel"):
        mtp_patched(wrapped)


def test_sets_name_the_same_guarantees_for_both_detach_modes() -> None:
    """The hybrid sets hold a forward patch, the MTP-loss wraps and recompute; the detached one also detaches inputs."""
    native = {"mtp_heads_attached", "rl_mode_forward", "rl_mode_hybrid_mtp_loss"}  # 0.19.2: upstream's RL mode
    today = {"hybrid_forward", "hybrid_mtp_loss", "mamba_mtp_loss", "checkpointed_forward"}
    assert native | today == set(HYBRID_MTP_SET.names)
    assert {"mtp_input_detached", "detach_embeddings"} <= set(HYBRID_MTP_DETACH_SET.names)
