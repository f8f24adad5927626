"""Fixtures for the Megatron-Core patch sets: gloo, parallel_state, tiny real GPTModels, the reference.

Everything here is real Megatron-Core on CPU (under ``cpu_patched()``); nothing is mocked.
The reference MTP loss is computed independently of the patches: decoder and MTP-layer
hidden states captured with forward hooks during an upstream forward, the model's own
output layer, labels rolled left in plain torch, masked mean cross-entropy per depth.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

import patchreg

#: The version of the megatron-core code imported (a source tree without metadata too), None when there is none.
MCORE = patchreg.provider("megatron-core").version

VOCAB, SEQ, BATCH, HIDDEN = 64, 8, 2, 32


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="package")
def distributed() -> Iterator[None]:
    """torch.distributed on gloo with one process and parallel_state for TP=PP=1, torn down after this package."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    owned = not dist.is_initialized()
    if owned:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
        dist.init_process_group("gloo", rank=0, world_size=1)
    initialized = not parallel_state.model_parallel_is_initialized()
    if initialized:
        parallel_state.initialize_model_parallel(1, 1)
    yield
    if initialized:
        parallel_state.destroy_model_parallel()
    if owned:
        dist.destroy_process_group()


@pytest.fixture(autouse=True)
def cpu(request: Any) -> Iterator[Any]:
    """Every test here runs under the CPU shims (tests that need no model skip the distributed setup)."""
    from patches.megatron import cpu_patched

    if "no_distributed" not in request.keywords:
        request.getfixturevalue("distributed")
    if "no_cpu_shims" in request.keywords:
        yield None
        return
    with cpu_patched() as report:
        _reset_mtp_state()
        yield report


def _reset_mtp_state() -> None:
    import torch
    from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler, MTPLossLoggingHelper

    MTPLossAutoScaler.set_loss_scale(torch.tensor(1.0))
    MTPLossLoggingHelper.tracker.clear()


def pytest_configure(config: Any) -> None:
    """Declare the marker for tests that must not initialise torch.distributed."""
    config.addinivalue_line("markers", "no_distributed: the test needs no process group")
    config.addinivalue_line("markers", "no_cpu_shims: the test manages cpu_patched itself")


def make_config(**overrides: Any) -> Any:
    """A tiny fp32 TransformerConfig with MTP, dropout off, CPU initialisation."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    fields = dict(
        num_layers=1,
        hidden_size=HIDDEN,
        num_attention_heads=2,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        mtp_num_layers=1,
        mtp_loss_scaling_factor=0.3,
    )
    fields.update(overrides)
    return TransformerConfig(**fields)


def build_gpt(seed: int = 1234, tied: bool = False, mtp: bool = True, **overrides: Any) -> Any:
    """A tiny real GPTModel (MTP block unless ``mtp=False``), weights from ``seed``."""
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel import random as tp_random

    pre, post = overrides.pop("pre_process", True), overrides.pop("post_process", True)
    config = make_config(**overrides) if mtp else make_config(mtp_num_layers=None, **overrides)
    spec = get_gpt_layer_local_spec()
    torch.manual_seed(seed)
    tp_random.model_parallel_cuda_manual_seed(seed)
    mtp_spec = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False) if mtp else None
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=VOCAB,
        max_sequence_length=SEQ * 2,
        pre_process=pre,
        post_process=post,
        share_embeddings_and_output_weights=tied,
        mtp_block_spec=mtp_spec,
    )
    return model


@attrs.frozen
class Batch:
    """One tiny batch: token ids, positions, causal mask, labels and loss mask."""

    input_ids: Any
    position_ids: Any
    attention_mask: Any
    labels: Any
    loss_mask: Any

    def args(self) -> tuple[Any, Any, Any]:
        """Positional arguments of GPTModel.forward."""
        return self.input_ids, self.position_ids, self.attention_mask

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments with labels and loss mask."""
        return {"labels": self.labels, "loss_mask": self.loss_mask}


def make_batch(seed: int = 7, masked: str = "some") -> Batch:
    """A batch; ``masked`` is 'none' (all valid), 'some' (a prompt and a pad masked) or 'all'."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    pos = torch.arange(SEQ).expand(BATCH, SEQ).contiguous()
    causal = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]
    labels = torch.roll(ids, -1, dims=1)
    mask = torch.ones(BATCH, SEQ)
    if masked == "some":
        mask[0, :2] = 0
        mask[1, -1] = 0
    elif masked == "all":
        mask.zero_()
    return Batch(ids, pos, causal, labels, mask)


def unwrap(model: Any) -> Any:
    """The GPTModel inside ``.module`` / ``.language_model`` wrappers."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    while not isinstance(model, GPTModel):
        model = getattr(model, "module", None) or model.language_model
    return model


def roll_left(tensor: Any, shift: int) -> Any:
    """Shift the last dimension ``shift`` places left, filling the tail with zeros (plain torch)."""
    import torch

    out = torch.zeros_like(tensor)
    out[..., : tensor.shape[-1] - shift] = tensor[..., shift:]
    return out


@attrs.frozen
class Reference:
    """The independent reference for one batch: main logits, per-depth losses, total MTP loss."""

    logits: Any
    depth_losses: tuple[Any, ...]
    mtp_loss: Any


def reference(model: Any, batch: Batch) -> Reference:
    """Main-head logits and the MTP loss from the model's own modules, hooks and plain torch."""
    import torch
    import torch.nn.functional as F

    gpt = unwrap(model)
    captured: dict[str, Any] = {"mtp": []}
    hooks = [gpt.decoder.register_forward_hook(lambda m, i, o: captured.__setitem__("decoder", o))]
    for layer in gpt.mtp.layers:
        hooks.append(layer.register_forward_hook(lambda m, i, o: captured["mtp"].append(_first(o))))
    try:
        gpt(*batch.args(), **batch.kwargs())
    finally:
        for hook in hooks:
            hook.remove()
    weight = gpt.shared_embedding_or_output_weight() if gpt.share_embeddings_and_output_weights else None
    logits = gpt.output_layer(_first(captured["decoder"]), weight=weight)[0].transpose(0, 1)
    losses = []
    for depth, states in enumerate(captured["mtp"], start=1):
        labels, mask = roll_left(batch.labels, depth), roll_left(batch.loss_mask, depth)
        depth_logits = gpt.output_layer(states, weight=weight)[0].transpose(0, 1)
        ce = F.cross_entropy(depth_logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="none")
        losses.append((ce.view_as(mask) * mask).sum() / mask.sum().clamp(min=1))
    scale = gpt.config.mtp_loss_scaling_factor / gpt.config.mtp_num_layers
    return Reference(logits, tuple(losses), scale * torch.stack(losses).sum())


def _first(output: Any) -> Any:
    return output[0] if isinstance(output, tuple) else output


def mtp_params(model: Any) -> dict[str, Any]:
    """The MTP layers' parameters by name."""
    return {n: p for n, p in unwrap(model).named_parameters() if n.startswith("mtp.")}


def trunk_params(model: Any) -> dict[str, Any]:
    """Embedding, decoder and output-layer parameters by name (shared weights once)."""
    return {n: p for n, p in unwrap(model).named_parameters() if not n.startswith("mtp.")}


def rel_err(got: Any, want: Any) -> float:
    """max |got - want| / max |want| (1 when want is all zero and got is not)."""
    scale = float(want.abs().max())
    diff = float((got - want).abs().max())
    return diff / scale if scale > 0 else (0.0 if diff == 0 else 1.0)


def grad_of(param: Any) -> Any:
    """The parameter's gradient, zeros when it received none."""
    import torch

    return param.grad if param.grad is not None else torch.zeros_like(param)


def check_gradients(mtp: dict[str, Any], trunk: dict[str, Any], want: dict[str, Any], detach: bool, key: str) -> None:
    """MTP parameters match ``want`` within 1e-5 (the worst diff recorded under ``key``); the trunk gets exactly
    zero when ``detach``, else matches ``want`` too and is trained."""
    import torch

    worst = 0.0
    for name, param in mtp.items():
        assert rel_err(grad_of(param), want[name]) <= 1e-5, name
        worst = max(worst, float((grad_of(param) - want[name]).abs().max()))
    record_measurement(key, worst)
    for name, param in trunk.items():
        if detach:
            assert param.grad is None or torch.count_nonzero(param.grad) == 0, name
        else:
            assert rel_err(grad_of(param), want[name]) <= 1e-5, name
    if not detach:
        assert any(torch.count_nonzero(grad_of(p)) for p in trunk.values())


def record_measurement(key: str, value: float) -> None:
    """Append a measured number to $PATCHREG_MEASUREMENTS (the matrix runner's summary) when set."""
    path = os.environ.get("PATCHREG_MEASUREMENTS")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"megatron-core": MCORE, "key": key, "value": value}) + "\n")


@pytest.fixture
def todays_route() -> Iterator[None]:
    """mtp_patched takes today's patches for the test even where upstream's RL mode would carry it (0.19.2+)."""
    import patchreg
    from patches.megatron import _native

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_native, "_rl_mode_probe", lambda: (False, "the test takes today's patches"))
        patchreg.refresh()
        try:
            yield
        finally:
            mp.undo()
            patchreg.refresh()
