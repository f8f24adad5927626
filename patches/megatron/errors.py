"""Errors raised by the Megatron-Core patch sets; all are :class:`patchreg.PatchError` subclasses."""

from __future__ import annotations

from patchreg import PatchConflictError, PatchError

__all__ = ["MTPConflictError", "MTPPatchError", "MissingUpstreamArgumentError", "UnsupportedModelError"]


class MTPPatchError(PatchError):
    """Root of the errors of ``patches.megatron``."""


class UnsupportedModelError(MTPPatchError, TypeError):
    """``mtp_patched`` was given something that holds no Megatron-Core ``GPTModel``."""


class MissingUpstreamArgumentError(MTPPatchError, TypeError):
    """An upstream function of the installed release requires an argument the patch cannot supply."""


class MTPConflictError(MTPPatchError, PatchConflictError):
    """``mtp_patched`` was nested with a different ``detach_encoder`` on the same model."""
