"""Megatron-Core patch sets: MTP for PPO (``mtp_patched``; GPTModel, HybridModel, MambaModel 0.17), CPU shims,
and the Megatron-Bridge fix-ups (``bridge_patched``)."""

from __future__ import annotations

from patches.megatron.bridge import BRIDGE_IMPORT_SET, BRIDGE_SET, bridge_patched
from patches.megatron.cpu import CPU_SET, cpu_patched
from patches.megatron.errors import (
    MissingUpstreamArgumentError,
    MTPConflictError,
    MTPPatchError,
    UnsupportedModelError,
)
from patches.megatron.mtp import (
    CHECKPOINTED_FORWARD,
    DETACH_EMBEDDINGS,
    HYBRID_MTP_DETACH_SET,
    HYBRID_MTP_SET,
    MTP_DETACH_SET,
    MTP_FIXUPS_SET,
    MTP_SET,
    PACKED_PADDED_ROLL,
    POSTPROCESS,
    POSTPROCESS_DETACHED,
    MTPBlock,
    MTPReport,
    mtp_patched,
)
from patches.megatron.verify import MTPVerification, verify_mtp

__all__ = [
    "BRIDGE_IMPORT_SET",
    "BRIDGE_SET",
    "CHECKPOINTED_FORWARD",
    "CPU_SET",
    "DETACH_EMBEDDINGS",
    "HYBRID_MTP_DETACH_SET",
    "HYBRID_MTP_SET",
    "MTP_DETACH_SET",
    "MTP_FIXUPS_SET",
    "MTP_SET",
    "PACKED_PADDED_ROLL",
    "POSTPROCESS",
    "POSTPROCESS_DETACHED",
    "MTPBlock",
    "MTPConflictError",
    "MTPPatchError",
    "MTPReport",
    "MTPVerification",
    "MissingUpstreamArgumentError",
    "UnsupportedModelError",
    "bridge_patched",
    "cpu_patched",
    "mtp_patched",
    "verify_mtp",
]
