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
- ``mtp_acceptance_device``: dev's packed MTP acceptance counters (``_save_acceptance_counts``) on the counts' device
- ``inference_linear_on_cpu``: main's ``MultiTokenPredictionLayer.__init__`` asks ``is_inference_column_parallel_linear``,
  an ``isinstance`` against Transformer Engine stand-ins without TE (``TypeError``): answered for the classes that exist
- ``hybrid_final_norm``: the final norm ``HybridStack`` (0.18+) / ``MambaStack`` (0.17) hard-code as ``TENorm`` is
  built as a torch norm (``WrappedTorchNorm``) while the model is built

For real architectures (MoE, MLA, RoPE, packed sequences; docs/guides/architectures.md has the table):

- ``moe_router_on_cpu``: ``Router.gating`` on the weights' device (plain torch where 0.13-0.16 lack ``te_general_gemm``)
- ``causal_mask_on_cpu``: ``get_default_causal_mask`` (no attention mask passed) on the CPU
- ``rope_init_on_cpu`` / ``rope_on_cpu`` / ``rope_forward_on_cpu``: RoPE frequencies built and kept on the CPU
- ``mla_local_attention`` / ``mla_no_te_linear``: local MLA (``k_channels`` / ``v_channels``; 0.14-0.16's stand-in)
- ``packed_local_attention``: packed (``thd``) sequences on local ``DotProductAttention``

Usage: ``with cpu_patched(), mtp_patched(model): ...``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import patchreg
from patches.megatron._compat import MTP, RANDOM, absent, module, parameters, upstream
from patchreg import Patch, PatchSet, Verified, accepts, check, has, not_needed_when, requires

__all__ = ["CPU_SET", "cpu_patched"]

_UTILS = "megatron.core.utils"
_TRACKER = f"{RANDOM}:CudaRNGStatesTracker"
_HELPER = f"{MTP}:MTPLossLoggingHelper"
_MAPPINGS = "megatron.core.tensor_parallel.mappings"
_ROUTER = "megatron.core.transformer.moe.router"
_SOFTMAX = "megatron.core.fusions.fused_softmax"
_MOE_UTILS = "megatron.core.transformer.moe.moe_utils"
_MLA_MODULE = "megatron.core.transformer.multi_latent_attention"
_DPA = "megatron.core.transformer.dot_product_attention:DotProductAttention"
_ROPE = "megatron.core.models.common.embeddings.rotary_pos_embedding"
_ROTARY = f"{_ROPE}:RotaryEmbedding"
_TO = "<=0.19.2"  # the newest release these bodies were verified on


def _body(path: str, bodies: dict[str, str]) -> Verified:
    """The upstream body a shim re-implements, per release range (``python -m patchreg body PATH``)."""
    return Verified("megatron-core", path, bodies)


_GATING_BODY = _body(
    f"{_ROUTER}:Router.gating", {">=0.13,<0.15": "02301c8e477da4bd", f">=0.15,{_TO}": "539c2e6066a2d2f3"}
)
_GET_EMB_BODY = _body(f"{_ROTARY}.get_emb", {f">=0.16,{_TO}": "0f35c4637d3fa5a4"})
_ROPE_FORWARD_BODY = _body(f"{_ROTARY}.forward", {">=0.13,<0.16": "fa063a9363130b43"})
_CAUSAL_MASK_BODY = _body(
    f"{_SOFTMAX}:get_default_causal_mask", {">=0.13,<0.16": "f654b91be8fa0b97", f">=0.16,{_TO}": "a6d8867dadf67846"}
)


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


def _router_gating(self: Any, input: Any) -> Any:
    """Router logits on the weights' own device (upstream first moves CPU weights to ``torch.cuda.current_device()``).

    Upstream's ``router_gating_linear`` where it runs without Transformer Engine; on 0.13-0.16 it names
    ``te_general_gemm``, which those releases leave undefined without TE (``NameError``), so the gate is
    the same product in plain torch (``router_dtype`` in, ``router_dtype`` out, as upstream's fallback).
    """
    import torch

    router_dtype = {"fp32": torch.float32, "fp64": torch.float64}.get(self.config.moe_router_dtype, input.dtype)
    bias = getattr(self, "bias", None)
    if "te_general_gemm" in vars(module(_MOE_UTILS)):
        linear = upstream(_ROUTER, "router_gating_linear")
        if "bias" in parameters(linear)[0]:  # 0.15+: the router may have a bias
            return linear(input, self.weight, bias, router_dtype)
        return linear(input, self.weight, router_dtype)
    weight = self.weight.to(router_dtype)
    return torch.nn.functional.linear(input.to(router_dtype), weight, None if bias is None else bias.to(router_dtype))


def _default_causal_mask(sq: int) -> Any:
    """The causal upper-triangular mask ``[sq, sq]`` (True: masked) on the CPU (upstream allocates it on CUDA)."""
    import torch

    return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)


class _NoTELinear:
    """Stands in for Transformer Engine's ``TELinear`` where MLA holds a non-type stand-in: nothing is one."""


def _te_linear_is_type() -> tuple[bool, str]:
    """Whether MLA's ``TELinear`` is a class (TE installed, or ``None`` guarded by ``HAVE_TE``): no shim then."""
    missing = absent("megatron.core")
    if missing:
        return False, missing
    found = vars(module(_MLA_MODULE)).get("TELinear")
    if found is None or isinstance(found, type):
        return True, f"multi_latent_attention.TELinear is {'None' if found is None else 'a class'}"
    return False, f"multi_latent_attention.TELinear is a {type(found).__name__} stand-in, not a class (no TE)"


def _packed_attention(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Packed sequences (``qkv_format="thd"``) on local ``DotProductAttention``, which refuses them.

    The pack runs as one sequence whose mask keeps each token to its own sequence (``cu_seqlens``, padded
    ones where given) and, for causal attention, to the tokens before it. The output is TE's ``[t, np*hn]``
    (``hn``: the value's width, which MLA pads for packed inputs and trims after).
    """
    import torch

    bound = inspect.signature(wrapped).bind(*args, **kwargs)
    a = bound.arguments
    packed = a.get("packed_seq_params")
    if packed is None or getattr(packed, "qkv_format", None) != "thd":
        return wrapped(*args, **kwargs)
    squeezed = a["query"].dim() == 3  # [t, np, hn], as upstream hands packed inputs to TE
    query, key, value = (t.unsqueeze(1) if squeezed else t for t in (a["query"], a["key"], a["value"]))
    cu_q, cu_kv = _cu_seqlens(packed, "q"), _cu_seqlens(packed, "kv")
    seg_q = torch.searchsorted(cu_q[1:].to(query.device), torch.arange(query.shape[0]), right=True)
    seg_kv = torch.searchsorted(cu_kv[1:].to(key.device), torch.arange(key.shape[0]), right=True)
    allowed = seg_q[:, None] == seg_kv[None, :]
    mask_type = a.get("attn_mask_type") or getattr(instance, "attn_mask_type", None)
    if getattr(mask_type, "name", None) == "causal":
        allowed &= torch.arange(key.shape[0])[None, :] <= torch.arange(query.shape[0])[:, None]
    a.update(query=query, key=key, value=value, attention_mask=~allowed[None, None], packed_seq_params=None)
    width = instance.hidden_size_per_partition
    instance.hidden_size_per_partition = value.shape[-1] * instance.num_attention_heads_per_partition
    try:  # MLA pads the packed value to the key's width (and slices the output back)
        out = wrapped(*bound.args, **bound.kwargs)
    finally:
        instance.hidden_size_per_partition = width
    return out.squeeze(1) if squeezed else out  # TE's [t, np*hn]


def _cu_seqlens(packed: Any, side: str) -> Any:
    """The pack's cumulative sequence lengths for ``side`` ("q" / "kv"), the padded ones where given."""
    padded = getattr(packed, f"cu_seqlens_{side}_padded", None)
    return padded if padded is not None else getattr(packed, f"cu_seqlens_{side}")


def _rope_emb(self: Any, max_seq_len: int, offset: int = 0) -> Any:
    """RoPE frequencies ``[s, 1, 1, dim]`` on ``inv_freq``'s own device (upstream moves it to CUDA first)."""
    import torch

    freqs = self.get_freqs_non_repeated(max_seq_len, offset)
    if not self.rotary_interleaved:
        emb = torch.cat((freqs, freqs), dim=-1)
    else:
        emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
    return emb[:, None, None, :]


def _rope_forward(self: Any, max_seq_len: int, offset: int = 0, packed_seq: bool = False) -> Any:
    """0.13-0.15's ``RotaryEmbedding.forward`` (no ``get_emb``): the CPU embedding, sliced for this CP rank."""
    emb = _rope_emb(self, max_seq_len, offset)
    cp_group = getattr(self, "cp_group", None)
    if cp_group is not None and cp_group.size() > 1 and not packed_seq:
        emb = upstream(_ROPE, "get_pos_emb_on_this_cp_rank")(emb, 0, cp_group)
    return emb


def _lacks(path: str, there: str, not_there: str) -> Callable[[], tuple[bool, str]]:
    """A ``not_needed_when`` check: True (not needed) where the installed megatron-core has no ``path`` (why:
    ``not_there``); False where it has it (``there``), and where no megatron-core is installed, which the patch's own
    ``has()`` then answers (no release to judge: not "not needed")."""

    def lacks() -> tuple[bool, str]:
        missing = absent("megatron.core")
        if missing:
            return False, missing
        return (False, there) if has(path).evaluate().ok else (True, not_there)

    return lacks


# RotaryEmbedding lacks get_emb on 0.13-0.15: forward moves to CUDA inline (rope_forward_on_cpu)
_no_get_emb = _lacks(
    f"{_ROTARY}.get_emb",
    "RotaryEmbedding.get_emb moves inv_freq to CUDA (0.16+)",
    "RotaryEmbedding has no get_emb before 0.16; forward moves inv_freq itself (rope_forward_on_cpu)",
)


def _rope_on_cpu_init(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Build the RoPE frequencies on the CPU (MLA constructs its RotaryEmbedding without use_cpu_initialization)."""
    bound = inspect.signature(wrapped).bind(*args, **kwargs)
    bound.arguments["use_cpu_initialization"] = True
    return wrapped(*bound.args, **bound.kwargs)


def _attention_head_dims(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Local ``DotProductAttention`` with MLA's ``k_channels`` / ``v_channels`` (upstream's takes neither).

    The key width sets the default softmax scale, the value width the output's width per head; upstream
    derives both from ``kv_channels``.
    """
    import math

    k_channels, v_channels = kwargs.pop("k_channels", None), kwargs.pop("v_channels", None)
    if k_channels is not None and kwargs.get("softmax_scale") is None:
        kwargs["softmax_scale"] = 1.0 / math.sqrt(k_channels)  # upstream still divides by its layer coefficient
    result = wrapped(*args, **kwargs)
    if v_channels is not None:
        instance.hidden_size_per_attention_head = v_channels
        instance.hidden_size_per_partition = v_channels * instance.num_attention_heads_per_partition
    return result


def _seed_tracker(keys: tuple[str, ...]) -> Any:
    def seed(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        import torch

        call = inspect.signature(wrapped).bind(*args, **kwargs)
        call.apply_defaults()
        bound = call.arguments
        tracker = upstream(MTP, "MTPLossLoggingHelper").tracker
        loss = bound["loss"] if "loss" in bound else bound["loss_sum"]  # dev: save_loss_to_tracker(loss_sum, ...)
        for key in _tracker_keys(keys, bound):
            if key not in tracker:
                tracker[key] = torch.zeros(bound["num_layers"], device=loss.device)
        if "calculate_per_token_loss" in bound:  # dev: upstream checks the mode of a tracker it did not create
            tracker.setdefault("calculate_per_token_loss", bound["calculate_per_token_loss"])
        return wrapped(*args, **kwargs)

    seed.__doc__ = f"Create the MTP tracker's {', '.join(keys)} on the loss's device before upstream looks for CUDA."
    return seed


def _tracker_keys(keys: tuple[str, ...], bound: dict[str, Any]) -> tuple[str, ...]:
    """The tracker entries a call allocates: ``keys``; dev's ``save_loss_to_tracker(loss_sum, num_tokens, ...)``:
    ``loss_sums``, and ``num_tokens`` with per-token loss."""
    if "loss_sum" not in bound:
        return keys
    return ("loss_sums", "num_tokens") if bound.get("calculate_per_token_loss") else ("loss_sums",)


# before dev the acceptance counts are allocated by save_metrics_to_tracker (mtp_metrics_device)
_no_packed_acceptance = _lacks(
    f"{_HELPER}._save_acceptance_counts",
    "MTPLossLoggingHelper._save_acceptance_counts allocates packed acceptance counters with CUDA (dev)",
    "MTPLossLoggingHelper has no _save_acceptance_counts on this release: save_metrics_to_tracker allocates the "
    "acceptance counts (mtp_metrics_device), or none are logged",
)


def _seed_acceptance(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Create dev's packed acceptance counters ``[2, num_layers]`` (and the ``correct_values`` / ``total_values``
    views upstream keeps) on the counts' device before upstream looks for CUDA."""
    import torch

    bound = inspect.signature(wrapped).bind(*args, **kwargs).arguments
    tracker = upstream(MTP, "MTPLossLoggingHelper").tracker
    shape = (2, bound["num_layers"])
    found = tracker.get("acceptance_counts")
    if found is None or tuple(found.shape) != shape:
        counts = tracker["acceptance_counts"] = torch.zeros(shape, device=bound["correct"].device)
        tracker["correct_values"], tracker["total_values"] = counts[0], counts[1]
    return wrapped(*args, **kwargs)


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
    return False, "MTPLossLoggingHelper.save_loss_to_tracker allocates the MTP tracker with CUDA (0.14-0.18, dev)"


def _metrics_tracker_not_needed() -> tuple[bool, str]:
    """Whether ``save_metrics_to_tracker`` needs no CPU shim: before 0.19 it does not exist and the loss goes elsewhere."""
    if has(f"{_HELPER}.save_metrics_to_tracker").evaluate().ok:
        return False, "MTPLossLoggingHelper.save_metrics_to_tracker allocates the MTP tracker with CUDA (0.19+)"
    if has(f"{_HELPER}.save_loss_to_tracker").evaluate().ok:
        return True, (
            "MTPLossLoggingHelper.save_metrics_to_tracker does not exist before megatron-core 0.19; the MTP loss is "
            "logged by save_loss_to_tracker (mtp_tracker_device)"
        )
    return False, "MTPLossLoggingHelper has neither save_metrics_to_tracker nor save_loss_to_tracker"


# --- inference_linear_on_cpu (issue 41): main's MTP layer asks whether eh_proj is an inference-optimized linear. ---
_INFERENCE = "megatron.core.tensor_parallel.inference_layers"
_INFERENCE_LINEARS = ("InferenceColumnParallelLinear", "InferenceLayerNormColumnParallelLinear")


def _inference_linear_classes() -> tuple[type, ...]:
    """The inference-optimized column-parallel linears upstream's check names, those that are classes."""
    found = vars(module(_INFERENCE))
    return tuple(cls for cls in (found.get(name) for name in _INFERENCE_LINEARS) if isinstance(cls, type))


def _is_inference_linear(module_: Any) -> bool:
    """Whether ``module_`` is an inference-optimized column-parallel linear, as upstream's check (main) asks; without
    Transformer Engine those classes derive from TE stand-ins (``MagicMock``), ``isinstance`` refuses them, and
    nothing built without TE is one: False."""
    classes = _inference_linear_classes()
    return bool(classes) and isinstance(module_, classes)


# before main (0.20) the MTP module asks no is_inference_column_parallel_linear: nothing to shim
_no_inference_linear_check = _lacks(
    f"{MTP}:is_inference_column_parallel_linear",
    "MultiTokenPredictionLayer.__init__ calls is_inference_column_parallel_linear (main, 0.20)",
    "the MTP module calls no is_inference_column_parallel_linear on this release (it came after 0.19.2)",
)


def _inference_linears_are_classes() -> tuple[bool, str]:
    """Whether upstream's ``is_inference_column_parallel_linear`` can run: its classes are classes (TE installed)."""
    missing = absent("megatron.core")
    if missing:
        return False, missing
    if len(_inference_linear_classes()) == len(_INFERENCE_LINEARS):
        return True, "inference_layers' column-parallel linears are classes (Transformer Engine is installed)"
    found = vars(module(_INFERENCE))
    stand_ins = [f"{name} is a {type(found.get(name)).__name__}" for name in _INFERENCE_LINEARS
                 if not isinstance(found.get(name), type)]  # fmt: skip
    return False, (
        f"inference_layers.{', '.join(stand_ins)} (no Transformer Engine): is_inference_column_parallel_linear "
        "raises TypeError in MultiTokenPredictionLayer.__init__"
    )


# --- end inference_linear_on_cpu ---

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
    missing = absent("megatron.core")
    if missing:
        return False, missing
    where = _stack_with_te_norm()
    if where == _HYBRID_BLOCK:
        return False, "HybridStack hard-codes TENorm as its final norm"
    if where == _MAMBA_BLOCK:
        return True, "no HybridStack before megatron-core 0.18; MambaStack builds the final norm (mamba_final_norm)"
    return True, "no HybridStack or MambaStack with a TENorm final norm on this release"


def _mamba_norm_not_needed() -> tuple[bool, str]:
    """MambaStack's final norm needs the shim before 0.18; from 0.18 HybridStack builds it (MambaModel is a HybridModel)."""
    missing = absent("megatron.core")
    if missing:
        return False, missing
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
        Patch("causal_mask_on_cpu", f"{_SOFTMAX}:get_default_causal_mask", _default_causal_mask,
              when=has(f"{_SOFTMAX}:get_default_causal_mask"), verified=_CAUSAL_MASK_BODY),
        Patch("moe_router_on_cpu", f"{_ROUTER}:Router.gating", _router_gating,
              when=has(f"{_ROUTER}:Router.gating") & has(f"{_ROUTER}:router_gating_linear"), verified=_GATING_BODY),
        Patch("mla_no_te_linear", f"{_MLA_MODULE}:TELinear", _NoTELinear,
              when=not_needed_when(check(_te_linear_is_type, "MLA's TELinear is a class or None"))
              & has(f"{_MLA_MODULE}:TELinear")),
        Patch("mla_local_attention", f"{_DPA}.__init__", _attention_head_dims, kind="wrap",
              when=not_needed_when(accepts(f"{_DPA}.__init__", "k_channels")) & has(f"{_DPA}.__init__")),
        Patch("packed_local_attention", f"{_DPA}.forward", _packed_attention, kind="wrap",
              when=accepts(f"{_DPA}.forward", "query", "key", "value", "attention_mask", "packed_seq_params")),
        Patch("rope_init_on_cpu", f"{_ROTARY}.__init__", _rope_on_cpu_init, kind="wrap",
              when=accepts(f"{_ROTARY}.__init__", "use_cpu_initialization")),
        Patch("rope_on_cpu", f"{_ROTARY}.get_emb", _rope_emb,
              when=not_needed_when(check(_no_get_emb, "RotaryEmbedding has no get_emb"))
              & accepts(f"{_ROTARY}.get_emb", "max_seq_len", "offset"),
              verified=_GET_EMB_BODY),
        Patch("rope_forward_on_cpu", f"{_ROTARY}.forward", _rope_forward,
              when=not_needed_when(has(f"{_ROTARY}.get_emb"))
              & accepts(f"{_ROTARY}.forward", "max_seq_len", "offset", "packed_seq"), verified=_ROPE_FORWARD_BODY),
        Patch("mtp_tracker_device", f"{_HELPER}.save_loss_to_tracker", _seed_tracker(("values",)), kind="wrap",
              when=not_needed_when(check(_loss_tracker_not_needed, "save_loss_to_tracker needs no CPU shim"))
              & has(f"{_HELPER}.save_loss_to_tracker")),
        Patch("mtp_metrics_device", f"{_HELPER}.save_metrics_to_tracker",
              _seed_tracker(("loss_values", "correct_values", "total_values")), kind="wrap",
              when=not_needed_when(check(_metrics_tracker_not_needed, "save_metrics_to_tracker needs no CPU shim"))
              & has(f"{_HELPER}.save_metrics_to_tracker")),
        Patch("mtp_acceptance_device", f"{_HELPER}._save_acceptance_counts", _seed_acceptance, kind="wrap",
              when=not_needed_when(check(_no_packed_acceptance, "no packed acceptance counters"))
              & has(f"{_HELPER}._save_acceptance_counts")),
        Patch("inference_linear_on_cpu", f"{MTP}:is_inference_column_parallel_linear", _is_inference_linear,
              when=not_needed_when(check(_no_inference_linear_check, "no inference-linear check in the MTP layer"))
              & not_needed_when(check(_inference_linears_are_classes, "the inference linears are classes"))
              & has(f"{MTP}:is_inference_column_parallel_linear")),
        *_HYBRID_NORM_PATCHES,
    ),
    doc="CPU-only shims so tiny Megatron-Core models run forward and backward without CUDA",
)  # fmt: skip


def cpu_patched(registry: patchreg.Registry | None = None) -> patchreg.Patched:
    """``with cpu_patched():`` (or ``@cpu_patched()``): the CPU shims for the duration of a block."""
    return (registry if registry is not None else patchreg.registry).patched(CPU_SET)
