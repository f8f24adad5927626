"""CPU shims for Megatron-Core: tiny real models run forward and backward without CUDA.

For tests and examples on machines without a GPU; never use it on a GPU run (it moves the
"CUDA" RNG states of the model-parallel tracker onto the CPU generator). Class- and
module-level patches, each gated per release:

- ``memory_buffer_on_cpu``: ``GlobalMemoryBuffer.get_tensor`` (DotProductAttention's scratch) on the CPU
- ``rng_state_get`` / ``rng_state_set``: the tracker's and recompute's CUDA RNG state -> the CPU generator
- ``rng_tracker_add`` / ``rng_tracker_fork``: ``CudaRNGStatesTracker`` seeding and forking on the CPU
- ``tp_gather_on_cpu``: the tensor-parallel all-gather along the last dimension into CPU buffers (gloo)
- ``mtp_tracker_device`` / ``mtp_metrics_device``: the MTP loss tracker allocated on the loss's device
  (``save_loss_to_tracker`` on 0.14-0.18, ``save_metrics_to_tracker`` from 0.19; each is "not needed" on the
  releases where the other one logs the MTP loss, and ``mtp_tracker_device`` on 0.13, which allocates on the loss's
  device already)
- ``hybrid_final_norm``: the final norm ``HybridStack`` (0.18+) / ``MambaStack`` (0.17) hard-code as ``TENorm`` is
  built as a torch norm (``WrappedTorchNorm``) while the model is built

Usage: ``with cpu_patched(), mtp_patched(model): ...``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import patchreg
from patches.megatron._compat import MTP, RANDOM, upstream
from patchreg import Patch, PatchSet, check, has, not_needed_when, requires

__all__ = ["CPU_SET", "cpu_patched"]

_UTILS = "megatron.core.utils"
_TRACKER = f"{RANDOM}:CudaRNGStatesTracker"
_HELPER = f"{MTP}:MTPLossLoggingHelper"
_MAPPINGS = "megatron.core.tensor_parallel.mappings"


def _get_tensor(self: Any, tensor_shape: Any, dtype: Any, name: Any, *args: Any, **kwargs: Any) -> Any:
    """Allocate the scratch tensor on the CPU (upstream asks torch.cuda.current_device())."""
    import torch

    return torch.empty(tuple(tensor_shape), dtype=dtype)


def _get_rng_state(*args: Any, **kwargs: Any) -> Any:
    """The CPU generator's state stands in for the CUDA one."""
    import torch

    return torch.get_rng_state()


def _set_rng_state(new_state: Any, *args: Any, **kwargs: Any) -> None:
    """Set the CPU generator's state where upstream sets the CUDA one."""
    import torch

    torch.set_rng_state(new_state)


def _tracker_add(self: Any, name: str, seed: int) -> None:
    """Track a named RNG state seeded with ``seed``, as a CPU generator state."""
    import torch

    if seed in self.seeds_:
        msg = f"seed {seed} already exists"
        raise Exception(msg)
    if name in self.states_:
        msg = f"cuda rng state {name} already exists"
        raise Exception(msg)
    self._is_initialized = True
    self.seeds_.add(seed)
    generator = torch.Generator()
    generator.manual_seed(seed)
    self.states_[name] = generator.get_state()


@contextlib.contextmanager
def _tracker_fork(self: Any, name: str | None = None) -> Iterator[None]:
    """Run the block on the named RNG state (CPU generator) and keep its advance; restore the caller's."""
    import torch

    name = name if name is not None else upstream(RANDOM, "_MODEL_PARALLEL_RNG_TRACKER_NAME")
    if name not in self.states_:
        msg = f"cuda rng state {name} is not added"
        raise Exception(msg)
    outer = torch.get_rng_state()
    torch.set_rng_state(self.states_[name])
    try:
        yield
    finally:
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(outer)


def _gather_along_last_dim(input_: Any, group: Any) -> Any:
    """All-gather tensor-parallel shards along the last dimension into CPU tensors (gloo)."""
    import torch
    import torch.distributed as dist

    size = group.size()
    if size == 1:
        return input_
    parts = [torch.empty_like(input_) for _ in range(size)]
    dist.all_gather(parts, input_.contiguous(), group=group)
    return torch.cat(parts, dim=-1).contiguous()


def _seed_tracker(keys: tuple[str, ...]) -> Any:
    def seed(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        import torch

        bound = inspect.signature(wrapped).bind(*args, **kwargs).arguments
        tracker = upstream(MTP, "MTPLossLoggingHelper").tracker
        for key in keys:
            if key not in tracker:
                tracker[key] = torch.zeros(bound["num_layers"], device=bound["loss"].device)
        return wrapped(*args, **kwargs)

    seed.__doc__ = f"Create the MTP tracker's {', '.join(keys)} on the loss's device before upstream looks for CUDA."
    return seed


def _loss_tracker_not_needed() -> tuple[bool, str]:
    """Whether ``save_loss_to_tracker`` needs no CPU shim: 0.13 allocates on the loss's device, 0.19 removed it."""
    if not has(f"{_HELPER}.save_loss_to_tracker").evaluate().ok:
        if has(f"{_HELPER}.save_metrics_to_tracker").evaluate().ok:
            return True, (
                "MTPLossLoggingHelper.save_loss_to_tracker is gone (megatron-core 0.19); the MTP loss is logged by "
                "save_metrics_to_tracker, which mtp_metrics_device puts on the loss's device"
            )
        return False, "MTPLossLoggingHelper has neither save_loss_to_tracker nor save_metrics_to_tracker"
    old = requires("megatron-core<0.14").evaluate()
    if old.ok:
        return True, f"{old.reason}, whose save_loss_to_tracker allocates the MTP tracker on the loss's device"
    return False, "MTPLossLoggingHelper.save_loss_to_tracker allocates the MTP tracker with CUDA (0.14-0.18)"


def _metrics_tracker_not_needed() -> tuple[bool, str]:
    """Whether ``save_metrics_to_tracker`` needs no CPU shim: before 0.19 it does not exist and the loss goes elsewhere."""
    if has(f"{_HELPER}.save_metrics_to_tracker").evaluate().ok:
        return False, "MTPLossLoggingHelper.save_metrics_to_tracker allocates the MTP tracker with CUDA (0.19)"
    if has(f"{_HELPER}.save_loss_to_tracker").evaluate().ok:
        return True, (
            "MTPLossLoggingHelper.save_metrics_to_tracker does not exist before megatron-core 0.19; the MTP loss is "
            "logged by save_loss_to_tracker (mtp_tracker_device)"
        )
    return False, "MTPLossLoggingHelper has neither save_metrics_to_tracker nor save_loss_to_tracker"


# --- hybrid_final_norm (helper `hybrid`, issue 14): HybridStack / MambaStack's hard-coded TENorm final norm. ---
_HYBRID_BLOCK = "megatron.core.models.hybrid.hybrid_block"
_MAMBA_BLOCK = "megatron.core.ssm.mamba_block"


def _torch_norm(config: Any, hidden_size: int, eps: float = 1e-5, *args: Any, **kwargs: Any) -> Any:
    """Build the stack's final norm as a torch LayerNorm / RMSNorm (``WrappedTorchNorm``) instead of TENorm."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    return WrappedTorchNorm(config=config, hidden_size=hidden_size, eps=eps)


def _stack_with_te_norm() -> str | None:
    """Which stack module builds the hard-coded TENorm final norm: HybridStack (0.18+), MambaStack (0.13-0.17)."""
    for where in (_HYBRID_BLOCK, _MAMBA_BLOCK):
        if has(f"{where}:TENorm").evaluate().ok:
            return where
    return None


def _hybrid_norm_not_needed() -> tuple[bool, str]:
    """HybridStack's final norm needs the shim where HybridStack exists; before 0.18 MambaStack builds it."""
    where = _stack_with_te_norm()
    if where == _HYBRID_BLOCK:
        return False, "HybridStack hard-codes TENorm as its final norm"
    if where == _MAMBA_BLOCK:
        return True, "no HybridStack before megatron-core 0.18; MambaStack builds the final norm (mamba_final_norm)"
    return True, "no HybridStack or MambaStack with a TENorm final norm on this release"


def _mamba_norm_not_needed() -> tuple[bool, str]:
    """MambaStack's final norm needs the shim before 0.18; from 0.18 HybridStack builds it (MambaModel is a HybridModel)."""
    where = _stack_with_te_norm()
    if where == _MAMBA_BLOCK:
        return False, "MambaStack hard-codes TENorm as its final norm"
    if where == _HYBRID_BLOCK:
        return True, "HybridStack builds the final norm on this release (hybrid_final_norm)"
    return True, "no HybridStack or MambaStack with a TENorm final norm on this release"


_HYBRID_NORM_PATCHES = (
    Patch("hybrid_final_norm", f"{_HYBRID_BLOCK}:TENorm", _torch_norm,
          when=not_needed_when(check(_hybrid_norm_not_needed, "HybridStack's final norm needs no shim"))
          & has(f"{_HYBRID_BLOCK}:TENorm")),
    Patch("mamba_final_norm", f"{_MAMBA_BLOCK}:TENorm", _torch_norm,
          when=not_needed_when(check(_mamba_norm_not_needed, "MambaStack's final norm needs no shim"))
          & has(f"{_MAMBA_BLOCK}:TENorm")),
)  # fmt: skip
# --- end hybrid_final_norm ---

CPU_SET = PatchSet(
    "megatron-cpu",
    (
        Patch("memory_buffer_on_cpu", f"{_UTILS}:GlobalMemoryBuffer.get_tensor", _get_tensor,
              when=has(f"{_UTILS}:GlobalMemoryBuffer.get_tensor")),
        Patch("rng_state_get", f"{RANDOM}:_get_cuda_rng_state", _get_rng_state, when=has(f"{RANDOM}:_get_cuda_rng_state")),
        Patch("rng_state_set", f"{RANDOM}:_set_cuda_rng_state", _set_rng_state, when=has(f"{RANDOM}:_set_cuda_rng_state")),
        Patch("rng_tracker_add", f"{_TRACKER}.add", _tracker_add, when=has(f"{_TRACKER}.add")),
        Patch("rng_tracker_fork", f"{_TRACKER}.fork", _tracker_fork, when=has(f"{_TRACKER}.fork")),
        Patch("tp_gather_on_cpu", f"{_MAPPINGS}:_gather_along_last_dim", _gather_along_last_dim,
              when=has(f"{_MAPPINGS}:_gather_along_last_dim")),
        Patch("mtp_tracker_device", f"{_HELPER}.save_loss_to_tracker", _seed_tracker(("values",)), kind="wrap",
              when=not_needed_when(check(_loss_tracker_not_needed, "save_loss_to_tracker needs no CPU shim"))
              & has(f"{_HELPER}.save_loss_to_tracker")),
        Patch("mtp_metrics_device", f"{_HELPER}.save_metrics_to_tracker",
              _seed_tracker(("loss_values", "correct_values", "total_values")), kind="wrap",
              when=not_needed_when(check(_metrics_tracker_not_needed, "save_metrics_to_tracker needs no CPU shim"))
              & has(f"{_HELPER}.save_metrics_to_tracker")),
        *_HYBRID_NORM_PATCHES,
    ),
    doc="CPU-only shims so tiny Megatron-Core models run forward and backward without CUDA",
)  # fmt: skip


def cpu_patched(registry: patchreg.Registry | None = None) -> patchreg.Patched:
    """``with cpu_patched():`` (or ``@cpu_patched()``): the CPU shims for the duration of a block."""
    return (registry if registry is not None else patchreg.registry).patched(CPU_SET)
