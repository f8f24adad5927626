"""A weight-transfer engine for vLLM on CPU: its session API (``start_weight_update`` / ``update_weights`` /
``finish_weight_update``, ``start_draft_weight_update``) with a safetensors file as the transport.

vLLM's own engines (NCCL, IPC, ...) need CUDA. This one is a subclass of vLLM's ``WeightTransferEngine``,
registered under :data:`BACKEND` with ``WeightTransferEngineFactory.register_engine`` (vLLM's extension point)
and chosen with ``weight_transfer_config={"backend": BACKEND}``. Like the IPC and NCCL engines it receives
checkpoint-format tensors into the session's model with ``model.load_weights`` inside vLLM's layerwise reload
(begun at the session's start, finished at its end). A model without ``load_weights`` (a plain
``torch.nn.Module``, in the class-level tests) takes each tensor by parameter name, in place, with no reload.
``update_weights`` skips the base class's ``torch.accelerator.synchronize()`` (no accelerator on CPU).

An update is ``{"path": <dir or file>, "only": ""}``: the tensors of ``<dir>/model.safetensors`` (or the
file), ``only="target"`` or ``"mtp"`` keeping that part of a checkpoint (:func:`patches.vllm.drafter.drafter_owns`
with the ``num_layers`` given, default 1).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Final

BACKEND: Final = "patchreg-cpu-file"


def register() -> None:
    """Register the engine with vLLM's factory under :data:`BACKEND` (once per process; again is a no-op)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(BACKEND, _engine_class())
    except ValueError as exc:  # registered before in this process
        if "already registered" not in str(exc):
            raise


def _engine_class() -> type[Any]:
    import torch
    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )

    @dataclasses.dataclass
    class FileInitInfo(WeightTransferInitInfo):
        """Nothing to set up: the trainer and the worker share a file system."""

    @dataclasses.dataclass
    class FileUpdateInfo(WeightTransferUpdateInfo):
        """One chunk: a safetensors file (or a checkpoint directory holding ``model.safetensors``)."""

        path: str
        only: str = ""
        num_layers: int = 1

    class FileWeightTransferEngine(WeightTransferEngine):  # type: ignore[misc,type-arg]
        """vLLM's weight-transfer engine contract with a file as the transport (CPU)."""

        init_info_cls = FileInitInfo
        update_info_cls = FileUpdateInfo

        def init_transfer_engine(self, init_info: Any) -> None:
            """Nothing to connect."""

        def start_weight_update(self) -> None:
            if hasattr(self.model, "load_weights"):
                from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

                initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            if hasattr(self.model, "load_weights"):
                from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

                finalize_layerwise_reload(self.model, self.model_config)

        def update_weights(self, update_info: dict[str, Any]) -> None:
            self.receive_weights(self.parse_update_info(update_info))

        def receive_weights(self, update_info: Any) -> None:
            tensors = list(_read(update_info))
            if hasattr(self.model, "load_weights"):
                self.model.load_weights(iter(tensors))
                return
            params = dict(self.model.named_parameters())
            with torch.no_grad():
                for name, tensor in tensors:
                    if name in params:
                        params[name].copy_(tensor)

        def shutdown(self) -> None:
            """Nothing to release."""

    return FileWeightTransferEngine


def _read(info: Any) -> Any:
    from safetensors import safe_open

    from patches.vllm.drafter import drafter_owns

    path = Path(info.path)
    path = path / "model.safetensors" if path.is_dir() else path
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            if not info.only or drafter_owns(name, info.num_layers) == (info.only == "mtp"):
                yield name, f.get_tensor(name)
