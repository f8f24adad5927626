"""verl's Megatron engine with ``patches.verl``: the engine's chunk before, inside and after the engine's life, on CPU.

The opt-in is verl's own: ``VERL_USE_EXTERNAL_MODULES=patches.verl`` makes ``import verl`` import
``patches.verl``, which applies ``VERL_MTP`` lazily. verl's real ``MegatronEngine.initialize()`` then calls
our ``patch_engine_mtp`` on the engine's chunks. The engine here builds a tiny GPTModel instead of
loading a checkpoint through mbridge (the only part of verl's engine replaced), and verl's platform is
set to the CPU with verl's own ``set_platform``. Needs verl 0.9.1 on the path: ``make test-verl`` puts it
in ``.cache/verl-overlay``; run ``PYTHONPATH=.cache/verl-overlay:. python examples/verl_mtp.py``.
"""

from __future__ import annotations

import gc
import os
import warnings
import weakref
from types import SimpleNamespace
from typing import Any

os.environ["VERL_USE_EXTERNAL_MODULES"] = "patches.verl"  # in a Ray job: runtime_env={"env_vars": {...}}
warnings.filterwarnings("ignore")  # "Apex is not installed", verl's optional engines, ...

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import verl  # noqa: E402, F401  (imports patches.verl: VERL_USE_EXTERNAL_MODULES)
from _tiny import batch, init_single_process, tiny_gpt  # noqa: E402  (examples/_tiny.py)

import patchreg  # noqa: E402
from patches.megatron import cpu_patched  # noqa: E402
from patches.verl import engine_report  # noqa: E402


def verl_on_cpu() -> None:
    """verl's CUDA platform with the CPU as device, set through verl's platform plugin API."""
    from verl.plugin.platform.platform_cuda import PlatformCUDA
    from verl.plugin.platform.platform_manager import set_platform

    class PlatformCPU(PlatformCUDA):
        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> Any:
            return torch.cpu

        def is_available(self) -> bool:
            return True

    set_platform(PlatformCPU())


def engine_class() -> Any:
    """verl's MegatronEngineWithLMHead; only its model-building steps return the tiny model."""
    from verl.workers.config import McoreEngineConfig
    from verl.workers.config.model import MtpConfig
    from verl.workers.engine.megatron.transformer_impl import MegatronEngineWithLMHead

    class TinyEngine(MegatronEngineWithLMHead):
        def __init__(self, chunks: list[Any]) -> None:  # verl's own needs mbridge and a checkpoint
            self.model_config = SimpleNamespace(mtp=MtpConfig(enable=True, enable_train=True, detach_encoder=True))
            self.engine_config = McoreEngineConfig(forward_only=True)
            self._qat_enabled, self._is_offload_param, self._chunks = False, False, chunks

        def _build_tf_config(self) -> None:
            self.tf_config = self._chunks[0].config

        def _build_megatron_module(self) -> list[Any]:
            chunks, self._chunks = self._chunks, []
            return chunks

    return TinyEngine


def show(label: str, gpt: Any) -> None:
    """What the chunk's _postprocess and forward are, its config's mtp_detach_heads (megatron-core 0.19.2 rides
    upstream's RL mode there instead of replacing _postprocess), and what its MTP layers' _get_embeddings are."""
    for attr in ("_postprocess", "forward"):
        own = attr in vars(gpt)
        found = vars(gpt)[attr] if own else getattr(type(gpt), attr)
        name = getattr(getattr(found, "__func__", found), "__qualname__", found)
        print(f"{label:<7} {attr}: {name} ({'instance' if own else 'class'});")
    layers = [("_get_embeddings" in vars(layer)) for layer in gpt.mtp.layers]
    verls = [k for k in vars(gpt) if k.endswith("_backup")]
    heads = getattr(gpt.config, "mtp_detach_heads", "absent")
    print(f"        MTP layers with their own _get_embeddings: {sum(layers)}/{len(layers)}; verl backups: {verls}; ")
    print(f"        config.mtp_detach_heads: {heads}")


def main() -> int:
    """Build, initialize and drop an engine; print its chunk at each stage."""
    import verl.workers.engine.megatron.transformer_impl as impl

    verl_on_cpu()
    init_single_process()
    print(f"verl's call site sees patch_engine_mtp from {impl.patch_engine_mtp.__module__}")
    with cpu_patched():
        gpt = tiny_gpt()
        show("before", gpt)
        engine = engine_class()([gpt])
        engine.initialize()  # verl's own initialize(): calls patch_engine_mtp(self.module, self.model_config)
        show("inside", gpt)
        record = engine_report(engine)
        print(record)
        logits = gpt(**batch())
        print(f"        forward with labels returns logits {tuple(logits.shape)} (the MTP loss rides on them)")
        model = weakref.ref(gpt)
        del engine, gpt, logits
        gc.collect()
    print(f"after   the engine is gone: model freed {model() is None}; its installs released {record.released}")
    mtp_left = [e for e in patchreg.registry.active() if e.patch in ("postprocess_detached", "detach_embeddings")]
    print(f"        MTP installs left in patchreg.registry: {len(mtp_left)}")
    dist.destroy_process_group()
    return 0 if model() is None and record is not None and record.released and not mtp_left else 1


if __name__ == "__main__":
    raise SystemExit(main())
