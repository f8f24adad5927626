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
import importlib.util
import os
import socket
import sys
import warnings
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ["VERL_USE_EXTERNAL_MODULES"] = "patches.verl"  # in a Ray job: runtime_env={"env_vars": {...}}
if importlib.util.find_spec("patches") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")  # "Apex is not installed", verl's optional engines, ...

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import verl  # noqa: E402, F401  (imports patches.verl: VERL_USE_EXTERNAL_MODULES)

import patchreg  # noqa: E402
from patches.megatron import cpu_patched  # noqa: E402
from patches.verl import engine_report  # noqa: E402

VOCAB, SEQ, BATCH = 64, 8, 2


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


def init_single_process() -> None:
    """gloo with one rank and Megatron-Core's parallel state for TP=PP=1."""
    from megatron.core import parallel_state

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(sock.getsockname()[1]))
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)


def tiny_gpt() -> Any:
    """A one-layer GPTModel with one MTP depth, fp32, on CPU."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel import random as tp_random
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1,
        hidden_size=32,
        num_attention_heads=2,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        mtp_num_layers=1,
        mtp_loss_scaling_factor=0.3,
    )
    spec = get_gpt_layer_local_spec()
    torch.manual_seed(0)
    tp_random.model_parallel_cuda_manual_seed(0)
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=VOCAB,
        max_sequence_length=2 * SEQ,
        mtp_block_spec=get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False),
    )


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
    """What the chunk's _postprocess is and what its MTP layers' _get_embeddings are."""
    own = "_postprocess" in vars(gpt)
    post = vars(gpt)["_postprocess"] if own else type(gpt)._postprocess
    layers = [("_get_embeddings" in vars(layer)) for layer in gpt.mtp.layers]
    verls = [k for k in vars(gpt) if k.endswith("_backup")]
    print(f"{label:<7} _postprocess: {getattr(post, '__qualname__', post)} ({'instance' if own else 'class'});")
    print(f"        MTP layers with their own _get_embeddings: {sum(layers)}/{len(layers)}; verl backups: {verls}")


def batch() -> dict[str, Any]:
    """Token ids, positions, a causal mask, labels and a loss mask."""
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    return {
        "input_ids": ids,
        "position_ids": torch.arange(SEQ).expand(BATCH, SEQ).contiguous(),
        "attention_mask": torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None],
        "labels": torch.roll(ids, -1, dims=1),
        "loss_mask": torch.ones(BATCH, SEQ),
    }


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
